//! Data built once per process and shared by every env over it, with a
//! bound on how many distinct values stay cached and, for the data a
//! request's params size (catalogs, corpora, their indexes), one memory
//! budget over all of it ([`SHARED_DATA`]).

use std::collections::HashMap;
use std::hash::Hash;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, TryLockError, Weak};

use lru::LruCache;

/// Values built once per process and shared by key: a catalog, a corpus, a
/// recipe book, a search index. `bench envs` and rollouts create one env per
/// task, and none of them may regenerate, reload or re-index the same data.
///
/// At most `capacity` values stay cached; building one more evicts the least
/// recently used. An evicted value lives on while an env still holds it and
/// is freed with the last one, so memory follows the values in use plus at
/// most `capacity` idle ones, however many distinct keys clients ask for.
/// Values built with [`SharedCache::get_or_try_build_charged`] also count
/// against a [`MemoryBudget`] for as long as any env holds them.
///
/// A value evicted from the cache but still held by an env is found again
/// by its key: a new env over the same data shares it instead of building a
/// second copy.
///
/// Meant as a `static`: `static BOOKS: SharedCache<PathBuf, Book> = SharedCache::new(4);`
pub struct SharedCache<K, V> {
    capacity: NonZeroUsize,
    /// Created on first use: `LruCache::new` is not `const`.
    map: Mutex<Option<Entries<K, V>>>,
    /// Whether a budget already knows this cache (to ask it for room).
    registered: AtomicBool,
}

/// A key and its value, as a cache evicts them.
type Evicted<K, V> = (K, Arc<V>);
/// A value found alive, and what caching it again evicted.
type Found<K, V> = (Arc<V>, Option<Evicted<K, V>>);

/// The values of a [`SharedCache`]: the cached ones, and every one still
/// alive anywhere.
struct Entries<K, V> {
    lru: LruCache<K, Arc<V>>,
    /// Every value built and not yet freed, cached or only held by envs.
    live: HashMap<K, Weak<V>>,
}

impl<K: Hash + Eq + Clone, V> Entries<K, V> {
    fn new(capacity: NonZeroUsize) -> Self {
        Self {
            lru: LruCache::new(capacity),
            live: HashMap::new(),
        }
    }

    /// The value of `key` if it is alive (cached again if it was evicted),
    /// and the value that caching it evicted.
    fn get(&mut self, key: &K) -> Option<Found<K, V>> {
        if let Some(v) = self.lru.get(key) {
            return Some((Arc::clone(v), None));
        }
        let v = self.live.get(key)?.upgrade()?;
        let evicted = self.lru.push(key.clone(), Arc::clone(&v));
        Some((v, evicted))
    }

    /// Cache a new value; the value it evicted.
    fn insert(&mut self, key: K, value: &Arc<V>) -> Option<Evicted<K, V>> {
        // Forget the values freed since: the map stays as small as the
        // values alive.
        self.live.retain(|_, v| v.strong_count() > 0);
        self.live.insert(key.clone(), Arc::downgrade(value));
        self.lru.push(key, Arc::clone(value))
    }

    /// Drop the least recently used cached value that no env holds; whether
    /// one was.
    fn evict_one_idle(&mut self) -> bool {
        // `iter` runs from the most recently used: the last idle one is the oldest.
        let oldest_idle = self
            .lru
            .iter()
            .filter(|(_, v)| Arc::strong_count(v) == 1)
            .last()
            .map(|(k, _)| k.clone());
        oldest_idle.is_some_and(|k| self.lru.pop(&k).is_some())
    }
}

impl<K: Hash + Eq + Clone, V> SharedCache<K, V> {
    /// An empty cache holding at most `capacity` (≥ 1) values.
    pub const fn new(capacity: usize) -> Self {
        let Some(capacity) = NonZeroUsize::new(capacity) else {
            panic!("a SharedCache needs a capacity of at least 1");
        };
        Self {
            capacity,
            map: Mutex::new(None),
            registered: AtomicBool::new(false),
        }
    }

    /// The entries, created on first use. A poisoned lock only means another
    /// thread panicked mid-build; the map holds only completed values, so
    /// keep using it.
    fn entries(&self) -> std::sync::MutexGuard<'_, Option<Entries<K, V>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The value for `key`, built by `build` on first use (or once it was
    /// evicted and freed). A failed build is returned and not cached, so the
    /// next call tries again.
    pub fn get_or_try_build<E>(
        &self,
        key: K,
        build: impl FnOnce() -> Result<V, E>,
    ) -> Result<Arc<V>, E> {
        self.get_or_build_locked(key, |_| build())
    }

    /// The value under `key`, or the one `build` makes, given the entries,
    /// and caches. The lock is held while building: concurrent creators of
    /// the same data wait for one build instead of each building it.
    fn get_or_build_locked<E>(
        &self,
        key: K,
        build: impl FnOnce(&mut Entries<K, V>) -> Result<V, E>,
    ) -> Result<Arc<V>, E> {
        let mut guard = self.entries();
        let entries = guard.get_or_insert_with(|| Entries::new(self.capacity));
        if let Some((v, evicted)) = entries.get(&key) {
            drop(guard);
            drop(evicted);
            return Ok(v);
        }
        let value = Arc::new(build(entries)?);
        let evicted = entries.insert(key, &value);
        drop(guard);
        // Freeing a large catalog takes a while: not under the lock.
        drop(evicted);
        Ok(value)
    }

    /// Values cached right now (at most the capacity).
    pub fn len(&self) -> usize {
        self.entries().as_ref().map_or(0, |e| e.lru.len())
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

impl<K: Hash + Eq + Clone + Send + 'static, V: Send + Sync + 'static> SharedCache<K, V> {
    /// [`SharedCache::get_or_try_build`] for a value of about `bytes` bytes
    /// charged to `budget`: before building, `bytes` are reserved, and
    /// `build` receives the [`Reservation`] to keep inside the value, so the
    /// bytes stay charged until the last env holding the value drops it.
    /// When they do not fit, idle values (held by no env, only by a cache)
    /// are dropped, least recently used first, from this cache and then from
    /// the budget's other caches; if that is not enough the call fails with
    /// `over_budget` and builds nothing.
    pub fn get_or_try_build_charged<E>(
        &'static self,
        key: K,
        bytes: usize,
        budget: &'static MemoryBudget,
        build: impl FnOnce(Reservation) -> Result<V, E>,
        over_budget: impl FnOnce(OverBudget) -> E,
    ) -> Result<Arc<V>, E> {
        if !self.registered.swap(true, Ordering::AcqRel) {
            budget.register(self);
        }
        self.get_or_build_locked(key, |entries| {
            let reservation = loop {
                if let Some(r) = budget.try_reserve(bytes) {
                    break r;
                }
                // This cache's own idle values first (its lock is ours), then
                // the other caches' (each only if its lock is free: a cache
                // that is building is skipped, so no two caches wait on each
                // other).
                if entries.evict_one_idle() || budget.evict_elsewhere() {
                    continue;
                }
                return Err(over_budget(OverBudget {
                    needed: bytes,
                    used: budget.used(),
                    limit: budget.limit(),
                }));
            };
            build(reservation)
        })
    }
}

/// A cache a [`MemoryBudget`] can ask to drop an idle value.
trait EvictIdle: Send + Sync {
    /// Drop one value no env holds, unless the cache is busy; whether it did.
    fn evict_idle(&self) -> bool;
}

impl<K: Hash + Eq + Clone + Send, V: Send + Sync> EvictIdle for SharedCache<K, V> {
    fn evict_idle(&self) -> bool {
        let mut guard = match self.map.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return false,
        };
        guard.as_mut().is_some_and(Entries::evict_one_idle)
    }
}

/// The default of [`SHARED_DATA`]: 512 MiB, room for the largest generated
/// WebShop catalog (100,000 products, about 250 MiB with its index) beside
/// the defaults of every env.
pub const DEFAULT_SHARED_DATA_BYTES: usize = 512 << 20;

/// The budget of the data that envs share and whose size a request's
/// params choose: WebShop's catalogs, SearchQA's corpora and their search
/// indexes. `agentrl serve --shared-data-mib` sets it.
pub static SHARED_DATA: MemoryBudget = MemoryBudget::new(DEFAULT_SHARED_DATA_BYTES);

/// A budget in bytes for values held by envs: each value reserves its size
/// while it is alive ([`Reservation`]), and a reservation that does not fit
/// is refused instead of growing the process without bound.
pub struct MemoryBudget {
    limit: AtomicUsize,
    used: AtomicUsize,
    /// The caches whose values are charged here, asked for idle values when
    /// a reservation does not fit.
    caches: Mutex<Vec<&'static dyn EvictIdle>>,
}

impl MemoryBudget {
    /// A budget of `limit` bytes with nothing reserved.
    pub const fn new(limit: usize) -> Self {
        Self {
            limit: AtomicUsize::new(limit),
            used: AtomicUsize::new(0),
            caches: Mutex::new(Vec::new()),
        }
    }

    /// Change the limit; values already reserved stay (the new limit applies
    /// to the next reservations).
    pub fn set_limit(&self, bytes: usize) {
        self.limit.store(bytes, Ordering::Relaxed);
    }

    /// The limit in bytes.
    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    /// Bytes reserved right now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Reserve `bytes` if they fit under the limit beside what is reserved.
    pub fn try_reserve(&'static self, bytes: usize) -> Option<Reservation> {
        let limit = self.limit();
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&total| total <= limit)
            })
            .ok()?;
        Some(Reservation {
            budget: self,
            bytes,
        })
    }

    fn register(&self, cache: &'static dyn EvictIdle) {
        self.caches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(cache);
    }

    /// Ask the registered caches, in turn, for one idle value.
    fn evict_elsewhere(&self) -> bool {
        let caches = self
            .caches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        caches.iter().any(|c| c.evict_idle())
    }
}

impl std::fmt::Debug for MemoryBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBudget")
            .field("limit", &self.limit())
            .field("used", &self.used())
            .finish()
    }
}

/// Bytes reserved from a [`MemoryBudget`], given back when dropped. A
/// shared value keeps its reservation as a field, so the bytes are charged
/// exactly as long as the value is alive.
#[derive(Debug)]
pub struct Reservation {
    budget: &'static MemoryBudget,
    bytes: usize,
}

impl Reservation {
    /// The bytes reserved.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// A value that did not fit its [`MemoryBudget`], even after every idle
/// value was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverBudget {
    /// Bytes the value needs.
    pub needed: usize,
    /// Bytes held by values in use.
    pub used: usize,
    /// The budget's limit.
    pub limit: usize,
}

impl std::fmt::Display for OverBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const MIB: f64 = (1 << 20) as f64;
        let (needed, used, limit) = (
            self.needed as f64 / MIB,
            self.used as f64 / MIB,
            self.limit as f64 / MIB,
        );
        if self.needed > self.limit {
            write!(
                f,
                "the data needs about {needed:.0} MiB, more than the whole shared-data budget \
                 of {limit:.0} MiB (`agentrl serve --shared-data-mib` raises it)"
            )
        } else {
            write!(
                f,
                "the data needs about {needed:.0} MiB, but open sessions hold {used:.0} MiB of \
                 the {limit:.0} MiB shared-data budget; retry once sessions close, or use a \
                 size that is already loaded"
            )
        }
    }
}

impl<K: Hash + Eq + Clone, V> std::fmt::Debug for SharedCache<K, V> {
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
        // Evicted but alive: found again, not built a second time.
        let again = cache
            .get_or_try_build(1, || Ok::<_, ()>("uno".into()))
            .unwrap();
        assert!(Arc::ptr_eq(&held, &again));
        // Once freed, it is built anew.
        drop((held, again));
        cache
            .get_or_try_build(2, || Ok::<_, ()>("two".into()))
            .unwrap();
        let rebuilt = cache
            .get_or_try_build(1, || Ok::<_, ()>("uno".into()))
            .unwrap();
        assert_eq!(*rebuilt, "uno");
    }

    /// A value holding its reservation, as a charged cache stores it.
    struct Charged {
        _reservation: Reservation,
        id: u32,
    }

    fn charged(id: u32) -> impl FnOnce(Reservation) -> Result<Charged, OverBudget> {
        move |r| {
            Ok(Charged {
                _reservation: r,
                id,
            })
        }
    }

    #[test]
    fn a_value_that_does_not_fit_is_refused_until_its_holders_let_go() {
        static BUDGET: MemoryBudget = MemoryBudget::new(100);
        static CACHE: SharedCache<u32, Charged> = SharedCache::new(4);
        let one = CACHE
            .get_or_try_build_charged(1, 60, &BUDGET, charged(1), |e| e)
            .unwrap();
        assert_eq!(BUDGET.used(), 60);
        // In use by an env: cannot be evicted, so the second value is refused
        // before anything is built.
        let refused = CACHE.get_or_try_build_charged(
            2,
            60,
            &BUDGET,
            |_| -> Result<Charged, OverBudget> { panic!("built over the budget") },
            |e| e,
        );
        let Err(e) = refused else {
            panic!("60 + 60 bytes fit a budget of 100")
        };
        assert_eq!((e.needed, e.used, e.limit), (60, 60, 100));
        assert!(e.to_string().contains("retry once sessions close"), "{e}");
        // The env lets go: the value is idle (only the cache holds it), and
        // the next build evicts it to make room.
        drop(one);
        assert_eq!(BUDGET.used(), 60, "an idle cached value stays charged");
        let two = CACHE
            .get_or_try_build_charged(2, 60, &BUDGET, charged(2), |e| e)
            .unwrap();
        assert_eq!((two.id, BUDGET.used(), CACHE.len()), (2, 60, 1));
        // A cached value is shared, not charged twice.
        let again = CACHE
            .get_or_try_build_charged(2, 60, &BUDGET, charged(20), |e| e)
            .unwrap();
        assert!(Arc::ptr_eq(&two, &again));
        assert_eq!(BUDGET.used(), 60);
        // More than the whole budget is refused with a message that says so.
        let Err(e) = CACHE.get_or_try_build_charged(3, 101, &BUDGET, charged(3), |e| e) else {
            panic!("101 bytes fit a budget of 100")
        };
        assert!(e.to_string().contains("more than the whole"), "{e}");
    }

    #[test]
    fn idle_values_of_other_caches_make_room_too() {
        static BUDGET: MemoryBudget = MemoryBudget::new(100);
        static CATALOGS: SharedCache<u32, Charged> = SharedCache::new(4);
        static CORPORA: SharedCache<u32, Charged> = SharedCache::new(4);
        let a = CATALOGS
            .get_or_try_build_charged(1, 50, &BUDGET, charged(1), |e| e)
            .unwrap();
        let b = CATALOGS
            .get_or_try_build_charged(2, 40, &BUDGET, charged(2), |e| e)
            .unwrap();
        drop(a);
        // 90 of 100 used; 30 more needs the idle catalog 1 gone, while
        // catalog 2, still in use, stays.
        let c = CORPORA
            .get_or_try_build_charged(1, 30, &BUDGET, charged(3), |e| e)
            .unwrap();
        assert_eq!(BUDGET.used(), 70);
        assert_eq!((CATALOGS.len(), CORPORA.len()), (1, 1));
        drop((b, c));
        assert_eq!(BUDGET.used(), 70, "idle values stay charged while cached");
    }
}
