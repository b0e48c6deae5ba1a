//! ALFWorld's action grammar.
//!
//! `go to X`, `open X`, `close X`, `take O from X`, `put O in/on X` (also
//! `move O to X`), `clean O with X`, `heat O with X`, `cool O with X`,
//! `use X`, `examine X`, `inventory`, `look`. Entity names are a type word and
//! a number ("cabinet 3"). Well-formed actions on things that do not exist
//! are not parse errors: the world answers "Nothing happens.".

use agentrl_env_core::action::normalized_action;
use agentrl_env_core::ActionError;

/// Longest action text accepted.
pub const MAX_ACTION_LEN: usize = 300;

const EXPECTED: &str =
    "go to X | open X | close X | take O from X | put O in/on X | clean O with X | \
                        heat O with X | cool O with X | use X | examine X | inventory | look";

/// A parsed action; names are normalised ("cabinet 3").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Look,
    Inventory,
    GoTo(String),
    Open(String),
    Close(String),
    Take { obj: String, from: String },
    Put { obj: String, to: String },
    Clean { obj: String, with: String },
    Heat { obj: String, with: String },
    Cool { obj: String, with: String },
    Use(String),
    Examine(String),
}

/// "cabinet 3" → itself; anything else is malformed.
fn entity(action: &str, s: &str) -> Result<String, ActionError> {
    let s = s.trim();
    let malformed =
        || ActionError::malformed(action, format!("'{s}' is not a name like 'cabinet 1'"));
    let (word, num) = s.rsplit_once(' ').ok_or_else(malformed)?;
    if word.is_empty() || word.contains(' ') || num.parse::<u32>().is_err() {
        return Err(malformed());
    }
    Ok(s.to_string())
}

fn two(action: &str, rest: &str, seps: &[&str]) -> Result<(String, String), ActionError> {
    for sep in seps {
        if let Some((a, b)) = rest.split_once(sep) {
            return Ok((entity(action, a)?, entity(action, b)?));
        }
    }
    let expected = format!("expected '<object> {} <receptacle>'", seps[0].trim());
    Err(ActionError::malformed(action, expected))
}

/// Parse one action text.
pub fn parse(text: &str) -> Result<Action, ActionError> {
    let t = normalized_action(text, MAX_ACTION_LEN)?;
    match t.as_str() {
        "look" | "look around" => return Ok(Action::Look),
        "inventory" | "inv" | "check inventory" => return Ok(Action::Inventory),
        _ => {}
    }
    if let Some(r) = t.strip_prefix("go to ") {
        return Ok(Action::GoTo(entity(text, r)?));
    }
    if let Some(r) = t.strip_prefix("open ") {
        return Ok(Action::Open(entity(text, r)?));
    }
    if let Some(r) = t.strip_prefix("close ") {
        return Ok(Action::Close(entity(text, r)?));
    }
    if let Some(r) = t.strip_prefix("take ") {
        let (obj, from) = two(text, r, &[" from "])?;
        return Ok(Action::Take { obj, from });
    }
    if let Some(r) = t.strip_prefix("put ") {
        let (obj, to) = two(text, r, &[" in/on ", " in ", " on ", " into ", " onto "])?;
        return Ok(Action::Put { obj, to });
    }
    if let Some(r) = t.strip_prefix("move ") {
        let (obj, to) = two(text, r, &[" to "])?;
        return Ok(Action::Put { obj, to });
    }
    for (verb, make) in [
        (
            "clean ",
            (|obj, with| Action::Clean { obj, with }) as fn(String, String) -> Action,
        ),
        ("heat ", |obj, with| Action::Heat { obj, with }),
        ("cool ", |obj, with| Action::Cool { obj, with }),
    ] {
        if let Some(r) = t.strip_prefix(verb) {
            let (obj, with) = two(text, r, &[" with ", " using "])?;
            return Ok(make(obj, with));
        }
    }
    if let Some(r) = t.strip_prefix("use ") {
        return Ok(Action::Use(entity(text, r)?));
    }
    if let Some(r) = t.strip_prefix("examine ") {
        return Ok(Action::Examine(entity(text, r)?));
    }
    Err(ActionError::unknown(text, EXPECTED))
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentrl_env_core::testing::refusal_of;

    #[test]
    fn parses_every_verb() {
        let put = Action::Put {
            obj: "apple 1".into(),
            to: "fridge 1".into(),
        };
        let take = Action::Take {
            obj: "apple 1".into(),
            from: "countertop 2".into(),
        };
        let heat = Action::Heat {
            obj: "egg 2".into(),
            with: "microwave 1".into(),
        };
        for (text, want) in [
            ("go to Cabinet 3.", Action::GoTo("cabinet 3".into())),
            ("take apple 1 from countertop 2", take),
            ("put apple 1 in/on fridge 1", put.clone()),
            ("put apple 1 on fridge 1", put.clone()),
            ("move apple 1 to fridge 1", put),
            ("heat egg 2 with microwave 1", heat),
            ("use desklamp 1", Action::Use("desklamp 1".into())),
            ("LOOK", Action::Look),
        ] {
            assert_eq!(parse(text).unwrap(), want, "{text}");
        }
    }

    #[test]
    fn malformed_names_are_typed_errors() {
        for text in [
            "go to the fridge",
            "take apple from table 1",
            "put apple 1 fridge 1",
        ] {
            assert_eq!(refusal_of(parse(text)), Some("Malformed"), "{text}");
        }
        assert_eq!(refusal_of(parse("jump")), Some("Unknown"));
        assert_eq!(parse(""), Err(ActionError::Empty));
    }
}
