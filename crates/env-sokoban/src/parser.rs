//! Action text → [`Action`].

use agentrl_env_core::Direction::{Down, Left, Right, Up};
use agentrl_env_core::{parse_direction, ActionError, Direction};

/// A move of the player.
pub type Action = Direction;

/// The moves in RAGEN's order: 1 = Up, 2 = Down, 3 = Left, 4 = Right.
pub const ACTIONS: [Action; 4] = [Up, Down, Left, Right];

/// Parse one action: a direction name (case-insensitive, surrounding
/// whitespace ignored) or RAGEN's index `1`–`4` (Up, Down, Left, Right).
pub fn parse_action(text: &str) -> Result<Action, ActionError> {
    parse_direction(text, &ACTIONS)
}
