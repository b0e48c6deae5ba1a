//! Data built once per process and shared by every env over it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Values built once per process and shared by key: a catalog, a corpus, a
/// recipe book, a search index. `bench envs` and rollouts create one env per
/// task, and none of them may regenerate, reload or re-index the same data.
///
/// Meant as a `static`: `static BOOKS: SharedCache<PathBuf, Book> = SharedCache::new();`
#[derive(Debug)]
pub struct SharedCache<K, V> {
    map: Mutex<BTreeMap<K, Arc<V>>>,
}

impl<K: Ord, V> SharedCache<K, V> {
    /// An empty cache.
    pub const fn new() -> Self {
        Self {
            map: Mutex::new(BTreeMap::new()),
        }
    }

    /// The value for `key`, built by `build` on first use. A failed build is
    /// returned and not cached, so the next call tries again.
    pub fn get_or_try_build<E>(
        &self,
        key: K,
        build: impl FnOnce() -> Result<V, E>,
    ) -> Result<Arc<V>, E> {
        // The lock is held while building: concurrent creators of the same
        // data wait for one build instead of each building it. A poisoned
        // lock only means another thread panicked mid-build; the map holds
        // only completed values, so keep using it.
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = map.get(&key) {
            return Ok(Arc::clone(v));
        }
        let value = Arc::new(build()?);
        map.insert(key, Arc::clone(&value));
        Ok(value)
    }
}

impl<K: Ord, V> Default for SharedCache<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_once_and_does_not_cache_failures() {
        static CACHE: SharedCache<&str, String> = SharedCache::new();
        let failed: Result<_, &str> = CACHE.get_or_try_build("a", || Err("disk on fire"));
        assert_eq!(failed, Err("disk on fire"));
        let a = CACHE
            .get_or_try_build("a", || Ok::<_, ()>("built".to_string()))
            .unwrap();
        let again = CACHE
            .get_or_try_build("a", || Ok::<_, ()>("rebuilt".to_string()))
            .unwrap();
        assert!(Arc::ptr_eq(&a, &again));
        assert_eq!(*again, "built");
    }
}
