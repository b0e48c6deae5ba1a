//! The expert: an attribute matcher that acts through the shop's pages.
//!
//! It searches for the goal's attributes, product noun and option values,
//! scores every result with WebShop's reward (choosing, per product, the
//! option values that match the goal), opens the best result (paging with
//! `next >` / `< prev` to reach it), clicks the matching options and buys.
//! It decides from the current page alone, so it also takes over mid-episode.

use crate::catalog::Goal;
use crate::reward::{normalize_color, reward, token_set_ratio};
use crate::{Page, WebShopEnv, RESULTS_PER_PAGE};

/// The query the expert types: attributes, the product noun, option values.
pub fn representative_query(goal: &Goal) -> String {
    let mut parts: Vec<&str> = goal.attributes.iter().map(|s| s.as_str()).collect();
    if !goal.query.is_empty() {
        parts.push(&goal.query);
    }
    parts.extend(goal.options.iter().map(|(_, v)| v.as_str()));
    parts.join(" ")
}

/// Per goal option, the first value of `product` that matches it, at most one
/// per option group (a group holds one chosen value).
fn matching_values(env: &WebShopEnv, product: usize) -> Vec<String> {
    let p = &env.world.products[product];
    let mut used_groups: Vec<&str> = Vec::new();
    let mut out = Vec::new();
    for (_, want) in &env.goal.options {
        let want = normalize_color(want);
        let found = p
            .options
            .iter()
            .filter(|(g, _)| !used_groups.contains(&g.as_str()))
            .find_map(|(g, vs)| {
                vs.iter()
                    .find(|v| token_set_ratio(&normalize_color(v), &want) > 85)
                    .map(|v| (g.as_str(), v))
            });
        if let Some((g, v)) = found {
            used_groups.push(g);
            out.push(v.clone());
        }
    }
    out
}

/// The reward of buying `product` with its best option values.
pub(crate) fn achievable(env: &WebShopEnv, product: usize) -> f64 {
    let p = &env.world.products[product];
    reward(p, &env.goal, p.price, &matching_values(env, product)).total
}

/// Position (in the result list) of the best result; ties go to the first.
fn best_result(env: &WebShopEnv) -> Option<(usize, f64)> {
    let mut best: Option<(usize, f64)> = None;
    for (pos, &i) in env.results.iter().enumerate() {
        let r = achievable(env, i);
        if best.is_none_or(|(_, b)| r > b + 1e-12) {
            best = Some((pos, r));
        }
    }
    best
}

pub(crate) fn next_action(env: &WebShopEnv) -> Option<String> {
    match &env.page {
        Page::Search => Some(format!("search[{}]", representative_query(&env.goal))),
        Page::Results { page } => {
            let Some((pos, best)) = best_result(env) else {
                return Some("click[back to search]".into());
            };
            // Someone else's search that holds no perfect product: search again.
            if best < 1.0 - 1e-9 && env.query != representative_query(&env.goal) {
                return Some("click[back to search]".into());
            }
            let target_page = pos / RESULTS_PER_PAGE;
            if target_page > *page {
                Some("click[next >]".into())
            } else if target_page < *page {
                Some("click[< prev]".into())
            } else {
                Some(format!(
                    "click[{}]",
                    env.world.products[env.results[pos]].asin.to_lowercase()
                ))
            }
        }
        Page::Item { product, .. } => {
            let best = best_result(env).map(|(_, r)| r).unwrap_or(0.0);
            if achievable(env, *product) + 1e-12 < best {
                return Some("click[< prev]".into());
            }
            let p = &env.world.products[*product];
            for v in matching_values(env, *product) {
                let group = p
                    .options
                    .iter()
                    .find(|(_, vs)| vs.contains(&v))
                    .map(|(n, _)| n);
                if let Some(g) = group {
                    if env.selected.get(g) != Some(&v) {
                        return Some(format!("click[{v}]"));
                    }
                }
            }
            Some("click[buy now]".into())
        }
        Page::Detail { .. } => Some("click[< prev]".into()),
    }
}
