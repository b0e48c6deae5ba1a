//! BabyAI: grid-world missions with a partial egocentric text view, as
//! AgentGym-RL serves them.
//!
//! Rooms of 8×8 cells with shared walls and doors (locked doors open with the
//! key of their colour); balls, boxes and keys in six colours. The agent sees
//! MiniGrid's 7×7 egocentric view, rendered to text ("There is a red ball 1,
//! 1 step right and 2 steps forward."). Actions are the primitives (turn
//! left/right, move forward, pick up, drop, toggle) and AgentGym's high-level
//! actions on visible things (`go to red ball 1`, `pickup red ball 1`,
//! `go through grey door 1`, `toggle and go through grey door 1`, `check
//! available actions`). Reward on success is MiniGrid's
//! `1 − 0.9 · steps / max_steps`, counting text actions.

pub mod generator;
pub mod grid;
pub mod mission;
pub mod parser;
pub mod solver;
pub mod view;

use agentrl_env_core::{
    parse_params, stable_hash, task_rng, Env, EnvDescriptor, EnvError, EnvParams, Episode, Outcome,
    Step, StepError, TaskSpec,
};
use rand::seq::IndexedRandom;
use serde::Deserialize;

pub use generator::Family;
pub use grid::{Cell, Color, DoorState, Kind, Obj, Prim, State};
pub use mission::{Desc, Instr, Join, Mission};
pub use parser::{parse, Action, Target};

/// Registry name.
pub const NAME: &str = "babyai";
/// Difficulties: `easy` (default), `medium`, `hard`, then one per family.
pub const DIFFICULTIES: &[&str] = &[
    "easy",
    "medium",
    "hard",
    "gotoredball",
    "gotolocal",
    "pickuploc",
    "opendoor",
    "putnextlocal",
    "goto",
    "unlock",
    "bosslevel",
];

/// What an impossible action answers.
pub const NOTHING_HAPPENS: &str = "Nothing happens.";

/// The families a difficulty draws from.
pub fn families_of(difficulty: &str) -> Option<Vec<Family>> {
    Some(match difficulty {
        "easy" => vec![Family::GoToRedBall, Family::GoToLocal, Family::PickupLoc],
        "medium" => vec![Family::OpenDoor, Family::PutNextLocal, Family::Unlock],
        "hard" => vec![
            Family::GoTo,
            Family::Unlock,
            Family::PutNextLocal,
            Family::BossLevel,
        ],
        other => vec![Family::from_name(other)?],
    })
}

/// The registry entry.
pub fn descriptor() -> EnvDescriptor {
    EnvDescriptor {
        name: NAME,
        summary: "BabyAI grid missions (go to, pick up, open, unlock, put next to) with a partial egocentric text view",
        difficulties: DIFFICULTIES,
        default_max_turns: 20,
        request_params: &["show_available_actions"],
        operator_params: &[],
        factory: |spec, params| Ok(Box::new(BabyAi::new(spec, params)?)),
    }
}

/// The `[env]` params.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    /// Append the valid-action list to every observation, as AgentGym does.
    #[serde(default)]
    show_available_actions: bool,
}

/// One BabyAI episode.
#[derive(Debug, Clone)]
pub struct BabyAi {
    spec: TaskSpec,
    family: Family,
    initial: State,
    state: State,
    mission: Mission,
    done_instrs: Vec<bool>,
    show_actions: bool,
    last_obs: String,
    episode: Episode,
}

impl BabyAi {
    /// Create the task a spec names. Parameter: `show_available_actions`
    /// (bool, default false) appends the valid-action list to every
    /// observation, as AgentGym does.
    pub fn new(spec: &TaskSpec, params: &EnvParams) -> Result<Self, EnvError> {
        let params: Params = parse_params(NAME, params)?;
        let families = families_of(&spec.difficulty)
            .ok_or_else(|| EnvError::unknown_difficulty(NAME, &spec.difficulty, DIFFICULTIES))?;
        let mut rng = task_rng(spec)?;
        let family = *families.choose(&mut rng).unwrap_or(&Family::GoToLocal);
        let (state, mission) = generator::generate(&mut rng, family).ok_or_else(|| {
            EnvError::generation(
                NAME,
                format!(
                    "no valid {family:?} layout in {} draws",
                    generator::MAX_LAYOUT_DRAWS
                ),
            )
        })?;
        let mut env = Self::from_parts(spec.clone(), family, state, mission);
        env.show_actions = params.show_available_actions;
        env.reset();
        Ok(env)
    }

    /// An episode on a given layout (hand-made levels in tests).
    pub fn from_parts(spec: TaskSpec, family: Family, state: State, mission: Mission) -> Self {
        let n = mission.instrs.len();
        let mut env = Self {
            spec,
            family,
            initial: state.clone(),
            state,
            mission,
            done_instrs: vec![false; n],
            show_actions: false,
            last_obs: String::new(),
            episode: Episode::new(family.max_steps()),
        };
        env.reset();
        env
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    pub fn mission(&self) -> &Mission {
        &self.mission
    }

    pub fn family(&self) -> Family {
        self.family
    }

    fn view_text(&self) -> String {
        let mut s = format!(
            "Your goal: {}\n{}",
            self.mission.text(),
            view::render(&self.state)
        );
        if self.show_actions {
            s.push_str(&format!(
                "\nAvailable actions: {}",
                self.available_actions().join(", ")
            ));
        }
        s
    }

    /// Apply primitives in order, latching mission progress after each;
    /// stops at the first that fails. Returns how many changed the state.
    fn run(&mut self, prims: &[Prim]) -> usize {
        let mut n = 0;
        for &p in prims {
            if !self.state.apply(p) {
                break;
            }
            n += 1;
            self.mission.update(&self.state, &mut self.done_instrs);
        }
        n
    }

    fn resolve(&self, t: &Target) -> Option<view::Entity> {
        let name = t.name();
        view::entities(&self.state)
            .into_iter()
            .find(|e| e.name == name && e.n == t.n)
    }

    /// Path (open doors only) after which `pos` is in front of the agent.
    fn approach(&self, pos: (i32, i32)) -> Option<Vec<Prim>> {
        self.state.plan(&|p| p == pos, false)
    }

    /// Apply an action; returns whether it changed anything.
    fn apply(&mut self, action: &Action) -> bool {
        match action {
            Action::Prim(p) => self.run(&[*p]) > 0,
            Action::CheckActions => false,
            Action::GoTo(t)
            | Action::Pickup(t)
            | Action::GoThrough(t)
            | Action::ToggleGoThrough(t) => {
                let Some(e) = self.resolve(t) else {
                    return false;
                };
                let Some(mut prims) = self.approach(e.pos) else {
                    return false;
                };
                match action {
                    Action::Pickup(_) => {
                        if e.is_door() || self.state.carrying.is_some() {
                            return false;
                        }
                        prims.push(Prim::Pickup);
                    }
                    Action::GoThrough(_) => {
                        if !matches!(
                            e.cell,
                            Cell::Door {
                                state: DoorState::Open,
                                ..
                            }
                        ) {
                            return false;
                        }
                        prims.extend([Prim::Forward, Prim::Forward]);
                    }
                    Action::ToggleGoThrough(_) => {
                        if !e.is_door() {
                            return false;
                        }
                        if !matches!(
                            e.cell,
                            Cell::Door {
                                state: DoorState::Open,
                                ..
                            }
                        ) {
                            prims.push(Prim::Toggle);
                        }
                        prims.extend([Prim::Forward, Prim::Forward]);
                    }
                    _ => {}
                }
                self.run(&prims) > 0
            }
        }
    }
}

impl Env for BabyAi {
    fn spec(&self) -> &TaskSpec {
        &self.spec
    }

    fn instructions(&self) -> String {
        "You are an agent in a grid world of rooms, walls and doors, with balls, boxes and keys in six colours \
         (red, green, blue, purple, yellow, grey). You see a 7x7 area in front of you; walls and closed doors \
         block the view. Complete the goal. Locked doors open with a key of the same colour. You can carry one \
         object at a time.\n\
         Actions: turn left, turn right, move forward, pick up, drop, toggle (open/close the door in front of \
         you), go to <obj> <n>, pickup <obj> <n>, go through <door> <n>, toggle and go through <door> <n>, \
         check available actions. <obj> <n> names something you currently see, e.g. \"go to red ball 1\"."
            .to_string()
    }

    fn reset(&mut self) -> String {
        self.state = self.initial.clone();
        self.done_instrs = vec![false; self.mission.instrs.len()];
        self.episode.reset();
        self.last_obs = self.view_text();
        self.last_obs.clone()
    }

    fn step(&mut self, action: &str) -> Result<Step, StepError> {
        let act = self.episode.begin(action, parse)?;
        let effective = self.apply(&act);
        let mut reward = 0.0;
        if self.done_instrs.iter().all(|d| *d) {
            self.episode.settle(Outcome::Won);
            let (steps, max) = (self.episode.steps(), self.episode.max_steps());
            reward = 1.0 - 0.9 * (steps as f64 / max as f64);
        } else {
            self.episode.settle(Outcome::Running);
        }
        let prefix = match act {
            Action::CheckActions => format!(
                "Available actions: {}\n",
                self.available_actions().join(", ")
            ),
            _ if !effective => format!("{NOTHING_HAPPENS}\n"),
            _ => String::new(),
        };
        let obs = format!("{prefix}{}", self.view_text());
        self.last_obs = obs.clone();
        let mut extra = serde_json::Map::new();
        extra.insert("family".into(), self.family.name().into());
        Ok(self.episode.step_result(obs, reward, effective, extra))
    }

    fn observation(&self) -> String {
        self.last_obs.clone()
    }

    fn available_actions(&self) -> Vec<String> {
        let mut out: Vec<String> = [
            Prim::Left,
            Prim::Right,
            Prim::Forward,
            Prim::Pickup,
            Prim::Drop,
            Prim::Toggle,
        ]
        .iter()
        .map(|p| p.text().to_string())
        .collect();
        for e in view::entities(&self.state) {
            let l = e.label();
            out.push(format!("go to {l}"));
            if e.is_door() {
                out.push(format!("go through {l}"));
                out.push(format!("toggle and go through {l}"));
            } else {
                out.push(format!("pickup {l}"));
            }
        }
        out.push("check available actions".into());
        out
    }

    fn state_key(&self) -> u64 {
        let s = &self.state;
        let mut bytes: Vec<u8> = Vec::with_capacity(s.cells.len() * 2 + 16);
        for c in &s.cells {
            match c {
                Cell::Empty => bytes.push(0),
                Cell::Wall => bytes.push(1),
                Cell::Door { color, state } => bytes.extend([2, *color as u8, *state as u8]),
                Cell::Obj(o) => bytes.extend([3, o.kind as u8, o.color as u8]),
            }
        }
        bytes.extend(s.pos.0.to_le_bytes());
        bytes.extend(s.pos.1.to_le_bytes());
        bytes.push(s.dir as u8);
        match s.carrying {
            Some(o) => bytes.extend([o.kind as u8, o.color as u8]),
            None => bytes.push(0xff),
        }
        bytes.extend(self.done_instrs.iter().map(|d| *d as u8));
        stable_hash(&[self.mission.text().as_bytes(), &bytes])
    }

    fn expert_action(&mut self) -> Option<String> {
        if self.episode.is_done() {
            return None;
        }
        solver::next_action(&self.state, &self.mission, &self.done_instrs)
    }

    fn episode(&self) -> Option<&Episode> {
        Some(&self.episode)
    }
}
