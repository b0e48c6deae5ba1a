//! Missions: BabyAI's instructions (go to, pick up, open, put next to) and
//! their compositions, with success checks.

use crate::grid::{Cell, Color, DoorState, Kind, Obj, State};

/// What an instruction refers to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Desc {
    /// An object of this kind and colour; `ids` (PickupLoc) restricts it to
    /// the objects that matched the location words at the start, and `loc`
    /// is those words ("in front of you").
    Obj {
        kind: Kind,
        color: Color,
        ids: Option<Vec<u16>>,
        loc: Option<&'static str>,
    },
    Door {
        color: Color,
    },
}

impl Desc {
    pub fn obj(kind: Kind, color: Color) -> Self {
        Desc::Obj {
            kind,
            color,
            ids: None,
            loc: None,
        }
    }

    pub fn matches_obj(&self, o: &Obj) -> bool {
        match self {
            Desc::Obj {
                kind, color, ids, ..
            } => {
                o.kind == *kind
                    && o.color == *color
                    && ids.as_ref().is_none_or(|ids| ids.contains(&o.id))
            }
            Desc::Door { .. } => false,
        }
    }

    pub fn matches_cell(&self, c: Cell) -> bool {
        match (self, c) {
            (Desc::Door { color }, Cell::Door { color: c, .. }) => *color == c,
            (_, Cell::Obj(o)) => self.matches_obj(&o),
            _ => false,
        }
    }

    /// Cells currently holding what this describes.
    pub fn cells(&self, s: &State) -> Vec<(i32, i32)> {
        match self {
            Desc::Door { color } => s.find_doors(Some(*color)),
            _ => s.find_objs(&|o| self.matches_obj(o)),
        }
    }

    pub fn text(&self) -> String {
        match self {
            Desc::Obj {
                kind, color, loc, ..
            } => match loc {
                Some(l) => format!("the {} {} {l}", color.name(), kind.name()),
                None => format!("the {} {}", color.name(), kind.name()),
            },
            Desc::Door { color } => format!("the {} door", color.name()),
        }
    }
}

/// One instruction.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Instr {
    GoTo(Desc),
    Pickup(Desc),
    Open(Desc),
    PutNext(Desc, Desc),
}

impl Instr {
    pub fn text(&self) -> String {
        match self {
            Instr::GoTo(d) => format!("go to {}", d.text()),
            Instr::Pickup(d) => format!("pick up {}", d.text()),
            Instr::Open(d) => format!("open {}", d.text()),
            Instr::PutNext(a, b) => format!("put {} next to {}", a.text(), b.text()),
        }
    }

    /// Whether the instruction holds in state `s` (BabyAI's verify).
    pub fn satisfied(&self, s: &State) -> bool {
        match self {
            Instr::GoTo(d) => d.matches_cell(s.get(s.front())),
            Instr::Pickup(d) => s.carrying.is_some_and(|o| d.matches_obj(&o)),
            Instr::Open(d) => d.cells(s).iter().any(|&p| {
                matches!(
                    s.get(p),
                    Cell::Door {
                        state: DoorState::Open,
                        ..
                    }
                )
            }),
            Instr::PutNext(a, b) => {
                let bs = b.cells(s);
                a.cells(s).iter().any(|pa| {
                    bs.iter()
                        .any(|pb| (pa.0 - pb.0).abs() + (pa.1 - pb.1).abs() == 1)
                })
            }
        }
    }
}

/// How two instructions combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Join {
    /// "A and B": both, in any order.
    And,
    /// "A, then B".
    Then,
    /// "B after you A" (A first).
    After,
}

/// A mission: one instruction or two joined.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Mission {
    pub instrs: Vec<Instr>,
    pub join: Option<Join>,
}

impl Mission {
    pub fn single(i: Instr) -> Self {
        Self {
            instrs: vec![i],
            join: None,
        }
    }

    pub fn text(&self) -> String {
        match (self.join, self.instrs.as_slice()) {
            (Some(Join::And), [a, b]) => format!("{} and {}", a.text(), b.text()),
            (Some(Join::Then), [a, b]) => format!("{}, then {}", a.text(), b.text()),
            (Some(Join::After), [a, b]) => format!("{} after you {}", b.text(), a.text()),
            _ => self
                .instrs
                .iter()
                .map(|i| i.text())
                .collect::<Vec<_>>()
                .join(", then "),
        }
    }

    /// Latch the instructions satisfied now; `done[i]` stays true once set.
    /// Ordered joins only check an instruction once all earlier ones are done.
    pub fn update(&self, s: &State, done: &mut [bool]) {
        let ordered = self.join != Some(Join::And);
        for (i, instr) in self.instrs.iter().enumerate() {
            if done[i] {
                continue;
            }
            if ordered && done[..i].iter().any(|d| !d) {
                break;
            }
            if instr.satisfied(s) {
                done[i] = true;
            }
        }
    }

    /// Index of the instruction to work on next.
    pub fn current(&self, done: &[bool]) -> Option<usize> {
        done.iter().position(|d| !d)
    }
}
