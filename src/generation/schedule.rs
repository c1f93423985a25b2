//! Smooth weighted round-robin: which backend of a weighted upstream
//! each pick goes to.

/// Smooth weighted round-robin without unrolling the cycle: picks walk
/// the positions `0..total` (one per unit of reduced weight) with a
/// stride near `total / φ` that is coprime with `total`, and each position
/// belongs to the backend whose weight range holds it.
///
/// Over every `total` consecutive picks each backend gets exactly its
/// weight (the stride visits every position once), and its picks are
/// spread through the cycle: a golden-ratio rotation leaves at most three
/// distinct gaps between visits of any range (the three-distance
/// theorem), each within about 2.6 × the ideal `total / weight`. Building
/// is O(backends), picking is O(log backends) and lock-free; nginx's
/// algorithm, unrolled, was O(total × backends) to build: hundreds of
/// milliseconds for a thousand heavily weighted backends
/// (`docs/performance.md`, "Figures behind choices in the code").
#[derive(Debug, Default)]
pub struct WeightedSchedule {
    /// Cumulative reduced weights: backend `i` owns positions
    /// `ends[i-1]..ends[i]`.
    ends: Vec<u64>,
    total: u64,
    stride: u64,
}

impl WeightedSchedule {
    pub fn new(weights: &[u32]) -> Self {
        let divisor = u64::from(weights.iter().copied().fold(0, gcd).max(1));
        let mut total = 0u64;
        let ends = weights
            .iter()
            .map(|w| {
                total += u64::from(*w) / divisor;
                total
            })
            .collect();
        // ⌊total / φ⌋, then the next value coprime with total.
        let mut stride = ((total as f64) * 0.618_033_988_749_895) as u64;
        stride = stride.clamp(1, total.max(1));
        while total > 1 && gcd64(stride, total) != 1 {
            stride += 1;
        }
        Self {
            ends,
            total,
            stride,
        }
    }

    /// The backend index for pick number `turn`.
    pub fn pick(&self, turn: u64) -> usize {
        if self.total == 0 {
            return 0;
        }
        // Both factors are below `total` (at most 1 000 × backends), so
        // the product fits in 64 bits for any plausible upstream; u128
        // keeps it exact regardless.
        let position = (u128::from(turn % self.total) * u128::from(self.stride)
            % u128::from(self.total)) as u64;
        self.ends.partition_point(|end| *end <= position)
    }
}

fn gcd64(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd64(b, a % b)
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Every backend's picks over two cycles of `weights`: exact shares
    /// per cycle, and no gap between two picks of a backend over three
    /// times its ideal spacing.
    fn assert_smooth(weights: &[u32]) {
        let schedule = WeightedSchedule::new(weights);
        let total = schedule.total;
        let picks: Vec<usize> = (0..2 * total).map(|turn| schedule.pick(turn)).collect();
        let divisor = weights.iter().copied().fold(0, gcd);
        for (i, weight) in weights.iter().enumerate() {
            let share = u64::from(weight / divisor);
            let turns: Vec<u64> = (0..2 * total).filter(|t| picks[*t as usize] == i).collect();
            assert_eq!(turns.len() as u64, 2 * share, "{weights:?}: backend {i}");
            let ideal = total as f64 / share as f64;
            let widest = turns.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
            assert!(
                widest as f64 <= 3.0 * ideal + 1.0,
                "{weights:?}: backend {i} waits {widest} turns, ideal {ideal:.1}"
            );
        }
    }

    #[test]
    fn weighted_picks_are_exact_per_cycle_and_spread() {
        assert_eq!(
            (0..7)
                .map(|t| WeightedSchedule::new(&[5, 1, 1]).pick(t))
                .collect::<Vec<_>>(),
            vec![0, 0, 0, 1, 0, 2, 0]
        );
        // Equal weights are plain round-robin.
        assert_eq!(
            (0..4)
                .map(|t| WeightedSchedule::new(&[2, 2]).pick(t))
                .collect::<Vec<_>>(),
            vec![0, 1, 0, 1]
        );
        for weights in [
            vec![5, 1, 1],
            vec![3, 1, 6],
            vec![1, 1, 1, 1, 1],
            vec![100, 1],
            vec![7, 11, 13, 17],
            (1..=50).collect(),
        ] {
            assert_smooth(&weights);
        }
    }

    #[test]
    fn a_thousand_backends_weighted_to_a_thousand_build_at_once() {
        let weights: Vec<u32> = (1..=1000).collect();
        let started = std::time::Instant::now();
        let schedule = WeightedSchedule::new(&weights);
        assert!(started.elapsed() < Duration::from_millis(10));
        assert_eq!(schedule.total, 500_500);
        // The heaviest backend gets 1000 of each 500 500 turns.
        let heaviest = (0..500_500).filter(|t| schedule.pick(*t) == 999).count();
        assert_eq!(heaviest, 1000);
    }
}
