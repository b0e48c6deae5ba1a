//! Procedural households: a room of the kind the task needs, receptacles up
//! to the difficulty's count, the goal objects in plausible places (never
//! already in the target), distractor objects, closed containers.

use std::collections::BTreeMap;

use rand::seq::IndexedRandom;
use rand::Rng;

use agentrl_env_core::TaskRng;

use crate::catalog::{
    recep_def, ObjDef, RecepDef, RoomKind, TaskType, DESKLAMP, OBJECTS, RECEPTACLES,
};
use crate::world::{Goal, Obj, ObjLoc, Recep, World};

/// Which tasks and how large a room a difficulty draws.
#[derive(Debug, Clone, Copy)]
pub struct Level {
    pub tasks: &'static [TaskType],
    /// Inclusive range of receptacle instances.
    pub receptacles: (usize, usize),
}

const LAMP_HOLDERS: &[&str] = &["desk", "sidetable", "dresser"];

fn types_in(room: RoomKind) -> Vec<&'static RecepDef> {
    RECEPTACLES.iter().filter(|r| r.in_room(room)).collect()
}

/// The found-in types of `o` that a room of this kind can hold.
fn plausible(o: &ObjDef, room: RoomKind) -> Vec<&'static str> {
    o.found_in
        .iter()
        .copied()
        .filter(|r| recep_def(r).is_some_and(|d| d.in_room(room)))
        .collect()
}

struct Choice {
    task: TaskType,
    room: RoomKind,
    obj: &'static ObjDef,
    target: Option<&'static str>,
    source: &'static str,
}

/// Task draws at most before [`generate`] gives up; the tables give a valid
/// choice on most draws, so this only stops a table edit from hanging.
pub const MAX_TASK_DRAWS: usize = 1000;

fn choose(rng: &mut TaskRng, tasks: &[TaskType]) -> Option<Choice> {
    (0..MAX_TASK_DRAWS).find_map(|_| {
        let task = *tasks.choose(rng).unwrap_or(&TaskType::PickAndPlace);
        let room = *task.rooms().choose(rng).unwrap_or(&RoomKind::Kitchen);
        let objs: Vec<&'static ObjDef> = OBJECTS
            .iter()
            .filter(|o| o.in_room(room) && task.accepts(o) && !plausible(o, room).is_empty())
            .collect();
        let &obj = objs.choose(rng)?;
        let places = plausible(obj, room);
        let target = if task == TaskType::LookAtObjInLight {
            None
        } else {
            let targets: Vec<&'static str> = places
                .iter()
                .copied()
                .filter(|&t| t != "garbagecan" && Some(t) != task.appliance())
                .collect();
            Some(*targets.choose(rng)?)
        };
        let sources: Vec<&'static str> = places
            .iter()
            .copied()
            .filter(|&s| Some(s) != target)
            .collect();
        let &source = sources.choose(rng)?;
        Some(Choice {
            task,
            room,
            obj,
            target,
            source,
        })
    })
}

fn goal_text(rng: &mut TaskRng, c: &Choice) -> String {
    let o = c.obj.name;
    let Some(t) = c.target else {
        return if rng.random_bool(0.5) {
            format!("look at {o} under the desklamp.")
        } else {
            format!("examine the {o} with the desklamp.")
        };
    };
    let prep = recep_def(t).map_or("in", |d| d.prep);
    let alt = rng.random_bool(0.5);
    match (c.task, alt) {
        (TaskType::PickAndPlace, false) => format!("put a {o} {prep} {t}."),
        (TaskType::PickAndPlace, true) => format!("put some {o} {prep} {t}."),
        (TaskType::PickCleanThenPlace, false) => format!("put a clean {o} {prep} {t}."),
        (TaskType::PickCleanThenPlace, true) => format!("clean some {o} and put it {prep} {t}."),
        (TaskType::PickHeatThenPlace, false) => format!("put a hot {o} {prep} {t}."),
        (TaskType::PickHeatThenPlace, true) => format!("heat some {o} and put it {prep} {t}."),
        (TaskType::PickCoolThenPlace, false) => format!("put a cool {o} {prep} {t}."),
        (TaskType::PickCoolThenPlace, true) => format!("cool some {o} and put it {prep} {t}."),
        (TaskType::PickTwoObjAndPlace, false) => format!("put two {o} {prep} {t}."),
        (TaskType::PickTwoObjAndPlace, true) => format!("find two {o} and put them {prep} {t}."),
        (TaskType::LookAtObjInLight, _) => format!("look at {o} under the desklamp."),
    }
}

/// Generate one household task for `level`; `None` when no task, room and
/// objects fitting `level` came up in [`MAX_TASK_DRAWS`] draws.
pub fn generate(rng: &mut TaskRng, level: Level) -> Option<World> {
    let c = choose(rng, level.tasks)?;
    let room = c.room;
    let pool = types_in(room);

    // Receptacle counts: the ones the task needs, then random others.
    let mut counts: BTreeMap<&'static str, u32> = BTreeMap::new();
    let mut required = vec![c.source];
    required.extend(c.target);
    required.extend(c.task.appliance());
    if c.task == TaskType::LookAtObjInLight {
        let holders: Vec<&str> = LAMP_HOLDERS
            .iter()
            .copied()
            .filter(|h| pool.iter().any(|d| d.name == *h))
            .collect();
        required.push(holders.choose(rng).copied().unwrap_or("sidetable"));
    }
    for r in required {
        counts.insert(r, 1);
    }
    let (lo, hi) = level.receptacles;
    let n = rng.random_range(lo..=hi.max(lo));
    let mut guard = 0;
    while counts.values().sum::<u32>() < n as u32 && guard < 1000 {
        guard += 1;
        let Some(d) = pool.choose(rng) else { break };
        let e = counts.entry(d.name).or_insert(0);
        if *e < d.max {
            *e += 1;
        }
    }
    let mut receps: Vec<Recep> = Vec::new();
    for (name, k) in &counts {
        let Some(def) = recep_def(name) else { continue };
        for num in 1..=*k {
            receps.push(Recep {
                def,
                num,
                open: false,
                contents: Vec::new(),
            });
        }
    }
    let instances = |ty: &str, receps: &[Recep]| -> Vec<usize> {
        receps
            .iter()
            .enumerate()
            .filter(|(_, r)| r.def.name == ty)
            .map(|(i, _)| i)
            .collect()
    };

    let mut objs: Vec<Obj> = Vec::new();
    let mut numbers: BTreeMap<&'static str, u32> = BTreeMap::new();
    let mut place =
        |def: &'static ObjDef, r: usize, objs: &mut Vec<Obj>, receps: &mut Vec<Recep>| {
            let num = numbers.entry(def.name).or_insert(0);
            *num += 1;
            objs.push(Obj {
                def,
                num: *num,
                clean: false,
                hot: false,
                cold: false,
                on: false,
                loc: ObjLoc::In(r),
            });
            receps[r].contents.push(objs.len() - 1);
        };

    // Goal objects: the first in the chosen source, the others anywhere
    // plausible except a target receptacle (so the task never starts done).
    let n_goal = match c.task {
        TaskType::PickTwoObjAndPlace => rng.random_range(2..=3),
        _ => rng.random_range(1..=2),
    };
    let goal_places: Vec<usize> = plausible(c.obj, room)
        .into_iter()
        .filter(|&t| Some(t) != c.target)
        .flat_map(|t| instances(t, &receps))
        .collect();
    let src = instances(c.source, &receps);
    if let Some(&r) = src.choose(rng) {
        place(c.obj, r, &mut objs, &mut receps);
    }
    for _ in 1..n_goal {
        if let Some(&r) = goal_places.choose(rng) {
            place(c.obj, r, &mut objs, &mut receps);
        }
    }

    // A desk lamp wherever a holder exists (always for look tasks, which
    // required one above).
    let holders: Vec<usize> = LAMP_HOLDERS
        .iter()
        .flat_map(|h| instances(h, &receps))
        .collect();
    if !holders.is_empty() && (c.task == TaskType::LookAtObjInLight || rng.random_bool(0.5)) {
        if let Some(&r) = holders.choose(rng) {
            place(&DESKLAMP, r, &mut objs, &mut receps);
        }
    }

    // Distractors: other object types of this room in plausible places.
    let others: Vec<&'static ObjDef> = OBJECTS
        .iter()
        .filter(|o| o.in_room(room) && o.name != c.obj.name)
        .collect();
    let n_distractors = receps.len() + rng.random_range(0..=receps.len() / 2);
    for _ in 0..n_distractors {
        let Some(&d) = others.choose(rng) else { break };
        let spots: Vec<usize> = plausible(d, room)
            .into_iter()
            .flat_map(|t| instances(t, &receps))
            .collect();
        if let Some(&r) = spots.choose(rng) {
            place(d, r, &mut objs, &mut receps);
        }
    }

    let text = goal_text(rng, &c);
    let seen = vec![false; receps.len()];
    Some(World {
        room,
        receps,
        objs,
        loc: None,
        holding: None,
        seen,
        goal: Goal {
            task: c.task,
            obj: c.obj.name,
            target: c.target,
            text,
        },
    })
}
