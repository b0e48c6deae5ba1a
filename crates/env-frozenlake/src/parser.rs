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
    use agentrl_env_core::testing::check_named_actions;

    /// RAGEN's names and indices (1 = Left, 2 = Down, 3 = Right, 4 = Up); the shared rules
    /// (trimming, case, length) are tested in env-core.
    #[test]
    fn parses_names_in_any_case_and_ragen_indices() {
        check_named_actions(parse_action, &Action::ALL, &["Left", "Down", "Right", "Up"]);
    }
}
