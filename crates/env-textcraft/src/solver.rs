//! The recipe-planner expert: walk the goal's recipe tree depth first,
//! getting missing base items and crafting each intermediate in one batch.

use std::collections::BTreeMap;

use crate::book::RecipeBook;

/// Guard against malformed books; real trees are at most a few levels deep.
const MAX_DEPTH: usize = 64;

/// The first action of a plan that ends with `qty` of `item` in the
/// inventory, given the current inventory; `None` when nothing is missing.
///
/// The inventory is consumed as the plan reserves items, so an item already
/// held counts once even when two branches need it.
pub fn next_action(
    book: &RecipeBook,
    inv: &BTreeMap<String, u32>,
    item: &str,
    qty: u32,
) -> Option<String> {
    let mut inv = inv.clone();
    first_missing(book, &mut inv, item, qty, 0)
}

fn first_missing(
    book: &RecipeBook,
    inv: &mut BTreeMap<String, u32>,
    item: &str,
    qty: u32,
    depth: usize,
) -> Option<String> {
    let have = inv.get(item).copied().unwrap_or(0);
    if have >= qty {
        inv.insert(item.to_string(), have - qty);
        return None;
    }
    let need = qty - have;
    inv.insert(item.to_string(), 0);
    let recipe = match book.primary_recipe(item) {
        Some(r) if depth < MAX_DEPTH => r,
        _ => return Some(format!("get {need} {item}")),
    };
    let batches = need.div_ceil(recipe.out_count);
    for (input, c) in &recipe.inputs {
        if let Some(a) = first_missing(book, inv, input, c * batches, depth + 1) {
            return Some(a);
        }
    }
    Some(recipe.command(batches))
}
