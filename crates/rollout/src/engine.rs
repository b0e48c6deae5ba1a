//! The rollout engine: the one episode loop every player goes through.
//!
//! Per turn: one batched [`Actor::act`] over every unfinished episode (a
//! model generates all its replies in one pass; a scripted player plays its
//! moves through its [`Seat`]), then each reply is read, its actions applied
//! and the next observation appended. Finished episodes leave the batch.

use agentrl_env_core::{Env, StepError, TaskSpec};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::actor::{ExpertActor, PolicyActor};
use crate::codec::{ChatCodec, CodecError};
use crate::format::ReplyFormat;
use crate::policy::{Followup, Generation, Policy, PolicyError, SamplingParams};
use crate::trajectory::{Trajectory, Turn};

/// RAGEN's system prompt.
pub const SYSTEM_PROMPT: &str = "You're a helpful assistant.";

/// The rollout filter of `[rollout] rollout_filter_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum GroupFilterType {
    /// StarPO-S: a fixed share of groups by in-group reward std.
    Std,
    /// RAGEN-2's SNR-adaptive filter: a top-p share of the reward signal.
    Snr,
}

/// How the agent carries what it worked out from turn to turn
/// (AgentGym-RL's agent module).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum AgentStrategy {
    /// Act every turn from the prompt alone.
    #[default]
    Plain,
    /// Plan, then act: the first reply's thoughts are a plan for the whole
    /// task, shown in every later prompt.
    Plan,
    /// Reflect: after a reply that could not be read or named an invalid
    /// action, the next reply first reflects on what went wrong; the latest
    /// reflection is shown in every later prompt.
    Reflect,
}

/// How trajectories are played (the `[rollout]` config section, verl/RAGEN names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RolloutConfig {
    /// Samples per task (group size G).
    pub n: usize,
    /// Each member of a group meets the task with its own luck (a bandit's
    /// payout, a slip on the ice: [`agentrl_env_core::Env::set_chance_stream`]),
    /// so the group compares choices rather than one shared draw. Off, as in
    /// RAGEN, every member replays the task's one draw. In-process envs only.
    pub independent_chance: bool,
    /// Tasks per step (B).
    pub env_groups: usize,
    /// Sampling temperature of the training rollouts (0 = greedy).
    pub temperature: f64,
    /// Nucleus sampling: keep the smallest set of tokens whose probability
    /// reaches this (1 = off).
    pub top_p: f64,
    /// Sample among the k most likely tokens only (0 = off).
    pub top_k: usize,
    /// Turns per trajectory at most (validation and evaluation too).
    pub max_turns: usize,
    /// ScalingInter-RL (AgentGym-RL's `scaling_inter_stepwise`): the turn
    /// budget of each stage of RL, growing as training goes (e.g. `[2, 4,
    /// 8]`); empty = `max_turns` throughout. Validation and evaluation play
    /// `max_turns`.
    pub max_turns_schedule: Vec<usize>,
    /// RL steps per stage of `max_turns_schedule` (stage = step / this, the
    /// last stage holding).
    pub max_turns_stage_steps: usize,
    /// Actions one reply may name (RAGEN's `a1 || a2`); extra ones are cut.
    pub max_actions_per_turn: usize,
    /// Action budget of a whole trajectory.
    pub max_actions: usize,
    /// New tokens per turn.
    pub response_length: usize,
    /// Stop a trajectory whose context would exceed this many tokens.
    pub max_context_tokens: usize,
    /// The reply format the policy is prompted and trained to use.
    pub format: ReplyFormat,
    /// Reward (≤ 0) for a turn whose reply does not parse or names an invalid action.
    pub format_penalty: f32,
    /// Show the list of currently valid actions (off by default: it hurts transfer).
    pub show_valid_actions: bool,
    /// Show the env's reading of the state ([`Env::perception`]: on
    /// Sokoban each neighbour, where the box and its target are) under the
    /// observation, so the policy acts on it without writing it first.
    /// An env without a perception shows nothing more.
    pub show_perception: bool,
    /// Feed the last turn's reward back in the next observation.
    pub feed_reward: bool,
    /// Which group filter picks the groups the update trains on.
    pub rollout_filter_type: GroupFilterType,
    /// `std` (StarPO-S): keep this fraction of groups with the highest reward std.
    pub rollout_filter_ratio: f32,
    /// `snr` (RAGEN-2): keep the highest-std groups that carry this share of
    /// the batch's summed in-group std (zero-std groups never kept).
    pub rollout_filter_top_p: f32,
    /// `snr`: slack subtracted from the share's threshold.
    pub rollout_filter_eps: f32,
    /// Of the kept groups, drop those whose raw rewards all agree (std 0):
    /// no task signal, only penalties, which collapse the entropy before a
    /// first success is found.
    pub drop_zero_std_groups: bool,
    /// A local model keeps each dialogue's KV cache between turns and encodes
    /// only what a turn adds (off: every turn re-encodes the whole dialogue).
    pub kv_cache_reuse: bool,
    /// Continuous batching: an episode whose reply has ended plays its
    /// turn and starts its next reply at once, its new prompt encoded in the
    /// same forward passes as the other episodes' tokens, instead of
    /// waiting for every reply of the turn (lock-step turns). A local
    /// model on the CPU and an OpenAI-compatible server batch continuously
    /// (the server gets an episode's next request as soon as its last
    /// answer is in); other policies play lock-step either way. The draws come in another order than
    /// lock-step's, so the trajectories differ from it; the same seed and
    /// config still give the same trajectories.
    pub continuous_batching: bool,
    /// verl-agent's memory: unset, every turn continues the whole dialogue;
    /// `k`, every turn gets a fresh prompt holding the instructions, the
    /// last `k` turns as text (state, actions, reward) and the current
    /// state, and is trained as a sequence of its own. `0` is a Markov
    /// prompt: only the current state.
    pub history_turns: Option<usize>,
    /// With a history window, every turn's prompt repeats the env's
    /// instructions and the reply format (verl-agent's layout). `false`
    /// shows them in the first turn's prompt only: a later prompt is the
    /// window and the state, about a third of the tokens on FrozenLake,
    /// for a policy that has learnt the task and need not reread it.
    pub repeat_instructions: bool,
    /// Plain, plan-then-act or reflect ([`AgentStrategy`]).
    pub agent: AgentStrategy,
    /// RAGEN's pre-fill: every generation prompt ends with the opening of
    /// the reply format (`<think>` for `think_answer`, `Thought:` for
    /// `react`, nothing for `tools`, whose replies open with free
    /// thoughts), so the policy writes its reply from inside the format. A
    /// pretrained chat model otherwise answers in free prose. The pre-fill
    /// is context, not the policy's tokens; the reply read back includes it.
    pub prefill: bool,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        Self {
            n: 8,
            independent_chance: false,
            env_groups: 8,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_turns: 5,
            max_turns_schedule: Vec::new(),
            max_turns_stage_steps: 0,
            max_actions_per_turn: 2,
            max_actions: 10,
            response_length: 32,
            max_context_tokens: 2048,
            format: ReplyFormat::ThinkAnswer,
            format_penalty: -0.1,
            show_valid_actions: false,
            show_perception: false,
            feed_reward: true,
            rollout_filter_type: GroupFilterType::Std,
            rollout_filter_ratio: 0.25,
            rollout_filter_top_p: 0.9,
            rollout_filter_eps: 0.01,
            drop_zero_std_groups: false,
            kv_cache_reuse: true,
            continuous_batching: false,
            history_turns: None,
            repeat_instructions: true,
            agent: AgentStrategy::Plain,
            prefill: false,
        }
    }
}

impl RolloutConfig {
    /// Play by a scripted actor (expert, random) with no budget of the
    /// engine's own: the environment's step limit ends an episode, and a
    /// scripted actor gives up after 4·max_steps + 16 turns. Tasks are
    /// played 64 at a time.
    pub fn scripted() -> Self {
        Self {
            n: 1,
            env_groups: 64,
            max_turns: usize::MAX,
            max_actions: usize::MAX,
            ..Self::default()
        }
    }

    /// What a model samples its replies with; `stop` ends a reply.
    pub fn sampling(&self, stop: u32) -> SamplingParams {
        SamplingParams {
            max_new_tokens: self.response_length,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            stop_tokens: vec![stop],
        }
    }
}

/// A rollout failed (the actor or the tokenizer failed; environments never
/// fail a rollout).
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Codec(#[from] CodecError),
    #[error("actor returned {got} replies for {expected} episodes")]
    BatchMismatch { expected: usize, got: usize },
    #[error("a model's reply needs a conversation: play it with a codec")]
    NoConversation,
    #[error("task {spec}: {reason}")]
    Task { spec: String, reason: String },
    #[error("episode {episode} played before the actor began its batch ({streams} episodes)")]
    NotBegun { episode: usize, streams: usize },
    #[error("policy answered for sequence {index} of a continuous batch of {batch}")]
    UnknownSequence { index: usize, batch: usize },
    #[error("policy ended its continuous batch with episode {episode} unfinished")]
    Unfinished { episode: usize },
}

/// Who plays the episodes the engine drives: an LLM policy ([`PolicyActor`]),
/// the environment's expert ([`ExpertActor`]) or a random player
/// ([`crate::RandomActor`]).
pub trait Actor {
    /// A new set of episodes begins; `specs[i]` is the task of episode `i`
    /// (the [`Seat::episode`] index).
    fn begin(&mut self, specs: &[&TaskSpec]) -> Result<(), RolloutError> {
        let _ = specs;
        Ok(())
    }

    /// One reply for each seat, in order: this turn of every unfinished
    /// episode. `rng` is the batch's sampling stream.
    fn act(
        &mut self,
        seats: &mut [Seat<'_>],
        rng: &mut ChaCha8Rng,
    ) -> Result<Vec<Reply>, RolloutError>;

    /// A model actor's policy and sampling params, which
    /// `rollout.continuous_batching` plays through
    /// [`Policy::generate_continuous`]; `None` (scripted players) plays
    /// lock-step turns through [`Actor::act`].
    fn policy(&mut self) -> Option<(&mut dyn Policy, &SamplingParams)> {
        None
    }
}

/// An actor's reply for one episode's turn.
pub enum Reply {
    /// Tokens a model generated: the engine decodes them, reads the actions
    /// with the reply format and plays them.
    Generated(Generation),
    /// A scripted player already played its moves through [`Seat::play`];
    /// the engine writes them, after `thought` (often empty), as a reply in
    /// the format. No move at all ends the episode.
    Played { thought: String },
}

/// What became of one action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Play {
    /// A valid step; `done` if it ended the episode.
    Stepped { done: bool },
    /// The environment rejected the action (counted, penalised; play goes on).
    Invalid,
    /// Nothing happened: the episode is over or its action budget is spent.
    Over,
}

/// One unfinished episode at its current turn, as an actor sees it.
pub struct Seat<'s> {
    episode: usize,
    prompt: &'s [u32],
    turns_played: usize,
    env: &'s mut dyn Env,
    turn: &'s mut Turn,
    actions_left: &'s mut usize,
    error: &'s mut Option<String>,
}

impl Seat<'_> {
    /// Index of the episode in the batch (as in [`Actor::begin`]).
    pub fn episode(&self) -> usize {
        self.episode
    }

    /// The conversation so far: the prompt a model continues (empty when
    /// the engine plays without a conversation).
    pub fn prompt(&self) -> &[u32] {
        self.prompt
    }

    /// The environment, to read (observation, valid actions, limits).
    pub fn env(&self) -> &dyn Env {
        &*self.env
    }

    /// The environment's expert move from the current state.
    pub fn expert_action(&mut self) -> Option<String> {
        self.env.expert_action()
    }

    /// Turns this episode has played before this one.
    pub fn turns_played(&self) -> usize {
        self.turns_played
    }

    /// Actions played this turn (valid or not).
    pub fn actions_this_turn(&self) -> usize {
        self.turn.actions.len()
    }

    /// Actions left in the episode's budget.
    pub fn actions_left(&self) -> usize {
        *self.actions_left
    }

    /// Play one action: a valid one adds its reward to the turn, an invalid
    /// one is counted (and the turn penalised); both use up the budget.
    pub fn play(&mut self, action: String) -> Play {
        if *self.actions_left == 0 {
            return Play::Over;
        }
        *self.actions_left -= 1;
        match self.env.step(&action) {
            Ok(step) => {
                self.turn.env_reward += step.reward as f32;
                self.turn.actions.push(action);
                Play::Stepped { done: step.done }
            }
            Err(StepError::InvalidAction(e)) => {
                self.turn.invalid_actions += 1;
                self.turn.actions.push(action);
                *self.error = Some(e.to_string());
                Play::Invalid
            }
            Err(StepError::EpisodeOver) => Play::Over,
        }
    }
}

/// A conversation under construction: tokens and loss mask.
#[derive(Default)]
struct Conversation {
    tokens: Vec<u32>,
    mask: Vec<u8>,
}

impl Conversation {
    fn push_context(&mut self, ids: &[u32]) {
        self.tokens.extend_from_slice(ids);
        self.mask.extend(std::iter::repeat_n(0, ids.len()));
    }
    fn push_policy(&mut self, ids: &[u32]) {
        self.tokens.extend_from_slice(ids);
        self.mask.extend(std::iter::repeat_n(1, ids.len()));
    }
}

/// One episode being played.
struct Episode<'e> {
    env: &'e mut dyn Env,
    group: usize,
    conv: Conversation,
    turns: Vec<Turn>,
    /// The turn in play (between the actor's reply and its record).
    turn: Turn,
    /// What the environment said about this turn's last invalid action or
    /// unreadable reply, shown to the player next turn.
    error: Option<String>,
    actions_left: usize,
    finished: bool,
    truncated: bool,
    /// Where the sequence in play begins in `conv` (0 until a history
    /// window starts a turn's own sequence).
    sequence_start: usize,
    /// Every sequence start after the first.
    sequence_starts: Vec<usize>,
    /// What the agent strategy keeps from earlier turns.
    memory: Memory,
}

/// What a plan or reflect agent carries between turns.
#[derive(Default)]
struct Memory {
    /// The first reply's thoughts (`plan`).
    plan: Option<String>,
    /// The latest reflection (`reflect`).
    reflection: Option<String>,
    /// The last turn failed: the next reply reflects first (`reflect`).
    reflect_now: bool,
}

impl Memory {
    /// Keep what `turn` (0-based) wrote, under `strategy`, and note whether
    /// the next turn must reflect.
    fn record(
        &mut self,
        strategy: AgentStrategy,
        turn: usize,
        reply: &Turn,
        thought: Option<String>,
    ) {
        match strategy {
            AgentStrategy::Plain => {}
            AgentStrategy::Plan => {
                if turn == 0 {
                    self.plan = thought;
                }
            }
            AgentStrategy::Reflect => {
                if self.reflect_now && thought.is_some() {
                    self.reflection = thought;
                }
                self.reflect_now = reply.format_error || reply.invalid_actions > 0;
            }
        }
    }
}

impl<'e> Episode<'e> {
    /// The sequence in play: what the model continues.
    fn prompt(&self) -> &[u32] {
        &self.conv.tokens[self.sequence_start..]
    }

    fn seat(&mut self, episode: usize) -> Seat<'_> {
        Seat {
            episode,
            prompt: &self.conv.tokens[self.sequence_start..],
            turns_played: self.turns.len(),
            env: &mut *self.env,
            turn: &mut self.turn,
            actions_left: &mut self.actions_left,
            error: &mut self.error,
        }
    }

    /// Open a turn: its record starts at the end of the conversation, in the
    /// state the environment is in now.
    fn open_turn(&mut self) {
        self.turn = Turn {
            start: self.conv.tokens.len(),
            end: self.conv.tokens.len(),
            reply: String::new(),
            actions: vec![],
            env_reward: 0.0,
            penalty: 0.0,
            format_error: false,
            invalid_actions: 0,
            state_key: self.env.state_key(),
            observation: self.env.observation(),
            perception: self.env.perception(),
        };
        self.error = None;
    }
}

/// The text of the user message that opens turn `turn` (1-based).
///
/// With the whole dialogue in the context, the first message carries the
/// instructions and later ones only what changed (the last reward, an
/// error, the new state). With a history window every message is a whole
/// prompt: the instructions, the window's turns as text, the new state.
fn user_message(
    env: &dyn Env,
    cfg: &RolloutConfig,
    turn: usize,
    actions_left: usize,
    history: &[Turn],
    last_error: Option<&str>,
    memory: &Memory,
) -> String {
    let mut s = String::new();
    let window = cfg.history_turns;
    if turn == 1 || (window.is_some() && cfg.repeat_instructions) {
        s.push_str(&env.instructions());
        s.push('\n');
        s.push_str(&cfg.format.instruction(cfg.max_actions_per_turn));
        s.push('\n');
    }
    if turn == 1 && cfg.agent == AgentStrategy::Plan {
        s.push_str("First write a short plan for the whole task in your thoughts; it stays with you until the end.\n");
    }
    // In a dialogue the plan and reflections are still in the context; a
    // fresh prompt carries them.
    if window.is_some() {
        if let Some(plan) = &memory.plan {
            s.push_str(&format!("Your plan: {plan}\n"));
        }
        if let Some(reflection) = &memory.reflection {
            s.push_str(&format!("Your reflection: {reflection}\n"));
        }
    }
    let shown = window.map_or(0, |k| k.min(history.len()));
    if shown > 0 {
        let first = history.len() - shown + 1;
        s.push_str(&format!("Your last {shown} turns:\n"));
        for (j, t) in history[history.len() - shown..].iter().enumerate() {
            let actions = if t.actions.is_empty() {
                "none (unreadable reply)".to_string()
            } else {
                t.actions.join(" || ")
            };
            s.push_str(&format!(
                "Turn {}:\nState:\n{}\nActions: {actions}\n",
                first + j,
                t.observation
            ));
            if cfg.feed_reward {
                s.push_str(&format!("Reward: {:.2}\n", t.reward()));
            }
        }
    } else if let Some(t) = history.last().filter(|_| cfg.feed_reward) {
        s.push_str(&format!("Reward: {:.2}\n", t.reward()));
    }
    if let Some(err) = last_error.filter(|_| turn > 1) {
        s.push_str(&format!("Invalid: {err}\n"));
    }
    if memory.reflect_now {
        s.push_str(
            "Your last reply failed. Before acting, reflect in your thoughts on what went wrong.\n",
        );
    }
    s.push_str(&state_message(env, cfg, turn, actions_left));
    s
}

/// The end of every user message, the part that shows the state: `Turn k:`,
/// the observation, the valid actions where shown, the actions left. A
/// perception pre-training prompt is this message alone.
pub fn state_message(
    env: &dyn Env,
    cfg: &RolloutConfig,
    turn: usize,
    actions_left: usize,
) -> String {
    let mut s = format!("Turn {turn}:\nState:\n{}\n", env.observation());
    if let Some(reading) = cfg.show_perception.then(|| env.perception()).flatten() {
        s.push_str(&format!("Reading: {reading}\n"));
    }
    if cfg.show_valid_actions {
        s.push_str(&format!(
            "Valid actions: {}\n",
            env.available_actions().join(", ")
        ));
    }
    // The budget the prompt states is the one that binds: the rollout's,
    // or the env's own step limit when that is tighter (a Bandit is pulled
    // once, whatever the rollout allows).
    let env_left = env.max_steps().saturating_sub(env.steps());
    let left = match env.max_steps() {
        0 => actions_left,
        _ => actions_left.min(env_left),
    };
    s.push_str(&format!("You have {left} actions left."));
    s
}

/// The prompt of one state on its own, for perception pre-training: at
/// turn 1 exactly the prompt a fresh episode opens with (system prompt,
/// instructions, the state); at a later turn the system prompt and the
/// state's message alone (`Turn k:`, the observation, the budget), with no
/// instructions and no history, short enough for thousands of updates in a
/// minute. The text between the state and the reply is a rollout's in both,
/// and the mix of long and short prompts keeps what is learnt from
/// depending on where the state sits in the context.
///
/// With a history window (`history_turns`) every turn's prompt is a whole
/// prompt (instructions, window, state). With `history_turns = 0` this is
/// exactly a rollout's prompt after a valid reply whose turn earned
/// `last_reward`; with a wider window it is that prompt without the turns
/// the window would show.
pub fn state_prompt(
    codec: &dyn ChatCodec,
    env: &dyn Env,
    cfg: &RolloutConfig,
    turn: usize,
    actions_left: usize,
    last_reward: f32,
) -> Result<Vec<u32>, CodecError> {
    let fresh = Memory::default();
    let user = match (turn, cfg.history_turns) {
        (1, _) => user_message(env, cfg, 1, actions_left, &[], None, &fresh),
        (_, Some(0)) => {
            // An empty window still shows the last turn's reward.
            let previous = Turn {
                env_reward: last_reward,
                ..Turn::default()
            };
            let history = std::slice::from_ref(&previous);
            user_message(env, cfg, turn, actions_left, history, None, &fresh)
        }
        (_, Some(_)) => user_message(env, cfg, turn, actions_left, &[], None, &fresh),
        (_, None) => state_message(env, cfg, turn, actions_left),
    };
    opening(codec, cfg, &user)
}

/// A turn's opening context as its own sequence: system prompt, the user
/// message, the assistant header.
fn opening(codec: &dyn ChatCodec, cfg: &RolloutConfig, user: &str) -> Result<Vec<u32>, CodecError> {
    let mut ids = codec.message("system", SYSTEM_PROMPT)?;
    ids.extend(codec.message("user", user)?);
    ids.extend(reply_opening(codec, cfg)?);
    Ok(ids)
}

/// What a reply is generated after: the assistant header, then the
/// format's pre-fill when `cfg.prefill` is on.
pub fn reply_opening(codec: &dyn ChatCodec, cfg: &RolloutConfig) -> Result<Vec<u32>, CodecError> {
    let mut ids = codec.assistant_header_for("assistant")?;
    if let Some(text) = prefill_text(cfg) {
        ids.extend(codec.encode(text)?);
    }
    Ok(ids)
}

/// The pre-fill text of `cfg`'s format, when pre-filling is on.
pub fn prefill_text(cfg: &RolloutConfig) -> Option<&'static str> {
    cfg.prefill.then_some(cfg.format.prefill())
}

/// The part of a reply the policy writes itself: all of it, or what
/// follows the pre-fill when the prompt ends with one.
pub fn policy_written<'a>(cfg: &RolloutConfig, reply: &'a str) -> &'a str {
    prefill_text(cfg)
        .and_then(|p| reply.strip_prefix(p))
        .unwrap_or(reply)
}

fn start_episode<'e>(
    env: &'e mut dyn Env,
    group: usize,
    codec: Option<&dyn ChatCodec>,
    cfg: &RolloutConfig,
) -> Result<Episode<'e>, CodecError> {
    env.reset();
    let mut conv = Conversation::default();
    let mut too_long = false;
    if let Some(codec) = codec {
        let first = user_message(
            &*env,
            cfg,
            1,
            cfg.max_actions,
            &[],
            None,
            &Memory::default(),
        );
        conv.push_context(&opening(codec, cfg, &first)?);
        // A first prompt that leaves no room for a reply ends before it starts.
        too_long = conv.tokens.len() + cfg.response_length > cfg.max_context_tokens;
    }
    Ok(Episode {
        env,
        group,
        conv,
        turns: vec![],
        turn: Turn::default(),
        error: None,
        actions_left: cfg.max_actions,
        finished: too_long,
        truncated: too_long,
        sequence_start: 0,
        sequence_starts: Vec::new(),
        memory: Memory::default(),
    })
}

/// Read a model's reply: append its tokens, decode, parse, play its actions.
fn apply_generated(
    ep: &mut Episode<'_>,
    index: usize,
    gen: Generation,
    codec: &dyn ChatCodec,
    cfg: &RolloutConfig,
) -> Result<(), CodecError> {
    ep.conv.push_policy(&gen.tokens);
    ep.turn.end = ep.conv.tokens.len();
    if gen.tokens.last() != Some(&codec.im_end()) {
        // Cut off by the token budget: close the message so the next one is
        // well formed; the closing token is not the policy's.
        ep.conv.push_context(&[codec.im_end()]);
    }
    let reply_ids: Vec<u32> = gen
        .tokens
        .into_iter()
        .filter(|&t| t != codec.im_end())
        .collect();
    let reply = format!(
        "{}{}",
        prefill_text(cfg).unwrap_or(""),
        codec.decode(&reply_ids)?
    );
    match cfg.format.parse(&reply, cfg.max_actions_per_turn) {
        Err(e) => {
            ep.turn.format_error = true;
            ep.error = Some(e.to_string());
        }
        Ok(actions) => {
            let mut seat = ep.seat(index);
            for action in actions {
                match seat.play(action) {
                    Play::Stepped { done: false } | Play::Invalid => {}
                    Play::Stepped { done: true } | Play::Over => break,
                }
            }
        }
    }
    ep.turn.reply = reply;
    Ok(())
}

/// Write the moves a scripted player made as its reply in the format (with
/// no conversation there is no reply to write: its actions say it all).
fn apply_played(
    ep: &mut Episode<'_>,
    thought: &str,
    codec: Option<&dyn ChatCodec>,
    cfg: &RolloutConfig,
) -> Result<(), CodecError> {
    let Some(codec) = codec else {
        return Ok(());
    };
    let reply = cfg.format.render(thought, &ep.turn.actions);
    // The pre-fill is already in the context: the policy writes the rest.
    let mut ids = codec.encode(policy_written(cfg, &reply))?;
    ids.push(codec.im_end());
    ep.conv.push_policy(&ids);
    ep.turn.end = ep.conv.tokens.len();
    ep.turn.reply = reply;
    Ok(())
}

/// After a turn: end the episode or append the next observation.
fn advance(
    ep: &mut Episode<'_>,
    codec: Option<&dyn ChatCodec>,
    cfg: &RolloutConfig,
) -> Result<(), CodecError> {
    let turn_no = ep.turns.len();
    if ep.env.is_done() || ep.actions_left == 0 || turn_no >= cfg.max_turns {
        ep.finished = true;
        return Ok(());
    }
    let Some(codec) = codec else {
        return Ok(());
    };
    let msg = user_message(
        &*ep.env,
        cfg,
        turn_no + 1,
        ep.actions_left,
        &ep.turns,
        ep.error.as_deref(),
        &ep.memory,
    );
    // A history window starts a sequence of its own; otherwise the
    // dialogue goes on.
    let (next, context) = if cfg.history_turns.is_some() {
        (opening(codec, cfg, &msg)?, 0)
    } else {
        let mut next = codec.encode("\n")?;
        next.extend(codec.message("user", &msg)?);
        next.extend(reply_opening(codec, cfg)?);
        (next, ep.conv.tokens.len() - ep.sequence_start)
    };
    if context + next.len() + cfg.response_length > cfg.max_context_tokens {
        ep.finished = true;
        ep.truncated = true;
        return Ok(());
    }
    if cfg.history_turns.is_some() {
        ep.sequence_start = ep.conv.tokens.len();
        ep.sequence_starts.push(ep.sequence_start);
    }
    ep.conv.push_context(&next);
    Ok(())
}

fn finish(ep: Episode<'_>) -> Trajectory {
    Trajectory {
        spec: ep.env.spec().clone(),
        group: ep.group,
        tokens: ep.conv.tokens,
        loss_mask: ep.conv.mask,
        sequence_starts: ep.sequence_starts,
        turns: ep.turns,
        success: ep.env.is_success(),
        env_done: ep.env.is_done(),
        truncated: ep.truncated,
        env_steps: ep.env.steps(),
        instructions: ep.env.instructions(),
        final_observation: ep.env.observation(),
        final_state_key: ep.env.state_key(),
        env_max_steps: ep.env.max_steps(),
    }
}

/// Play every environment to the end with `actor`, in lock-step turns.
///
/// `envs[i]` belongs to group `groups[i]`; environments are reset first.
/// With a `codec` each episode is a conversation (the tokens a model reads
/// and trains on); without one nothing is rendered, which only scripted
/// actors can play (evaluation and benchmarks of experts and random play).
pub fn play_episodes(
    actor: &mut dyn Actor,
    codec: Option<&dyn ChatCodec>,
    envs: &mut [Box<dyn Env>],
    groups: &[usize],
    cfg: &RolloutConfig,
    rng: &mut ChaCha8Rng,
) -> Result<Vec<Trajectory>, RolloutError> {
    let specs: Vec<&TaskSpec> = envs.iter().map(|e| e.spec()).collect();
    actor.begin(&specs)?;
    let mut eps: Vec<Episode<'_>> = envs
        .iter_mut()
        .zip(groups.iter().copied())
        .map(|(env, g)| start_episode(env.as_mut(), g, codec, cfg))
        .collect::<Result<_, _>>()?;
    if let (true, Some(codec)) = (cfg.continuous_batching, codec) {
        if let Some((policy, params)) = actor.policy() {
            play_continuously(policy, params, &mut eps, codec, cfg, rng)?;
            return Ok(eps.into_iter().map(finish).collect());
        }
    }
    loop {
        let active: Vec<usize> = (0..eps.len()).filter(|&i| !eps[i].finished).collect();
        if active.is_empty() {
            break;
        }
        let replies = {
            let mut seats: Vec<Seat<'_>> = Vec::with_capacity(active.len());
            for (i, ep) in eps.iter_mut().enumerate().filter(|(_, e)| !e.finished) {
                ep.open_turn();
                seats.push(ep.seat(i));
            }
            actor.act(&mut seats, rng)?
        };
        if replies.len() != active.len() {
            return Err(RolloutError::BatchMismatch {
                expected: active.len(),
                got: replies.len(),
            });
        }
        for (&i, reply) in active.iter().zip(replies) {
            conclude_turn(&mut eps[i], i, reply, codec, cfg)?;
        }
    }
    Ok(eps.into_iter().map(finish).collect())
}

/// Ends the turn in play of episode `ep` (index `i`) with the actor's
/// `reply`: plays it, penalises a failed turn, keeps what the agent
/// strategy remembers, records the turn and appends the next observation
/// or ends the episode.
fn conclude_turn(
    ep: &mut Episode<'_>,
    i: usize,
    reply: Reply,
    codec: Option<&dyn ChatCodec>,
    cfg: &RolloutConfig,
) -> Result<(), RolloutError> {
    match reply {
        Reply::Generated(gen) => {
            let codec = codec.ok_or(RolloutError::NoConversation)?;
            apply_generated(ep, i, gen, codec, cfg)?;
        }
        Reply::Played { .. } if ep.turn.actions.is_empty() => {
            // A scripted player with no move: the episode ends here.
            ep.finished = true;
            return Ok(());
        }
        Reply::Played { thought } => apply_played(ep, &thought, codec, cfg)?,
    }
    if ep.turn.format_error || ep.turn.invalid_actions > 0 {
        ep.turn.penalty = cfg.format_penalty;
    }
    let thought = cfg.format.thought(&ep.turn.reply);
    ep.memory
        .record(cfg.agent, ep.turns.len(), &ep.turn, thought);
    let turn = std::mem::take(&mut ep.turn);
    ep.turns.push(turn);
    advance(ep, codec, cfg)?;
    Ok(())
}

/// Plays every unfinished episode of `eps` to the end through one
/// continuously batched generation (`rollout.continuous_batching`): an
/// episode whose reply ends concludes its turn at once and, unless it is
/// over, goes on with its next prompt.
fn play_continuously(
    policy: &mut dyn Policy,
    params: &SamplingParams,
    eps: &mut [Episode<'_>],
    codec: &dyn ChatCodec,
    cfg: &RolloutConfig,
    rng: &mut ChaCha8Rng,
) -> Result<(), RolloutError> {
    let mut rows = Vec::new();
    let mut prompts = Vec::new();
    for (i, ep) in eps.iter_mut().enumerate().filter(|(_, e)| !e.finished) {
        ep.open_turn();
        rows.push(i);
        prompts.push(ep.prompt().to_vec());
    }
    if rows.is_empty() {
        return Ok(());
    }
    let mut failed = None;
    let mut next = |row: usize, gen: Generation| {
        let Some(&i) = rows.get(row) else {
            failed = Some(RolloutError::UnknownSequence {
                index: row,
                batch: rows.len(),
            });
            return Followup::Abort;
        };
        let ep = &mut eps[i];
        match conclude_turn(ep, i, Reply::Generated(gen), Some(codec), cfg) {
            Err(e) => {
                failed = Some(e);
                Followup::Abort
            }
            Ok(()) if ep.finished => Followup::Done,
            Ok(()) => {
                ep.open_turn();
                Followup::Continue(ep.prompt().to_vec())
            }
        }
    };
    let played = policy.generate_continuous(prompts, params, rng, &mut next);
    if let Some(e) = failed {
        return Err(e);
    }
    played?;
    match eps.iter().position(|e| !e.finished) {
        Some(episode) => Err(RolloutError::Unfinished { episode }),
        None => Ok(()),
    }
}

/// Play every environment to the end with a model `policy` (see
/// [`play_episodes`]), sampling with the config's settings.
pub fn run_rollouts(
    policy: &mut dyn Policy,
    codec: &dyn ChatCodec,
    mut envs: Vec<Box<dyn Env>>,
    groups: &[usize],
    cfg: &RolloutConfig,
    rng: &mut ChaCha8Rng,
) -> Result<Vec<Trajectory>, RolloutError> {
    let mut actor = PolicyActor::new(policy, cfg.sampling(codec.im_end()));
    play_episodes(&mut actor, Some(codec), &mut envs, groups, cfg, rng)
}

/// Expert demonstrations: `envs` played by their expert solvers (see
/// [`ExpertActor`]), tokenised exactly as a rollout would be.
pub fn expert_demonstrations(
    expert: &mut ExpertActor,
    codec: &dyn ChatCodec,
    mut envs: Vec<Box<dyn Env>>,
    groups: &[usize],
    cfg: &RolloutConfig,
) -> Result<Vec<Trajectory>, RolloutError> {
    // Scripted actors draw from their own per-episode streams.
    let mut unused = ChaCha8Rng::seed_from_u64(0);
    play_episodes(expert, Some(codec), &mut envs, groups, cfg, &mut unused)
}
