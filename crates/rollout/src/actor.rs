//! The actors agentrl ships: a model policy, the environment's expert
//! solver and a uniformly random player. The engine drives all three
//! through the same episode loop ([`crate::play_episodes`]).

use std::collections::HashMap;

use agentrl_env_core::{stable_hash, Env, TaskSpec};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::engine::{Actor, Play, Reply, RolloutError, Seat};
use crate::policy::{Policy, SamplingParams};

/// A token-level [`Policy`] (a local model, an inference server) as an actor:
/// one batched generation per turn.
pub struct PolicyActor<'p> {
    policy: &'p mut dyn Policy,
    params: SamplingParams,
}

impl<'p> PolicyActor<'p> {
    /// `policy` sampling with `params` (see [`crate::RolloutConfig::sampling`]).
    pub fn new(policy: &'p mut dyn Policy, params: SamplingParams) -> Self {
        Self { policy, params }
    }
}

impl Actor for PolicyActor<'_> {
    fn act(
        &mut self,
        seats: &mut [Seat<'_>],
        rng: &mut ChaCha8Rng,
    ) -> Result<Vec<Reply>, RolloutError> {
        let prompts: Vec<Vec<u32>> = seats.iter().map(|s| s.prompt().to_vec()).collect();
        let gens = self.policy.generate(&prompts, &self.params, rng)?;
        Ok(gens.into_iter().map(Reply::Generated).collect())
    }

    fn policy(&mut self) -> Option<(&mut dyn Policy, &SamplingParams)> {
        Some((&mut *self.policy, &self.params))
    }
}

/// What a scripted player (the expert, random play) decides: its moves of
/// one turn of one episode, from the environment alone. [`Scripted`] makes
/// it an [`Actor`].
pub trait ScriptedPlayer {
    /// Seed of the random stream of the episode playing `spec`: a stream per
    /// episode, so that its play does not depend on what shares its batch.
    fn stream_seed(&self, spec: &TaskSpec) -> Result<u64, RolloutError>;

    /// Play this turn through `seat`; playing nothing ends the episode.
    fn turn(&mut self, seat: &mut Seat<'_>, rng: &mut ChaCha8Rng);

    /// The thought written before this turn's moves, from the state the
    /// turn starts in (none by default).
    fn thought(&self, _env: &dyn Env) -> String {
        String::new()
    }
}

/// A [`ScriptedPlayer`] as an actor: one random stream per episode, and a
/// player that has had 4·max_steps + 16 turns without finishing gives up (a
/// guard for play with no turn budget, e.g. moves the environment keeps
/// rejecting).
pub struct Scripted<P> {
    player: P,
    rngs: Vec<ChaCha8Rng>,
}

impl<P: ScriptedPlayer> Scripted<P> {
    /// `player` as an actor.
    pub fn of(player: P) -> Self {
        Self {
            player,
            rngs: vec![],
        }
    }
}

impl<P: ScriptedPlayer> Actor for Scripted<P> {
    fn begin(&mut self, specs: &[&TaskSpec]) -> Result<(), RolloutError> {
        // The j-th copy of a task in the batch (several samples of one task)
        // gets its own stream; the first keeps the task's, so a batch of
        // distinct tasks plays as it always has.
        let mut copies: HashMap<&TaskSpec, u64> = HashMap::new();
        self.rngs = specs
            .iter()
            .map(|&s| {
                let seed = self.player.stream_seed(s)?;
                let j = copies.entry(s).or_insert(0);
                let seed = match *j {
                    0 => seed,
                    j => stable_hash(&[&seed.to_le_bytes(), b"sample", &j.to_le_bytes()]),
                };
                *j += 1;
                Ok(ChaCha8Rng::seed_from_u64(seed))
            })
            .collect::<Result<_, RolloutError>>()?;
        Ok(())
    }

    fn act(
        &mut self,
        seats: &mut [Seat<'_>],
        _rng: &mut ChaCha8Rng,
    ) -> Result<Vec<Reply>, RolloutError> {
        let streams = self.rngs.len();
        let mut thoughts = Vec::with_capacity(seats.len());
        for seat in seats.iter_mut() {
            thoughts.push(self.player.thought(seat.env()));
            let limit = seat.env().max_steps().saturating_mul(4).saturating_add(16);
            if seat.turns_played() >= limit {
                continue;
            }
            let episode = seat.episode();
            let rng = self
                .rngs
                .get_mut(episode)
                .ok_or(RolloutError::NotBegun { episode, streams })?;
            self.player.turn(seat, rng);
        }
        Ok(thoughts
            .into_iter()
            .map(|thought| Reply::Played { thought })
            .collect())
    }
}

/// The environment's expert solver, `actions_per_turn` moves a turn, each
/// replaced with probability `noise` by a uniformly random valid action (an
/// ε-greedy expert that replans from wherever that leads). Imitating a noisy
/// expert gives a policy that knows the expert's move but does not reliably
/// take it: a modest prior for RL.
pub struct Expert {
    actions_per_turn: usize,
    noise: f64,
    /// Where a noisy move is drawn from.
    random_moves: RandomMoves,
    /// Think the env's [`Env::perception`] before moving.
    perceive: bool,
}

/// The actions a noisy expert's random move is drawn from.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum RandomMoves {
    /// Every valid action.
    #[default]
    Valid,
    /// The env's [`Env::safe_actions`]: the moves a reading of the state
    /// does not rule out, so that each move follows from the perception
    /// written before it.
    Safe,
}

/// The expert as an actor.
pub type ExpertActor = Scripted<Expert>;

impl ExpertActor {
    pub fn new(actions_per_turn: usize, noise: f64) -> Self {
        Scripted::of(Expert {
            actions_per_turn: actions_per_turn.max(1),
            noise,
            random_moves: RandomMoves::Valid,
            perceive: false,
        })
    }

    /// This expert, drawing its random moves from `moves`.
    pub fn random_moves(mut self, moves: RandomMoves) -> Self {
        self.player.random_moves = moves;
        self
    }

    /// This expert, thinking what it perceives (the env's
    /// [`Env::perception`]) before each turn's moves.
    pub fn perceiving(mut self, perceive: bool) -> Self {
        self.player.perceive = perceive;
        self
    }
}

impl ScriptedPlayer for Expert {
    fn stream_seed(&self, spec: &TaskSpec) -> Result<u64, RolloutError> {
        // The noise stream of a task depends only on its seed.
        Ok(stable_hash(&[b"expert-noise", &spec.seed.to_le_bytes()]))
    }

    fn thought(&self, env: &dyn Env) -> String {
        match self.perceive {
            true => env.perception().unwrap_or_default(),
            false => String::new(),
        }
    }

    fn turn(&mut self, seat: &mut Seat<'_>, rng: &mut ChaCha8Rng) {
        // The expert's next move depends on the last one's outcome, so the
        // moves of a turn are played one by one.
        while seat.actions_this_turn() < self.actions_per_turn
            && seat.actions_left() > 0
            && !seat.env().is_done()
        {
            let Some(expert) = seat.expert_action() else {
                break;
            };
            let action = if self.noise > 0.0 && rng.random::<f64>() < self.noise {
                let valid = match self.random_moves {
                    RandomMoves::Valid => seat.env().available_actions(),
                    RandomMoves::Safe => seat.env().safe_actions(),
                };
                if valid.is_empty() {
                    expert
                } else {
                    valid[rng.random_range(0..valid.len())].clone()
                }
            } else {
                expert
            };
            if !matches!(seat.play(action), Play::Stepped { .. }) {
                break;
            }
        }
    }
}

/// One uniformly random valid action a turn, from a stream per task seeded
/// by (`seed`, the task's absolute seed).
pub struct Random {
    seed: u64,
}

/// Random play as an actor.
pub type RandomActor = Scripted<Random>;

impl RandomActor {
    pub fn new(seed: u64) -> Self {
        Scripted::of(Random { seed })
    }
}

impl ScriptedPlayer for Random {
    fn stream_seed(&self, spec: &TaskSpec) -> Result<u64, RolloutError> {
        let abs = spec.absolute_seed().map_err(|e| RolloutError::Task {
            spec: spec.to_string(),
            reason: e.to_string(),
        })?;
        Ok(stable_hash(&[
            b"random-policy",
            &self.seed.to_le_bytes(),
            &abs.to_le_bytes(),
        ]))
    }

    fn turn(&mut self, seat: &mut Seat<'_>, rng: &mut ChaCha8Rng) {
        let actions = seat.env().available_actions();
        if actions.is_empty() {
            return;
        }
        let i = rng.random_range(0..actions.len());
        if let Some(action) = actions.into_iter().nth(i) {
            seat.play(action);
        }
    }
}
