//! The planner expert: BFS over (cell, facing) with door and key handling,
//! speaking AgentGym's high-level actions when their target is visible
//! ("pickup red ball 1", "toggle and go through grey door 1") and primitive
//! moves otherwise.

use crate::grid::{Cell, DoorState, Kind, Prim, State};
use crate::mission::{Desc, Instr, Mission};
use crate::view::entities;

const NEIGHBOURS: [(i32, i32); 4] = [(1, 0), (-1, 0), (0, 1), (0, -1)];

/// What to do once the targeted cell is in front of the agent.
enum Finish {
    /// Nothing: facing it is the goal (go to).
    Face,
    Do(Prim),
}

fn near_door(s: &State, p: (i32, i32)) -> bool {
    NEIGHBOURS
        .iter()
        .any(|(dx, dy)| matches!(s.get((p.0 + dx, p.1 + dy)), Cell::Door { .. }))
}

/// Targets and finishing move for the instruction, handling the hand:
/// a wrong object held is dropped first, a locked door sends the agent for
/// its key.
fn subgoal(s: &State, instr: &Instr) -> (Vec<(i32, i32)>, Finish) {
    let drop_spot = |s: &State| -> Vec<(i32, i32)> {
        let mut v = Vec::new();
        for y in 0..s.height {
            for x in 0..s.width {
                if s.get((x, y)) == Cell::Empty && !near_door(s, (x, y)) && (x, y) != s.pos {
                    v.push((x, y));
                }
            }
        }
        v
    };
    let fetch = |s: &State, d: &Desc| -> (Vec<(i32, i32)>, Finish) {
        match s.carrying {
            Some(o) if !d.matches_obj(&o) => (drop_spot(s), Finish::Do(Prim::Drop)),
            _ => (d.cells(s), Finish::Do(Prim::Pickup)),
        }
    };
    match instr {
        Instr::GoTo(d) => (d.cells(s), Finish::Face),
        Instr::Pickup(d) => fetch(s, d),
        Instr::Open(d) => {
            let shut: Vec<(i32, i32)> = d
                .cells(s)
                .into_iter()
                .filter(|&p| {
                    !matches!(
                        s.get(p),
                        Cell::Door {
                            state: DoorState::Open,
                            ..
                        }
                    )
                })
                .collect();
            let openable: Vec<(i32, i32)> = shut
                .iter()
                .copied()
                .filter(|&p| match s.get(p) {
                    Cell::Door {
                        state: DoorState::Locked,
                        color,
                    } => s
                        .carrying
                        .is_some_and(|k| k.kind == Kind::Key && k.color == color),
                    _ => true,
                })
                .collect();
            if !openable.is_empty() {
                return (openable, Finish::Do(Prim::Toggle));
            }
            // Every matching door is locked: fetch the key of its colour.
            match shut.first().map(|&p| s.get(p)) {
                Some(Cell::Door { color, .. }) => fetch(s, &Desc::obj(Kind::Key, color)),
                _ => (Vec::new(), Finish::Face),
            }
        }
        Instr::PutNext(a, b) => match s.carrying {
            Some(o) if a.matches_obj(&o) => {
                let mut spots = Vec::new();
                for pb in b.cells(s) {
                    for (dx, dy) in NEIGHBOURS {
                        let p = (pb.0 + dx, pb.1 + dy);
                        if s.get(p) == Cell::Empty && p != s.pos {
                            spots.push(p);
                        }
                    }
                }
                (spots, Finish::Do(Prim::Drop))
            }
            _ => fetch(s, a),
        },
    }
}

/// The expert's next action text, or `None` when it has no move.
pub fn next_action(s: &State, m: &Mission, done: &[bool]) -> Option<String> {
    let cur = m.current(done)?;
    let (targets, finish) = subgoal(s, &m.instrs[cur]);
    if targets.is_empty() {
        return None;
    }
    if targets.contains(&s.front()) {
        return match finish {
            Finish::Do(p) => Some(p.text().to_string()),
            Finish::Face => None,
        };
    }
    let is_target = |p: (i32, i32)| targets.contains(&p);
    let plan = s.plan(&is_target, true)?;
    let ents = entities(s);

    // A visible target reachable without opening doors: one high-level action.
    if s.plan(&is_target, false).is_some() {
        if let Some(e) = ents.iter().find(|e| targets.contains(&e.pos)) {
            match finish {
                Finish::Do(Prim::Pickup) if !e.is_door() => {
                    return Some(format!("pickup {}", e.label()))
                }
                Finish::Face | Finish::Do(Prim::Toggle) => {
                    return Some(format!("go to {}", e.label()))
                }
                _ => {}
            }
        }
    }
    // The first door on the path, if visible: go through it in one action.
    let mut sim = s.clone();
    for &a in &plan {
        if a == Prim::Forward {
            if let Cell::Door { .. } = sim.get(sim.front()) {
                let door = sim.front();
                // The real door, not the simulated one a planned toggle opened.
                let open = matches!(
                    s.get(door),
                    Cell::Door {
                        state: DoorState::Open,
                        ..
                    }
                );
                if let Some(e) = ents.iter().find(|e| e.pos == door) {
                    let verb = if open {
                        "go through"
                    } else {
                        "toggle and go through"
                    };
                    return Some(format!("{verb} {}", e.label()));
                }
                break;
            }
        }
        sim.apply(a);
    }
    plan.first().map(|p| p.text().to_string())
}
