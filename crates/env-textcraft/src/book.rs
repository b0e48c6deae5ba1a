//! Recipes and the recipe book a task is played against.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// One crafting recipe: `craft {out_count} {output} using {count} {input}, …`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Recipe {
    pub output: String,
    /// How many items one application of the recipe makes.
    pub out_count: u32,
    /// Ingredients with their counts per application, sorted by name, no duplicates.
    pub inputs: Vec<(String, u32)>,
}

impl Recipe {
    /// Build a recipe, merging duplicate ingredients and sorting them so
    /// two recipes with the same ingredients compare equal.
    pub fn new(output: impl Into<String>, out_count: u32, inputs: &[(String, u32)]) -> Self {
        let mut merged: BTreeMap<String, u32> = BTreeMap::new();
        for (name, count) in inputs {
            *merged.entry(name.clone()).or_insert(0) += count;
        }
        Self {
            output: output.into(),
            out_count: out_count.max(1),
            inputs: merged.into_iter().collect(),
        }
    }

    /// The crafting command that applies this recipe `batches` times.
    pub fn command(&self, batches: u32) -> String {
        let inputs: Vec<String> = self
            .inputs
            .iter()
            .map(|(name, c)| format!("{} {}", c * batches, name))
            .collect();
        format!(
            "craft {} {} using {}",
            self.out_count * batches,
            self.output,
            inputs.join(", ")
        )
    }
}

impl fmt::Display for Recipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.command(1))
    }
}

/// Every item, recipe and base item of a crafting world.
///
/// Base items are obtained with `get`; every other item must be crafted.
/// `depth` is 0 for base items and `1 + max(depth of ingredients)` through the
/// item's primary recipe (the shallowest one), which is the one the expert
/// uses and the prompt shows.
#[derive(Debug, Clone, Default)]
pub struct RecipeBook {
    /// All recipes that make each item (alternatives in a stable order).
    pub recipes: BTreeMap<String, Vec<Recipe>>,
    pub base: BTreeSet<String>,
    pub depth: BTreeMap<String, u32>,
    /// Index into `recipes[item]` of the shallowest recipe.
    pub primary: BTreeMap<String, usize>,
}

impl RecipeBook {
    /// Build a book from recipes and the items that are known to exist.
    ///
    /// Items without a recipe are base items. Recipe cycles (iron ingot ↔ iron
    /// block ↔ iron nugget in Minecraft) are broken by making base the item of
    /// the cycle that the most other unresolved items are made from (the
    /// ingot), so that every item gets a finite depth.
    pub fn build(items: &BTreeSet<String>, recipes: Vec<Recipe>) -> Self {
        let mut by_item: BTreeMap<String, Vec<Recipe>> = BTreeMap::new();
        for r in recipes {
            let list = by_item.entry(r.output.clone()).or_default();
            if !list.contains(&r) {
                list.push(r);
            }
        }
        let mut all: BTreeSet<String> = items.clone();
        for (out, list) in &by_item {
            all.insert(out.clone());
            for r in list {
                for (i, _) in &r.inputs {
                    all.insert(i.clone());
                }
            }
        }
        let mut base: BTreeSet<String> = all
            .iter()
            .filter(|i| !by_item.contains_key(*i))
            .cloned()
            .collect();
        let mut depth: BTreeMap<String, u32> = base.iter().map(|b| (b.clone(), 0)).collect();
        let mut primary: BTreeMap<String, usize> = BTreeMap::new();
        loop {
            // Bellman-style relaxation to a fixed point: shallowest recipe wins,
            // the first listed recipe on ties.
            let mut changed = true;
            while changed {
                changed = false;
                for (out, list) in &by_item {
                    if base.contains(out) {
                        continue;
                    }
                    for (idx, r) in list.iter().enumerate() {
                        let d = r
                            .inputs
                            .iter()
                            .map(|(i, _)| depth.get(i).copied())
                            .try_fold(0u32, |acc, d| d.map(|d| acc.max(d)));
                        if let Some(d) = d {
                            let d = d + 1;
                            if depth.get(out).is_none_or(|&old| d < old) {
                                depth.insert(out.clone(), d);
                                primary.insert(out.clone(), idx);
                                changed = true;
                            }
                        }
                    }
                }
            }
            let unresolved: Vec<&String> =
                by_item.keys().filter(|i| !depth.contains_key(*i)).collect();
            if unresolved.is_empty() {
                break;
            }
            let unresolved_set: BTreeSet<&String> = unresolved.iter().copied().collect();
            // How many unresolved items use each unresolved item as an ingredient.
            let mut uses: BTreeMap<&String, usize> = BTreeMap::new();
            for out in &unresolved {
                let mut seen = BTreeSet::new();
                for r in &by_item[*out] {
                    for (i, _) in &r.inputs {
                        if unresolved_set.contains(i) && seen.insert(i) {
                            *uses.entry(i).or_insert(0) += 1;
                        }
                    }
                }
            }
            // Most used first; names break ties (BTreeMap order), so the choice is stable.
            let pick = unresolved
                .iter()
                .max_by(|a, b| {
                    let ua = uses.get(*a).copied().unwrap_or(0);
                    let ub = uses.get(*b).copied().unwrap_or(0);
                    ua.cmp(&ub).then_with(|| b.cmp(a))
                })
                .map(|s| (*s).clone());
            match pick {
                Some(p) => {
                    depth.insert(p.clone(), 0);
                    base.insert(p);
                }
                None => break,
            }
        }
        Self {
            recipes: by_item,
            base,
            depth,
            primary,
        }
    }

    /// The recipe the expert uses for `item`, if it is craftable.
    pub fn primary_recipe(&self, item: &str) -> Option<&Recipe> {
        if self.base.contains(item) {
            return None;
        }
        let idx = *self.primary.get(item)?;
        self.recipes.get(item)?.get(idx)
    }

    /// Craftable items whose depth is `d`, sorted by name.
    pub fn items_at_depth(&self, d: u32) -> Vec<String> {
        self.depth
            .iter()
            .filter(|(i, &dd)| dd == d && !self.base.contains(*i))
            .map(|(i, _)| i.clone())
            .collect()
    }

    /// The primary recipes needed to craft `goal` from base items, goal first,
    /// each recipe once.
    pub fn needed_recipes(&self, goal: &str) -> Vec<Recipe> {
        let mut out: Vec<Recipe> = Vec::new();
        let mut seen = BTreeSet::new();
        let mut stack = vec![goal.to_string()];
        while let Some(item) = stack.pop() {
            if !seen.insert(item.clone()) {
                continue;
            }
            if let Some(r) = self.primary_recipe(&item) {
                for (i, _) in r.inputs.iter().rev() {
                    stack.push(i.clone());
                }
                out.push(r.clone());
            }
        }
        out
    }

    /// Whether `item` is known to this book at all.
    pub fn knows(&self, item: &str) -> bool {
        self.base.contains(item) || self.recipes.contains_key(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(out: &str, n: u32, ins: &[(&str, u32)]) -> Recipe {
        let ins: Vec<(String, u32)> = ins.iter().map(|(a, b)| (a.to_string(), *b)).collect();
        Recipe::new(out, n, &ins)
    }

    #[test]
    fn depth_follows_shallowest_recipe() {
        let book = RecipeBook::build(
            &BTreeSet::new(),
            vec![
                r("planks", 4, &[("log", 1)]),
                r("stick", 4, &[("planks", 2)]),
                r("stick", 1, &[("log", 1)]),
            ],
        );
        assert_eq!(book.depth["log"], 0);
        assert_eq!(book.depth["planks"], 1);
        assert_eq!(book.depth["stick"], 1);
        assert_eq!(
            book.primary_recipe("stick").unwrap().inputs,
            vec![("log".to_string(), 1)]
        );
    }

    #[test]
    fn cycles_are_broken_at_the_most_used_item() {
        let book = RecipeBook::build(
            &BTreeSet::new(),
            vec![
                r("iron block", 1, &[("iron ingot", 9)]),
                r("iron ingot", 9, &[("iron block", 1)]),
                r("iron ingot", 1, &[("iron nugget", 9)]),
                r("iron nugget", 9, &[("iron ingot", 1)]),
            ],
        );
        assert!(book.base.contains("iron ingot"));
        assert_eq!(book.depth["iron block"], 1);
        assert_eq!(book.depth["iron nugget"], 1);
    }

    #[test]
    fn recipe_command_scales_with_batches() {
        let rec = r("stick", 4, &[("planks", 2)]);
        assert_eq!(rec.command(2), "craft 8 stick using 4 planks");
    }
}
