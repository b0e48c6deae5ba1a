//! Action text → [`Action`].

use agentrl_env_core::{parse_direction, ActionError, Direction};

/// A move on the ice.
pub type Action = Direction;

/// The moves in RAGEN's order: 1 = Left, 2 = Down, 3 = Right, 4 = Up.
pub const ACTIONS: [Action; 4] = [
    Direction::Left,
    Direction::Down,
    Direction::Right,
    Direction::Up,
];

/// Parse one action: a direction name (case-insensitive, surrounding
/// whitespace ignored) or RAGEN's index `1`–`4` (Left, Down, Right, Up).
pub fn parse_action(text: &str) -> Result<Action, ActionError> {
    parse_direction(text, &ACTIONS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentrl_env_core::testing::check_named_actions;

    /// RAGEN's names and indices (1 = Left, 2 = Down, 3 = Right, 4 = Up); the shared rules
    /// (trimming, case, length) are tested in env-core.
    #[test]
    fn parses_names_in_any_case_and_ragen_indices() {
        check_named_actions(parse_action, &ACTIONS, &["Left", "Down", "Right", "Up"]);
    }
}
