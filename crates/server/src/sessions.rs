//! Live sessions: one environment each, behind its own lock, with an idle TTL.
//!
//! Session ids are random (below 2^53, see [`SessionId`]): any client can
//! close any session it can name, so ids must not be guessable.
//!
//! The map lock is held only to look a session up, insert or remove it; the
//! environment itself sits behind a per-session `tokio::sync::Mutex`, so two
//! requests for one session run one after the other while requests for
//! different sessions run in parallel.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use agentrl_env_core::{Env, EnvParams};
use tokio::sync::Mutex as AsyncMutex;

use agentrl_env_client::protocol::{SessionId, SessionStatus};

/// The protocol a session's client speaks, chosen when it was created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// agentrl's typed API: invalid actions 400, step after done 409, …
    Agentrl,
    /// AgentGym's env-server dialect of the session's env (`crate::agentgym`).
    AgentGym,
}

/// The mutable part of a session, behind the session lock.
pub(crate) struct SessionState {
    pub env: Box<dyn Env>,
    /// Sum of rewards since the last reset.
    pub score: f64,
    /// The observation of the last reset (WebShop's instruction, SearchQA's question).
    pub first_observation: String,
}

impl SessionState {
    pub(crate) fn status(&self) -> SessionStatus {
        SessionStatus {
            done: self.env.is_done(),
            success: self.env.is_success(),
            score: self.score,
            steps: self.env.steps(),
            invalid_actions: self.env.invalid_actions(),
            max_steps: self.env.max_steps(),
            state_key: self.env.state_key(),
        }
    }
}

/// One live session.
pub(crate) struct Session {
    pub env_name: &'static str,
    pub dialect: Dialect,
    /// The params the session was created with, reused when a reset switches task.
    pub params: EnvParams,
    pub state: Arc<AsyncMutex<SessionState>>,
    /// Milliseconds since the store's epoch at the last request.
    last_used_ms: AtomicU64,
}

/// Bits of a session id: integers below 2^53 are exact in every JSON parser
/// (JavaScript's numbers included), and AgentGym clients keep ids as
/// integers; 53 random bits are far beyond guessing one live id.
const SESSION_ID_BITS: u32 = 53;

/// A fresh id from the thread-local CSPRNG (ChaCha, seeded by the OS).
fn random_session_id() -> SessionId {
    rand::random::<u64>() >> (64 - SESSION_ID_BITS)
}

/// Every live session of a server.
pub(crate) struct SessionStore {
    sessions: Mutex<HashMap<SessionId, Arc<Session>>>,
    epoch: Instant,
    pub max_sessions: usize,
}

impl SessionStore {
    pub(crate) fn new(max_sessions: usize) -> Self {
        Self {
            sessions: Mutex::new(HashMap::new()),
            epoch: Instant::now(),
            max_sessions,
        }
    }

    fn map(&self) -> MutexGuard<'_, HashMap<SessionId, Arc<Session>>> {
        // A panic while holding this lock cannot leave the map half-updated
        // (every critical section is a single insert/remove/get), so a
        // poisoned lock is still consistent.
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Number of live sessions.
    pub(crate) fn len(&self) -> usize {
        self.map().len()
    }

    /// Whether a new session would be refused (checked before building an env).
    pub(crate) fn is_full(&self) -> bool {
        self.len() >= self.max_sessions
    }

    /// Insert a new session; `None` when the store is full.
    pub(crate) fn insert(
        &self,
        env_name: &'static str,
        dialect: Dialect,
        params: EnvParams,
        state: SessionState,
    ) -> Option<SessionId> {
        let session = Arc::new(Session {
            env_name,
            dialect,
            params,
            state: Arc::new(AsyncMutex::new(state)),
            last_used_ms: AtomicU64::new(self.now_ms()),
        });
        let mut map = self.map();
        if map.len() >= self.max_sessions {
            return None;
        }
        let id = loop {
            let id = random_session_id();
            // A clash with a live id is one in 2^53 / live sessions: redraw.
            if !map.contains_key(&id) {
                break id;
            }
        };
        map.insert(id, session);
        Some(id)
    }

    /// Look a session up and mark it used.
    pub(crate) fn get(&self, id: SessionId) -> Option<Arc<Session>> {
        let s = self.map().get(&id).cloned()?;
        s.last_used_ms.store(self.now_ms(), Ordering::Relaxed);
        Some(s)
    }

    /// Mark a session used (at the end of a long request).
    pub(crate) fn touch(&self, s: &Session) {
        s.last_used_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Remove a session; the env is dropped once in-flight requests finish.
    pub(crate) fn remove(&self, id: SessionId) -> Option<Arc<Session>> {
        self.map().remove(&id)
    }

    /// Remove every session idle for longer than `ttl` and not in use right
    /// now; returns how many were removed.
    pub(crate) fn reap(&self, ttl: Duration) -> usize {
        let now = self.now_ms();
        let ttl_ms = ttl.as_millis() as u64;
        let mut removed = Vec::new();
        {
            let mut map = self.map();
            map.retain(|_, s| {
                let idle = now.saturating_sub(s.last_used_ms.load(Ordering::Relaxed));
                // A session whose lock is held is in use, whatever its timestamp.
                let expired = idle > ttl_ms && s.state.try_lock().is_ok();
                if expired {
                    removed.push(Arc::clone(s));
                }
                !expired
            });
        }
        // Drop the environments outside the map lock: an env's Drop may be slow.
        let n = removed.len();
        drop(removed);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_random_json_safe_integers() {
        let ids: Vec<SessionId> = (0..1000).map(|_| random_session_id()).collect();
        assert!(ids.iter().all(|&id| id < 1 << 53));
        let distinct: std::collections::BTreeSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
        // Far from a counter: most ids use the top of the range.
        assert!(ids.iter().filter(|&&id| id > 1 << 48).count() > 900);
    }
}
