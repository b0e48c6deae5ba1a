//! The rollout engine: B tasks × G samples in lock-step turns.
//!
//! Per turn: one batched `generate` over every unfinished trajectory, then each
//! environment steps through the actions its reply names. Finished
//! trajectories leave the batch.

use agentrl_env_core::{Env, StepError};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::codec::{ChatCodec, CodecError};
use crate::format::ReplyFormat;
use crate::policy::{Policy, PolicyError, SamplingParams};
use crate::trajectory::{Trajectory, Turn};

/// RAGEN's system prompt.
pub const SYSTEM_PROMPT: &str = "You're a helpful assistant.";

/// How trajectories are played (the `[rollout]` config section, verl/RAGEN names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RolloutConfig {
    /// Samples per task (group size G).
    pub n: usize,
    /// Tasks per step (B).
    pub env_groups: usize,
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: usize,
    pub max_turns: usize,
    pub max_actions_per_turn: usize,
    /// Action budget of a whole trajectory.
    pub max_actions: usize,
    /// New tokens per turn.
    pub response_length: usize,
    /// Stop a trajectory whose context would exceed this many tokens.
    pub max_context_tokens: usize,
    pub format: ReplyFormat,
    /// Reward (≤ 0) for a turn whose reply does not parse or names an invalid action.
    pub format_penalty: f32,
    /// Show the list of currently valid actions (off by default: it hurts transfer).
    pub show_valid_actions: bool,
    /// Feed the last turn's reward back in the next observation.
    pub feed_reward: bool,
    /// StarPO-S: keep this fraction of groups with the highest reward std.
    pub rollout_filter_ratio: f32,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        Self {
            n: 8,
            env_groups: 8,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_turns: 5,
            max_actions_per_turn: 2,
            max_actions: 10,
            response_length: 32,
            max_context_tokens: 2048,
            format: ReplyFormat::ThinkAnswer,
            format_penalty: -0.1,
            show_valid_actions: false,
            feed_reward: true,
            rollout_filter_ratio: 0.25,
        }
    }
}

/// A rollout failed (the policy or the tokenizer failed; environments never
/// fail a rollout).
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Codec(#[from] CodecError),
    #[error("policy returned {got} generations for {expected} prompts")]
    BatchMismatch { expected: usize, got: usize },
}

/// A conversation under construction: tokens, loss mask, sampling log-probs.
struct Conversation {
    tokens: Vec<u32>,
    mask: Vec<u8>,
    logprobs: Vec<f32>,
}

impl Conversation {
    fn push_context(&mut self, ids: &[u32]) {
        self.tokens.extend_from_slice(ids);
        self.mask.extend(std::iter::repeat_n(0, ids.len()));
        self.logprobs.extend(std::iter::repeat_n(0.0, ids.len()));
    }
    fn push_policy(&mut self, ids: &[u32], logprobs: &[f32]) {
        self.tokens.extend_from_slice(ids);
        self.mask.extend(std::iter::repeat_n(1, ids.len()));
        self.logprobs.extend_from_slice(logprobs);
    }
}

/// One trajectory being played.
struct Episode {
    env: Box<dyn Env>,
    group: usize,
    conv: Conversation,
    turns: Vec<Turn>,
    actions_left: usize,
    finished: bool,
    truncated: bool,
}

/// The text of the user message that opens turn `turn` (1-based).
fn user_message(
    env: &dyn Env,
    cfg: &RolloutConfig,
    turn: usize,
    actions_left: usize,
    last: Option<&Turn>,
    last_error: Option<&str>,
) -> String {
    let mut s = String::new();
    if turn == 1 {
        s.push_str(&env.instructions());
        s.push('\n');
        s.push_str(&cfg.format.instruction(cfg.max_actions_per_turn));
        s.push('\n');
    } else if let Some(t) = last {
        if cfg.feed_reward {
            s.push_str(&format!("Reward: {:.2}\n", t.reward()));
        }
        if let Some(err) = last_error {
            s.push_str(&format!("Invalid: {err}\n"));
        }
    }
    s.push_str(&format!("Turn {turn}:\nState:\n{}\n", env.observation()));
    if cfg.show_valid_actions {
        s.push_str(&format!(
            "Valid actions: {}\n",
            env.available_actions().join(", ")
        ));
    }
    s.push_str(&format!("You have {actions_left} actions left."));
    s
}

/// Apply one reply to its environment; returns the turn record and an error
/// text to show the policy next turn, if any.
fn apply_reply(
    ep: &mut Episode,
    cfg: &RolloutConfig,
    reply: String,
    start: usize,
    end: usize,
) -> (Turn, Option<String>) {
    let state_key = ep.env.state_key();
    let parsed = cfg.format.parse(&reply, cfg.max_actions_per_turn);
    let mut turn = Turn {
        start,
        end,
        reply,
        actions: vec![],
        env_reward: 0.0,
        penalty: 0.0,
        format_error: false,
        invalid_actions: 0,
        state_key,
    };
    let mut error = None;
    match parsed {
        Err(e) => {
            turn.format_error = true;
            turn.penalty = cfg.format_penalty;
            error = Some(e.to_string());
        }
        Ok(actions) => {
            for action in actions.into_iter().take(ep.actions_left) {
                ep.actions_left -= 1;
                match ep.env.step(&action) {
                    Ok(step) => {
                        turn.env_reward += step.reward as f32;
                        turn.actions.push(action);
                        if step.done {
                            break;
                        }
                    }
                    Err(StepError::InvalidAction(e)) => {
                        turn.invalid_actions += 1;
                        turn.actions.push(action);
                        error = Some(e.to_string());
                    }
                    Err(StepError::EpisodeOver) => break,
                }
            }
            if turn.invalid_actions > 0 {
                turn.penalty = cfg.format_penalty;
            }
        }
    }
    (turn, error)
}

fn finish(ep: Episode) -> Trajectory {
    Trajectory {
        spec: ep.env.spec().clone(),
        group: ep.group,
        tokens: ep.conv.tokens,
        loss_mask: ep.conv.mask,
        sample_logprobs: ep.conv.logprobs,
        turns: ep.turns,
        success: ep.env.is_success(),
        env_done: ep.env.is_done(),
        truncated: ep.truncated,
        env_steps: ep.env.steps(),
    }
}

fn start_episode(
    env: Box<dyn Env>,
    group: usize,
    codec: &dyn ChatCodec,
    cfg: &RolloutConfig,
) -> Result<Episode, CodecError> {
    let mut env = env;
    env.reset();
    let mut conv = Conversation {
        tokens: vec![],
        mask: vec![],
        logprobs: vec![],
    };
    conv.push_context(&codec.message("system", SYSTEM_PROMPT)?);
    let first = user_message(env.as_ref(), cfg, 1, cfg.max_actions, None, None);
    conv.push_context(&codec.message("user", &first)?);
    conv.push_context(&codec.assistant_header_for("assistant")?);
    // A first prompt that leaves no room for a reply ends before it starts.
    let too_long = conv.tokens.len() + cfg.response_length > cfg.max_context_tokens;
    Ok(Episode {
        env,
        group,
        conv,
        turns: vec![],
        actions_left: cfg.max_actions,
        finished: too_long,
        truncated: too_long,
    })
}

/// After a turn: end the episode or append the next observation.
fn advance(
    ep: &mut Episode,
    codec: &dyn ChatCodec,
    cfg: &RolloutConfig,
    error: Option<String>,
) -> Result<(), CodecError> {
    let turn_no = ep.turns.len();
    if ep.env.is_done() || ep.actions_left == 0 || turn_no >= cfg.max_turns {
        ep.finished = true;
        return Ok(());
    }
    let mut next = codec.encode("\n")?;
    let msg = user_message(
        ep.env.as_ref(),
        cfg,
        turn_no + 1,
        ep.actions_left,
        ep.turns.last(),
        error.as_deref(),
    );
    next.extend(codec.message("user", &msg)?);
    next.extend(codec.assistant_header_for("assistant")?);
    if ep.conv.tokens.len() + next.len() + cfg.response_length > cfg.max_context_tokens {
        ep.finished = true;
        ep.truncated = true;
        return Ok(());
    }
    ep.conv.push_context(&next);
    Ok(())
}

/// Play every environment to the end with the policy, in lock-step turns.
///
/// `envs[i]` belongs to group `groups[i]`; environments are reset first.
pub fn run_rollouts(
    policy: &mut dyn Policy,
    codec: &dyn ChatCodec,
    envs: Vec<Box<dyn Env>>,
    groups: &[usize],
    cfg: &RolloutConfig,
    rng: &mut ChaCha8Rng,
) -> Result<Vec<Trajectory>, RolloutError> {
    let mut eps: Vec<Episode> = envs
        .into_iter()
        .zip(groups.iter().copied())
        .map(|(env, g)| start_episode(env, g, codec, cfg))
        .collect::<Result<_, _>>()?;
    let params = SamplingParams {
        max_new_tokens: cfg.response_length,
        temperature: cfg.temperature,
        top_p: cfg.top_p,
        top_k: cfg.top_k,
        stop_tokens: vec![codec.im_end()],
    };
    loop {
        let active: Vec<usize> = (0..eps.len()).filter(|&i| !eps[i].finished).collect();
        if active.is_empty() {
            break;
        }
        let prompts: Vec<Vec<u32>> = active.iter().map(|&i| eps[i].conv.tokens.clone()).collect();
        let gens = policy.generate(&prompts, &params, rng)?;
        if gens.len() != prompts.len() {
            return Err(RolloutError::BatchMismatch {
                expected: prompts.len(),
                got: gens.len(),
            });
        }
        for (&i, gen) in active.iter().zip(gens) {
            let ep = &mut eps[i];
            let start = ep.conv.tokens.len();
            ep.conv.push_policy(&gen.tokens, &gen.logprobs);
            let end = ep.conv.tokens.len();
            if gen.tokens.last() != Some(&codec.im_end()) {
                // Cut off by the token budget: close the message so the next
                // one is well formed; the closing token is not the policy's.
                ep.conv.push_context(&[codec.im_end()]);
            }
            let reply_ids: Vec<u32> = gen
                .tokens
                .iter()
                .copied()
                .filter(|&t| t != codec.im_end())
                .collect();
            let reply = codec.decode(&reply_ids)?;
            let (turn, error) = apply_reply(ep, cfg, reply, start, end);
            ep.turns.push(turn);
            advance(ep, codec, cfg, error)?;
        }
    }
    Ok(eps.into_iter().map(finish).collect())
}

/// Play one environment with its expert solver, rendering the expert's
/// actions as replies in the configured format: a demonstration for SFT,
/// tokenised exactly as a rollout would be.
///
/// With `noise > 0` each action is, with that probability, drawn uniformly
/// from the env's available actions instead (an ε-greedy expert; the expert
/// replans from wherever that leads). Imitating it gives a policy that knows
/// the expert's move but does not reliably take it: a modest prior for RL.
pub fn expert_trajectory(
    env: Box<dyn Env>,
    group: usize,
    codec: &dyn ChatCodec,
    cfg: &RolloutConfig,
    actions_per_turn: usize,
    noise: f64,
    rng: &mut impl Rng,
) -> Result<Trajectory, RolloutError> {
    let mut ep = start_episode(env, group, codec, cfg)?;
    while !ep.finished {
        let mut actions = Vec::new();
        // Plan ahead on a scratch copy is not possible through the trait, so
        // the expert's actions are taken one by one and grouped per turn.
        let mut turn = Turn {
            start: ep.conv.tokens.len(),
            end: 0,
            reply: String::new(),
            actions: vec![],
            env_reward: 0.0,
            penalty: 0.0,
            format_error: false,
            invalid_actions: 0,
            state_key: ep.env.state_key(),
        };
        while actions.len() < actions_per_turn.max(1) && ep.actions_left > 0 && !ep.env.is_done() {
            let Some(expert) = ep.env.expert_action() else {
                break;
            };
            let a = if noise > 0.0 && rng.random::<f64>() < noise {
                let valid = ep.env.available_actions();
                if valid.is_empty() {
                    expert
                } else {
                    valid[rng.random_range(0..valid.len())].clone()
                }
            } else {
                expert
            };
            match ep.env.step(&a) {
                Ok(step) => {
                    turn.env_reward += step.reward as f32;
                    ep.actions_left -= 1;
                    actions.push(a);
                }
                Err(_) => break,
            }
        }
        if actions.is_empty() {
            break;
        }
        let reply = cfg.format.render("", &actions);
        let mut ids = codec.encode(&reply)?;
        ids.push(codec.im_end());
        let zeros = vec![0.0; ids.len()];
        ep.conv.push_policy(&ids, &zeros);
        turn.end = ep.conv.tokens.len();
        turn.reply = reply;
        turn.actions = actions;
        ep.turns.push(turn);
        advance(&mut ep, codec, cfg, None)?;
    }
    Ok(finish(ep))
}
