//! A small deterministic test environment and helpers shared by the tests.
#![allow(dead_code)]

use agentrl_env_core::{
    stable_hash, task_rng, ActionError, Env, EnvDescriptor, EnvError, EnvParams, Step, StepError,
    StepInfo, TaskRng, TaskSpec,
};
use agentrl_server::{ServerConfig, ServerHandle};
use rand::Rng;
use reqwest::StatusCode;
use serde_json::Value;
use std::net::SocketAddr;

/// "counter": reach a target number with `inc`, `dec`, `add N`. Rewards carry
/// random fractions (drawn from the task RNG) so float exactness is tested,
/// and `noop` moves the RNG so that `reset` must restore it.
pub struct Counter {
    spec: TaskSpec,
    rng0: TaskRng,
    rng: TaskRng,
    target: i64,
    value: i64,
    steps: usize,
    invalid: usize,
    max_steps: usize,
    done: bool,
    success: bool,
}

pub fn counter_factory(spec: &TaskSpec, params: &EnvParams) -> Result<Box<dyn Env>, EnvError> {
    let mut max_steps = if spec.difficulty == "hard" { 20 } else { 10 };
    let integer = |k: &String, v: &serde_json::Value| {
        v.as_u64().ok_or_else(|| EnvError::InvalidParam {
            env: "counter".into(),
            key: k.clone(),
            reason: "expected a positive integer".into(),
        })
    };
    for (k, v) in params {
        match k.as_str() {
            "max_steps" => max_steps = integer(k, v)? as usize,
            // A slow build (a large catalog, say), for the request timeout.
            "build_ms" => std::thread::sleep(std::time::Duration::from_millis(integer(k, v)?)),
            // An operator-only param; the counter reads no files.
            "data_dir" => {}
            _ => {
                return Err(EnvError::InvalidParam {
                    env: "counter".into(),
                    key: k.clone(),
                    reason: "unknown parameter".into(),
                })
            }
        }
    }
    let mut rng = task_rng(spec)?;
    let span = if spec.difficulty == "hard" { 12 } else { 5 };
    let target = rng.random_range(2..2 + span);
    Ok(Box::new(Counter {
        spec: spec.clone(),
        rng0: rng.clone(),
        rng,
        target,
        value: 0,
        steps: 0,
        invalid: 0,
        max_steps,
        done: false,
        success: false,
    }))
}

pub fn counter_descriptor() -> EnvDescriptor {
    EnvDescriptor {
        name: "counter",
        summary: "test env: count up to a target",
        difficulties: &["easy", "hard"],
        default_max_turns: 10,
        request_params: &["max_steps", "build_ms"],
        operator_params: &["data_dir"],
        factory: counter_factory,
    }
}

impl Env for Counter {
    fn spec(&self) -> &TaskSpec {
        &self.spec
    }
    fn instructions(&self) -> String {
        "Reach the target number. Actions: inc, dec, add N (N in 1..=3), noop.".into()
    }
    fn reset(&mut self) -> String {
        self.rng = self.rng0.clone();
        self.value = 0;
        self.steps = 0;
        self.invalid = 0;
        self.done = false;
        self.success = false;
        self.observation()
    }
    fn step(&mut self, action: &str) -> Result<Step, StepError> {
        if self.done {
            return Err(StepError::EpisodeOver);
        }
        let a = action.trim();
        let delta = match a {
            "" => Err(ActionError::Empty),
            "inc" => Ok(1),
            "dec" if self.value == 0 => Err(ActionError::NotPossible {
                action: a.into(),
                reason: "already at 0".into(),
            }),
            "dec" => Ok(-1),
            "noop" => Ok(0),
            "slow" => {
                std::thread::sleep(std::time::Duration::from_millis(300));
                Ok(0)
            }
            "boom" => panic!("counter env asked to panic"),
            _ => match a.strip_prefix("add ") {
                Some(n) => match n.trim().parse::<i64>() {
                    Ok(n) if (1..=3).contains(&n) => Ok(n),
                    _ => Err(ActionError::Malformed {
                        action: a.into(),
                        reason: "N must be 1, 2 or 3".into(),
                    }),
                },
                None => Err(ActionError::Unknown {
                    action: a.into(),
                    expected: "inc, dec, add N, noop".into(),
                }),
            },
        };
        let delta = match delta {
            Ok(d) => d,
            Err(e) => {
                self.invalid += 1;
                return Err(StepError::InvalidAction(e));
            }
        };
        self.value += delta;
        self.steps += 1;
        let mut reward = -0.1 + self.rng.random::<f64>() * 1e-3;
        if self.value == self.target {
            reward += 1.0;
            self.done = true;
            self.success = true;
        } else if self.steps >= self.max_steps {
            self.done = true;
        }
        let mut extra = serde_json::Map::new();
        extra.insert("value".into(), self.value.into());
        Ok(Step {
            observation: self.observation(),
            reward,
            done: self.done,
            success: self.success,
            info: StepInfo {
                effective: delta != 0,
                extra,
            },
        })
    }
    fn observation(&self) -> String {
        format!(
            "value {} target {} steps {}",
            self.value, self.target, self.steps
        )
    }
    fn available_actions(&self) -> Vec<String> {
        let mut v = vec!["inc".to_string(), "noop".to_string(), "add 2".to_string()];
        if self.value > 0 {
            v.push("dec".into());
        }
        v
    }
    fn state_key(&self) -> u64 {
        stable_hash(&[&self.value.to_le_bytes(), &self.target.to_le_bytes()])
    }
    fn expert_action(&mut self) -> Option<String> {
        if self.done {
            return None;
        }
        Some(
            if self.value < self.target {
                "inc"
            } else {
                "dec"
            }
            .into(),
        )
    }
    fn steps(&self) -> usize {
        self.steps
    }
    fn invalid_actions(&self) -> usize {
        self.invalid
    }
    fn max_steps(&self) -> usize {
        self.max_steps
    }
    fn is_done(&self) -> bool {
        self.done
    }
    fn is_success(&self) -> bool {
        self.success
    }
}

/// The test env plus every registered env.
pub fn all_descriptors() -> Vec<EnvDescriptor> {
    let mut v = vec![counter_descriptor()];
    v.extend(agentrl_envs::descriptors());
    v
}

/// A loopback config on an OS-assigned port.
pub fn test_config() -> ServerConfig {
    ServerConfig {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        ..ServerConfig::default()
    }
}

pub async fn start(config: ServerConfig) -> ServerHandle {
    agentrl_server::spawn(config, all_descriptors())
        .await
        .unwrap()
}

/// A server on `test_config()` changed by `change`.
pub async fn start_with(change: impl FnOnce(&mut ServerConfig)) -> ServerHandle {
    let mut config = test_config();
    change(&mut config);
    start(config).await
}

/// A server on `test_config()` and a client of it.
pub async fn serve() -> (ServerHandle, Api) {
    let server = start(test_config()).await;
    let api = Api::new(&server);
    (server, api)
}

/// Open file descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// A JSON client of one server: each call answers the status and the body.
#[derive(Clone)]
pub struct Api {
    pub client: reqwest::Client,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
}

impl Api {
    pub fn new(server: &ServerHandle) -> Self {
        Self::with_client(server, reqwest::Client::new())
    }

    pub fn with_client(server: &ServerHandle, client: reqwest::Client) -> Self {
        Api {
            client,
            base: server.base_url(),
        }
    }

    /// POST `path` with `body`; the answer must be JSON.
    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let r = self.client.post(self.url(path)).json(&body).send().await;
        json_answer(r.unwrap()).await
    }

    /// POST /create with `body`.
    pub async fn create(&self, body: Value) -> (StatusCode, Value) {
        self.post("/create", body).await
    }

    /// A new "counter" session of at most `max_steps` steps: its id.
    pub async fn counter_session(&self, max_steps: u64) -> u64 {
        let body = serde_json::json!({"env": "counter", "params": {"max_steps": max_steps}});
        let (status, v) = self.create(body).await;
        assert_eq!(status, 200, "{v}");
        v["id"].as_u64().unwrap()
    }

    /// POST /step: `action` in session `id`.
    pub async fn step(&self, id: u64, action: &str) -> (StatusCode, Value) {
        self.post("/step", serde_json::json!({"id": id, "action": action}))
            .await
    }

    /// GET `path`; the answer must be JSON.
    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        json_answer(self.client.get(self.url(path)).send().await.unwrap()).await
    }

    /// `method` `path`, with `body` as JSON when there is one; the answer's
    /// JSON, or its text as a JSON string where it is not JSON.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> (StatusCode, Value) {
        let req = match method {
            "GET" => self.client.get(self.url(path)),
            _ => self.client.post(self.url(path)),
        };
        let req = match body {
            Some(b) => req.json(b),
            None => req,
        };
        let r = req.send().await.unwrap();
        let status = r.status();
        let text = r.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, body)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

async fn json_answer(r: reqwest::Response) -> (StatusCode, Value) {
    let status = r.status();
    (status, r.json().await.unwrap())
}
