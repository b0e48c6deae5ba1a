//! Making the starting policy: a tokenizer and a model, either loaded from a
//! Hugging Face directory or created on the spot (byte-level BPE trained on the
//! environment's own text, and a tiny randomly initialised Qwen2).

use std::cell::RefCell;
use std::path::Path;

use agentrl_env_core::{Env, EnvError, EnvParams, Split, TaskSpec};
use agentrl_model::{ModelConfig, PolicyModel};
use agentrl_rollout::{
    expert_demonstrations, ChatCodec, CodecError, ExpertActor, RolloutConfig, RolloutError,
    SYSTEM_PROMPT,
};
use agentrl_tokenizer::ChatTokenizer;
use candle_core::Device;

use crate::config::{EnvProtocol, SftSection, TrainConfig};
use crate::mixture::task_sources;

/// Train tasks whose first observation the tiny tokenizer of an env without
/// an expert is trained on (each is a session on the server).
const OBSERVED_EPISODES: usize = 16;
use crate::evaluate::EnvMaker;

/// A codec that records every text it is asked to encode: running expert
/// demonstrations through it yields exactly the text a rollout tokenises,
/// which is the corpus the tiny tokenizer is trained on.
struct RecordingCodec {
    texts: RefCell<Vec<String>>,
}

impl ChatCodec for RecordingCodec {
    fn encode(&self, text: &str) -> Result<Vec<u32>, CodecError> {
        self.texts.borrow_mut().push(text.to_string());
        Ok(text.bytes().map(u32::from).collect())
    }
    fn decode(&self, ids: &[u32]) -> Result<String, CodecError> {
        Ok(ids.iter().filter_map(|&i| char::from_u32(i)).collect())
    }
    fn im_start(&self) -> u32 {
        1 << 20
    }
    fn im_end(&self) -> u32 {
        (1 << 20) + 1
    }
}

/// Text of expert episodes (prompts, observations, replies, with the
/// perception thoughts where `sft.perceive`) plus error messages the policy
/// will see, from `episodes` train tasks.
pub fn environment_corpus(
    make: &EnvMaker<'_>,
    env: &str,
    difficulties: &[&str],
    params: &EnvParams,
    rollout: &RolloutConfig,
    sft: &SftSection,
    episodes: usize,
) -> Result<Vec<String>, BootstrapError> {
    let codec = RecordingCodec {
        texts: RefCell::new(vec![SYSTEM_PROMPT.to_string()]),
    };
    for d in difficulties {
        for seed in 0..episodes as u64 {
            let spec = TaskSpec::new(env, Split::Train, *d, seed);
            // One episode at a time: the corpus keeps each episode's texts together.
            let e: Box<dyn Env> = make(&spec, params)?;
            let mut expert = ExpertActor::new(sft.actions_per_turn, 0.0).perceiving(sft.perceive);
            expert_demonstrations(&mut expert, &codec, vec![e], &[0], rollout)?;
            // The messages an invalid action produces.
            let mut e = make(&spec, params)?;
            e.reset();
            if let Err(err) = e.step("not an action") {
                codec.texts.borrow_mut().push(format!("Invalid: {err}"));
            }
        }
    }
    let mut texts = codec.texts.into_inner();
    texts.extend(format_error_texts());
    Ok(texts)
}

/// The messages the rollout shows for unreadable replies.
fn format_error_texts() -> Vec<String> {
    let mut texts = Vec::new();
    for f in [
        agentrl_rollout::ReplyFormat::ThinkAnswer,
        agentrl_rollout::ReplyFormat::React,
    ] {
        for e in [
            f.parse("", 1),
            f.parse("<think></think><answer></answer>", 1),
        ] {
            if let Err(e) = e {
                texts.push(format!("Invalid: {e}"));
            }
        }
    }
    texts
}

/// Text of an env without an expert (an AgentGym server): the instructions,
/// the first observation of `episodes` train tasks and the server's answer
/// to an invalid action in each.
pub fn observed_corpus(
    make: &EnvMaker<'_>,
    env: &str,
    difficulty: &str,
    params: &EnvParams,
    episodes: usize,
) -> Result<Vec<String>, BootstrapError> {
    let mut texts = vec![SYSTEM_PROMPT.to_string()];
    for seed in 0..episodes as u64 {
        let mut e = make(&TaskSpec::new(env, Split::Train, difficulty, seed), params)?;
        if seed == 0 {
            texts.push(e.instructions());
        }
        texts.push(e.reset());
        if let Err(err) = e.step("not an action") {
            texts.push(format!("Invalid: {err}"));
        }
    }
    texts.extend(format_error_texts());
    Ok(texts)
}

/// Error making the starting policy.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error("expert demonstration for the tokenizer corpus: {0}")]
    Demonstration(#[from] RolloutError),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("model: {0}")]
    Model(String),
}

/// Load the configured model directory, or create a tokenizer and tiny model.
pub fn starting_policy(
    cfg: &TrainConfig,
    make: &EnvMaker<'_>,
    with_value_head: bool,
    device: &Device,
) -> Result<(ChatTokenizer, PolicyModel), BootstrapError> {
    if !cfg.model.path.is_empty() {
        let dir = Path::new(&cfg.model.path);
        let tok = ChatTokenizer::load(dir).map_err(|e| BootstrapError::Tokenizer(e.to_string()))?;
        let mut model = PolicyModel::load(dir, with_value_head, device)
            .map_err(|e| BootstrapError::Model(e.to_string()))?;
        model
            .set_precision(cfg.model.precision)
            .map_err(|e| BootstrapError::Model(e.to_string()))?;
        model.set_gradient_checkpointing(cfg.model.gradient_checkpointing);
        model.set_flash_attention(cfg.model.flash_attention);
        return Ok((tok, model));
    }
    let corpus = if cfg.env.protocol == EnvProtocol::Agentgym {
        observed_corpus(
            make,
            &cfg.env.name,
            &cfg.env.difficulty,
            &cfg.env.params,
            OBSERVED_EPISODES,
        )?
    } else {
        let desc = agentrl_envs::find(&cfg.env.name).map_err(|e| {
            BootstrapError::Tokenizer(format!(
                "{e}: the tiny model's tokenizer is trained on the env's expert play, which only agentrl's own envs have; set model.path (a Hugging Face model directory or a GGUF file), or env.protocol = \"agentgym\" for an AgentGym server"
            ))
        })?;
        let mut difficulties: Vec<&str> = vec![cfg.env.difficulty.as_str()];
        for d in desc.difficulties {
            if !difficulties.contains(d) {
                difficulties.push(d);
            }
        }
        environment_corpus(
            make,
            &cfg.env.name,
            &difficulties,
            &cfg.env.params,
            &cfg.rollout,
            &cfg.sft,
            48,
        )?
    };
    // One tokenizer for every env the policy meets: a mixture's other
    // sources, then `model.tokenizer_envs` (played in-process).
    let mut corpus = corpus;
    let mut covered = vec![cfg.env.name.clone()];
    let in_process = |spec: &TaskSpec, params: &EnvParams| agentrl_envs::make_env(spec, params);
    let extra = task_sources(cfg)
        .into_iter()
        .map(|s| (s.env, s.params, true))
        .chain(
            cfg.model
                .tokenizer_envs
                .iter()
                .map(|e| (e.clone(), EnvParams::new(), false)),
        );
    for (env, params, from_run) in extra {
        if covered.contains(&env) {
            continue;
        }
        let desc =
            agentrl_envs::find(&env).map_err(|e| BootstrapError::Tokenizer(e.to_string()))?;
        let maker: &EnvMaker<'_> = if from_run { make } else { &in_process };
        corpus.extend(environment_corpus(
            maker,
            &env,
            desc.difficulties,
            &params,
            &cfg.rollout,
            &cfg.sft,
            48,
        )?);
        covered.push(env);
    }
    let tok = ChatTokenizer::train_bpe(&corpus, cfg.model.config.vocab_size)
        .map_err(|e| BootstrapError::Tokenizer(e.to_string()))?;
    // `[model] vocab_size` is what the tokenizer was asked for; the model
    // gets the size it actually has.
    let mcfg = ModelConfig {
        vocab_size: tok.vocab_size(),
        ..cfg.model.config.clone()
    };
    let mut model = PolicyModel::new_random(&mcfg, with_value_head, cfg.model.init_seed, device)
        .map_err(|e| BootstrapError::Model(e.to_string()))?;
    model
        .set_precision(cfg.model.precision)
        .map_err(|e| BootstrapError::Model(e.to_string()))?;
    model.set_gradient_checkpointing(cfg.model.gradient_checkpointing);
    model.set_flash_attention(cfg.model.flash_attention);
    Ok((tok, model))
}
