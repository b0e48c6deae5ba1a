//! Issue 47: sessions over many distinct catalog sizes cannot hold more
//! than the shared-data budget, whatever the session cap. Alone in its
//! binary: it lowers the process-wide budget, which every other test's
//! catalogs would count against.

use agentrl_env_core::{Env, EnvError, EnvParams, Split, TaskSpec, SHARED_DATA};
use agentrl_env_webshop::WebShopEnv;

/// A session over a generated catalog of `size` products, indexed in memory.
fn session(size: usize) -> Result<WebShopEnv, EnvError> {
    let mut p = EnvParams::new();
    p.insert("catalog_size".into(), size.into());
    p.insert("cache_dir".into(), "memory".into());
    WebShopEnv::new(&TaskSpec::new("webshop", Split::Train, "easy", 0), &p)
}

#[test]
fn open_sessions_over_distinct_catalogs_stay_within_the_budget() {
    let limit = 64 << 20;
    SHARED_DATA.set_limit(limit);
    // The client: one session per catalog size, none closed. Each
    // small catalog is charged about 5.5 MiB, so about 11 fit.
    let mut open = Vec::new();
    let refused = loop {
        match session(100 + open.len()) {
            Ok(env) => open.push(env),
            Err(e) => break e,
        }
        assert!(
            open.len() < 40,
            "40 distinct catalogs fit a budget of 64 MiB"
        );
    };
    assert!(matches!(refused, EnvError::Busy { .. }), "{refused}");
    assert!(
        refused.to_string().contains("retry once sessions close"),
        "{refused}"
    );
    assert!(open.len() >= 8, "only {} catalogs fit", open.len());
    assert!(SHARED_DATA.used() <= limit);
    // A size already loaded is shared, not charged again.
    let used = SHARED_DATA.used();
    let again = session(100).unwrap();
    assert_eq!(SHARED_DATA.used(), used);
    assert!(std::ptr::eq(again.world(), open[0].world()));
    // Closing a session frees its catalog for the next size.
    let next = 100 + open.len();
    open.remove(3);
    let mut env = session(next).unwrap();
    assert!(!env.reset().is_empty());
    assert!(SHARED_DATA.used() <= limit);
    // More than the whole budget is refused whatever is open.
    drop((open, again, env));
    let err = session(100_000).unwrap_err();
    assert!(err.to_string().contains("more than the whole"), "{err}");
}
