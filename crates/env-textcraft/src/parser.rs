//! The TextCraft action grammar:
//! `get N item` | `craft N item using N a, N b, …` | `inventory`.

use agentrl_env_core::action::normalized_action;
use agentrl_env_core::ActionError;

/// Longest action text accepted.
pub const MAX_ACTION_LEN: usize = 400;
/// Largest count accepted in `get` / `craft`.
pub const MAX_COUNT: u32 = 10_000;

const EXPECTED: &str = "get N item | craft N item using N a, N b | inventory";

/// A parsed action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Get {
        count: u32,
        item: String,
    },
    Craft {
        count: u32,
        item: String,
        inputs: Vec<(String, u32)>,
    },
    Inventory,
}

/// Accept minecraft-data spellings (`minecraft:oak_planks`) in a
/// normalised command: underscores are spaces, the namespace goes.
fn plain_spelling(command: &str) -> String {
    let t = command.replace('_', " ").replace("minecraft:", "");
    t.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn count_and_item(action: &str, part: &str) -> Result<(u32, String), ActionError> {
    let part = part.trim();
    let malformed = |reason: String| ActionError::malformed(action, reason);
    let (num, item) = part
        .split_once(' ')
        .ok_or_else(|| malformed(format!("expected 'N item', got '{part}'")))?;
    let count: u32 = num
        .parse()
        .map_err(|_| malformed(format!("'{num}' is not a count")))?;
    if count == 0 || count > MAX_COUNT {
        return Err(malformed(format!("count must be 1..={MAX_COUNT}")));
    }
    let item = item.trim();
    if item.is_empty() {
        return Err(malformed("missing item name".into()));
    }
    Ok((count, item.to_string()))
}

/// Parse one action text.
pub fn parse(text: &str) -> Result<Command, ActionError> {
    let t = plain_spelling(&normalized_action(text, MAX_ACTION_LEN)?);
    if t.is_empty() {
        return Err(ActionError::Empty);
    }
    if t == "inventory" || t == "inv" || t == "check inventory" {
        return Ok(Command::Inventory);
    }
    if let Some(rest) = t.strip_prefix("get ") {
        let (count, item) = count_and_item(text, rest)?;
        return Ok(Command::Get { count, item });
    }
    if let Some(rest) = t.strip_prefix("craft ") {
        let (lhs, rhs) = rest.split_once(" using ").ok_or_else(|| {
            ActionError::malformed(text, "expected 'craft N item using N a, N b'")
        })?;
        let (count, item) = count_and_item(text, lhs)?;
        let mut inputs = Vec::new();
        for part in rhs.split(',') {
            let (c, i) = count_and_item(text, part)?;
            inputs.push((i, c));
        }
        return Ok(Command::Craft {
            count,
            item,
            inputs,
        });
    }
    Err(ActionError::unknown(text, EXPECTED))
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentrl_env_core::testing::refusal_of;

    #[test]
    fn parses_the_three_commands() {
        assert_eq!(
            parse("get 2 oak log").unwrap(),
            Command::Get {
                count: 2,
                item: "oak log".into()
            }
        );
        assert_eq!(
            parse("Craft 4 Oak Planks using 1 minecraft:oak_log.").unwrap(),
            Command::Craft {
                count: 4,
                item: "oak planks".into(),
                inputs: vec![("oak log".into(), 1)]
            }
        );
        assert_eq!(
            parse("craft 1 stone pickaxe using 3 cobblestone,  2 stick").unwrap(),
            Command::Craft {
                count: 1,
                item: "stone pickaxe".into(),
                inputs: vec![("cobblestone".into(), 3), ("stick".into(), 2)]
            }
        );
        assert_eq!(parse(" inventory ").unwrap(), Command::Inventory);
    }

    #[test]
    fn rejects_malformed_actions_with_typed_errors() {
        assert_eq!(parse("   "), Err(ActionError::Empty));
        for text in [
            "get oak log",
            "get 0 oak log",
            "craft 1 pickaxe with 3 stone",
        ] {
            assert_eq!(refusal_of(parse(text)), Some("Malformed"), "{text}");
        }
        assert_eq!(refusal_of(parse("dance")), Some("Unknown"));
        assert_eq!(refusal_of(parse(&"x".repeat(1000))), Some("TooLong"));
    }
}
