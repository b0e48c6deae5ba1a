//! What the two remote envs ([`crate::HttpEnv`], [`crate::AgentGymEnv`])
//! share: one HTTP client, the endpoint check, and a step whose transport failure ends the
//! episode.

use std::sync::OnceLock;

use agentrl_env_core::{EnvError, Step, StepError};
use reqwest::blocking::Client;

/// One process-wide blocking client for both: each
/// `reqwest::blocking::Client` owns a runtime thread, and rollouts open
/// thousands of envs.
pub(crate) fn shared_client() -> Result<Client, EnvError> {
    static CLIENT: OnceLock<Result<Client, String>> = OnceLock::new();
    CLIENT
        .get_or_init(|| Client::builder().build().map_err(|e| e.to_string()))
        .clone()
        .map_err(|e| EnvError::Remote(format!("cannot build the HTTP client: {e}")))
}

/// An env server's base URL without its trailing slashes; an error unless it
/// is http or https.
pub(crate) fn endpoint_base(url: &str) -> Result<String, EnvError> {
    let base = url.trim_end_matches('/');
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        return Err(EnvError::Remote(format!(
            "endpoint '{url}' must start with http:// or https://"
        )));
    }
    Ok(base.to_string())
}

/// A remote round trip: the env's own answer, or why the server could not
/// be reached or understood.
pub(crate) type RemoteStep = Result<Result<Step, StepError>, EnvError>;

/// `Env::step` of a remote env: after the episode is `over`, `EpisodeOver`;
/// else `send` the action, and on a transport failure hand the error to
/// `fail` (which ends the episode and keeps it) and answer `EpisodeOver`.
pub(crate) fn step_remote<S>(
    session: &mut S,
    over: bool,
    action: &str,
    send: fn(&mut S, &str) -> RemoteStep,
    fail: fn(&mut S, EnvError),
) -> Result<Step, StepError> {
    if over {
        return Err(StepError::EpisodeOver);
    }
    match send(session, action) {
        Ok(r) => r,
        Err(e) => {
            fail(session, e);
            Err(StepError::EpisodeOver)
        }
    }
}
