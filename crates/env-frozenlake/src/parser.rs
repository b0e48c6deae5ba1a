//! Action text → [`Action`].

use agentrl_env_core::action::choose_action;
use agentrl_env_core::ActionError;

/// Longest action text accepted (after trimming); longer text is rejected
/// before any matching so that a runaway reply costs nothing.
pub const MAX_ACTION_LEN: usize = 64;

/// A move on the ice. The discriminants follow RAGEN's numbering (1 = Left,
/// 2 = Down, 3 = Right, 4 = Up) minus one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    Left = 0,
    Down = 1,
    Right = 2,
    Up = 3,
}

impl Action {
    /// All actions in RAGEN's order.
    pub const ALL: [Action; 4] = [Action::Left, Action::Down, Action::Right, Action::Up];

    /// The canonical name (`Left`, `Down`, `Right`, `Up`).
    pub fn name(self) -> &'static str {
        match self {
            Action::Left => "Left",
            Action::Down => "Down",
            Action::Right => "Right",
            Action::Up => "Up",
        }
    }

    /// The two moves at right angles to this one (where a slip sends the player).
    pub fn perpendicular(self) -> [Action; 2] {
        match self {
            Action::Left | Action::Right => [Action::Up, Action::Down],
            Action::Up | Action::Down => [Action::Left, Action::Right],
        }
    }

    /// (row, column) offset of the move.
    pub fn delta(self) -> (isize, isize) {
        match self {
            Action::Left => (0, -1),
            Action::Down => (1, 0),
            Action::Right => (0, 1),
            Action::Up => (-1, 0),
        }
    }
}

/// Parse one action: a direction name (case-insensitive, surrounding
/// whitespace ignored) or RAGEN's index `1`–`4` (Left, Down, Right, Up).
pub fn parse_action(text: &str) -> Result<Action, ActionError> {
    let names = Action::ALL.map(Action::name);
    let i = choose_action(text, &names, MAX_ACTION_LEN, || {
        "Left, Down, Right, Up (or 1-4)".to_string()
    })?;
    Ok(Action::ALL[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_case_insensitively_and_indices() {
        assert_eq!(parse_action("left").unwrap(), Action::Left);
        assert_eq!(parse_action("  DOWN\n").unwrap(), Action::Down);
        assert_eq!(parse_action("Right").unwrap(), Action::Right);
        assert_eq!(parse_action("uP").unwrap(), Action::Up);
        assert_eq!(parse_action("1").unwrap(), Action::Left);
        assert_eq!(parse_action("2").unwrap(), Action::Down);
        assert_eq!(parse_action("3").unwrap(), Action::Right);
        assert_eq!(parse_action("4").unwrap(), Action::Up);
    }

    #[test]
    fn rejects_empty_unknown_and_out_of_range_indices() {
        assert_eq!(parse_action(""), Err(ActionError::Empty));
        assert_eq!(parse_action(" \t\n"), Err(ActionError::Empty));
        for bad in ["0", "5", "12", "north", "Left Up", "Lef", "Up!"] {
            assert!(
                matches!(parse_action(bad), Err(ActionError::Unknown { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn rejects_huge_input_without_echoing_it() {
        let huge = "Up".repeat(1_000_000);
        assert_eq!(
            parse_action(&huge),
            Err(ActionError::TooLong {
                len: 2_000_000,
                max: MAX_ACTION_LEN
            })
        );
    }

    #[test]
    fn lossy_decoded_bytes_are_an_error_not_a_panic() {
        let text = String::from_utf8_lossy(&[0xff, 0xfe, b'U', b'p', 0xc3]);
        assert!(matches!(
            parse_action(&text),
            Err(ActionError::Unknown { .. })
        ));
        let text = String::from_utf8_lossy(&[0xe2, 0x88]);
        assert!(parse_action(&text).is_err());
    }
}
