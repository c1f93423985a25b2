//! A map of values shared by whoever holds them, found again by key while
//! anyone does: how backends, retry budgets and per-route, per-listener
//! and per-quota state outlive the generation that made them and are
//! dropped once no live generation names them.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError, Weak};

#[derive(Debug)]
pub struct WeakMap<K, V> {
    map: Mutex<HashMap<K, Weak<V>>>,
}

impl<K, V> Default for WeakMap<K, V> {
    fn default() -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash, V> WeakMap<K, V> {
    /// The live value for `key`, or the one `make` returns (kept weakly).
    pub fn get_or_try_insert<Q, E>(
        &self,
        key: &Q,
        make: impl FnOnce() -> Result<Arc<V>, E>,
    ) -> Result<Arc<V>, E>
    where
        K: Borrow<Q>,
        Q: ToOwned<Owned = K> + Eq + Hash + ?Sized,
    {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(live) = map.get(key).and_then(Weak::upgrade) {
            return Ok(live);
        }
        // Dead entries go only when the map has doubled since the last
        // sweep: sweeping on every insert made building N entries O(N²).
        if map.len() >= 64 && map.len().is_power_of_two() {
            map.retain(|_, weak| weak.strong_count() > 0);
        }
        let value = make()?;
        map.insert(key.to_owned(), Arc::downgrade(&value));
        Ok(value)
    }

    /// The live value for `key`, or a new one from `make`.
    pub fn get_or_insert<Q>(&self, key: &Q, make: impl FnOnce() -> V) -> Arc<V>
    where
        K: Borrow<Q>,
        Q: ToOwned<Owned = K> + Eq + Hash + ?Sized,
    {
        match self.get_or_try_insert(key, || Ok::<_, std::convert::Infallible>(Arc::new(make()))) {
            Ok(value) => value,
            Err(never) => match never {},
        }
    }

    /// The live value for `key`, if there is one.
    pub fn get<Q>(&self, key: &Q) -> Option<Arc<V>>
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        let map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(key).and_then(Weak::upgrade)
    }

    /// Every live value.
    pub fn values(&self) -> Vec<Arc<V>> {
        let map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.values().filter_map(Weak::upgrade).collect()
    }

    /// How many values are alive.
    pub fn live(&self) -> usize {
        let map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.values().filter(|w| w.strong_count() > 0).count()
    }
}
