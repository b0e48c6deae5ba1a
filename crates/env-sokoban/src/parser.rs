//! Action text → [`Action`].

use agentrl_env_core::action::choose_action;
use agentrl_env_core::ActionError;

/// Longest action text accepted (after trimming).
pub const MAX_ACTION_LEN: usize = 64;

/// A move of the player. Order and 1-based indices follow RAGEN
/// (1 = Up, 2 = Down, 3 = Left, 4 = Right).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    Up = 0,
    Down = 1,
    Left = 2,
    Right = 3,
}

impl Action {
    /// All actions in RAGEN's order.
    pub const ALL: [Action; 4] = [Action::Up, Action::Down, Action::Left, Action::Right];

    /// The canonical name.
    pub fn name(self) -> &'static str {
        match self {
            Action::Up => "Up",
            Action::Down => "Down",
            Action::Left => "Left",
            Action::Right => "Right",
        }
    }

    /// The opposite move.
    pub fn reverse(self) -> Action {
        match self {
            Action::Up => Action::Down,
            Action::Down => Action::Up,
            Action::Left => Action::Right,
            Action::Right => Action::Left,
        }
    }
}

/// Parse one action: a direction name (case-insensitive, surrounding
/// whitespace ignored) or RAGEN's index `1`–`4` (Up, Down, Left, Right).
pub fn parse_action(text: &str) -> Result<Action, ActionError> {
    let names = Action::ALL.map(Action::name);
    let i = choose_action(text, &names, MAX_ACTION_LEN, || {
        "Up, Down, Left, Right (or 1-4)".to_string()
    })?;
    Ok(Action::ALL[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_case_insensitively_and_ragen_indices() {
        assert_eq!(parse_action("up").unwrap(), Action::Up);
        assert_eq!(parse_action("\tDOWN  ").unwrap(), Action::Down);
        assert_eq!(parse_action("LeFt").unwrap(), Action::Left);
        assert_eq!(parse_action("Right\n").unwrap(), Action::Right);
        assert_eq!(parse_action("1").unwrap(), Action::Up);
        assert_eq!(parse_action("2").unwrap(), Action::Down);
        assert_eq!(parse_action("3").unwrap(), Action::Left);
        assert_eq!(parse_action("4").unwrap(), Action::Right);
    }

    #[test]
    fn rejects_empty_unknown_and_out_of_range_input() {
        assert_eq!(parse_action(""), Err(ActionError::Empty));
        assert_eq!(parse_action("   \n"), Err(ActionError::Empty));
        for bad in ["0", "5", "-1", "upp", "up up", "push", "Up || Down", "١"] {
            assert!(
                matches!(parse_action(bad), Err(ActionError::Unknown { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn rejects_huge_input() {
        let huge = "x".repeat(10_000_000);
        assert!(matches!(
            parse_action(&huge),
            Err(ActionError::TooLong { .. })
        ));
        let padded = format!("{}Up{}", " ".repeat(100_000), " ".repeat(100_000));
        assert_eq!(parse_action(&padded).unwrap(), Action::Up);
    }

    #[test]
    fn lossy_decoded_bytes_are_an_error_not_a_panic() {
        for bytes in [
            &[0xffu8, 0xfe][..],
            &[b'U', 0x80, b'p'][..],
            &[0xe2, 0x88, 0x9a][..],
            &[0][..],
        ] {
            let text = String::from_utf8_lossy(bytes);
            assert!(parse_action(&text).is_err(), "{bytes:?}");
        }
    }
}
