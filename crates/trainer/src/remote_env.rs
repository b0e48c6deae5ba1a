//! Environments behind `env.endpoint`: one or several `agentrl serve`
//! processes ([`EndpointPool`]) or one of AgentGym's env servers
//! ([`AgentGymEnv`]), by `env.protocol`.

use agentrl_env_client::{
    AgentGymEnv, AgentGymOptions, ClientOptions, DataIdxRanges, EndpointPool,
};
use agentrl_env_core::{Env, EnvError, EnvParams, TaskSpec};

use crate::config::{EnvProtocol, EnvSection};
use crate::evaluate::EnvMaker;

/// The instructions of an AgentGym env: `env.instructions`, or the text of
/// `env.instructions_file`.
pub fn instructions(env: &EnvSection) -> Result<String, EnvError> {
    if env.instructions_file.is_empty() {
        return Ok(env.instructions.clone());
    }
    std::fs::read_to_string(&env.instructions_file).map_err(|e| EnvError::InvalidParam {
        env: env.name.clone(),
        key: "instructions_file".into(),
        reason: format!("cannot read {}: {e}", env.instructions_file),
    })
}

/// The options of every [`AgentGymEnv`] of `env`.
pub fn agentgym_options(env: &EnvSection) -> Result<AgentGymOptions, EnvError> {
    AgentGymOptions::new(
        &env.name,
        &instructions(env)?,
        env.invalid_action_patterns.as_deref(),
        env.reward_scale,
    )
}

/// Makes the envs of `env` on its endpoint; for AgentGym, `data_idx` maps
/// each spec's split and index to the server's task index.
pub fn remote_maker(
    env: &EnvSection,
    data_idx: DataIdxRanges,
) -> Result<Box<EnvMaker<'static>>, EnvError> {
    match env.protocol {
        EnvProtocol::Agentrl => {
            // The token `agentrl serve --token` reads from the same variable.
            let token = std::env::var("AGENTRL_SERVER_TOKEN")
                .ok()
                .filter(|t| !t.is_empty());
            let opts = ClientOptions {
                token,
                ..ClientOptions::default()
            };
            let pool = EndpointPool::new(env.endpoint.urls(), opts)?;
            Ok(Box::new(
                move |spec: &TaskSpec, params: &EnvParams| -> Result<Box<dyn Env>, EnvError> {
                    Ok(Box::new(pool.connect(spec, params)?))
                },
            ))
        }
        EnvProtocol::Agentgym => {
            let endpoint = match env.endpoint.urls() {
                [one] => one.clone(),
                urls => {
                    return Err(EnvError::Remote(format!(
                        "the agentgym protocol takes one env server, not {}",
                        urls.len()
                    )))
                }
            };
            let opts = agentgym_options(env)?;
            Ok(Box::new(
                move |spec: &TaskSpec, _: &EnvParams| -> Result<Box<dyn Env>, EnvError> {
                    let idx = data_idx.data_idx(spec.split, spec.seed)?;
                    Ok(Box::new(AgentGymEnv::connect(
                        &endpoint,
                        spec,
                        idx,
                        opts.clone(),
                    )?))
                },
            ))
        }
    }
}
