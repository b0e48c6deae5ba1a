use crate::{Env, EnvError, TaskSpec};

/// Environment-specific options (e.g. a data path, the slip probability),
/// taken from the `[env]` config section. Unknown keys are an error of the env.
pub type EnvParams = serde_json::Map<String, serde_json::Value>;

/// Builds an environment for a spec.
pub type EnvFactory = fn(&TaskSpec, &EnvParams) -> Result<Box<dyn Env>, EnvError>;

/// What the registry knows about one environment.
#[derive(Clone)]
pub struct EnvDescriptor {
    pub name: &'static str,
    /// One line for `agentrl envs`.
    pub summary: &'static str,
    /// Difficulty levels; the first is the default.
    pub difficulties: &'static [&'static str],
    /// Suggested turn budget for an LLM agent (RAGEN / AgentGym defaults).
    pub default_max_turns: usize,
    /// The `[env]` params a client of the env server may send with `create`:
    /// each one bounded by the env and touching nothing outside it.
    pub request_params: &'static [&'static str],
    /// The `[env]` params only whoever runs the process may set (a config
    /// file, `agentrl serve --env-param`): file paths and cache locations,
    /// which reach the filesystem. The server refuses them from a request.
    pub operator_params: &'static [&'static str],
    pub factory: EnvFactory,
}

impl EnvDescriptor {
    /// Whether `key` is one of this env's params, from anyone.
    pub fn knows_param(&self, key: &str) -> bool {
        self.request_params.contains(&key) || self.operator_params.contains(&key)
    }

    /// Create an env for `spec`, checking the difficulty first.
    pub fn create(&self, spec: &TaskSpec, params: &EnvParams) -> Result<Box<dyn Env>, EnvError> {
        if !self.difficulties.contains(&spec.difficulty.as_str()) {
            return Err(EnvError::unknown_difficulty(
                self.name,
                &spec.difficulty,
                self.difficulties,
            ));
        }
        spec.absolute_seed()?;
        (self.factory)(spec, params)
    }
}

crate::debug_fields!(EnvDescriptor { name, difficulties });
