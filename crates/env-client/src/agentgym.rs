//! [`AgentGymEnv`]: an environment on one of AgentGym's Python env servers
//! (TextCraft, BabyAI, SciWorld, ALFWorld, WebShop, SearchQA), spoken in each
//! one's dialect ([`Dialect`]).
//!
//! What those servers answer (recorded in
//! `crates/server/tests/data/agentgym/*.json`, summed up in
//! `scripts/agentgym/GAP.md`): `POST /create` → `{"id": N}` or a bare id;
//! `POST /reset {id, data_idx}` → `{"observation", …}` (SciWorld adds
//! `task_description`); `POST /step {id, action}` → `{"observation",
//! "reward", "done"}` plus `score` where the env keeps one; every env-level
//! failure (unknown id, finished task, `data_idx` out of range) is a **200**
//! `{"error": "…"}`; an invalid action is a 200 whose observation says so.
//! AgentGym keeps the prompt in its client, so the instructions come from the
//! user, and its servers have no expert.

use agentrl_env_core::{
    stable_hash, ActionError, Env, EnvError, Split, Step, StepError, StepInfo, TaskSpec,
};
use regex::Regex;
use reqwest::blocking::Client;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::client::ClientOptions;
use crate::remote::{endpoint_base, shared_client, step_remote, RemoteStep};

/// The invalid-action messages of AgentGym's envs (their servers answer an
/// invalid action with a 200 and one of these as the observation).
pub fn default_invalid_action_patterns(env: &str) -> &'static [&'static str] {
    match env {
        "textcraft" => &[r"^Could not (execute|find|extract)", r"^Wrong item format"],
        "babyai" => &[
            r"^The action is not recognized",
            r"^No change in state",
            r"^You cannot ",
            r"^There is a barrier",
        ],
        "sciworld" => &[r"^No known action matches that input"],
        "alfworld" => &[r"^Nothing happens\."],
        "searchqa" => &[r"^Your previous action is invalid"],
        _ => &[],
    }
}

/// `Ok` when `pattern` is a regular expression [`AgentGymOptions`] accepts;
/// else the pattern and why not.
pub fn check_invalid_action_pattern(pattern: &str) -> Result<(), String> {
    Regex::new(pattern)
        .map(drop)
        .map_err(|e| format!("{pattern:?}: {e}"))
}

/// Which `data_idx` each split's task indices map to: `[start, end)` per
/// split. Validation and test indices map one to one (`start + index`, which
/// must stay below `end`); training draws indices from a huge range, so a
/// train index wraps (`start + index % (end - start)`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DataIdxRanges {
    /// `[start, end)` of the training tasks' `data_idx` (a train index wraps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train: Option<[u64; 2]>,
    /// `[start, end)` of the validation tasks' `data_idx`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val: Option<[u64; 2]>,
    /// `[start, end)` of the test tasks' `data_idx`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test: Option<[u64; 2]>,
}

impl DataIdxRanges {
    /// Every split maps its index to the same `data_idx` (`agentrl eval`,
    /// where `--seed-start` and `--n` name the server's indices directly).
    pub fn identity() -> Self {
        let all = Some([0, u64::MAX]);
        Self {
            train: all,
            val: all,
            test: all,
        }
    }

    /// The `[start, end)` range of `split`, if configured.
    pub fn range(&self, split: Split) -> Option<[u64; 2]> {
        match split {
            Split::Train => self.train,
            Split::Val => self.val,
            Split::Test => self.test,
        }
    }

    /// The server's `data_idx` of task `index` of `split`.
    pub fn data_idx(&self, split: Split, index: u64) -> Result<u64, EnvError> {
        let [start, end] = self.range(split).ok_or_else(|| {
            EnvError::InvalidSpec(format!(
                "no data_idx range for the {split} split (set env.data_idx.{split} = [start, end])"
            ))
        })?;
        let len = end.saturating_sub(start);
        if len == 0 {
            return Err(EnvError::InvalidSpec(format!(
                "env.data_idx.{split} = [{start}, {end}] is empty"
            )));
        }
        match split {
            Split::Train => Ok(start + index % len),
            _ if index < len => Ok(start + index),
            _ => Err(EnvError::InvalidSpec(format!(
                "{split} task {index} is past env.data_idx.{split} = [{start}, {end}] ({len} tasks)"
            ))),
        }
    }
}

/// What an [`AgentGymEnv`] needs besides the server's address.
#[derive(Debug, Clone)]
pub struct AgentGymOptions {
    /// The prompt AgentGym's client would send (its `conversation_start`).
    instructions: String,
    invalid_action: Vec<Regex>,
    /// Multiplies every reward (SciWorld's scores run −100..100).
    reward_scale: f64,
    /// Valid steps after which the episode ends unsuccessfully: AgentGym's
    /// servers keep no step limit (its `BaseTask` stops at `max_rounds`), and
    /// a scripted player on one would otherwise never stop.
    pub max_steps: usize,
    pub client: ClientOptions,
}

/// [`AgentGymOptions::max_steps`] unless set.
pub const AGENTGYM_MAX_STEPS: usize = 100;

impl AgentGymOptions {
    /// Options for `env`: `instructions` must not be empty (AgentGym's
    /// servers do not serve them); `patterns` are regular expressions an
    /// invalid action's observation matches (None: the env's defaults,
    /// [`default_invalid_action_patterns`]).
    pub fn new(
        env: &str,
        instructions: &str,
        patterns: Option<&[String]>,
        reward_scale: f64,
    ) -> Result<Self, EnvError> {
        let invalid = |key: &str, reason: String| EnvError::InvalidParam {
            env: env.to_string(),
            key: key.to_string(),
            reason,
        };
        if instructions.trim().is_empty() {
            return Err(invalid(
                "instructions",
                "AgentGym's servers keep no prompt: give the instructions (env.instructions or env.instructions_file)".into(),
            ));
        }
        if !(reward_scale.is_finite() && reward_scale > 0.0) {
            return Err(invalid(
                "reward_scale",
                format!("{reward_scale} must be a finite number > 0"),
            ));
        }
        let owned: Vec<String>;
        let patterns: &[String] = match patterns {
            Some(p) => p,
            None => {
                owned = default_invalid_action_patterns(env)
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                &owned
            }
        };
        let invalid_action = patterns
            .iter()
            .map(|p| {
                Regex::new(p).map_err(|e| invalid("invalid_action_patterns", format!("{p:?}: {e}")))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            instructions: instructions.to_string(),
            invalid_action,
            reward_scale,
            max_steps: AGENTGYM_MAX_STEPS,
            client: ClientOptions::default(),
        })
    }

    /// Whether `observation` is the server's answer to an invalid action.
    pub fn is_invalid(&self, observation: &str) -> bool {
        self.invalid_action.iter().any(|r| r.is_match(observation))
    }
}

/// The message of an AgentGym error body: an object with `error` and no
/// observation, whatever the status (their servers send env failures as 200).
fn error_message(body: &Value) -> Option<String> {
    let error = body.get("error")?;
    if body.get("observation").is_some() || body.get("state").is_some() {
        return None;
    }
    Some(match error {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

/// The observation text of an answer: `observation` (or WebShop's `state`),
/// a bare string, or the first string of a list.
fn observation_of(body: &Value) -> Option<String> {
    let text = match body {
        Value::String(s) => Some(s.as_str()),
        Value::Object(o) => o
            .get("observation")
            .or_else(|| o.get("state"))
            .and_then(Value::as_str),
        Value::Array(a) => a.first().and_then(Value::as_str),
        _ => None,
    };
    text.map(str::to_string)
}

/// The actions a BabyAI observation lists (`Available actions: ["…", …]`).
fn listed_actions(observation: &str) -> Vec<String> {
    observation
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("Available actions: "))
        .and_then(|list| serde_json::from_str(list).ok())
        .unwrap_or_default()
}

/// How one of AgentGym's env servers names its session and its task: each
/// env's client in `agentenv/envs/` sends its own fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// TextCraft, BabyAI, SciWorld (and any env not listed): the session is
    /// `id`, `reset {id, data_idx}`.
    Plain,
    /// ALFWorld: `reset {id, game, world_type: "Text"}`; no `/close` route.
    AlfWorld,
    /// WebShop: the session is `env_idx`, `create` answers a bare id,
    /// `reset {env_idx, session_id}` answers `[observation, null]`; no `/close`.
    WebShop,
    /// SearchQA: the session is `env_idx`, `create {id: 0}` answers a bare id,
    /// `reset {env_idx, id: data_idx}`.
    SearchQa,
}

impl Dialect {
    /// The dialect of AgentGym's client for `env`.
    pub fn of(env: &str) -> Self {
        match env {
            "alfworld" => Dialect::AlfWorld,
            "webshop" => Dialect::WebShop,
            "searchqa" => Dialect::SearchQa,
            _ => Dialect::Plain,
        }
    }

    /// The field (and query key) naming the session.
    pub fn id_key(self) -> &'static str {
        match self {
            Dialect::WebShop | Dialect::SearchQa => "env_idx",
            Dialect::Plain | Dialect::AlfWorld => "id",
        }
    }

    /// What `POST /create` carries (TextCraft's requires a body; SearchQA's an `id`).
    fn create_body(self) -> Value {
        match self {
            Dialect::SearchQa => json!({ "id": 0 }),
            _ => json!({}),
        }
    }

    /// `POST /reset` for session `id` and task `data_idx`.
    fn reset_body(self, id: &Value, data_idx: u64) -> Value {
        match self {
            Dialect::Plain => json!({ "id": id, "data_idx": data_idx }),
            Dialect::AlfWorld => json!({ "id": id, "game": data_idx, "world_type": "Text" }),
            Dialect::WebShop => json!({ "env_idx": id, "session_id": data_idx }),
            Dialect::SearchQa => json!({ "env_idx": id, "id": data_idx }),
        }
    }

    /// Whether the server has a `/close` route.
    fn closes(self) -> bool {
        !matches!(self, Dialect::AlfWorld | Dialect::WebShop)
    }
}

/// An episode on an AgentGym env server, behind the `Env` trait.
///
/// Creating it creates the session and resets it to `data_idx` (an error
/// there, e.g. SciWorld's `list index out of range`, is an error of the
/// creation); the first `reset` after that plays that state without a
/// second request, so an episode costs one reset. Dropping it closes the
/// session. A failure mid-episode (transport, or an `{"error": …}` body)
/// ends the episode: `is_done()`, `step` answers `EpisodeOver`, and
/// [`AgentGymEnv::last_error`] names the request and the server's message.
pub struct AgentGymEnv {
    base: String,
    dialect: Dialect,
    opts: AgentGymOptions,
    client: Client,
    spec: TaskSpec,
    data_idx: u64,
    id: Value,
    observation: String,
    /// The `available_actions` the last answer listed (ALFWorld).
    answer_actions: Option<Vec<String>>,
    /// The server's `score` after the last step (scores are cumulative).
    score: f64,
    reward_sum: f64,
    steps: usize,
    invalid_actions: usize,
    done: bool,
    success: bool,
    /// The state is the one just reset to: `reset` needs no request.
    fresh: bool,
    last_error: Option<EnvError>,
    closed: bool,
}

impl AgentGymEnv {
    /// Create a session on the server at `base_url` (the server root, where
    /// AgentGym mounts `/create`, `/reset`, …) playing task `data_idx`.
    pub fn connect(
        base_url: &str,
        spec: &TaskSpec,
        data_idx: u64,
        opts: AgentGymOptions,
    ) -> Result<Self, EnvError> {
        let base = endpoint_base(base_url)?;
        let mut env = Self {
            base,
            dialect: Dialect::of(&spec.env),
            opts,
            client: shared_client()?,
            spec: spec.clone(),
            data_idx,
            id: Value::Null,
            observation: String::new(),
            answer_actions: None,
            score: 0.0,
            reward_sum: 0.0,
            steps: 0,
            invalid_actions: 0,
            done: false,
            success: false,
            fresh: false,
            last_error: None,
            closed: true,
        };
        let body = env.request("create", &env.dialect.create_body())?;
        env.id = match body.get("id") {
            Some(id) => id.clone(),
            None if body.is_number() || body.is_string() => body.clone(),
            None => {
                return Err(EnvError::Remote(format!(
                    "{}/create answered no session id: {body}",
                    env.base
                )))
            }
        };
        env.closed = false;
        env.remote_reset()?;
        Ok(env)
    }

    /// The server's session id.
    pub fn id(&self) -> &Value {
        &self.id
    }

    /// The task index this env plays.
    pub fn data_idx(&self) -> u64 {
        self.data_idx
    }

    /// What ended the episode early, if anything did.
    pub fn last_error(&self) -> Option<&EnvError> {
        self.last_error.as_ref()
    }

    /// Send `body` to `POST /route` (`GET /route?id=` when `body` is None)
    /// and return the answer's JSON; a non-200 or an `{"error": …}` body is
    /// an error naming the route, what was sent and the server's message.
    fn send(&self, route: &str, body: Option<&Value>) -> Result<Value, EnvError> {
        let url = format!("{}/{route}", self.base);
        let sent = match body {
            Some(b) => format!("POST /{route} {b}"),
            None => format!("GET /{route}?{}={}", self.dialect.id_key(), self.id),
        };
        let mut wait = self.opts.client.backoff;
        let mut attempt = 0;
        let resp = loop {
            let rb = match body {
                Some(b) => self.client.post(&url).json(b),
                None => {
                    let id = match &self.id {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    self.client.get(&url).query(&[(self.dialect.id_key(), id)])
                }
            };
            let rb = rb.timeout(self.opts.client.timeout);
            let rb = match &self.opts.client.token {
                Some(t) => rb.bearer_auth(t),
                None => rb,
            };
            match rb.send() {
                Ok(r) => break r,
                Err(e) if e.is_connect() && attempt < self.opts.client.connect_retries => {
                    std::thread::sleep(wait);
                    wait = wait.saturating_mul(2);
                    attempt += 1;
                }
                Err(e) => return Err(EnvError::Remote(format!("{sent} to {}: {e}", self.base))),
            }
        };
        let status = resp.status();
        let text = resp
            .text()
            .map_err(|e| EnvError::Remote(format!("{sent}: reading the answer: {e}")))?;
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if !status.is_success() {
            return Err(EnvError::Remote(format!(
                "{sent} answered {status}: {value}"
            )));
        }
        if let Some(message) = error_message(&value) {
            return Err(EnvError::Remote(format!(
                "{sent} answered the error {message:?}"
            )));
        }
        Ok(value)
    }

    fn request(&self, route: &str, body: &Value) -> Result<Value, EnvError> {
        self.send(route, Some(body))
    }

    /// Reset the session to `data_idx`; the first observation is built as
    /// AgentGym's clients build it.
    fn remote_reset(&mut self) -> Result<(), EnvError> {
        let body = self.request("reset", &self.dialect.reset_body(&self.id, self.data_idx))?;
        // WebShop's client reads the observation with a GET after a reset.
        let from_reset = observation_of(&body).filter(|_| self.dialect != Dialect::WebShop);
        let observation = match from_reset {
            Some(o) => o,
            None => {
                let o = self.send("observation", None)?;
                observation_of(&o).ok_or_else(|| {
                    EnvError::Remote(format!("GET /observation answered no observation: {o}"))
                })?
            }
        };
        // SciWorld's task is only in `task_description` (its client prepends it).
        let mut observation = match body.get("task_description").and_then(Value::as_str) {
            Some(task) => format!("{task}\n{observation}"),
            None => observation,
        };
        // ALFWorld's client appends the admissible actions after a reset.
        self.answer_actions = actions_of(&body);
        if let Some(actions) = &self.answer_actions {
            observation = format!("{observation}\nAVAILABLE ACTIONS: {}", actions.join(","));
        }
        self.observation = observation;
        self.score = body.get("score").and_then(Value::as_f64).unwrap_or(0.0);
        self.reward_sum = 0.0;
        self.steps = 0;
        self.invalid_actions = 0;
        self.done = false;
        self.success = false;
        self.fresh = true;
        self.last_error = None;
        Ok(())
    }

    fn remote_step(&mut self, action: &str) -> RemoteStep {
        // Played: a reset now restarts the task on the server.
        self.fresh = false;
        let mut request = json!({ "action": action });
        request[self.dialect.id_key()] = self.id.clone();
        let body = self.request("step", &request)?;
        let observation = observation_of(&body).ok_or_else(|| {
            EnvError::Remote(format!("POST /step answered no observation: {body}"))
        })?;
        let done = body.get("done").and_then(Value::as_bool).unwrap_or(false);
        // AgentGym's clients report `score` (cumulative) where the server
        // sends one; its change is this step's reward, so an episode sums to it.
        let raw = match body.get("score").and_then(Value::as_f64) {
            Some(score) => {
                let r = score - self.score;
                self.score = score;
                r
            }
            None => body.get("reward").and_then(Value::as_f64).unwrap_or(0.0),
        };
        if !done && self.opts.is_invalid(&observation) {
            self.invalid_actions += 1;
            return Ok(Err(StepError::InvalidAction(ActionError::not_possible(
                action,
                observation,
            ))));
        }
        let reward = raw * self.opts.reward_scale;
        self.reward_sum += raw;
        self.steps += 1;
        // Only the server's own end can be a success; the step limit ends
        // the episode unsuccessfully.
        let finished = done;
        let done = finished || self.steps >= self.opts.max_steps;
        self.done = done;
        // WebShop pays partial credit for a partly right purchase; a success
        // is a perfect one, as in agentrl's own WebShop.
        self.success = finished
            && match self.dialect {
                Dialect::WebShop => self.reward_sum >= 1.0 - 1e-9,
                _ => self.reward_sum > 0.0,
            };
        self.answer_actions = actions_of(&body);
        self.observation = observation.clone();
        Ok(Ok(Step {
            observation,
            reward,
            done,
            success: self.success,
            info: StepInfo {
                effective: true,
                extra: serde_json::Map::new(),
            },
        }))
    }

    fn break_with(&mut self, e: EnvError) {
        tracing::error!(error = %e, env = %self.spec, data_idx = self.data_idx, "AgentGym environment failed; ending the episode");
        self.done = true;
        self.last_error = Some(e);
    }
}

fn actions_of(body: &Value) -> Option<Vec<String>> {
    body.get("available_actions")
        .and_then(|a| serde_json::from_value(a.clone()).ok())
}

impl Env for AgentGymEnv {
    fn spec(&self) -> &TaskSpec {
        &self.spec
    }

    fn instructions(&self) -> String {
        self.opts.instructions.clone()
    }

    fn reset(&mut self) -> String {
        if !self.fresh {
            if let Err(e) = self.remote_reset() {
                self.break_with(e);
            }
        }
        self.observation.clone()
    }

    fn step(&mut self, action: &str) -> Result<Step, StepError> {
        let over = self.done;
        step_remote(self, over, action, Self::remote_step, Self::break_with)
    }

    fn observation(&self) -> String {
        self.observation.clone()
    }

    /// The actions the server listed last (ALFWorld's `available_actions`,
    /// BabyAI's `Available actions: [...]` line); none for the others.
    fn available_actions(&self) -> Vec<String> {
        match &self.answer_actions {
            Some(a) => a.clone(),
            None => listed_actions(&self.observation),
        }
    }

    fn state_key(&self) -> u64 {
        stable_hash(&[self.observation.as_bytes()])
    }

    /// AgentGym's servers have no expert.
    fn expert_action(&mut self) -> Option<String> {
        None
    }

    fn steps(&self) -> usize {
        self.steps
    }

    fn invalid_actions(&self) -> usize {
        self.invalid_actions
    }

    fn max_steps(&self) -> usize {
        self.opts.max_steps
    }

    fn is_done(&self) -> bool {
        self.done
    }

    fn is_success(&self) -> bool {
        self.success
    }
}

impl Drop for AgentGymEnv {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        if !self.dialect.closes() {
            return;
        }
        // One short try: SciWorld answers a second close with 500; it does not matter.
        let url = format!("{}/close", self.base);
        let mut body = json!({});
        body[self.dialect.id_key()] = self.id.clone();
        let rb = self
            .client
            .post(&url)
            .json(&body)
            .timeout(std::time::Duration::from_secs(5));
        if let Err(e) = rb.send() {
            tracing::debug!(error = %e, "closing the AgentGym session failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each env's requests as its AgentGym client sends them (agentenv/envs/*.py).
    #[test]
    fn each_dialect_names_session_and_task_as_its_client_does() {
        let id = json!(7);
        assert_eq!(
            Dialect::of("babyai").reset_body(&id, 3),
            json!({"id": 7, "data_idx": 3})
        );
        assert_eq!(
            Dialect::of("alfworld").reset_body(&id, 3),
            json!({"id": 7, "game": 3, "world_type": "Text"})
        );
        assert_eq!(
            Dialect::of("webshop").reset_body(&id, 3),
            json!({"env_idx": 7, "session_id": 3})
        );
        assert_eq!(
            Dialect::of("searchqa").reset_body(&id, 3),
            json!({"env_idx": 7, "id": 3})
        );
        assert_eq!(Dialect::of("searchqa").create_body(), json!({"id": 0}));
        assert_eq!(Dialect::of("webshop").id_key(), "env_idx");
        assert!(!Dialect::of("alfworld").closes() && !Dialect::of("webshop").closes());
        assert!(Dialect::of("sciworld").closes());
    }

    #[test]
    fn an_error_body_is_an_error_only_without_an_observation() {
        assert_eq!(
            error_message(&json!({"error": "list index out of range"})).as_deref(),
            Some("list index out of range")
        );
        assert_eq!(
            error_message(&json!({"error": "x", "observation": "o"})),
            None
        );
        assert_eq!(error_message(&json!("error")), None);
        assert_eq!(error_message(&json!({"id": 0})), None);
    }

    #[test]
    fn observations_come_from_each_answer_shape() {
        assert_eq!(observation_of(&json!({"observation": "a"})).unwrap(), "a");
        assert_eq!(observation_of(&json!({"state": "b"})).unwrap(), "b");
        assert_eq!(observation_of(&json!("c")).unwrap(), "c");
        assert_eq!(observation_of(&json!(["d", null])).unwrap(), "d");
        assert_eq!(observation_of(&json!({"id": 1})), None);
    }

    #[test]
    fn babyai_lists_its_actions_in_the_observation() {
        let o = "You see a wall.\nAvailable actions: [\"turn left\", \"go to red ball 1\"]";
        assert_eq!(listed_actions(o), ["turn left", "go to red ball 1"]);
        assert!(listed_actions("no list here").is_empty());
    }

    #[test]
    fn data_idx_ranges_hold_out_validation_and_wrap_training() {
        let r = DataIdxRanges {
            train: Some([100, 110]),
            val: Some([0, 5]),
            test: None,
        };
        assert_eq!(r.data_idx(Split::Train, 3).unwrap(), 103);
        assert_eq!(
            r.data_idx(Split::Train, 1 << 31).unwrap(),
            100 + (1 << 31) % 10
        );
        assert_eq!(r.data_idx(Split::Val, 4).unwrap(), 4);
        let e = r.data_idx(Split::Val, 5).unwrap_err().to_string();
        assert!(e.contains("past env.data_idx.val"), "{e}");
        let e = r.data_idx(Split::Test, 0).unwrap_err().to_string();
        assert!(e.contains("env.data_idx.test"), "{e}");
        let id = DataIdxRanges::identity();
        assert_eq!(id.data_idx(Split::Val, 4638).unwrap(), 4638);
        assert_eq!(id.data_idx(Split::Train, 7).unwrap(), 7);
    }

    #[test]
    fn options_require_instructions_and_valid_patterns() {
        let refusal = |env, instructions, patterns| {
            AgentGymOptions::new(env, instructions, patterns, 1.0)
                .unwrap_err()
                .to_string()
        };
        for (env, blank) in [("sciworld", "  "), ("babyai", "")] {
            let e = refusal(env, blank, None);
            assert!(e.contains("env.instructions"), "{e}");
        }
        let bad = vec!["(".to_string()];
        let e = refusal("sciworld", "play", Some(&bad));
        assert!(e.contains("invalid_action_patterns"), "{e}");
        let o = AgentGymOptions::new("textcraft", "play", None, 1.0).unwrap();
        assert!(o.is_invalid("Could not execute fly to the moon"));
        assert!(!o.is_invalid("Got 1 blue orchid"));
        assert!(AgentGymOptions::new("babyai", "play", None, 0.0).is_err());
    }
}
