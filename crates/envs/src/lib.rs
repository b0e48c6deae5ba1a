//! The registry: every environment agentrl ships, by name.

pub use agentrl_env_core::*;

/// Every registered environment, in the order `agentrl envs` lists them.
pub fn descriptors() -> Vec<EnvDescriptor> {
    vec![
        // Each env crate adds one line here: `agentrl_env_x::descriptor(),`
        agentrl_env_bandit::descriptor(),
        agentrl_env_frozenlake::descriptor(),
        agentrl_env_sokoban::descriptor(),
        agentrl_env_textcraft::descriptor(),
        agentrl_env_alfworld::descriptor(),
        agentrl_env_babyai::descriptor(),
        agentrl_env_webshop::descriptor(),
        agentrl_env_searchqa::descriptor(),
    ]
}

/// The descriptor of the environment called `name`.
pub fn find(name: &str) -> Result<EnvDescriptor, EnvError> {
    let all = descriptors();
    all.iter()
        .find(|d| d.name == name)
        .cloned()
        .ok_or_else(|| EnvError::UnknownEnv {
            name: name.to_string(),
            available: all.iter().map(|d| d.name).collect::<Vec<_>>().join(", "),
        })
}

/// Create the environment a spec names.
pub fn make_env(spec: &TaskSpec, params: &EnvParams) -> Result<Box<dyn Env>, EnvError> {
    find(&spec.env)?.create(spec, params)
}
