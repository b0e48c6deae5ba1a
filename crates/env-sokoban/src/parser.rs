//! Action text → [`Action`].

use agentrl_env_core::{parse_direction, ActionError, Direction};

/// A move of the player.
pub type Action = Direction;

/// The moves in RAGEN's order: 1 = Up, 2 = Down, 3 = Left, 4 = Right.
pub const ACTIONS: [Action; 4] = [
    Direction::Up,
    Direction::Down,
    Direction::Left,
    Direction::Right,
];

/// Parse one action: a direction name (case-insensitive, surrounding
/// whitespace ignored) or RAGEN's index `1`–`4` (Up, Down, Left, Right).
pub fn parse_action(text: &str) -> Result<Action, ActionError> {
    parse_direction(text, &ACTIONS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentrl_env_core::testing::check_named_actions;

    /// RAGEN's names and indices (1 = Up, 2 = Down, 3 = Left, 4 = Right); the shared rules
    /// (trimming, case, length) are tested in env-core.
    #[test]
    fn parses_names_in_any_case_and_ragen_indices() {
        check_named_actions(parse_action, &ACTIONS, &["Up", "Down", "Left", "Right"]);
    }
}
