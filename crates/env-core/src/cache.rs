//! Data built once per process and shared by every env over it, with a
//! bound on how many distinct values stay cached.

use std::hash::Hash;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use lru::LruCache;

/// Values built once per process and shared by key: a catalog, a corpus, a
/// recipe book, a search index. `bench envs` and rollouts create one env per
/// task, and none of them may regenerate, reload or re-index the same data.
///
/// At most `capacity` values stay cached; building one more evicts the least
/// recently used. An evicted value lives on while an env still holds it and
/// is freed with the last one, so memory follows the values in use plus at
/// most `capacity` idle ones, however many distinct keys clients ask for.
///
/// Meant as a `static`: `static BOOKS: SharedCache<PathBuf, Book> = SharedCache::new(4);`
pub struct SharedCache<K, V> {
    capacity: NonZeroUsize,
    /// Created on first use: `LruCache::new` is not `const`.
    map: Mutex<Option<LruCache<K, Arc<V>>>>,
}

impl<K: Hash + Eq, V> SharedCache<K, V> {
    /// An empty cache holding at most `capacity` (≥ 1) values.
    pub const fn new(capacity: usize) -> Self {
        let Some(capacity) = NonZeroUsize::new(capacity) else {
            panic!("a SharedCache needs a capacity of at least 1");
        };
        Self {
            capacity,
            map: Mutex::new(None),
        }
    }

    /// The value for `key`, built by `build` on first use (or after it was
    /// evicted). A failed build is returned and not cached, so the next call
    /// tries again.
    pub fn get_or_try_build<E>(
        &self,
        key: K,
        build: impl FnOnce() -> Result<V, E>,
    ) -> Result<Arc<V>, E> {
        // The lock is held while building: concurrent creators of the same
        // data wait for one build instead of each building it. A poisoned
        // lock only means another thread panicked mid-build; the map holds
        // only completed values, so keep using it.
        let mut guard = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let map = guard.get_or_insert_with(|| LruCache::new(self.capacity));
        if let Some(v) = map.get(&key) {
            return Ok(Arc::clone(v));
        }
        let value = Arc::new(build()?);
        let evicted = map.push(key, Arc::clone(&value));
        drop(guard);
        // Freeing a large catalog takes a while: not under the lock.
        drop(evicted);
        Ok(value)
    }

    /// Values cached right now (at most the capacity).
    pub fn len(&self) -> usize {
        let guard = self.map.lock().unwrap_or_else(|e| e.into_inner());
        guard.as_ref().map_or(0, LruCache::len)
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most values this cache keeps.
    pub fn capacity(&self) -> usize {
        self.capacity.get()
    }
}

impl<K: Hash + Eq, V> std::fmt::Debug for SharedCache<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedCache")
            .field("capacity", &self.capacity)
            .field("len", &self.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Weak;

    #[test]
    fn builds_once_and_does_not_cache_failures() {
        static CACHE: SharedCache<&str, String> = SharedCache::new(4);
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

    #[test]
    fn many_distinct_keys_keep_at_most_capacity_values_alive() {
        let cache: SharedCache<usize, Vec<u8>> = SharedCache::new(3);
        let mut freed: Vec<Weak<Vec<u8>>> = Vec::new();
        for size in 0..200 {
            let v = cache
                .get_or_try_build(size, || Ok::<_, ()>(vec![0u8; 1000 + size]))
                .unwrap();
            freed.push(Arc::downgrade(&v));
            // Nobody holds `v` any longer: only the cache keeps it alive.
            drop(v);
            assert!(cache.len() <= 3);
        }
        let alive = freed.iter().filter(|w| w.upgrade().is_some()).count();
        assert_eq!(alive, 3, "only the cached values are still in memory");
        assert!(freed[199].upgrade().is_some() && freed[0].upgrade().is_none());
    }

    #[test]
    fn the_least_recently_used_value_is_evicted_first() {
        let cache: SharedCache<&str, u32> = SharedCache::new(2);
        let build = |n| move || Ok::<_, ()>(n);
        cache.get_or_try_build("a", build(1)).unwrap();
        cache.get_or_try_build("b", build(2)).unwrap();
        // Using "a" makes "b" the oldest; "c" evicts it.
        cache.get_or_try_build("a", build(10)).unwrap();
        cache.get_or_try_build("c", build(3)).unwrap();
        assert_eq!(*cache.get_or_try_build("a", build(100)).unwrap(), 1);
        assert_eq!(*cache.get_or_try_build("b", build(20)).unwrap(), 20);
    }

    #[test]
    fn a_value_still_in_use_outlives_its_eviction() {
        let cache: SharedCache<u8, String> = SharedCache::new(1);
        let held = cache
            .get_or_try_build(1, || Ok::<_, ()>("one".into()))
            .unwrap();
        cache
            .get_or_try_build(2, || Ok::<_, ()>("two".into()))
            .unwrap();
        assert_eq!(cache.len(), 1);
        assert_eq!(*held, "one");
    }
}
