//! Level generation: BabyAI's room grids (rooms of 8×8 cells sharing walls,
//! doors in the shared walls) and the missions of each level family.

use rand::seq::{IndexedRandom, SliceRandom};
use rand::Rng;

use agentrl_env_core::TaskRng;

use crate::grid::{Cell, Color, DoorState, Kind, Obj, State};
use crate::mission::{Desc, Instr, Join, Mission};

/// Room size including walls (BabyAI's default).
pub const ROOM: i32 = 8;

/// The level families.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Family {
    GoToRedBall,
    GoToLocal,
    PickupLoc,
    OpenDoor,
    PutNextLocal,
    GoTo,
    Unlock,
    BossLevel,
}

impl Family {
    pub const ALL: [Family; 8] = [
        Family::GoToRedBall,
        Family::GoToLocal,
        Family::PickupLoc,
        Family::OpenDoor,
        Family::PutNextLocal,
        Family::GoTo,
        Family::Unlock,
        Family::BossLevel,
    ];

    /// Lower-case name, also accepted as a difficulty.
    pub fn name(self) -> &'static str {
        match self {
            Family::GoToRedBall => "gotoredball",
            Family::GoToLocal => "gotolocal",
            Family::PickupLoc => "pickuploc",
            Family::OpenDoor => "opendoor",
            Family::PutNextLocal => "putnextlocal",
            Family::GoTo => "goto",
            Family::Unlock => "unlock",
            Family::BossLevel => "bosslevel",
        }
    }

    pub fn from_name(s: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == s)
    }

    /// Valid steps (text actions) before the episode ends.
    pub fn max_steps(self) -> usize {
        match self {
            Family::GoTo | Family::BossLevel => 64,
            _ => 32,
        }
    }
}

/// An empty grid of `cols × rows` rooms.
fn rooms(cols: i32, rows: i32) -> State {
    let w = (ROOM - 1) * cols + 1;
    let h = (ROOM - 1) * rows + 1;
    let mut s = State::new(w, h);
    for y in 0..h {
        for x in 0..w {
            if x % (ROOM - 1) == 0 || y % (ROOM - 1) == 0 {
                s.set((x, y), Cell::Wall);
            }
        }
    }
    s
}

/// Cells inside room (i, j).
fn interior(i: i32, j: i32) -> Vec<(i32, i32)> {
    let mut out = Vec::new();
    for y in 1..ROOM - 1 {
        for x in 1..ROOM - 1 {
            out.push((i * (ROOM - 1) + x, j * (ROOM - 1) + y));
        }
    }
    out
}

/// Put a door in the wall between room (i, j) and its right (`horizontal`)
/// or lower neighbour.
fn add_door(
    s: &mut State,
    rng: &mut TaskRng,
    i: i32,
    j: i32,
    horizontal: bool,
    color: Color,
    state: DoorState,
) {
    let off = rng.random_range(1..ROOM - 1);
    let p = if horizontal {
        ((i + 1) * (ROOM - 1), j * (ROOM - 1) + off)
    } else {
        (i * (ROOM - 1) + off, (j + 1) * (ROOM - 1))
    };
    s.set(p, Cell::Door { color, state });
}

/// Connect all rooms with closed doors: a random spanning tree, plus a few
/// extra doors.
fn connect(s: &mut State, rng: &mut TaskRng, cols: i32, rows: i32) {
    let mut edges: Vec<(i32, i32, bool)> = Vec::new();
    for j in 0..rows {
        for i in 0..cols {
            if i + 1 < cols {
                edges.push((i, j, true));
            }
            if j + 1 < rows {
                edges.push((i, j, false));
            }
        }
    }
    edges.shuffle(rng);
    // Kruskal with a tiny union-find over rooms.
    let mut parent: Vec<usize> = (0..(cols * rows) as usize).collect();
    fn find(p: &mut [usize], x: usize) -> usize {
        let mut r = x;
        while p[r] != r {
            r = p[r];
        }
        p[x] = r;
        r
    }
    for (i, j, h) in edges {
        let a = (j * cols + i) as usize;
        let b = if h { a + 1 } else { a + cols as usize };
        let (ra, rb) = (find(&mut parent, a), find(&mut parent, b));
        let color = *Color::ALL.choose(rng).unwrap_or(&Color::Grey);
        if ra != rb {
            parent[ra] = rb;
            add_door(s, rng, i, j, h, color, DoorState::Closed);
        } else if rng.random_bool(0.25) {
            add_door(s, rng, i, j, h, color, DoorState::Closed);
        }
    }
}

/// A free cell for an object or the agent: empty, not the agent's, and not
/// beside a door (so nothing blocks a doorway).
fn free_cell(s: &State, rng: &mut TaskRng, room: (i32, i32)) -> Option<(i32, i32)> {
    let cells: Vec<(i32, i32)> = interior(room.0, room.1)
        .into_iter()
        .filter(|&p| {
            s.get(p) == Cell::Empty
                && p != s.pos
                && [(1, 0), (-1, 0), (0, 1), (0, -1)]
                    .iter()
                    .all(|(dx, dy)| !matches!(s.get((p.0 + dx, p.1 + dy)), Cell::Door { .. }))
        })
        .collect();
    cells.choose(rng).copied()
}

struct Builder<'a> {
    rng: &'a mut TaskRng,
    s: State,
    next_id: u16,
}

impl Builder<'_> {
    fn place_agent(&mut self, room: (i32, i32)) {
        // Agent first: free_cell excludes the current (default) agent cell,
        // so move it out of the grid while choosing.
        self.s.pos = (-1, -1);
        if let Some(p) = free_cell(&self.s, self.rng, room) {
            self.s.pos = p;
        }
        self.s.dir = self.rng.random_range(0..4);
    }

    fn place(&mut self, kind: Kind, color: Color, room: (i32, i32)) -> Option<Obj> {
        let p = free_cell(&self.s, self.rng, room)?;
        let o = Obj {
            kind,
            color,
            id: self.next_id,
        };
        self.next_id += 1;
        self.s.set(p, Cell::Obj(o));
        Some(o)
    }

    /// `n` objects with distinct kind/colour pairs, none in `exclude`, in
    /// random rooms among `rooms`.
    fn distractors(
        &mut self,
        n: usize,
        exclude: &[(Kind, Color)],
        rooms: &[(i32, i32)],
    ) -> Vec<Obj> {
        let mut combos: Vec<(Kind, Color)> = Kind::ALL
            .iter()
            .flat_map(|&k| Color::ALL.iter().map(move |&c| (k, c)))
            .filter(|kc| !exclude.contains(kc))
            .collect();
        combos.shuffle(self.rng);
        let mut out = Vec::new();
        for (k, c) in combos.into_iter().take(n) {
            let room = *rooms.choose(self.rng).unwrap_or(&(0, 0));
            if let Some(o) = self.place(k, c, room) {
                out.push(o);
            }
        }
        out
    }

    fn all_rooms(cols: i32, rows: i32) -> Vec<(i32, i32)> {
        (0..rows)
            .flat_map(|j| (0..cols).map(move |i| (i, j)))
            .collect()
    }

    fn pick<T: Clone>(&mut self, v: &[T]) -> Option<T> {
        v.choose(self.rng).cloned()
    }

    /// A connected 3×3 grid of rooms with the agent in a random one; every
    /// room of it, for the objects.
    fn connected_grid_with_agent(&mut self) -> Option<Vec<(i32, i32)>> {
        self.s = rooms(3, 3);
        connect(&mut self.s, self.rng, 3, 3);
        let all = Builder::all_rooms(3, 3);
        let start = self.pick(&all)?;
        self.place_agent(start);
        Some(all)
    }
}

fn desc_of(o: &Obj) -> Desc {
    Desc::obj(o.kind, o.color)
}

/// Where `p` lies relative to the agent's starting pose, in BabyAI's words.
fn locs_of(s: &State, p: (i32, i32)) -> Vec<&'static str> {
    let (fx, fy) = crate::grid::DIRS[s.dir];
    let (rx, ry) = crate::grid::DIRS[(s.dir + 1) % 4];
    let (dx, dy) = (p.0 - s.pos.0, p.1 - s.pos.1);
    let f = dx * fx + dy * fy;
    let r = dx * rx + dy * ry;
    let mut out = Vec::new();
    if f > 0 {
        out.push("in front of you");
    }
    if f < 0 {
        out.push("behind you");
    }
    if r < 0 {
        out.push("on your left");
    }
    if r > 0 {
        out.push("on your right");
    }
    out
}

fn adjacent(a: (i32, i32), b: (i32, i32)) -> bool {
    (a.0 - b.0).abs() + (a.1 - b.1).abs() == 1
}

/// Every empty cell is reachable from the agent (doors count as passable)
/// and every object has an empty neighbour, so objects never wall off a
/// part of a room.
fn all_reachable(s: &State) -> bool {
    let open = |c: Cell| matches!(c, Cell::Empty | Cell::Door { .. });
    let mut seen = vec![false; (s.width * s.height) as usize];
    let idx = |p: (i32, i32)| (p.1 * s.width + p.0) as usize;
    let mut stack = vec![s.pos];
    seen[idx(s.pos)] = true;
    while let Some(p) = stack.pop() {
        for (dx, dy) in [(1, 0), (-1, 0), (0, 1), (0, -1)] {
            let q = (p.0 + dx, p.1 + dy);
            if open(s.get(q)) && !seen[idx(q)] {
                seen[idx(q)] = true;
                stack.push(q);
            }
        }
    }
    for y in 0..s.height {
        for x in 0..s.width {
            match s.get((x, y)) {
                Cell::Empty if !seen[idx((x, y))] => return false,
                Cell::Obj(_) => {
                    let has_free = [(1, 0), (-1, 0), (0, 1), (0, -1)].iter().any(|(dx, dy)| {
                        s.get((x + dx, y + dy)) == Cell::Empty || (x + dx, y + dy) == s.pos
                    });
                    if !has_free {
                        return false;
                    }
                }
                _ => {}
            }
        }
    }
    true
}

fn try_generate(rng: &mut TaskRng, family: Family) -> Option<(State, Mission)> {
    let one = [(0, 0)];
    let mut b = Builder {
        rng,
        s: rooms(1, 1),
        next_id: 0,
    };
    let mission = match family {
        Family::GoToRedBall => {
            b.place_agent((0, 0));
            b.place(Kind::Ball, Color::Red, (0, 0))?;
            b.distractors(7, &[(Kind::Ball, Color::Red)], &one);
            Mission::single(Instr::GoTo(Desc::obj(Kind::Ball, Color::Red)))
        }
        Family::GoToLocal => {
            b.place_agent((0, 0));
            let objs = b.distractors(8, &[], &one);
            Mission::single(Instr::GoTo(desc_of(&b.pick(&objs)?)))
        }
        Family::PickupLoc => {
            b.place_agent((0, 0));
            let objs = b.distractors(8, &[], &one);
            let target = b.pick(&objs)?;
            // Half the time a twin of the target makes the location words matter.
            if b.rng.random_bool(0.5) {
                b.place(target.kind, target.color, (0, 0));
            }
            let tpos = *b.s.find_objs(&|o| o.id == target.id).first()?;
            let loc = b.pick(&locs_of(&b.s, tpos))?;
            let ids: Vec<u16> =
                b.s.find_objs(&|o| o.kind == target.kind && o.color == target.color)
                    .into_iter()
                    .filter(|&p| locs_of(&b.s, p).contains(&loc))
                    .filter_map(|p| match b.s.get(p) {
                        Cell::Obj(o) => Some(o.id),
                        _ => None,
                    })
                    .collect();
            Mission::single(Instr::Pickup(Desc::Obj {
                kind: target.kind,
                color: target.color,
                ids: Some(ids),
                loc: Some(loc),
            }))
        }
        Family::OpenDoor => {
            b.s = rooms(3, 3);
            // Connect every room first, so the whole grid is reachable; the
            // centre doors placed next may replace some of these, never the
            // other way round (the mission's door must exist).
            connect(&mut b.s, b.rng, 3, 3);
            let mut colors = Color::ALL.to_vec();
            colors.shuffle(b.rng);
            // The centre room's four doors, in distinct colours.
            add_door(&mut b.s, b.rng, 0, 1, true, colors[0], DoorState::Closed);
            add_door(&mut b.s, b.rng, 1, 1, true, colors[1], DoorState::Closed);
            add_door(&mut b.s, b.rng, 1, 0, false, colors[2], DoorState::Closed);
            add_door(&mut b.s, b.rng, 1, 1, false, colors[3], DoorState::Closed);
            b.place_agent((1, 1));
            b.distractors(4, &[], &[(1, 1)]);
            let c = colors[b.rng.random_range(0..4)];
            Mission::single(Instr::Open(Desc::Door { color: c }))
        }
        Family::PutNextLocal => {
            b.place_agent((0, 0));
            let objs = b.distractors(8, &[], &one);
            let a = b.pick(&objs)?;
            let others: Vec<Obj> = objs.iter().copied().filter(|o| o.id != a.id).collect();
            let c = b.pick(&others)?;
            Mission::single(Instr::PutNext(desc_of(&a), desc_of(&c)))
        }
        Family::GoTo => {
            let all = b.connected_grid_with_agent()?;
            let objs = b.distractors(12, &[], &all);
            Mission::single(Instr::GoTo(desc_of(&b.pick(&objs)?)))
        }
        Family::Unlock => {
            b.s = rooms(2, 1);
            let c = *Color::ALL.choose(b.rng)?;
            add_door(&mut b.s, b.rng, 0, 0, true, c, DoorState::Locked);
            b.place_agent((0, 0));
            b.place(Kind::Key, c, (0, 0))?;
            b.distractors(3, &[(Kind::Key, c)], &[(0, 0), (1, 0)]);
            Mission::single(Instr::Open(Desc::Door { color: c }))
        }
        Family::BossLevel => {
            let all = b.connected_grid_with_agent()?;
            let objs = b.distractors(10, &[], &all);
            let doors = b.s.find_doors(None);
            let mut instrs = Vec::new();
            for _ in 0..2 {
                let instr = match b.rng.random_range(0..5) {
                    0 => Instr::GoTo(desc_of(&b.pick(&objs)?)),
                    1 => Instr::Pickup(desc_of(&b.pick(&objs)?)),
                    2 => {
                        let d = b.pick(&doors)?;
                        match b.s.get(d) {
                            Cell::Door { color, .. } => Instr::Open(Desc::Door { color }),
                            _ => return None,
                        }
                    }
                    3 => {
                        let d = b.pick(&doors)?;
                        match b.s.get(d) {
                            Cell::Door { color, .. } => Instr::GoTo(Desc::Door { color }),
                            _ => return None,
                        }
                    }
                    _ => {
                        let a = b.pick(&objs)?;
                        let others: Vec<Obj> =
                            objs.iter().copied().filter(|o| o.id != a.id).collect();
                        Instr::PutNext(desc_of(&a), desc_of(&b.pick(&others)?))
                    }
                };
                instrs.push(instr);
            }
            // Two instructions on the same object can contradict each other
            // ("go to the ball after you pick up the ball"): redraw.
            let descs = |i: &Instr| -> Vec<Desc> {
                match i {
                    Instr::GoTo(d) | Instr::Pickup(d) | Instr::Open(d) => vec![d.clone()],
                    Instr::PutNext(a, c) => vec![a.clone(), c.clone()],
                }
            };
            let (d0, d1) = (descs(&instrs[0]), descs(&instrs[1]));
            if d0.iter().any(|d| d1.contains(d)) {
                return None;
            }
            let join = *[Join::And, Join::Then, Join::After].choose(b.rng)?;
            Mission {
                instrs,
                join: Some(join),
            }
        }
    };
    // Reject a mission already (partly) satisfied at the start, and put-next
    // pairs that start side by side.
    if mission.instrs.iter().any(|i| i.satisfied(&b.s)) {
        return None;
    }
    for i in &mission.instrs {
        if let Instr::PutNext(x, y) = i {
            let (xs, ys) = (x.cells(&b.s), y.cells(&b.s));
            if xs.iter().any(|&p| ys.iter().any(|&q| adjacent(p, q))) {
                return None;
            }
        }
    }
    if b.s.pos.0 < 0 || !all_reachable(&b.s) {
        return None;
    }
    Some((b.s, mission))
}

/// Layouts drawn at most for one level; every family succeeds on most draws.
pub const MAX_LAYOUT_DRAWS: usize = 1000;

/// Generate a level of `family`, redrawing (from the same RNG stream) until
/// the layout is valid; `None` after [`MAX_LAYOUT_DRAWS`] invalid layouts.
pub fn generate(rng: &mut TaskRng, family: Family) -> Option<(State, Mission)> {
    (0..MAX_LAYOUT_DRAWS).find_map(|_| try_generate(rng, family))
}
