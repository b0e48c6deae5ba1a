//! Task generation: the built-in procedural recipe generator, and goal
//! selection from a loaded recipe book.

use std::collections::BTreeSet;
use std::sync::Arc;

use rand::seq::SliceRandom;
use rand::Rng;

use agentrl_env_core::TaskRng;

use crate::book::{Recipe, RecipeBook};

/// At most this many distractor recipes are shown (as AgentGym's TextCraft).
pub const MAX_DISTRACTORS: usize = 10;

/// One TextCraft task: the goal, the crafting world and the recipes shown.
#[derive(Debug, Clone)]
pub struct Task {
    pub goal: String,
    /// Recipe depth of the goal (1–4).
    pub depth: u32,
    pub book: Arc<RecipeBook>,
    /// The crafting commands listed in the first observation, needed ones
    /// and distractors shuffled together.
    pub shown: Vec<Recipe>,
}

const MATERIALS: &[&str] = &[
    "oak",
    "birch",
    "spruce",
    "jungle",
    "acacia",
    "cherry",
    "mangrove",
    "crimson",
    "warped",
    "iron",
    "gold",
    "copper",
    "stone",
    "diamond",
    "emerald",
    "quartz",
    "redstone",
    "lapis",
    "amethyst",
    "obsidian",
    "sandstone",
    "clay",
    "bamboo",
    "prismarine",
    "blackstone",
    "granite",
    "andesite",
    "diorite",
    "basalt",
    "deepslate",
];
const RAW_FORMS: &[&str] = &[
    "log", "ore", "dust", "shard", "crystal", "fiber", "chunk", "pebble", "resin", "sap",
];
const PRODUCTS: &[&str] = &[
    "planks",
    "slab",
    "stairs",
    "fence",
    "fence gate",
    "door",
    "trapdoor",
    "sign",
    "button",
    "pressure plate",
    "pickaxe",
    "axe",
    "shovel",
    "sword",
    "hoe",
    "helmet",
    "chestplate",
    "block",
    "bars",
    "chain",
    "lantern",
    "torch",
    "wall",
    "tiles",
    "bricks",
    "pillar",
    "lamp",
    "bowl",
    "bucket",
    "boat",
    "chest",
    "barrel",
    "ladder",
    "frame",
    "rod",
    "ingot",
    "sheet",
    "panel",
    "beam",
    "gear",
    "hinge",
    "rail",
];

/// Draws unique item names for one generated world.
struct Names {
    used: BTreeSet<String>,
}

/// Name draws at most for one fresh name; the name space is far larger than
/// one world, so this only stops a table edit from hanging the generator.
const MAX_NAME_DRAWS: usize = 1000;

impl Names {
    fn fresh(&mut self, rng: &mut TaskRng, forms: &[&str]) -> Option<String> {
        (0..MAX_NAME_DRAWS).find_map(|_| {
            let m = MATERIALS[rng.random_range(0..MATERIALS.len())];
            let f = forms[rng.random_range(0..forms.len())];
            let name = format!("{m} {f}");
            self.used.insert(name.clone()).then_some(name)
        })
    }
}

struct Gen<'a> {
    rng: &'a mut TaskRng,
    names: Names,
    bases: Vec<String>,
    recipes: Vec<Recipe>,
}

impl Gen<'_> {
    fn base_item(&mut self) -> Option<String> {
        // Reuse an existing base item half the time, so branches share materials.
        if !self.bases.is_empty() && self.rng.random_bool(0.5) {
            let i = self.rng.random_range(0..self.bases.len());
            return Some(self.bases[i].clone());
        }
        let name = self.names.fresh(self.rng, RAW_FORMS)?;
        self.bases.push(name.clone());
        Some(name)
    }

    /// A new crafted item of exactly `depth` (≥ 1), with its recipe subtree.
    fn crafted(&mut self, depth: u32) -> Option<String> {
        let n_inputs = self.rng.random_range(1..=3usize);
        let mut inputs: Vec<(String, u32)> = Vec::new();
        for k in 0..n_inputs {
            // The first ingredient carries the depth; the others are mostly base
            // items so that deep trees stay solvable within the turn budget.
            let d = if k == 0 {
                depth - 1
            } else if depth > 1 && self.rng.random_bool(0.25) {
                self.rng.random_range(1..depth)
            } else {
                0
            };
            let item = if d == 0 {
                self.base_item()?
            } else {
                self.crafted(d)?
            };
            if inputs.iter().any(|(i, _)| *i == item) {
                continue;
            }
            inputs.push((item, self.rng.random_range(1..=4)));
        }
        let out_count = [1, 1, 1, 2, 4][self.rng.random_range(0..5usize)];
        let name = self.names.fresh(self.rng, PRODUCTS)?;
        self.recipes
            .push(Recipe::new(name.clone(), out_count, &inputs));
        Some(name)
    }
}

/// A fresh procedural crafting world whose goal has recipe depth `depth`;
/// `None` if the name tables ran out of fresh names.
pub fn generate(rng: &mut TaskRng, depth: u32) -> Option<Task> {
    let depth = depth.clamp(1, 4);
    let mut g = Gen {
        rng,
        names: Names {
            used: BTreeSet::new(),
        },
        bases: Vec::new(),
        recipes: Vec::new(),
    };
    let goal = g.crafted(depth)?;
    let needed_n = g.recipes.len();
    // Distractors: recipes for items the goal does not need, built partly from
    // the same base items so that reading the recipe list matters.
    let n_distractors = g.rng.random_range(3..=MAX_DISTRACTORS);
    for _ in 0..n_distractors {
        let d = g.rng.random_range(1..=2);
        g.crafted(d)?;
    }
    let recipes = std::mem::take(&mut g.recipes);
    let needed: Vec<Recipe> = recipes[..needed_n].to_vec();
    let distractors: Vec<Recipe> = recipes[needed_n..].to_vec();
    let book = RecipeBook::build(&g.bases.iter().cloned().collect(), recipes);
    // Distractor subtrees add more than n_distractors recipes; keep at most 10.
    let mut shown = needed;
    let keep = distractors.len().min(MAX_DISTRACTORS);
    shown.extend(distractors.into_iter().rev().take(keep));
    shown.shuffle(g.rng);
    let depth = book.depth.get(&goal).copied().unwrap_or(depth);
    Some(Task {
        goal,
        depth,
        book: Arc::new(book),
        shown,
    })
}

/// A task on a loaded book: a goal of one of `depths`, its needed recipes and
/// up to ten distractors. Goals are drawn from the sorted list of items of
/// those depths, so an index names the same task on every machine.
pub fn from_book(rng: &mut TaskRng, book: &Arc<RecipeBook>, depths: &[u32]) -> Option<Task> {
    let mut candidates: Vec<(String, u32)> = Vec::new();
    for &d in depths {
        candidates.extend(book.items_at_depth(d).into_iter().map(|i| (i, d)));
    }
    if candidates.is_empty() {
        return None;
    }
    let (goal, depth) = candidates[rng.random_range(0..candidates.len())].clone();
    let needed = book.needed_recipes(&goal);
    let needed_items: BTreeSet<&String> = needed.iter().map(|r| &r.output).collect();
    let others: Vec<&String> = book
        .recipes
        .keys()
        .filter(|i| !needed_items.contains(i) && !book.base.contains(*i))
        .collect();
    let mut shown = needed.clone();
    let n = others.len().min(MAX_DISTRACTORS);
    let picks = rand::seq::index::sample(rng, others.len(), n);
    let mut picks: Vec<usize> = picks.into_iter().collect();
    picks.sort_unstable();
    for i in picks {
        if let Some(r) = book.primary_recipe(others[i]) {
            shown.push(r.clone());
        }
    }
    shown.shuffle(rng);
    Some(Task {
        goal,
        depth,
        book: Arc::clone(book),
        shown,
    })
}
