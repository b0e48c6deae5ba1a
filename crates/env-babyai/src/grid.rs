//! The grid world: cells, the agent, primitive actions and path planning.

use std::collections::VecDeque;

/// BabyAI's six colours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Color {
    Red,
    Green,
    Blue,
    Purple,
    Yellow,
    Grey,
}

impl Color {
    pub const ALL: [Color; 6] = [
        Color::Red,
        Color::Green,
        Color::Blue,
        Color::Purple,
        Color::Yellow,
        Color::Grey,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Color::Red => "red",
            Color::Green => "green",
            Color::Blue => "blue",
            Color::Purple => "purple",
            Color::Yellow => "yellow",
            Color::Grey => "grey",
        }
    }

    pub fn from_name(s: &str) -> Option<Color> {
        Color::ALL
            .into_iter()
            .find(|c| c.name() == s || (s == "gray" && *c == Color::Grey))
    }
}

/// Pickable object kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Ball,
    Box,
    Key,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Ball, Kind::Box, Kind::Key];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Ball => "ball",
            Kind::Box => "box",
            Kind::Key => "key",
        }
    }
}

/// A movable object; `id` tells apart two objects of the same kind and colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Obj {
    pub kind: Kind,
    pub color: Color,
    pub id: u16,
}

impl Obj {
    /// "red ball".
    pub fn name(&self) -> String {
        format!("{} {}", self.color.name(), self.kind.name())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DoorState {
    Open,
    Closed,
    Locked,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cell {
    Empty,
    Wall,
    Door { color: Color, state: DoorState },
    Obj(Obj),
}

impl Cell {
    /// The agent can stand here.
    pub fn passable(self) -> bool {
        matches!(
            self,
            Cell::Empty
                | Cell::Door {
                    state: DoorState::Open,
                    ..
                }
        )
    }

    /// Light passes (MiniGrid: walls and closed doors block sight).
    pub fn see_behind(self) -> bool {
        match self {
            Cell::Wall => false,
            Cell::Door { state, .. } => state == DoorState::Open,
            _ => true,
        }
    }
}

/// Facing: 0 east (+x), 1 south (+y), 2 west, 3 north — MiniGrid's order.
pub const DIRS: [(i32, i32); 4] = [(1, 0), (0, 1), (-1, 0), (0, -1)];

/// A primitive action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prim {
    Left,
    Right,
    Forward,
    Pickup,
    Drop,
    Toggle,
}

impl Prim {
    pub fn text(self) -> &'static str {
        match self {
            Prim::Left => "turn left",
            Prim::Right => "turn right",
            Prim::Forward => "move forward",
            Prim::Pickup => "pick up",
            Prim::Drop => "drop",
            Prim::Toggle => "toggle",
        }
    }
}

/// The grid and the agent.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    pub width: i32,
    pub height: i32,
    pub cells: Vec<Cell>,
    pub pos: (i32, i32),
    pub dir: usize,
    pub carrying: Option<Obj>,
}

impl State {
    pub fn new(width: i32, height: i32) -> Self {
        Self {
            width,
            height,
            cells: vec![Cell::Empty; (width * height) as usize],
            pos: (1, 1),
            dir: 0,
            carrying: None,
        }
    }

    /// The cell at `p`; outside the grid reads as wall.
    pub fn get(&self, p: (i32, i32)) -> Cell {
        if p.0 < 0 || p.1 < 0 || p.0 >= self.width || p.1 >= self.height {
            return Cell::Wall;
        }
        self.cells[(p.1 * self.width + p.0) as usize]
    }

    pub fn set(&mut self, p: (i32, i32), c: Cell) {
        if p.0 >= 0 && p.1 >= 0 && p.0 < self.width && p.1 < self.height {
            self.cells[(p.1 * self.width + p.0) as usize] = c;
        }
    }

    pub fn front(&self) -> (i32, i32) {
        front_of(self.pos, self.dir)
    }

    /// Apply a primitive; returns whether anything changed.
    pub fn apply(&mut self, p: Prim) -> bool {
        let f = self.front();
        let fc = self.get(f);
        match p {
            Prim::Left => {
                self.dir = (self.dir + 3) % 4;
                true
            }
            Prim::Right => {
                self.dir = (self.dir + 1) % 4;
                true
            }
            Prim::Forward => {
                if fc.passable() {
                    self.pos = f;
                    true
                } else {
                    false
                }
            }
            Prim::Pickup => match (fc, self.carrying) {
                (Cell::Obj(o), None) => {
                    self.carrying = Some(o);
                    self.set(f, Cell::Empty);
                    true
                }
                _ => false,
            },
            Prim::Drop => match (fc, self.carrying) {
                (Cell::Empty, Some(o)) => {
                    self.set(f, Cell::Obj(o));
                    self.carrying = None;
                    true
                }
                _ => false,
            },
            Prim::Toggle => match fc {
                Cell::Door { color, state } => {
                    let next = match state {
                        DoorState::Open => DoorState::Closed,
                        DoorState::Closed => DoorState::Open,
                        DoorState::Locked => {
                            if self
                                .carrying
                                .is_some_and(|k| k.kind == Kind::Key && k.color == color)
                            {
                                DoorState::Open
                            } else {
                                return false;
                            }
                        }
                    };
                    self.set(f, Cell::Door { color, state: next });
                    true
                }
                _ => false,
            },
        }
    }

    /// Shortest primitive sequence after which the cell in front of the agent
    /// satisfies `goal`. With `through_doors`, closed doors (and locked ones
    /// whose key is carried) count as passable and a `Toggle` is inserted
    /// before walking into them; otherwise only open doors are passable.
    pub fn plan(
        &self,
        goal: &dyn Fn((i32, i32)) -> bool,
        through_doors: bool,
    ) -> Option<Vec<Prim>> {
        let n = (self.width * self.height * 4) as usize;
        let idx = |p: (i32, i32), d: usize| ((p.1 * self.width + p.0) as usize) * 4 + d;
        let mut prev: Vec<Option<(usize, Prim)>> = vec![None; n];
        let mut seen = vec![false; n];
        let start = idx(self.pos, self.dir);
        seen[start] = true;
        let mut queue = VecDeque::from([(self.pos, self.dir)]);
        let key = self
            .carrying
            .filter(|o| o.kind == Kind::Key)
            .map(|o| o.color);
        let enterable = |c: Cell| match c {
            Cell::Empty => true,
            Cell::Door {
                state: DoorState::Open,
                ..
            } => true,
            Cell::Door {
                state: DoorState::Closed,
                ..
            } => through_doors,
            Cell::Door {
                state: DoorState::Locked,
                color,
            } => through_doors && key == Some(color),
            _ => false,
        };
        while let Some((p, d)) = queue.pop_front() {
            if goal(front_of(p, d)) {
                // Walk back to the start.
                let mut acts = Vec::new();
                let mut cur = idx(p, d);
                while let Some((from, a)) = prev[cur] {
                    acts.push(a);
                    cur = from;
                }
                acts.reverse();
                return Some(self.insert_toggles(acts));
            }
            let here = idx(p, d);
            let f = front_of(p, d);
            let mut nexts = vec![(p, (d + 3) % 4, Prim::Left), (p, (d + 1) % 4, Prim::Right)];
            if enterable(self.get(f)) {
                nexts.push((f, d, Prim::Forward));
            }
            for (np, nd, a) in nexts {
                let k = idx(np, nd);
                if !seen[k] {
                    seen[k] = true;
                    prev[k] = Some((here, a));
                    queue.push_back((np, nd));
                }
            }
        }
        None
    }

    /// Replay `acts` on a copy and put a `Toggle` before each forward move
    /// into a door that is not open.
    fn insert_toggles(&self, acts: Vec<Prim>) -> Vec<Prim> {
        let mut sim = self.clone();
        let mut out = Vec::with_capacity(acts.len());
        for a in acts {
            if a == Prim::Forward
                && matches!(sim.get(sim.front()), Cell::Door { state, .. } if state != DoorState::Open)
            {
                sim.apply(Prim::Toggle);
                out.push(Prim::Toggle);
            }
            sim.apply(a);
            out.push(a);
        }
        out
    }

    /// Cells holding objects `pred` accepts.
    pub fn find_objs(&self, pred: &dyn Fn(&Obj) -> bool) -> Vec<(i32, i32)> {
        let mut out = Vec::new();
        for y in 0..self.height {
            for x in 0..self.width {
                if let Cell::Obj(o) = self.get((x, y)) {
                    if pred(&o) {
                        out.push((x, y));
                    }
                }
            }
        }
        out
    }

    /// Door cells of colour `color` (any colour when `None`).
    pub fn find_doors(&self, color: Option<Color>) -> Vec<(i32, i32)> {
        let mut out = Vec::new();
        for y in 0..self.height {
            for x in 0..self.width {
                if let Cell::Door { color: c, .. } = self.get((x, y)) {
                    if color.is_none_or(|cc| cc == c) {
                        out.push((x, y));
                    }
                }
            }
        }
        out
    }
}

/// The cell in front of `p` facing `d`.
pub fn front_of(p: (i32, i32), d: usize) -> (i32, i32) {
    let (dx, dy) = DIRS[d % 4];
    (p.0 + dx, p.1 + dy)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room() -> State {
        let mut s = State::new(5, 5);
        for i in 0..5 {
            s.set((i, 0), Cell::Wall);
            s.set((i, 4), Cell::Wall);
            s.set((0, i), Cell::Wall);
            s.set((4, i), Cell::Wall);
        }
        s
    }

    #[test]
    fn plan_turns_and_walks_to_face_a_target() {
        let mut s = room();
        s.pos = (1, 1);
        s.dir = 0;
        let ball = Obj {
            kind: Kind::Ball,
            color: Color::Red,
            id: 0,
        };
        s.set((3, 3), Cell::Obj(ball));
        let plan = s.plan(&|p| p == (3, 3), false).unwrap();
        let mut sim = s.clone();
        for a in &plan {
            sim.apply(*a);
        }
        assert_eq!(sim.front(), (3, 3));
        assert_eq!(plan.len(), 4); // forward, forward, right, forward — or an equally short path
    }

    #[test]
    fn locked_door_needs_the_matching_key() {
        let mut s = room();
        s.pos = (2, 2);
        s.dir = 0;
        s.set(
            (3, 2),
            Cell::Door {
                color: Color::Blue,
                state: DoorState::Locked,
            },
        );
        assert!(!s.apply(Prim::Toggle));
        s.carrying = Some(Obj {
            kind: Kind::Key,
            color: Color::Red,
            id: 0,
        });
        assert!(!s.apply(Prim::Toggle));
        s.carrying = Some(Obj {
            kind: Kind::Key,
            color: Color::Blue,
            id: 1,
        });
        assert!(s.apply(Prim::Toggle));
        assert_eq!(
            s.get((3, 2)),
            Cell::Door {
                color: Color::Blue,
                state: DoorState::Open
            }
        );
        assert!(s.apply(Prim::Forward));
    }
}
