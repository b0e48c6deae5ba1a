//! The planner expert. It does not peek into unseen receptacles: it searches
//! them in order of plausibility for the object it needs (the catalog's
//! found-in order), remembers what it has seen, then carries out the task's
//! steps (transform at the appliance, place, or switch on the lamp).

use crate::catalog::{obj_def, TaskType, DESKLAMP};
use crate::world::{ObjLoc, World};

/// Receptacle indices in the order to search for objects of `obj_type`:
/// plausible types first (in found-in order), then the rest, by number.
fn search_order(w: &World, obj_type: &str) -> Vec<usize> {
    let found_in: &[&str] = obj_def(obj_type).map_or(&[], |d| d.found_in);
    let mut idx: Vec<usize> = (0..w.receps.len()).collect();
    idx.sort_by_key(|&r| {
        let rank = found_in
            .iter()
            .position(|t| *t == w.receps[r].def.name)
            .unwrap_or(found_in.len());
        (rank, w.receps[r].def.name, w.receps[r].num)
    });
    idx
}

/// Step towards receptacle `r` and make its inside reachable: `go to`, then
/// `open` if it is closed; `None` when already there and open.
fn reach(w: &World, r: usize) -> Option<String> {
    let name = w.receps[r].name();
    if w.loc != Some(r) {
        return Some(format!("go to {name}"));
    }
    if !w.receps[r].accessible() {
        return Some(format!("open {name}"));
    }
    None
}

/// Go look for an object of `obj_type` that `wanted` accepts: go to (and
/// open) a seen receptacle holding one and take it, or search the next
/// unseen receptacle. `take` false only locates it (for the lamp).
fn fetch(
    w: &World,
    obj_type: &str,
    wanted: &dyn Fn(usize) -> bool,
    take: bool,
) -> Option<(usize, Option<String>)> {
    let order = search_order(w, obj_type);
    for &r in &order {
        if !w.seen[r] {
            continue;
        }
        if let Some(&o) = w.receps[r]
            .contents
            .iter()
            .find(|&&o| w.objs[o].def.name == obj_type && wanted(o))
        {
            if !take {
                return Some((r, None));
            }
            let act = reach(w, r).unwrap_or_else(|| {
                format!("take {} from {}", w.objs[o].name(), w.receps[r].name())
            });
            return Some((r, Some(act)));
        }
    }
    let next = order.into_iter().find(|&r| !w.seen[r])?;
    Some((
        next,
        Some(reach(w, next).unwrap_or_else(|| format!("examine {}", w.receps[next].name()))),
    ))
}

/// The expert's next action, or `None` if it has no move.
pub fn next_action(w: &World) -> Option<String> {
    if w.success() {
        return None;
    }
    let g = &w.goal;
    let is_goal_type = |o: usize| w.objs[o].def.name == g.obj;

    // For pick-two, the target instance is the one already holding a goal
    // object, else the first of its type.
    let target = g.target.and_then(|t| {
        let of_type: Vec<usize> = (0..w.receps.len())
            .filter(|&r| w.receps[r].def.name == t)
            .collect();
        of_type
            .iter()
            .copied()
            .max_by_key(|&r| (w.goal_objs_in(r), std::cmp::Reverse(r)))
    });
    // A goal object already placed where it counts is left alone.
    let placed = |o: usize| match (w.objs[o].loc, target) {
        (ObjLoc::In(r), Some(t)) => r == t && w.transformed(o),
        _ => false,
    };

    if let Some(h) = w.holding {
        let held = w.objs[h].name();
        if is_goal_type(h) {
            if g.task == TaskType::LookAtObjInLight {
                let lit = |o: usize| w.objs[o].def.name == DESKLAMP.name;
                let (r, act) = fetch(w, DESKLAMP.name, &lit, false)?;
                if act.is_some() {
                    return act;
                }
                if w.loc != Some(r) {
                    return Some(format!("go to {}", w.receps[r].name()));
                }
                let lamp = w.receps[r]
                    .contents
                    .iter()
                    .find(|&&o| w.objs[o].def.name == DESKLAMP.name)?;
                return Some(format!("use {}", w.objs[*lamp].name()));
            }
            if let Some(app) = g.task.appliance() {
                if !w.transformed(h) {
                    let a = (0..w.receps.len()).find(|&r| w.receps[r].def.name == app)?;
                    if w.loc != Some(a) {
                        return Some(format!("go to {}", w.receps[a].name()));
                    }
                    let verb = match g.task {
                        TaskType::PickCleanThenPlace => "clean",
                        TaskType::PickHeatThenPlace => "heat",
                        _ => "cool",
                    };
                    return Some(format!("{verb} {held} with {}", w.receps[a].name()));
                }
            }
            let t = target?;
            if let Some(a) = reach(w, t) {
                return Some(a);
            }
            return Some(format!(
                "put {held} {} {}",
                w.receps[t].def.prep,
                w.receps[t].name()
            ));
        }
        // Holding something useless: put it down where we stand, or at the
        // first surface.
        if let Some(l) = w.loc {
            if w.receps[l].accessible() {
                return Some(format!(
                    "put {held} {} {}",
                    w.receps[l].def.prep,
                    w.receps[l].name()
                ));
            }
            return Some(format!("open {}", w.receps[l].name()));
        }
        let surface = (0..w.receps.len()).find(|&r| !w.receps[r].def.openable)?;
        return Some(format!("go to {}", w.receps[surface].name()));
    }

    let wanted = |o: usize| !placed(o);
    fetch(w, g.obj, &wanted, true).and_then(|(_, a)| a)
}
