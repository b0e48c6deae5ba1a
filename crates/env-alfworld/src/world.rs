//! The household state, the effect of each action, and ALFWorld's wording.

use crate::catalog::{ObjDef, RecepDef, RoomKind, TaskType};
use crate::parser::Action;

/// The text ALFWorld answers an impossible but well-formed action with.
pub const NOTHING_HAPPENS: &str = "Nothing happens.";

/// One receptacle instance ("cabinet 3").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recep {
    pub def: &'static RecepDef,
    pub num: u32,
    pub open: bool,
    /// Object indices, in the order they are listed.
    pub contents: Vec<usize>,
}

impl Recep {
    pub fn name(&self) -> String {
        format!("{} {}", self.def.name, self.num)
    }

    /// Contents are visible and reachable (open, or no door at all).
    pub fn accessible(&self) -> bool {
        !self.def.openable || self.open
    }
}

/// Where an object is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjLoc {
    In(usize),
    Held,
}

/// One object instance ("apple 2").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Obj {
    pub def: &'static ObjDef,
    pub num: u32,
    pub clean: bool,
    pub hot: bool,
    pub cold: bool,
    /// Desk lamps only: switched on.
    pub on: bool,
    pub loc: ObjLoc,
}

impl Obj {
    pub fn name(&self) -> String {
        format!("{} {}", self.def.name, self.num)
    }
}

/// What the task asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Goal {
    pub task: TaskType,
    /// Goal object type.
    pub obj: &'static str,
    /// Target receptacle type (none for look_at_obj_in_light).
    pub target: Option<&'static str>,
    /// "put a clean apple in fridge."
    pub text: String,
}

/// A whole household episode state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct World {
    pub room: RoomKind,
    pub receps: Vec<Recep>,
    pub objs: Vec<Obj>,
    /// The receptacle the agent stands at; `None` in the middle of the room.
    pub loc: Option<usize>,
    pub holding: Option<usize>,
    /// Receptacles whose contents the agent has seen since reset (the
    /// expert's memory; objects only move when the agent moves them, so what
    /// was seen stays true).
    pub seen: Vec<bool>,
    pub goal: Goal,
}

/// "a apple 1, a mug 2, and a knife 1", ALFWorld's list wording (it always
/// writes "a", and ", and" even before the second of two).
pub fn list_things(names: &[String]) -> String {
    match names.len() {
        0 => "nothing".to_string(),
        1 => format!("a {}", names[0]),
        n => {
            let head: Vec<String> = names[..n - 1].iter().map(|s| format!("a {s}")).collect();
            format!("{}, and a {}", head.join(", "), names[n - 1])
        }
    }
}

impl World {
    pub fn recep_index(&self, name: &str) -> Option<usize> {
        self.receps.iter().position(|r| r.name() == name)
    }

    pub fn obj_index(&self, name: &str) -> Option<usize> {
        self.objs.iter().position(|o| o.name() == name)
    }

    /// Names of an accessible receptacle's contents.
    fn content_names(&self, r: usize) -> Vec<String> {
        self.receps[r]
            .contents
            .iter()
            .map(|&o| self.objs[o].name())
            .collect()
    }

    /// "The fridge 1 is closed." / "The fridge 1 is open. In it, you see …" /
    /// "On the countertop 1, you see …".
    pub fn describe_recep(&self, r: usize) -> String {
        let rec = &self.receps[r];
        let name = rec.name();
        let things = list_things(&self.content_names(r));
        if rec.def.openable {
            if rec.open {
                format!("The {name} is open. In it, you see {things}.")
            } else {
                format!("The {name} is closed.")
            }
        } else {
            format!("On the {name}, you see {things}.")
        }
    }

    /// The first observation: the room and the task.
    pub fn intro(&self) -> String {
        let names: Vec<String> = self.receps.iter().map(|r| r.name()).collect();
        format!(
            "You are in the middle of a room. Looking quickly around you, you see {}.\n\nYour task is to: {}",
            list_things(&names),
            self.goal.text
        )
    }

    fn mark_seen(&mut self, r: usize) {
        if self.receps[r].accessible() {
            self.seen[r] = true;
        }
    }

    fn holding_named(&self, name: &str) -> Option<usize> {
        self.holding.filter(|&h| self.objs[h].name() == name)
    }

    /// The receptacle named `name` if the agent stands at it.
    fn here(&self, name: &str) -> Option<usize> {
        self.loc.filter(|&l| self.receps[l].name() == name)
    }

    /// Apply an action; returns the observation and whether anything changed.
    pub fn apply(&mut self, action: &Action) -> (String, bool) {
        let nothing = (NOTHING_HAPPENS.to_string(), false);
        match action {
            Action::Look => {
                let text = match self.loc {
                    None => {
                        let names: Vec<String> = self.receps.iter().map(|r| r.name()).collect();
                        format!(
                            "You are in the middle of a room. Looking quickly around you, you see {}.",
                            list_things(&names)
                        )
                    }
                    Some(l) => format!(
                        "You are facing the {}. Next to it, you see nothing.",
                        self.receps[l].name()
                    ),
                };
                (text, false)
            }
            Action::Inventory => {
                let text = match self.holding {
                    Some(h) => format!("You are carrying: a {}.", self.objs[h].name()),
                    None => "You are not carrying anything.".to_string(),
                };
                (text, false)
            }
            Action::GoTo(name) => {
                let Some(r) = self.recep_index(name) else {
                    return nothing;
                };
                if self.loc == Some(r) {
                    return nothing;
                }
                self.loc = Some(r);
                self.mark_seen(r);
                (
                    format!("You arrive at {name}. {}", self.describe_recep(r)),
                    true,
                )
            }
            Action::Open(name) => {
                let Some(r) = self.here(name) else {
                    return nothing;
                };
                if !self.receps[r].def.openable || self.receps[r].open {
                    return nothing;
                }
                self.receps[r].open = true;
                self.mark_seen(r);
                let things = list_things(&self.content_names(r));
                (
                    format!("You open the {name}. The {name} is open. In it, you see {things}."),
                    true,
                )
            }
            Action::Close(name) => {
                let Some(r) = self.here(name) else {
                    return nothing;
                };
                if !self.receps[r].def.openable || !self.receps[r].open {
                    return nothing;
                }
                self.receps[r].open = false;
                (format!("You close the {name}."), true)
            }
            Action::Take { obj, from } => {
                let Some(r) = self.here(from) else {
                    return nothing;
                };
                if self.holding.is_some() || !self.receps[r].accessible() {
                    return nothing;
                }
                let Some(pos) = self.receps[r]
                    .contents
                    .iter()
                    .position(|&o| self.objs[o].name() == *obj)
                else {
                    return nothing;
                };
                let o = self.receps[r].contents[pos];
                if !self.objs[o].def.pickable {
                    return nothing;
                }
                self.receps[r].contents.remove(pos);
                self.objs[o].loc = ObjLoc::Held;
                self.holding = Some(o);
                (format!("You pick up the {obj} from the {from}."), true)
            }
            Action::Put { obj, to } => {
                let Some(r) = self.here(to) else {
                    return nothing;
                };
                let Some(o) = self.holding_named(obj) else {
                    return nothing;
                };
                if !self.receps[r].accessible() {
                    return nothing;
                }
                self.receps[r].contents.push(o);
                self.objs[o].loc = ObjLoc::In(r);
                self.holding = None;
                (format!("You move the {obj} to the {to}."), true)
            }
            Action::Clean { obj, with }
            | Action::Heat { obj, with }
            | Action::Cool { obj, with } => {
                let Some(r) = self.here(with) else {
                    return nothing;
                };
                let Some(o) = self.holding_named(obj) else {
                    return nothing;
                };
                let def = self.objs[o].def;
                let (appliance, able, verb) = match action {
                    Action::Clean { .. } => ("sinkbasin", def.cleanable, "clean"),
                    Action::Heat { .. } => ("microwave", def.heatable, "heat"),
                    _ => ("fridge", def.coolable, "cool"),
                };
                if self.receps[r].def.name != appliance || !able {
                    return nothing;
                }
                let ob = &mut self.objs[o];
                match verb {
                    "clean" => ob.clean = true,
                    "heat" => {
                        ob.hot = true;
                        ob.cold = false;
                    }
                    _ => {
                        ob.cold = true;
                        ob.hot = false;
                    }
                }
                (format!("You {verb} the {obj} using the {with}."), true)
            }
            Action::Use(name) => {
                let Some(l) = self.loc else { return nothing };
                let Some(&o) = self.receps[l]
                    .contents
                    .iter()
                    .find(|&&o| self.objs[o].name() == *name)
                else {
                    return nothing;
                };
                if self.objs[o].def.name != "desklamp" || self.objs[o].on {
                    return nothing;
                }
                self.objs[o].on = true;
                (format!("You turn on the {name}."), true)
            }
            Action::Examine(name) => {
                if let Some(r) = self.here(name) {
                    self.mark_seen(r);
                    return (self.describe_recep(r), false);
                }
                let visible = self.holding_named(name).or_else(|| {
                    let l = self.loc?;
                    if !self.receps[l].accessible() {
                        return None;
                    }
                    self.receps[l]
                        .contents
                        .iter()
                        .copied()
                        .find(|&o| self.objs[o].name() == *name)
                });
                let Some(o) = visible else { return nothing };
                let ob = &self.objs[o];
                let mut states = Vec::new();
                if ob.clean {
                    states.push("clean");
                }
                if ob.hot {
                    states.push("hot");
                }
                if ob.cold {
                    states.push("cool");
                }
                if ob.def.name == "desklamp" {
                    states.push(if ob.on { "switched on" } else { "switched off" });
                }
                let text = if states.is_empty() {
                    format!("There's nothing special about {name}.")
                } else {
                    format!("This is a {} {name}.", states.join(", "))
                };
                (text, false)
            }
        }
    }

    /// Whether object `o` is in the state the goal asks for (clean / hot / cool).
    pub fn transformed(&self, o: usize) -> bool {
        let ob = &self.objs[o];
        match self.goal.task {
            TaskType::PickCleanThenPlace => ob.clean,
            TaskType::PickHeatThenPlace => ob.hot,
            TaskType::PickCoolThenPlace => ob.cold,
            _ => true,
        }
    }

    /// Goal objects (right type, right state) inside receptacle `r`.
    pub fn goal_objs_in(&self, r: usize) -> usize {
        self.receps[r]
            .contents
            .iter()
            .filter(|&&o| self.objs[o].def.name == self.goal.obj && self.transformed(o))
            .count()
    }

    /// The task is complete.
    pub fn success(&self) -> bool {
        let g = &self.goal;
        match g.task {
            TaskType::LookAtObjInLight => {
                let holds = self.holding.is_some_and(|h| self.objs[h].def.name == g.obj);
                let lit = self.loc.is_some_and(|l| {
                    self.receps[l]
                        .contents
                        .iter()
                        .any(|&o| self.objs[o].def.name == "desklamp" && self.objs[o].on)
                });
                holds && lit
            }
            _ => {
                let need = if g.task == TaskType::PickTwoObjAndPlace {
                    2
                } else {
                    1
                };
                (0..self.receps.len()).any(|r| {
                    Some(self.receps[r].def.name) == g.target && self.goal_objs_in(r) >= need
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_use_alfworld_wording() {
        assert_eq!(list_things(&[]), "nothing");
        assert_eq!(list_things(&["apple 1".into()]), "a apple 1");
        assert_eq!(
            list_things(&["apple 1".into(), "mug 2".into()]),
            "a apple 1, and a mug 2"
        );
        assert_eq!(
            list_things(&["apple 1".into(), "mug 2".into(), "knife 1".into()]),
            "a apple 1, a mug 2, and a knife 1"
        );
    }
}
