//! The BabyAI action grammar (AgentGym's): primitives and high-level actions
//! naming a visible object or door ("go to red ball 1").

use agentrl_env_core::action::normalized_action;
use agentrl_env_core::ActionError;

use crate::grid::{Color, Prim};

/// Longest action text accepted.
pub const MAX_ACTION_LEN: usize = 200;

const EXPECTED: &str = "turn left | turn right | move forward | pick up | drop | toggle | go to <obj> <n> | \
                        pickup <obj> <n> | go through <door> <n> | toggle and go through <door> <n> | \
                        check available actions";

/// A named visible thing: colour, type word (ball, box, key, door), number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub color: Color,
    pub what: String,
    pub n: usize,
}

impl Target {
    /// "red ball" — the name entities are grouped by.
    pub fn name(&self) -> String {
        format!("{} {}", self.color.name(), self.what)
    }
}

/// A parsed action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Prim(Prim),
    GoTo(Target),
    Pickup(Target),
    GoThrough(Target),
    ToggleGoThrough(Target),
    CheckActions,
}

fn target(action: &str, s: &str) -> Result<Target, ActionError> {
    let malformed = |reason: &str| ActionError::malformed(action, reason);
    let words: Vec<&str> = s.split(' ').filter(|w| *w != "the").collect();
    let [c, what, n] = words.as_slice() else {
        return Err(malformed(
            "expected '<colour> <ball|box|key|door> <number>', e.g. 'red ball 1'",
        ));
    };
    let color = Color::from_name(c)
        .ok_or_else(|| malformed("colour must be red, green, blue, purple, yellow or grey"))?;
    if !matches!(*what, "ball" | "box" | "key" | "door") {
        return Err(malformed("object must be ball, box, key or door"));
    }
    let n: usize = n
        .parse()
        .map_err(|_| malformed("missing object number, e.g. 'red ball 1'"))?;
    if n == 0 {
        return Err(malformed("object numbers start at 1"));
    }
    Ok(Target {
        color,
        what: what.to_string(),
        n,
    })
}

/// Parse one action text.
pub fn parse(text: &str) -> Result<Action, ActionError> {
    let t = normalized_action(text, MAX_ACTION_LEN)?;
    let prim = match t.as_str() {
        "turn left" | "left" => Some(Prim::Left),
        "turn right" | "right" => Some(Prim::Right),
        "move forward" | "forward" | "go forward" | "move ahead" => Some(Prim::Forward),
        "pick up" | "pickup" => Some(Prim::Pickup),
        "drop" | "put down" => Some(Prim::Drop),
        "toggle" => Some(Prim::Toggle),
        _ => None,
    };
    if let Some(p) = prim {
        return Ok(Action::Prim(p));
    }
    if t == "check available actions" || t == "check actions" {
        return Ok(Action::CheckActions);
    }
    if let Some(r) = t.strip_prefix("toggle and go through ") {
        return Ok(Action::ToggleGoThrough(target(text, r)?));
    }
    if let Some(r) = t.strip_prefix("go through ") {
        return Ok(Action::GoThrough(target(text, r)?));
    }
    if let Some(r) = t.strip_prefix("go to ") {
        return Ok(Action::GoTo(target(text, r)?));
    }
    if let Some(r) = t
        .strip_prefix("pickup ")
        .or_else(|| t.strip_prefix("pick up "))
    {
        return Ok(Action::Pickup(target(text, r)?));
    }
    Err(ActionError::unknown(text, EXPECTED))
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentrl_env_core::testing::refusal_of;

    #[test]
    fn parses_primitives_and_high_level_actions() {
        assert_eq!(parse("Turn Left.").unwrap(), Action::Prim(Prim::Left));
        assert_eq!(parse("pick up").unwrap(), Action::Prim(Prim::Pickup));
        assert_eq!(
            parse("go to the red ball 2").unwrap(),
            Action::GoTo(Target {
                color: Color::Red,
                what: "ball".into(),
                n: 2
            })
        );
        assert_eq!(
            parse("toggle and go through grey door 1").unwrap(),
            Action::ToggleGoThrough(Target {
                color: Color::Grey,
                what: "door".into(),
                n: 1
            })
        );
        assert_eq!(
            parse("check available actions").unwrap(),
            Action::CheckActions
        );
    }

    #[test]
    fn malformed_targets_are_typed_errors() {
        for text in ["go to red ball", "go to pink ball 1", "pickup red chair 1"] {
            assert_eq!(refusal_of(parse(text)), Some("Malformed"), "{text}");
        }
        assert_eq!(refusal_of(parse("fly")), Some("Unknown"));
        assert_eq!(parse(" "), Err(ActionError::Empty));
    }
}
