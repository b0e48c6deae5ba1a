//! TextCraft: Minecraft-style crafting (AgentGym-RL's TextCraft).
//!
//! The first observation lists crafting commands (the recipes the goal needs
//! plus up to ten distractors) and the goal. Base items come from
//! `get N item`; everything else is made with `craft N X using N a, N b`.
//! The episode succeeds (reward 1) when the goal item is in the inventory.
//!
//! Worlds come from a built-in procedural generator (recipe depth 1–4), or
//! from the `items.json` / `recipes.json` of the `minecraft-data` package when
//! the env parameter `data_dir` names a directory holding them.

pub mod book;
pub mod generator;
pub mod loader;
pub mod parser;
pub mod solver;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agentrl_env_core::{
    parse_params, stable_hash, task_rng, Env, EnvDescriptor, EnvError, EnvParams, Episode, Outcome,
    SharedCache, Step, StepError, TaskSpec,
};
use serde::Deserialize;

pub use book::{Recipe, RecipeBook};
pub use generator::Task;
pub use parser::{parse, Command};

/// Registry name.
pub const NAME: &str = "textcraft";
/// Difficulties; `easy` (depth 1) is the default.
pub const DIFFICULTIES: &[&str] = &[
    "easy", "medium", "hard", "depth1", "depth2", "depth3", "depth4",
];
/// Valid steps before the episode ends unsuccessfully.
pub const MAX_STEPS: usize = 40;

/// The registry entry.
pub fn descriptor() -> EnvDescriptor {
    EnvDescriptor {
        name: NAME,
        summary: "Minecraft-style crafting: get base items, craft the goal through a recipe tree (depth 1-4)",
        difficulties: DIFFICULTIES,
        default_max_turns: 30,
        request_params: &[],
        operator_params: &["data_dir"],
        factory: |spec, params| Ok(Box::new(TextCraft::new(spec, params)?)),
    }
}

/// Recipe depths a difficulty draws goals from.
pub fn depths_of(difficulty: &str) -> Option<&'static [u32]> {
    Some(match difficulty {
        "easy" | "depth1" => &[1],
        "medium" | "depth2" => &[2],
        "hard" => &[3, 4],
        "depth3" => &[3],
        "depth4" => &[4],
        _ => return None,
    })
}

/// Loaded books by directory, so that creating many envs reads the files once.
fn load_cached(dir: &Path) -> Result<Arc<RecipeBook>, EnvError> {
    // Data directories come from the operator; a few at most.
    static BOOKS: SharedCache<PathBuf, RecipeBook> = SharedCache::new(4);
    BOOKS.get_or_try_build(dir.to_path_buf(), || {
        loader::load_dir(dir).map_err(|e| EnvError::Data {
            env: NAME.into(),
            path: dir.display().to_string(),
            reason: e.to_string(),
        })
    })
}

/// The `[env]` params.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    /// A directory holding minecraft-data's `items.json` and `recipes.json`.
    data_dir: Option<PathBuf>,
}

/// One TextCraft episode.
#[derive(Debug, Clone)]
pub struct TextCraft {
    spec: TaskSpec,
    task: Task,
    inventory: BTreeMap<String, u32>,
    last_obs: String,
    episode: Episode,
}

impl TextCraft {
    /// Create the task a spec names. Parameters: `data_dir` (optional path to
    /// minecraft-data's `items.json` and `recipes.json`).
    pub fn new(spec: &TaskSpec, params: &EnvParams) -> Result<Self, EnvError> {
        let Params { data_dir } = parse_params(NAME, params)?;
        let depths = depths_of(&spec.difficulty)
            .ok_or_else(|| EnvError::unknown_difficulty(NAME, &spec.difficulty, DIFFICULTIES))?;
        let mut rng = task_rng(spec)?;
        let task = match data_dir {
            None => {
                let d = if depths.len() == 1 {
                    depths[0]
                } else {
                    depths[rand::Rng::random_range(&mut rng, 0..depths.len())]
                };
                generator::generate(&mut rng, d).ok_or_else(|| {
                    EnvError::generation(NAME, "the item-name tables ran out of fresh names")
                })?
            }
            Some(dir) => {
                let book = load_cached(&dir)?;
                generator::from_book(&mut rng, &book, depths).ok_or_else(|| EnvError::Data {
                    env: NAME.into(),
                    path: dir.display().to_string(),
                    reason: format!("no craftable item of depth {depths:?}"),
                })?
            }
        };
        Ok(Self::from_task(spec.clone(), task))
    }

    /// An episode on a given task (hand-made tasks in tests).
    pub fn from_task(spec: TaskSpec, task: Task) -> Self {
        let mut env = Self {
            spec,
            task,
            inventory: BTreeMap::new(),
            last_obs: String::new(),
            episode: Episode::new(MAX_STEPS),
        };
        env.reset();
        env
    }

    /// The task being played.
    pub fn task(&self) -> &Task {
        &self.task
    }

    /// The current inventory.
    pub fn inventory(&self) -> &BTreeMap<String, u32> {
        &self.inventory
    }

    fn initial_observation(&self) -> String {
        let mut s = String::from("Crafting commands:\n");
        for r in &self.task.shown {
            s.push_str(&r.command(1));
            s.push('\n');
        }
        s.push_str(&format!("\nGoal: craft {}.", self.task.goal));
        s
    }

    fn inventory_text(&self) -> String {
        let held: Vec<String> = self
            .inventory
            .iter()
            .filter(|(_, &n)| n > 0)
            .map(|(i, n)| format!("[{i}] ({n})"))
            .collect();
        if held.is_empty() {
            "Inventory: You are not carrying anything.".into()
        } else {
            format!("Inventory: {}", held.join(", "))
        }
    }

    /// Apply a parsed command; returns the message and whether it changed state.
    fn apply(&mut self, cmd: Command) -> (String, bool) {
        let book = Arc::clone(&self.task.book);
        match cmd {
            Command::Inventory => (self.inventory_text(), false),
            Command::Get { count, item } => {
                if book.base.contains(&item) {
                    *self.inventory.entry(item.clone()).or_insert(0) += count;
                    (format!("Got {count} {item}"), true)
                } else if book.knows(&item) {
                    (
                        format!("Could not get {item}: it has to be crafted."),
                        false,
                    )
                } else {
                    (format!("Could not find {item}"), false)
                }
            }
            Command::Craft {
                count,
                item,
                inputs,
            } => {
                let Some(recipes) = book.recipes.get(&item) else {
                    return (format!("Could not find a valid recipe for {item}"), false);
                };
                let given: BTreeMap<&str, u32> =
                    inputs.iter().map(|(i, c)| (i.as_str(), *c)).collect();
                let same_names: Vec<&Recipe> = recipes
                    .iter()
                    .filter(|r| {
                        r.inputs.len() == given.len()
                            && r.inputs.iter().all(|(i, _)| given.contains_key(i.as_str()))
                    })
                    .collect();
                let Some(first) = same_names.first() else {
                    return (
                        format!("Could not find a valid recipe for {item} using those ingredients"),
                        false,
                    );
                };
                // Minecraft has recipes with equal ingredients and different
                // amounts; accept whichever one the counts fit.
                let fits = |r: &Recipe| {
                    count % r.out_count == 0
                        && r.inputs.iter().all(|(i, c)| {
                            given.get(i.as_str()).copied() == Some(c * (count / r.out_count))
                        })
                };
                let Some(recipe) = same_names.iter().copied().find(|r| fits(r)) else {
                    if count % first.out_count != 0 {
                        return (
                            format!(
                                "Wrong item number: {item} is crafted {} at a time",
                                first.out_count
                            ),
                            false,
                        );
                    }
                    return (
                        format!("Wrong ingredient amounts to craft {count} {item}"),
                        false,
                    );
                };
                let batches = count / recipe.out_count;
                if recipe
                    .inputs
                    .iter()
                    .any(|(i, c)| self.inventory.get(i).copied().unwrap_or(0) < c * batches)
                {
                    return (
                        format!("Could not find enough items to craft {count} {item}"),
                        false,
                    );
                }
                for (i, c) in &recipe.inputs {
                    if let Some(n) = self.inventory.get_mut(i) {
                        *n -= c * batches;
                    }
                }
                self.inventory.retain(|_, n| *n > 0);
                *self.inventory.entry(item.clone()).or_insert(0) += count;
                (format!("Crafted {count} {item}"), true)
            }
        }
    }
}

impl Env for TextCraft {
    fn spec(&self) -> &TaskSpec {
        &self.spec
    }

    fn instructions(&self) -> String {
        "You are given a few useful crafting recipes to craft items in Minecraft. Crafting commands are of the \
         format \"craft [target object] using [input ingredients]\".\n\
         Every round I will give you an observation; you have to respond with one action. Valid actions:\n\
         - get N item: obtain N of a base item (items that have no recipe), e.g. \"get 2 oak log\";\n\
         - craft N item using N a, N b: craft with a listed recipe, e.g. \"craft 4 oak planks using 1 oak log\"; \
         N must be a multiple of what the recipe makes and the ingredient counts must scale with it;\n\
         - inventory: list what you hold.\n\
         The task is done when the goal item is in your inventory."
            .to_string()
    }

    fn reset(&mut self) -> String {
        self.inventory.clear();
        self.episode.reset();
        self.last_obs = self.initial_observation();
        self.last_obs.clone()
    }

    fn step(&mut self, action: &str) -> Result<Step, StepError> {
        let cmd = self.episode.begin(action, parse)?;
        let (mut msg, effective) = self.apply(cmd);
        if self.inventory.get(&self.task.goal).copied().unwrap_or(0) > 0 {
            self.episode.settle(Outcome::Won);
            msg.push_str(&format!(
                "\nTask completed: you have crafted {}.",
                self.task.goal
            ));
        } else if self.episode.settle(Outcome::Running) {
            msg.push_str("\nOut of steps.");
        }
        self.last_obs = msg.clone();
        let mut extra = serde_json::Map::new();
        extra.insert("depth".into(), self.task.depth.into());
        let reward = if self.episode.is_success() { 1.0 } else { 0.0 };
        Ok(self.episode.step_result(msg, reward, effective, extra))
    }

    fn observation(&self) -> String {
        self.last_obs.clone()
    }

    fn available_actions(&self) -> Vec<String> {
        let mut out = vec!["inventory".to_string()];
        let mut bases = std::collections::BTreeSet::new();
        for r in &self.task.shown {
            for (i, _) in &r.inputs {
                if self.task.book.base.contains(i) {
                    bases.insert(i.clone());
                }
            }
        }
        out.extend(bases.into_iter().map(|b| format!("get 1 {b}")));
        for r in &self.task.shown {
            if r.inputs
                .iter()
                .all(|(i, c)| self.inventory.get(i).copied().unwrap_or(0) >= *c)
            {
                out.push(r.command(1));
            }
        }
        out
    }

    fn state_key(&self) -> u64 {
        let mut parts: Vec<Vec<u8>> = vec![self.task.goal.as_bytes().to_vec()];
        for (i, n) in &self.inventory {
            parts.push(i.as_bytes().to_vec());
            parts.push(n.to_le_bytes().to_vec());
        }
        let refs: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
        stable_hash(&refs)
    }

    fn expert_action(&mut self) -> Option<String> {
        if self.episode.is_done() {
            return None;
        }
        solver::next_action(&self.task.book, &self.inventory, &self.task.goal, 1)
    }

    fn episode(&self) -> Option<&Episode> {
        Some(&self.episode)
    }
}
