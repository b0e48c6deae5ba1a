//! Env servers on several hosts: [`EndpointPool`] spreads sessions over them
//! (least-loaded first) and [`PooledEnv`] moves an episode whose server stops
//! answering to another one, so no trajectory is lost.
//!
//! Moving works because agentrl's environments are deterministic given their
//! task spec: a new session for the same task, reset, and the episode's
//! actions replayed reach the same state (the state key and step counters are
//! checked), and the step that failed is sent again there. A server that did
//! not answer is skipped by new sessions for [`EndpointPool::RETRY_AFTER`],
//! then tried again (a restarted server comes back).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentrl_env_core::{Env, EnvError, EnvParams, Step, StepError, TaskSpec};

use crate::client::{ClientOptions, HttpEnv};
use crate::remote::endpoint_base;

/// One env server of the pool.
#[derive(Debug)]
struct Server {
    url: String,
    /// Sessions this process holds there.
    live: AtomicUsize,
    /// When it last failed to answer, while it is considered down.
    down_since: Mutex<Option<Instant>>,
}

/// Several `agentrl serve` processes serving the same environments.
#[derive(Debug)]
pub struct EndpointPool {
    servers: Vec<Server>,
    opts: ClientOptions,
    /// Episodes moved to another server after theirs stopped answering.
    moved: AtomicUsize,
}

impl EndpointPool {
    /// How long a server that did not answer is left out of new sessions.
    pub const RETRY_AFTER: Duration = Duration::from_secs(30);

    /// A pool of `urls` (each `http://` or `https://`, no duplicates).
    pub fn new(urls: &[String], opts: ClientOptions) -> Result<Arc<Self>, EnvError> {
        if urls.is_empty() {
            return Err(EnvError::Remote("no env server endpoint given".into()));
        }
        let mut servers: Vec<Server> = Vec::new();
        for url in urls {
            let url = endpoint_base(url)?;
            if servers.iter().any(|s| s.url == url) {
                return Err(EnvError::Remote(format!(
                    "endpoint '{url}' is listed twice"
                )));
            }
            servers.push(Server {
                url,
                live: AtomicUsize::new(0),
                down_since: Mutex::new(None),
            });
        }
        Ok(Arc::new(Self {
            servers,
            opts,
            moved: AtomicUsize::new(0),
        }))
    }

    /// The servers' URLs, in configured order.
    pub fn urls(&self) -> Vec<&str> {
        self.servers.iter().map(|s| s.url.as_str()).collect()
    }

    /// Sessions this process holds on each server, in configured order.
    pub fn live_sessions(&self) -> Vec<usize> {
        self.servers
            .iter()
            .map(|s| s.live.load(Ordering::SeqCst))
            .collect()
    }

    /// Episodes moved to another server so far.
    pub fn moved_episodes(&self) -> usize {
        self.moved.load(Ordering::SeqCst)
    }

    fn is_down(&self, i: usize) -> bool {
        let down = self.servers[i]
            .down_since
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        down.is_some_and(|t| t.elapsed() < Self::RETRY_AFTER)
    }

    fn set_down(&self, i: usize, down: bool) {
        let mut d = self.servers[i]
            .down_since
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *d = down.then(Instant::now);
    }

    /// Servers to try, best first: those up by fewest live sessions (ties by
    /// configured order), then those down; `avoid` last of all.
    fn candidates(&self, avoid: Option<usize>) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.servers.len()).collect();
        order.sort_by_key(|&i| {
            (
                Some(i) == avoid,
                self.is_down(i),
                self.servers[i].live.load(Ordering::SeqCst),
                i,
            )
        });
        order
    }

    /// A session for `spec` on the least-loaded server that answers.
    fn open(
        &self,
        spec: &TaskSpec,
        params: &EnvParams,
        avoid: Option<usize>,
    ) -> Result<(usize, HttpEnv), EnvError> {
        let mut last = None;
        for i in self.candidates(avoid) {
            let url = &self.servers[i].url;
            // A server known to be down gets one try, not the retry schedule.
            let opts = if self.is_down(i) {
                ClientOptions {
                    connect_retries: 0,
                    ..self.opts.clone()
                }
            } else {
                self.opts.clone()
            };
            match HttpEnv::connect_with(url, spec, params, opts) {
                Ok(env) => {
                    self.set_down(i, false);
                    self.servers[i].live.fetch_add(1, Ordering::SeqCst);
                    return Ok((i, env));
                }
                Err(e @ EnvError::Unreachable { .. }) => {
                    tracing::warn!(server = %url, error = %e, "env server unreachable; trying the next");
                    self.set_down(i, true);
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| EnvError::Remote("no env server to try".into())))
    }

    /// A session for `spec` with `params`, on the least-loaded server that answers.
    pub fn connect(
        self: &Arc<Self>,
        spec: &TaskSpec,
        params: &EnvParams,
    ) -> Result<PooledEnv, EnvError> {
        let (server, inner) = self.open(spec, params, None)?;
        Ok(PooledEnv {
            pool: Arc::clone(self),
            server,
            inner,
            params: params.clone(),
            actions: Vec::new(),
        })
    }
}

/// An episode on one server of an [`EndpointPool`], moved to another server
/// when its own stops answering.
pub struct PooledEnv {
    pool: Arc<EndpointPool>,
    server: usize,
    inner: HttpEnv,
    params: EnvParams,
    /// Every action sent since the last reset (invalid ones too: they count).
    actions: Vec<String>,
}

impl PooledEnv {
    /// The server the episode lives on now.
    pub fn endpoint(&self) -> &str {
        self.inner.endpoint()
    }

    /// Whether the episode broke because its server stopped answering.
    fn server_lost(&self) -> bool {
        matches!(self.inner.last_error(), Some(EnvError::Unreachable { .. }))
    }

    /// Move off a server another session found down, before a request of
    /// this one waits through the connection retries to learn the same.
    fn leave_a_downed_server(&mut self) {
        if self.pool.is_down(self.server) && !self.inner.is_done() {
            if let Err(e) = self.move_elsewhere() {
                tracing::warn!(error = %e, "could not move the episode off a server found down");
            }
        }
    }

    /// Replay the episode on another server and continue there.
    fn move_elsewhere(&mut self) -> Result<(), EnvError> {
        let from = self.inner.endpoint().to_string();
        let (want_steps, want_invalid) = (self.inner.steps(), self.inner.invalid_actions());
        let want_key = self.inner.state_key();
        self.pool.set_down(self.server, true);
        let (server, mut env) =
            self.pool
                .open(self.inner.spec(), &self.params, Some(self.server))?;
        env.reset();
        for a in &self.actions {
            // Refusals replay as refusals; only a transport failure stops.
            let _ = env.step(a);
            if let Some(e) = env.last_error() {
                return Err(e.clone());
            }
        }
        if (env.steps(), env.invalid_actions(), env.state_key())
            != (want_steps, want_invalid, want_key)
        {
            return Err(EnvError::Remote(format!(
                "replaying {} actions of {} on {} did not reach the state it had on {from}",
                self.actions.len(),
                self.inner.spec(),
                env.endpoint()
            )));
        }
        tracing::warn!(task = %self.inner.spec(), from = %from, to = %env.endpoint(), actions = self.actions.len(), "env server stopped answering; episode moved");
        self.pool.servers[self.server]
            .live
            .fetch_sub(1, Ordering::SeqCst);
        self.pool.moved.fetch_add(1, Ordering::SeqCst);
        self.server = server;
        self.inner = env;
        Ok(())
    }
}

impl Drop for PooledEnv {
    fn drop(&mut self) {
        self.pool.servers[self.server]
            .live
            .fetch_sub(1, Ordering::SeqCst);
    }
}

impl Env for PooledEnv {
    fn spec(&self) -> &TaskSpec {
        self.inner.spec()
    }

    fn instructions(&self) -> String {
        self.inner.instructions()
    }

    fn reset(&mut self) -> String {
        self.actions.clear();
        let observation = self.inner.reset();
        if self.server_lost() {
            if let Err(e) = self.move_elsewhere() {
                tracing::error!(error = %e, "no env server could take the episode");
            }
            return self.inner.reset();
        }
        observation
    }

    fn step(&mut self, action: &str) -> Result<Step, StepError> {
        self.leave_a_downed_server();
        let mut result = self.inner.step(action);
        if self.server_lost() {
            match self.move_elsewhere() {
                Ok(()) => result = self.inner.step(action),
                Err(e) => {
                    tracing::error!(error = %e, "no env server could take the episode");
                    return result;
                }
            }
        }
        if matches!(result, Ok(_) | Err(StepError::InvalidAction(_))) {
            self.actions.push(action.to_string());
        }
        result
    }

    fn observation(&self) -> String {
        self.inner.observation()
    }

    /// A failure here answers none (the method cannot move the episode);
    /// the next step moves it.
    fn available_actions(&self) -> Vec<String> {
        self.inner.available_actions()
    }

    fn state_key(&self) -> u64 {
        self.inner.state_key()
    }

    fn expert_action(&mut self) -> Option<String> {
        self.leave_a_downed_server();
        let mut answer = self.inner.try_expert_action();
        if matches!(answer, Err(EnvError::Unreachable { .. })) {
            answer = self
                .move_elsewhere()
                .and_then(|()| self.inner.try_expert_action());
        }
        answer.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "expert_action failed");
            None
        })
    }

    fn steps(&self) -> usize {
        self.inner.steps()
    }

    fn invalid_actions(&self) -> usize {
        self.inner.invalid_actions()
    }

    fn max_steps(&self) -> usize {
        self.inner.max_steps()
    }

    fn is_done(&self) -> bool {
        self.inner.is_done()
    }

    fn is_success(&self) -> bool {
        self.inner.is_success()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(urls: &[&str]) -> Arc<EndpointPool> {
        let urls: Vec<String> = urls.iter().map(|u| u.to_string()).collect();
        EndpointPool::new(&urls, ClientOptions::default()).unwrap()
    }

    #[test]
    fn least_loaded_up_servers_come_first_and_the_avoided_one_last() {
        let p = pool(&["http://a", "http://b/", "http://c"]);
        assert_eq!(p.urls(), ["http://a", "http://b", "http://c"]);
        assert_eq!(p.candidates(None), [0, 1, 2]);
        p.servers[0].live.store(2, Ordering::SeqCst);
        p.servers[1].live.store(1, Ordering::SeqCst);
        assert_eq!(p.candidates(None), [2, 1, 0]);
        p.set_down(2, true);
        assert_eq!(p.candidates(None), [1, 0, 2]);
        assert_eq!(p.candidates(Some(1)), [0, 2, 1]);
        p.set_down(2, false);
        assert_eq!(p.candidates(None), [2, 1, 0]);
    }

    #[test]
    fn bad_endpoint_lists_are_named() {
        let err = |urls: &[&str]| {
            let urls: Vec<String> = urls.iter().map(|u| u.to_string()).collect();
            EndpointPool::new(&urls, ClientOptions::default())
                .unwrap_err()
                .to_string()
        };
        assert!(err(&[]).contains("no env server"));
        assert!(err(&["ftp://x"]).contains("must start with http"));
        assert!(err(&["http://x", "http://x/"]).contains("listed twice"));
    }

    #[test]
    fn a_pool_of_dead_servers_says_which_it_tried() {
        let p = EndpointPool::new(
            &["http://127.0.0.1:1".to_string()],
            ClientOptions {
                connect_retries: 0,
                ..ClientOptions::default()
            },
        )
        .unwrap();
        let spec = TaskSpec::new("bandit", agentrl_env_core::Split::Train, "easy", 0);
        let e = p
            .connect(&spec, &EnvParams::new())
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("127.0.0.1:1") && e.contains("unreachable"),
            "{e}"
        );
        assert!(p.is_down(0));
    }
}
