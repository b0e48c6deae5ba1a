//! The agent's partial egocentric 7×7 view (MiniGrid's, with its occlusion
//! rule) and its text rendering in AgentGym's style.

use crate::grid::{Cell, DoorState, State, DIRS};

/// View width and depth (MiniGrid's default agent_view_size).
pub const VIEW: i32 = 7;

/// Something visible that actions can name: "red ball 1", "grey door 2".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entity {
    /// "red ball" / "red door".
    pub name: String,
    /// 1-based number among visible entities of the same name, nearest first.
    pub n: usize,
    pub pos: (i32, i32),
    pub cell: Cell,
    /// Steps forward (0 = beside the agent) and to the right (negative = left).
    pub forward: i32,
    pub right: i32,
}

impl Entity {
    /// "red ball 1".
    pub fn label(&self) -> String {
        format!("{} {}", self.name, self.n)
    }

    pub fn is_door(&self) -> bool {
        matches!(self.cell, Cell::Door { .. })
    }
}

/// World position of the view cell `forward` ahead and `right` to the right.
pub fn world_pos(s: &State, forward: i32, right: i32) -> (i32, i32) {
    let (fx, fy) = DIRS[s.dir];
    let (rx, ry) = DIRS[(s.dir + 1) % 4];
    (
        s.pos.0 + forward * fx + right * rx,
        s.pos.1 + forward * fy + right * ry,
    )
}

/// Visibility mask over view coordinates `[i][j]`, i = column 0..7 (agent at
/// column 3), j = row 0..7 (agent at row 6, facing row 0). This is
/// MiniGrid's `process_vis`: light spreads outward from the agent row by row
/// and stops at walls and closed doors.
pub fn visible(s: &State) -> [[bool; VIEW as usize]; VIEW as usize] {
    let w = VIEW as usize;
    let cell = |i: usize, j: usize| {
        let forward = (VIEW - 1) - j as i32;
        let right = i as i32 - VIEW / 2;
        s.get(world_pos(s, forward, right))
    };
    let mut mask = [[false; VIEW as usize]; VIEW as usize];
    mask[w / 2][w - 1] = true;
    for j in (0..w).rev() {
        for i in 0..w - 1 {
            if !mask[i][j] || !cell(i, j).see_behind() {
                continue;
            }
            mask[i + 1][j] = true;
            if j > 0 {
                mask[i + 1][j - 1] = true;
                mask[i][j - 1] = true;
            }
        }
        for i in (1..w).rev() {
            if !mask[i][j] || !cell(i, j).see_behind() {
                continue;
            }
            mask[i - 1][j] = true;
            if j > 0 {
                mask[i - 1][j - 1] = true;
                mask[i][j - 1] = true;
            }
        }
    }
    mask
}

/// Visible objects and doors, numbered per name, nearest first.
pub fn entities(s: &State) -> Vec<Entity> {
    let mask = visible(s);
    let mut found = Vec::new();
    for (i, col) in mask.iter().enumerate() {
        for (j, &vis) in col.iter().enumerate() {
            if !vis {
                continue;
            }
            let forward = (VIEW - 1) - j as i32;
            let right = i as i32 - VIEW / 2;
            if forward == 0 && right == 0 {
                continue;
            }
            let pos = world_pos(s, forward, right);
            let c = s.get(pos);
            let name = match c {
                Cell::Obj(o) => o.name(),
                Cell::Door { color, .. } => format!("{} door", color.name()),
                _ => continue,
            };
            found.push(Entity {
                name,
                n: 0,
                pos,
                cell: c,
                forward,
                right,
            });
        }
    }
    found.sort_by_key(|e| (e.forward + e.right.abs(), e.forward, e.right));
    let mut counts: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for e in &mut found {
        let c = counts.entry(e.name.clone()).or_insert(0);
        *c += 1;
        e.n = *c;
    }
    found
}

fn steps(n: i32) -> String {
    if n == 1 {
        "1 step".to_string()
    } else {
        format!("{n} steps")
    }
}

/// "1 step right and 2 steps forward".
pub fn relative(forward: i32, right: i32) -> String {
    let side = match right.cmp(&0) {
        std::cmp::Ordering::Less => Some(format!("{} left", steps(-right))),
        std::cmp::Ordering::Greater => Some(format!("{} right", steps(right))),
        std::cmp::Ordering::Equal => None,
    };
    let ahead = (forward > 0).then(|| format!("{} forward", steps(forward)));
    match (side, ahead) {
        (Some(s), Some(a)) => format!("{s} and {a}"),
        (Some(s), None) => s,
        (None, Some(a)) => a,
        (None, None) => "here".to_string(),
    }
}

/// Distance to the first wall along a straight line in the view, if it is
/// reached before any object or door.
fn wall_along(s: &State, df: i32, dr: i32, max: i32) -> Option<i32> {
    for k in 1..=max {
        match s.get(world_pos(s, df * k, dr * k)) {
            Cell::Wall => return Some(k),
            Cell::Empty
            | Cell::Door {
                state: DoorState::Open,
                ..
            } => {}
            _ => return None,
        }
    }
    None
}

/// The observation text: what is visible, walls ahead and beside, what the
/// agent carries.
pub fn render(s: &State) -> String {
    let ents = entities(s);
    let mut lines = Vec::new();
    if ents.is_empty() {
        lines.push("You see no objects or doors.".to_string());
    } else {
        for e in &ents {
            let state = match e.cell {
                Cell::Door {
                    state: DoorState::Open,
                    ..
                } => "open ",
                Cell::Door {
                    state: DoorState::Closed,
                    ..
                } => "closed ",
                Cell::Door {
                    state: DoorState::Locked,
                    ..
                } => "locked ",
                _ => "",
            };
            lines.push(format!(
                "There is a {state}{}, {}.",
                e.label(),
                relative(e.forward, e.right)
            ));
        }
    }
    if let Some(k) = wall_along(s, 1, 0, VIEW - 1) {
        lines.push(format!("You are facing a wall {} away.", steps(k)));
    }
    if let Some(k) = wall_along(s, 0, -1, VIEW / 2) {
        lines.push(format!("There is a wall {} to your left.", steps(k)));
    }
    if let Some(k) = wall_along(s, 0, 1, VIEW / 2) {
        lines.push(format!("There is a wall {} to your right.", steps(k)));
    }
    lines.push(match s.carrying {
        Some(o) => format!("You are carrying a {}.", o.name()),
        None => "You are not carrying anything.".to_string(),
    });
    lines.join("\n")
}
