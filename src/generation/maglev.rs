//! Maglev consistent hashing (Eisenbud et al., NSDI 2016): a lookup table
//! of a prime size where each backend owns an almost equal share of
//! slots, filled from per-backend permutations so that removing one of N
//! backends moves little more than the 1/N of keys it owned. Lookup is
//! one index; walking on from a key's slot gives the next backends to
//! try (for unusable or overloaded ones) in an order fixed per key.

use std::hash::{Hash, Hasher};

/// Slots in the table: a prime well above 100 × the backends an upstream
/// may reasonably have, so shares stay within about 1 % of equal.
pub const TABLE_SIZE: usize = 65_537;

#[derive(Debug, Default)]
pub struct Maglev {
    /// The backend index of each slot.
    table: Vec<u16>,
}

/// The key hash every lookup uses: SipHash with fixed keys, stable for
/// the life of the process and across activations.
pub fn hash_key(bytes: &[u8]) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    bytes.hash(&mut hasher);
    hasher.finish()
}

impl Maglev {
    /// The table for backends named `names` (their identities: the same
    /// name owns the same slots in every generation).
    pub fn new(names: &[&str]) -> Self {
        Self::weighted(names, &[])
    }

    /// As [`Maglev::new`], each backend owning a share of slots in
    /// proportion to its weight (`weights` aligned with `names`; empty:
    /// all alike). Each round of the fill gives a backend a credit of
    /// its weight and a slot per heaviest weight of credit, so equal
    /// weights fill exactly as the unweighted table does.
    pub fn weighted(names: &[&str], weights: &[u32]) -> Self {
        let n = names.len();
        if n == 0 || n > usize::from(u16::MAX) {
            return Self::default();
        }
        let weight = |i: usize| u64::from(weights.get(i).copied().unwrap_or(1).max(1));
        let heaviest = (0..n).map(weight).max().unwrap_or(1);
        let mut credit = vec![0u64; n];
        let m = TABLE_SIZE as u64;
        let permutations: Vec<(u64, u64)> = names
            .iter()
            .map(|name| {
                let h = hash_key(name.as_bytes());
                let offset = h % m;
                let skip = (h.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15) % (m - 1) + 1;
                (offset, skip)
            })
            .collect();
        let mut table = vec![u16::MAX; TABLE_SIZE];
        let mut next = vec![0u64; n];
        let mut filled = 0;
        'fill: loop {
            for (i, (offset, skip)) in permutations.iter().enumerate() {
                let Some(turn) = next.get_mut(i) else {
                    continue;
                };
                if let Some(c) = credit.get_mut(i) {
                    *c += weight(i);
                    if *c < heaviest {
                        continue;
                    }
                    *c -= heaviest;
                }
                // Each backend takes the next free slot of its own
                // permutation; a permutation visits every slot once.
                loop {
                    let slot = ((offset + *turn * skip) % m) as usize;
                    *turn += 1;
                    if let Some(entry) = table.get_mut(slot).filter(|e| **e == u16::MAX) {
                        *entry = i as u16;
                        filled += 1;
                        break;
                    }
                }
                if filled == TABLE_SIZE {
                    break 'fill;
                }
            }
        }
        Self { table }
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Backend indexes for `hash`: the owner of its slot first, then the
    /// owners of the slots after it (repeats included).
    pub fn walk(&self, hash: u64) -> impl Iterator<Item = usize> + '_ {
        let start = (hash % TABLE_SIZE as u64) as usize;
        let (after, before) = self.table.split_at(start.min(self.table.len()));
        before.iter().chain(after).map(|i| usize::from(*i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(table: &Maglev, key: u64) -> usize {
        table.walk(key).next().unwrap()
    }

    #[test]
    fn shares_are_even_and_removing_one_of_five_moves_about_a_fifth() {
        let names = [
            "10.0.0.1:80",
            "10.0.0.2:80",
            "10.0.0.3:80",
            "10.0.0.4:80",
            "10.0.0.5:80",
        ];
        let five = Maglev::new(&names);
        let mut counts = [0usize; 5];
        for slot in &five.table {
            counts[usize::from(*slot)] += 1;
        }
        for count in counts {
            let share = count as f64 / TABLE_SIZE as f64;
            assert!((share - 0.2).abs() < 0.01, "{counts:?}");
        }
        // Drop the third backend: keys it did not own mostly stay put.
        let four = Maglev::new(&[names[0], names[1], names[3], names[4]]);
        let renamed = |i: usize| {
            names
                .iter()
                .position(|n| *n == [names[0], names[1], names[3], names[4]][i])
                .unwrap()
        };
        let keys: Vec<u64> = (0..10_000u64).map(|k| hash_key(&k.to_le_bytes())).collect();
        let moved = keys
            .iter()
            .filter(|k| owner(&five, **k) != renamed(owner(&four, **k)))
            .count();
        assert!(moved <= 2_500, "{moved} of 10 000 keys moved");
        assert!(
            moved >= 1_800,
            "{moved}: the removed backend's keys must move"
        );
    }

    #[test]
    fn weighted_shares_follow_the_weights() {
        let names = ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"];
        let table = Maglev::weighted(&names, &[1, 3, 6]);
        let mut counts = [0usize; 3];
        for slot in &table.table {
            counts[usize::from(*slot)] += 1;
        }
        for (count, weight) in counts.iter().zip([1.0, 3.0, 6.0]) {
            let share = *count as f64 / TABLE_SIZE as f64;
            assert!((share - weight / 10.0).abs() < 0.01, "{counts:?}");
        }
        // Equal weights are the unweighted table, slot for slot.
        assert_eq!(
            Maglev::weighted(&names, &[4, 4, 4]).table,
            Maglev::new(&names).table
        );
    }

    #[test]
    fn a_walk_visits_other_backends_soon() {
        let names: Vec<String> = (0..100)
            .map(|i| format!("10.0.{}.{}:80", i / 256, i % 256))
            .collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let table = Maglev::new(&refs);
        let first_two: Vec<usize> = {
            let mut seen = Vec::new();
            for i in table.walk(12345) {
                if !seen.contains(&i) {
                    seen.push(i);
                }
                if seen.len() == 2 {
                    break;
                }
            }
            seen
        };
        assert_eq!(first_two.len(), 2);
    }
}
