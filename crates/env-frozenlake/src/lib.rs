//! FrozenLake as RAGEN uses it: an N×N slippery lake with holes and a goal.
//!
//! Maps come from gymnasium's random-map generator (each cell frozen with
//! probability 0.8, redrawn until solvable); the player starts top-left, the
//! goal is bottom-right. On slippery ice the intended move happens with
//! probability `1 - slip` and each perpendicular move with `slip / 2`
//! (RAGEN: 1/3 each, i.e. `slip = 2/3`). Reward 1 at the goal, else 0.

mod generator;
mod parser;
mod solver;

use agentrl_env_core::{
    chance_rng, direction_names, param_error, param_in_range, parse_params, safe_or_valid,
    stable_hash, stable_hash_words, task_rng, Env, EnvDescriptor, EnvError, EnvParams, Episode,
    Outcome, Step, StepError, TaskConfig, TaskSpec, MAX_STEPS_PARAM,
};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;

pub use generator::{generate_map, Map, Tile, MAX_MAP_DRAWS};
pub use parser::{parse_action, Action, ACTIONS};
pub use solver::{outcomes, solve, Policy};

/// Registry name.
pub const NAME: &str = "frozenlake";
/// Difficulty levels; the first is the default.
pub const DIFFICULTIES: &[&str] = &["easy", "hard"];
/// Label of the slip draws' RNG stream.
const SLIP_STREAM: &[u8] = b"frozenlake-slip";

/// RAGEN's slip: the intended move and each perpendicular move 1/3 each.
pub const DEFAULT_SLIP: f64 = 2.0 / 3.0;

/// The registry entry.
pub fn descriptor() -> EnvDescriptor {
    EnvDescriptor {
        name: NAME,
        summary:
            "slippery N×N ice with holes; reach the goal (RAGEN FrozenLake; easy 4×4, hard 6×6)",
        difficulties: DIFFICULTIES,
        default_max_turns: 5,
        request_params: &["slip", "is_slippery", "size", "frozen_prob", "max_steps"],
        operator_params: &[],
        factory: |spec, params| Ok(Box::new(FrozenLake::new(spec, params)?)),
    }
}

/// Everything that shapes a task, from the difficulty and the `[env]` params.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Side of the square map.
    pub size: usize,
    /// Probability that a generated cell is frozen (gymnasium's `p`).
    pub frozen_prob: f64,
    /// Probability that a move slips to one of the two perpendicular directions.
    pub slip: f64,
    /// Valid steps before the episode ends unsuccessfully.
    pub max_steps: usize,
}

/// The `[env]` params; an absent key keeps the config's value.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    slip: Option<f64>,
    is_slippery: Option<bool>,
    size: Option<usize>,
    frozen_prob: Option<f64>,
    max_steps: Option<usize>,
}

impl TaskConfig for Config {
    /// Defaults of a difficulty: easy 4×4, hard 6×6; RAGEN's slip; 100 steps.
    fn for_difficulty(difficulty: &str) -> Result<Self, EnvError> {
        let size = match difficulty {
            "easy" => 4,
            "hard" => 6,
            other => return Err(EnvError::unknown_difficulty(NAME, other, DIFFICULTIES)),
        };
        Ok(Self {
            size,
            frozen_prob: 0.8,
            slip: DEFAULT_SLIP,
            max_steps: 100,
        })
    }

    /// This config with `[env]` params applied: `slip` (0 ≤ slip ≤ 1),
    /// `is_slippery` (bool; false means `slip = 0`), `size` (2–16),
    /// `frozen_prob` (0 < p ≤ 1), `max_steps` (1–1000).
    fn with_params(mut self, params: &EnvParams) -> Result<Self, EnvError> {
        let p: Params = parse_params(NAME, params)?;
        if let Some(slip) = p.slip {
            self.slip = param_in_range(NAME, "slip", slip, 0.0..=1.0)?;
        }
        if p.is_slippery == Some(false) {
            if p.slip.is_some_and(|s| s > 0.0) {
                return Err(param_error(
                    NAME,
                    "is_slippery",
                    "is_slippery=false contradicts slip > 0",
                ));
            }
            self.slip = 0.0;
        }
        if let Some(size) = p.size {
            self.size = param_in_range(NAME, "size", size, 2..=16)?;
        }
        if let Some(frozen_prob) = p.frozen_prob {
            if !(frozen_prob > 0.0 && frozen_prob <= 1.0) {
                return Err(param_error(NAME, "frozen_prob", "must be in (0, 1]"));
            }
            self.frozen_prob = frozen_prob;
        }
        if let Some(max_steps) = p.max_steps {
            self.max_steps = param_in_range(NAME, "max_steps", max_steps, 1..=MAX_STEPS_PARAM)?;
        }
        Ok(self)
    }
}

/// One FrozenLake task.
#[derive(Debug, Clone)]
pub struct FrozenLake {
    spec: TaskSpec,
    config: Config,
    map: Map,
    map_hash: u64,
    pos: usize,
    episode: Episode,
    /// The slip stream as it is at reset, so a reset replays identically.
    slip_rng_start: ChaCha8Rng,
    slip_rng: ChaCha8Rng,
    /// Expert policy, computed on first use (value iteration is not free and
    /// most envs in training never ask for it).
    policy: Option<Policy>,
}

impl FrozenLake {
    /// Generate the task of `spec` with `[env]` params.
    pub fn new(spec: &TaskSpec, params: &EnvParams) -> Result<Self, EnvError> {
        let config = Config::for_task(spec, params)?;
        let mut rng = task_rng(spec)?;
        let map = generate_map(&mut rng, config.size, config.frozen_prob).ok_or_else(|| {
            EnvError::generation(
                NAME,
                format!(
                    "no {0}×{0} map with frozen_prob {1} had a path from start to goal in \
                     {MAX_MAP_DRAWS} draws; raise frozen_prob or lower size",
                    config.size, config.frozen_prob
                ),
            )
        })?;
        Self::from_map(spec, config, map)
    }

    /// An env playing a given map (tests, hand-made tasks). The map must be
    /// `config.size` square with the start at 0 and the goal at the last cell.
    pub fn from_map(spec: &TaskSpec, config: Config, map: Map) -> Result<Self, EnvError> {
        if map.size != config.size || map.tiles.len() != map.size * map.size || map.size < 2 {
            return Err(EnvError::InvalidSpec(
                "map does not match the configured size".into(),
            ));
        }
        // The slip stream is separate from the map stream so that changing
        // the slip parameter does not change the map.
        let slip_rng = chance_rng(SLIP_STREAM, spec, 0)?;
        let map_hash = stable_hash(&[&map.to_bytes(), &config.slip.to_le_bytes()]);
        Ok(Self {
            spec: spec.clone(),
            pos: map.start(),
            episode: Episode::new(config.max_steps),
            config,
            map,
            map_hash,
            slip_rng_start: slip_rng.clone(),
            slip_rng,
            policy: None,
        })
    }

    /// The lake.
    pub fn map(&self) -> &Map {
        &self.map
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The player's cell (row-major index).
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Render the grid with RAGEN's symbols.
    fn render(&self) -> String {
        let n = self.map.size;
        let mut s = String::with_capacity(n * (n + 1) + 2);
        for (i, tile) in self.map.tiles.iter().enumerate() {
            if i > 0 && i % n == 0 {
                s.push('\n');
            }
            let c = if i == self.pos {
                match tile {
                    Tile::Hole => 'X',
                    Tile::Goal => '√',
                    _ => 'P',
                }
            } else {
                match tile {
                    Tile::Start | Tile::Frozen => '_',
                    Tile::Hole => 'O',
                    Tile::Goal => 'G',
                }
            };
            s.push(c);
        }
        s
    }

    /// The direction the ice actually sends the player when `intended` is chosen.
    fn slide(&mut self, intended: Action) -> Action {
        if self.config.slip <= 0.0 {
            return intended;
        }
        let u: f64 = self.slip_rng.random();
        let [a, b] = intended.perpendicular();
        if u < self.config.slip / 2.0 {
            a
        } else if u < self.config.slip {
            b
        } else {
            intended
        }
    }

    /// The tile one step from the player in direction `a`; `None` past the edge.
    fn neighbour(&self, a: Action) -> Option<Tile> {
        let n = self.map.size as isize;
        let (row, col) = ((self.pos as isize) / n, (self.pos as isize) % n);
        let (dr, dc) = a.delta();
        let (r, c) = (row + dr, col + dc);
        match (0..n).contains(&r) && (0..n).contains(&c) {
            true => Some(self.map.tiles[(r * n + c) as usize]),
            false => None,
        }
    }
}

impl Env for FrozenLake {
    fn spec(&self) -> &TaskSpec {
        &self.spec
    }

    fn instructions(&self) -> String {
        let slip = if self.config.slip > 0.0 {
            format!(
                "The ice is slippery: the intended move happens with probability {:.2}; \
                 otherwise you slide to one of the two perpendicular directions \
                 (probability {:.2} each). Moving into the edge leaves you in place.",
                1.0 - self.config.slip,
                self.config.slip / 2.0
            )
        } else {
            "The ice is not slippery: every move goes where you intend. \
             Moving into the edge leaves you in place."
                .to_string()
        };
        format!(
            "FrozenLake: you are on a {n}×{n} frozen lake. Reach the goal without falling into a hole.\n\
             Symbols: P = you, _ = frozen ice, O = hole, G = goal, X = you in a hole, √ = you on the goal.\n\
             {slip}\n\
             Actions: Left, Down, Right, Up (or 1, 2, 3, 4).\n\
             Reward: 1 when you reach the goal, otherwise 0. Falling into a hole ends the game; \
             so does running out of steps ({max} steps).",
            n = self.map.size,
            max = self.config.max_steps
        )
    }

    fn set_chance_stream(&mut self, stream: u64) {
        // The spec was checked when the env was built, so this cannot fail.
        if let Ok(rng) = chance_rng(SLIP_STREAM, &self.spec, stream) {
            self.slip_rng_start = rng.clone();
            self.slip_rng = rng;
        }
    }

    fn reset(&mut self) -> String {
        self.pos = self.map.start();
        self.episode.reset();
        self.slip_rng = self.slip_rng_start.clone();
        self.render()
    }

    fn step(&mut self, action: &str) -> Result<Step, StepError> {
        let intended = self.episode.begin(action, parse_action)?;
        let moved = self.slide(intended);
        let next = self.map.neighbour(self.pos, moved.delta());
        let effective = next != self.pos;
        self.pos = next;
        let (reward, outcome) = match self.map.tiles[next] {
            Tile::Goal => (1.0, Outcome::Won),
            Tile::Hole => (0.0, Outcome::Lost),
            Tile::Start | Tile::Frozen => (0.0, Outcome::Running),
        };
        self.episode.settle(outcome);
        Ok(self
            .episode
            .step_result(self.render(), reward, effective, serde_json::Map::new()))
    }

    fn observation(&self) -> String {
        self.render()
    }

    fn available_actions(&self) -> Vec<String> {
        self.episode.offer(|| direction_names(&ACTIONS))
    }

    fn state_key(&self) -> u64 {
        stable_hash_words([self.map_hash, self.pos as u64])
    }

    fn expert_action(&mut self) -> Option<String> {
        if self.episode.is_done() {
            return None;
        }
        let (slip, horizon) = (self.config.slip, self.config.max_steps);
        let map = &self.map;
        let policy = self.policy.get_or_insert_with(|| solve(map, slip, horizon));
        let action = policy.action(self.pos, self.episode.steps_left());
        Some(action.name().to_string())
    }

    fn episode(&self) -> Option<&Episode> {
        Some(&self.episode)
    }

    /// What lies one step away in each direction, in the observation's own
    /// symbols (`Left O, Down _, Right edge, Up edge`): the two-hop lookup
    /// (find `P`, read its neighbour) a policy must make before it can
    /// avoid holes.
    fn perception(&self) -> Option<String> {
        let readings: Vec<String> = ACTIONS
            .iter()
            .map(|&a| {
                let seen = match self.neighbour(a) {
                    None => "edge",
                    Some(Tile::Start | Tile::Frozen) => "_",
                    Some(Tile::Hole) => "O",
                    Some(Tile::Goal) => "G",
                };
                format!("{} {seen}", a.name())
            })
            .collect();
        Some(readings.join(", "))
    }

    /// The moves onto a lake cell that is not a hole (the perception's `_`
    /// and `G`; not `O`, not `edge`); every valid move when there is none.
    fn safe_actions(&self) -> Vec<String> {
        let safe = ACTIONS
            .iter()
            .filter(|&&a| matches!(self.neighbour(a), Some(t) if t != Tile::Hole))
            .map(|a| a.name().to_string())
            .collect();
        safe_or_valid(self.available_actions(), safe)
    }
}

#[cfg(test)]
mod tests;
