//! ALFWorld-style text household tasks.
//!
//! The agent stands in a procedurally furnished room (kitchen, bedroom,
//! bathroom or living room) and must complete one of ALFWorld's six task
//! types with ALFWorld's observation wording and action grammar. Impossible
//! but well-formed actions answer "Nothing happens." (a valid step with no
//! effect); text that does not parse is an invalid action.

pub mod catalog;
pub mod generator;
pub mod parser;
pub mod solver;
pub mod world;

use agentrl_env_core::{
    parse_params, stable_hash, task_rng, Env, EnvDescriptor, EnvError, EnvParams, Episode, Outcome,
    Step, StepError, TaskSpec,
};
use serde::Deserialize;

pub use catalog::TaskType;
pub use generator::Level;
pub use parser::{parse, Action};
pub use world::{World, NOTHING_HAPPENS};

/// Registry name.
pub const NAME: &str = "alfworld";
/// Difficulties: `easy` (default), `medium`, `hard`, and one per task type.
pub const DIFFICULTIES: &[&str] = &[
    "easy",
    "medium",
    "hard",
    "pick_and_place",
    "look_at_obj_in_light",
    "pick_clean_then_place",
    "pick_heat_then_place",
    "pick_cool_then_place",
    "pick_two_obj_and_place",
];
/// Valid steps before the episode ends unsuccessfully (ALFWorld's 50).
pub const MAX_STEPS: usize = 50;

const EASY_TASKS: &[TaskType] = &[TaskType::PickAndPlace, TaskType::LookAtObjInLight];

/// The level a difficulty names.
pub fn level_of(difficulty: &str) -> Option<Level> {
    Some(match difficulty {
        "easy" => Level {
            tasks: EASY_TASKS,
            receptacles: (5, 7),
        },
        "medium" => Level {
            tasks: &TaskType::ALL,
            receptacles: (7, 10),
        },
        "hard" => Level {
            tasks: &TaskType::ALL,
            receptacles: (11, 16),
        },
        other => {
            let t = TaskType::from_name(other)?;
            let i = TaskType::ALL.iter().position(|x| *x == t)?;
            Level {
                tasks: &TaskType::ALL[i..=i],
                receptacles: (7, 12),
            }
        }
    })
}

/// The registry entry.
pub fn descriptor() -> EnvDescriptor {
    EnvDescriptor {
        name: NAME,
        summary: "ALFWorld-style household tasks (pick & place, look in light, clean, heat, cool, pick two)",
        difficulties: DIFFICULTIES,
        default_max_turns: 30,
        request_params: &[],
        operator_params: &[],
        factory: |spec, params| Ok(Box::new(AlfWorld::new(spec, params)?)),
    }
}

/// The `[env]` params: none.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {}

/// One household episode.
#[derive(Debug, Clone)]
pub struct AlfWorld {
    spec: TaskSpec,
    initial: World,
    world: World,
    last_obs: String,
    episode: Episode,
}

impl AlfWorld {
    /// Create the task a spec names; this env takes no parameters.
    pub fn new(spec: &TaskSpec, params: &EnvParams) -> Result<Self, EnvError> {
        let Params {} = parse_params(NAME, params)?;
        let level = level_of(&spec.difficulty)
            .ok_or_else(|| EnvError::unknown_difficulty(NAME, &spec.difficulty, DIFFICULTIES))?;
        let mut rng = task_rng(spec)?;
        let world = generator::generate(&mut rng, level).ok_or_else(|| {
            EnvError::generation(
                NAME,
                format!(
                    "no task fitting the level in {} draws",
                    generator::MAX_TASK_DRAWS
                ),
            )
        })?;
        Ok(Self::from_world(spec.clone(), world))
    }

    /// An episode on a given household (hand-made layouts in tests).
    pub fn from_world(spec: TaskSpec, world: World) -> Self {
        let mut env = Self {
            spec,
            initial: world.clone(),
            world,
            last_obs: String::new(),
            episode: Episode::new(MAX_STEPS),
        };
        env.reset();
        env
    }

    /// The current household state.
    pub fn world(&self) -> &World {
        &self.world
    }
}

impl Env for AlfWorld {
    fn spec(&self) -> &TaskSpec {
        &self.spec
    }

    fn instructions(&self) -> String {
        "Interact with a household to solve a task. Each turn you get an observation and answer with one action. \
         Available actions:\n\
         - go to X: walk to receptacle X (e.g. go to cabinet 1)\n\
         - open X / close X: open or close a receptacle you stand at\n\
         - take O from X: pick up object O from the receptacle you stand at (you hold one object at a time)\n\
         - put O in/on X: put the object you hold into or onto the receptacle you stand at\n\
         - clean O with sinkbasin 1 / heat O with microwave 1 / cool O with fridge 1: at that appliance, holding O\n\
         - use desklamp 1: switch on a desk lamp where you stand\n\
         - examine X, inventory, look\n\
         If an action is not possible, the observation is \"Nothing happens.\"."
            .to_string()
    }

    fn reset(&mut self) -> String {
        self.world = self.initial.clone();
        self.episode.reset();
        self.last_obs = self.world.intro();
        self.last_obs.clone()
    }

    fn step(&mut self, action: &str) -> Result<Step, StepError> {
        let act = self.episode.begin(action, parse)?;
        let (obs, effective) = self.world.apply(&act);
        self.episode.settle(if self.world.success() {
            Outcome::Won
        } else {
            Outcome::Running
        });
        self.last_obs = obs.clone();
        let mut extra = serde_json::Map::new();
        extra.insert("task_type".into(), self.world.goal.task.name().into());
        let reward = if self.episode.is_success() { 1.0 } else { 0.0 };
        Ok(self.episode.step_result(obs, reward, effective, extra))
    }

    fn observation(&self) -> String {
        self.last_obs.clone()
    }

    /// ALFWorld's admissible commands for the current state.
    fn available_actions(&self) -> Vec<String> {
        let w = &self.world;
        let mut out = Vec::new();
        for (i, r) in w.receps.iter().enumerate() {
            if w.loc != Some(i) {
                out.push(format!("go to {}", r.name()));
            }
        }
        if let Some(l) = w.loc {
            let r = &w.receps[l];
            let name = r.name();
            if r.def.openable {
                out.push(if r.open {
                    format!("close {name}")
                } else {
                    format!("open {name}")
                });
            }
            out.push(format!("examine {name}"));
            if r.accessible() {
                for &o in &r.contents {
                    let ob = &w.objs[o];
                    if w.holding.is_none() && ob.def.pickable {
                        out.push(format!("take {} from {name}", ob.name()));
                    }
                    if ob.def.name == "desklamp" && !ob.on {
                        out.push(format!("use {}", ob.name()));
                    }
                }
                if let Some(h) = w.holding {
                    out.push(format!("put {} {} {name}", w.objs[h].name(), r.def.prep));
                }
            }
            if let Some(h) = w.holding {
                let hd = w.objs[h].def;
                let hn = w.objs[h].name();
                match r.def.name {
                    "sinkbasin" if hd.cleanable => out.push(format!("clean {hn} with {name}")),
                    "microwave" if hd.heatable => out.push(format!("heat {hn} with {name}")),
                    "fridge" if hd.coolable => out.push(format!("cool {hn} with {name}")),
                    _ => {}
                }
            }
        }
        if let Some(h) = w.holding {
            out.push(format!("examine {}", w.objs[h].name()));
        }
        out.push("inventory".into());
        out.push("look".into());
        out
    }

    fn state_key(&self) -> u64 {
        let w = &self.world;
        let mut bytes: Vec<u8> = Vec::new();
        bytes.extend_from_slice(w.goal.text.as_bytes());
        bytes.extend_from_slice(&(w.loc.map_or(u64::MAX, |l| l as u64)).to_le_bytes());
        bytes.extend_from_slice(&(w.holding.map_or(u64::MAX, |h| h as u64)).to_le_bytes());
        for r in &w.receps {
            bytes.push(r.open as u8);
            for &o in &r.contents {
                bytes.extend_from_slice(&(o as u64).to_le_bytes());
            }
            bytes.push(0xfe);
        }
        for o in &w.objs {
            bytes
                .push(o.clean as u8 | (o.hot as u8) << 1 | (o.cold as u8) << 2 | (o.on as u8) << 3);
        }
        stable_hash(&[self.spec.to_string().as_bytes(), &bytes])
    }

    fn expert_action(&mut self) -> Option<String> {
        if self.episode.is_done() {
            return None;
        }
        solver::next_action(&self.world)
    }

    fn episode(&self) -> Option<&Episode> {
        Some(&self.episode)
    }
}
