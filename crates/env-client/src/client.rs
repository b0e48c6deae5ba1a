//! [`HttpEnv`]: an environment living on a server, behind the `Env` trait.
//!
//! It talks to an agentrl server (`agentrl serve`), whose answers carry the
//! task's spec and the session's counters. An AgentGym Python env server
//! speaks another dialect: [`crate::AgentGymEnv`] plays those.

use std::time::Duration;

use agentrl_env_core::{ActionError, Env, EnvError, EnvParams, Step, StepError, TaskSpec};
use reqwest::blocking::{Client, RequestBuilder};
use reqwest::StatusCode;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::protocol::{
    CreateRequest, ErrorBody, ErrorKind, ExpertActionResponse, ResetRequest, SessionId,
    SessionResponse, SessionStatus, StepRequest, StepResponse,
};
use crate::remote::{endpoint_base, shared_client, step_remote, RemoteStep};

/// How [`HttpEnv`] talks to the server.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Sent as `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Retries after a connection error (the request never reached the server).
    pub connect_retries: u32,
    /// Wait before the first retry; doubles on each retry.
    pub backoff: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            token: None,
            timeout: Duration::from_secs(60),
            connect_retries: 5,
            backoff: Duration::from_millis(50),
        }
    }
}

/// An answer: the status and the body parsed as JSON (`Null` when empty or not JSON).
struct Answer {
    status: StatusCode,
    body: Value,
}

impl Answer {
    fn error(&self) -> Option<ErrorBody> {
        serde_json::from_value(self.body.clone()).ok()
    }

    fn message(&self) -> String {
        match self.error() {
            Some(e) => format!("{} ({})", e.error, self.status),
            None => format!("{}: {}", self.status, self.body),
        }
    }

    fn parse<T: DeserializeOwned>(&self, what: &str) -> Result<T, EnvError> {
        serde_json::from_value(self.body.clone()).map_err(|e| {
            EnvError::Remote(format!("unexpected answer to {what}: {e}: {}", self.body))
        })
    }
}

/// A remote environment session. Creating it creates the session on the
/// server; dropping it closes the session.
///
/// The `Env` trait cannot report transport errors from `reset`/`step`; when
/// one happens the env is marked broken: `is_done()` is true, `step` answers
/// `StepError::EpisodeOver`, and [`HttpEnv::last_error`] says what happened.
/// Blocking client: do not use it inside an async runtime.
pub struct HttpEnv {
    base: String,
    opts: ClientOptions,
    client: Client,
    id: Value,
    spec: TaskSpec,
    instructions: String,
    observation: String,
    status: SessionStatus,
    last_error: Option<EnvError>,
    /// The session is in the state the server just created or reset it
    /// to: `reset` needs no request (one reset per episode, not two).
    fresh: bool,
    closed: bool,
}

impl HttpEnv {
    /// Create a session for `spec` on the server at `base_url` (either the
    /// server root or an `/{env}` mount), with the default options.
    pub fn connect(
        base_url: &str,
        spec: &TaskSpec,
        params: &EnvParams,
        token: Option<&str>,
    ) -> Result<Self, EnvError> {
        let opts = ClientOptions {
            token: token.map(str::to_string),
            ..ClientOptions::default()
        };
        Self::connect_with(base_url, spec, params, opts)
    }

    /// [`HttpEnv::connect`] with explicit options.
    pub fn connect_with(
        base_url: &str,
        spec: &TaskSpec,
        params: &EnvParams,
        opts: ClientOptions,
    ) -> Result<Self, EnvError> {
        let base = endpoint_base(base_url)?;
        let client = shared_client()?;
        let req = CreateRequest {
            env: Some(spec.env.clone()),
            seed: Some(spec.seed),
            data_idx: Some(spec.seed),
            difficulty: Some(spec.difficulty.clone()),
            split: Some(spec.split.as_str().to_string()),
            params: if params.is_empty() {
                None
            } else {
                Some(params.clone())
            },
        };
        let mut env = Self {
            base,
            opts,
            client,
            id: Value::Null,
            spec: spec.clone(),
            instructions: String::new(),
            observation: String::new(),
            status: SessionStatus {
                done: false,
                success: false,
                score: 0.0,
                steps: 0,
                invalid_actions: 0,
                max_steps: usize::MAX,
                state_key: 0,
            },
            last_error: None,
            fresh: false,
            // Nothing to close until the server gave an id.
            closed: true,
        };
        let answer = env.post("create", &req)?;
        if !answer.status.is_success() {
            return Err(EnvError::Remote(format!(
                "cannot create a {} session: {}",
                spec,
                answer.message()
            )));
        }
        if answer.body.get("spec").is_none() {
            // Close what the foreign server may have opened, then say why.
            if let Some(id) = answer.body.get("id").filter(|id| id.is_number()) {
                env.id = id.clone();
                env.closed = false;
            }
            return Err(EnvError::Remote(format!(
                "{} is not an agentrl server (create answered {}); for an AgentGym env server set env.protocol = \"agentgym\" (agentrl eval --protocol agentgym)",
                env.base, answer.body
            )));
        }
        let r: SessionResponse = answer.parse("create")?;
        env.id = Value::from(r.id);
        env.closed = false;
        if r.spec != *spec {
            return Err(EnvError::Remote(format!(
                "the server built task {} instead of {}",
                r.spec, spec
            )));
        }
        env.observation = r.observation;
        env.instructions = r.instructions.unwrap_or_default();
        env.status = r.status;
        env.fresh = true;
        Ok(env)
    }

    /// The server's session id.
    pub fn id(&self) -> &Value {
        &self.id
    }

    /// The transport or protocol error that broke this env, if any.
    pub fn last_error(&self) -> Option<&EnvError> {
        self.last_error.as_ref()
    }

    /// `GET /available_actions`, its failure reported (the `Env` method
    /// answers none instead).
    pub fn try_available_actions(&self) -> Result<Vec<String>, EnvError> {
        self.get_json("available_actions")
    }

    /// `GET /expert_action`, its failure reported (the `Env` method answers
    /// none instead).
    pub fn try_expert_action(&self) -> Result<Option<String>, EnvError> {
        Ok(self
            .get_json::<ExpertActionResponse>("expert_action")?
            .action)
    }

    /// The server this session lives on.
    pub fn endpoint(&self) -> &str {
        &self.base
    }

    /// Close the session now (dropping does the same, ignoring errors).
    pub fn close(mut self) -> Result<(), EnvError> {
        self.closed = true;
        let answer = self.post("close", &self.close_body())?;
        if answer.status.is_success() {
            Ok(())
        } else {
            Err(EnvError::Remote(format!(
                "close failed: {}",
                answer.message()
            )))
        }
    }

    /// `{"id": …}`: a [`crate::protocol::CloseRequest`] without `env`.
    fn close_body(&self) -> Value {
        serde_json::json!({ "id": self.id })
    }

    /// The session id as an agentrl server's numeric [`SessionId`].
    fn own_id(&self) -> Result<SessionId, EnvError> {
        self.id.as_u64().ok_or_else(|| {
            EnvError::Remote(format!(
                "the server's session id {} is not a non-negative integer",
                self.id
            ))
        })
    }

    fn url(&self, route: &str) -> String {
        format!("{}/{}", self.base, route)
    }

    fn authed(&self, rb: RequestBuilder) -> RequestBuilder {
        let rb = rb.timeout(self.opts.timeout);
        match &self.opts.token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    /// Send with retries on connection errors (the request never reached the
    /// server, so even a step is safe to resend); other errors are final.
    fn send(&self, build: impl Fn() -> RequestBuilder) -> Result<Answer, EnvError> {
        let mut wait = self.opts.backoff;
        let mut attempt = 0;
        loop {
            match self.authed(build()).send() {
                Ok(resp) => {
                    let status = resp.status();
                    let bytes = resp.bytes().map_err(|e| EnvError::Unreachable {
                        endpoint: self.base.clone(),
                        reason: format!("reading the answer: {e}"),
                    })?;
                    let body = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
                        if bytes.is_empty() {
                            Value::Null
                        } else {
                            Value::String(String::from_utf8_lossy(&bytes).into_owned())
                        }
                    });
                    return Ok(Answer { status, body });
                }
                Err(e) if e.is_connect() && attempt < self.opts.connect_retries => {
                    tracing::debug!(error = %e, attempt, "connection failed; retrying");
                    std::thread::sleep(wait);
                    wait = wait.saturating_mul(2);
                    attempt += 1;
                }
                // No answer at all: the server is down or hung.
                Err(e) if e.is_connect() || e.is_timeout() || e.is_request() => {
                    return Err(EnvError::Unreachable {
                        endpoint: self.base.clone(),
                        reason: e.to_string(),
                    })
                }
                Err(e) => {
                    return Err(EnvError::Remote(format!(
                        "request to {} failed: {e}",
                        self.base
                    )))
                }
            }
        }
    }

    fn post(&self, route: &str, body: &impl Serialize) -> Result<Answer, EnvError> {
        let url = self.url(route);
        self.send(|| self.client.post(&url).json(body))
    }

    fn get(&self, route: &str) -> Result<Answer, EnvError> {
        let url = self.url(route);
        let id = match &self.id {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        self.send(|| self.client.get(&url).query(&[("id", id.as_str())]))
    }

    fn get_json<T: DeserializeOwned>(&self, route: &str) -> Result<T, EnvError> {
        let answer = self.get(route)?;
        if !answer.status.is_success() {
            return Err(EnvError::Remote(format!(
                "GET /{route}: {}",
                answer.message()
            )));
        }
        answer.parse(route)
    }

    fn break_with(&mut self, e: EnvError) {
        tracing::error!(error = %e, env = %self.spec, "remote environment failed; marking it done");
        self.status.done = true;
        self.last_error = Some(e);
    }

    fn remote_reset(&mut self) -> Result<String, EnvError> {
        let body = ResetRequest {
            env: None,
            id: self.own_id()?,
            seed: Some(self.spec.seed),
            data_idx: None,
            difficulty: Some(self.spec.difficulty.clone()),
            split: Some(self.spec.split.as_str().to_string()),
        };
        let answer = self.post("reset", &body)?;
        if !answer.status.is_success() {
            return Err(EnvError::Remote(format!(
                "reset failed: {}",
                answer.message()
            )));
        }
        let r: SessionResponse = answer.parse("reset")?;
        self.observation = r.observation;
        self.status = r.status;
        self.last_error = None;
        self.fresh = true;
        Ok(self.observation.clone())
    }

    fn remote_step(&mut self, action: &str) -> RemoteStep {
        // Played: a reset now restarts the task on the server.
        self.fresh = false;
        let answer = self.post(
            "step",
            &StepRequest {
                env: None,
                id: self.own_id()?,
                action: action.to_string(),
            },
        )?;
        if answer.status.is_success() {
            return self.own_step(&answer).map(Ok);
        }
        let Some(err) = answer.error() else {
            return Err(EnvError::Remote(format!(
                "step failed: {}",
                answer.message()
            )));
        };
        if let Some(status) = err.status.clone() {
            self.status = status;
        }
        match (err.kind, err.action_error) {
            (ErrorKind::InvalidAction, Some(a)) => {
                Ok(Err(StepError::InvalidAction(ActionError::from(a))))
            }
            (ErrorKind::EpisodeOver, _) => Ok(Err(StepError::EpisodeOver)),
            _ => Err(EnvError::Remote(format!(
                "step failed: {}",
                answer.message()
            ))),
        }
    }

    fn own_step(&mut self, answer: &Answer) -> Result<Step, EnvError> {
        let r: StepResponse = answer.parse("step")?;
        self.observation = r.observation.clone();
        self.status = r.status;
        Ok(Step {
            observation: r.observation,
            reward: r.reward,
            done: self.status.done,
            success: self.status.success,
            info: r.info,
        })
    }
}

impl Env for HttpEnv {
    fn spec(&self) -> &TaskSpec {
        &self.spec
    }

    fn instructions(&self) -> String {
        self.instructions.clone()
    }

    fn reset(&mut self) -> String {
        if self.fresh {
            return self.observation.clone();
        }
        match self.remote_reset() {
            Ok(o) => o,
            Err(e) => {
                self.break_with(e);
                self.observation.clone()
            }
        }
    }

    fn step(&mut self, action: &str) -> Result<Step, StepError> {
        let over = self.last_error.is_some();
        step_remote(self, over, action, Self::remote_step, Self::break_with)
    }

    fn observation(&self) -> String {
        self.observation.clone()
    }

    fn available_actions(&self) -> Vec<String> {
        self.try_available_actions().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "available_actions failed; answering none");
            Vec::new()
        })
    }

    fn state_key(&self) -> u64 {
        self.status.state_key
    }

    fn expert_action(&mut self) -> Option<String> {
        match self.try_expert_action() {
            Ok(action) => action,
            Err(e) => {
                tracing::warn!(error = %e, "expert_action failed");
                None
            }
        }
    }

    fn steps(&self) -> usize {
        self.status.steps
    }

    fn invalid_actions(&self) -> usize {
        self.status.invalid_actions
    }

    fn max_steps(&self) -> usize {
        self.status.max_steps
    }

    fn is_done(&self) -> bool {
        self.status.done
    }

    fn is_success(&self) -> bool {
        self.status.success
    }
}

impl Drop for HttpEnv {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        let url = self.url("close");
        let body = self.close_body();
        // One try with a short timeout: a dead server must not stall a drop;
        // the server's TTL reaper closes what we could not.
        let rb = self
            .authed(self.client.post(&url).json(&body))
            .timeout(Duration::from_secs(5));
        if let Err(e) = rb.send() {
            tracing::debug!(error = %e, "closing the remote session failed");
        }
    }
}

/// A remote env as a boxed `Env`, for `env.endpoint = "http://…"` configs.
pub fn remote_env(
    endpoint: &str,
    spec: &TaskSpec,
    params: &EnvParams,
    token: Option<&str>,
) -> Result<Box<dyn Env>, EnvError> {
    Ok(Box::new(HttpEnv::connect(endpoint, spec, params, token)?))
}
