//! Action text → [`Action`].

use agentrl_env_core::Direction::{Down, Left, Right, Up};
use agentrl_env_core::{parse_direction, ActionError, Direction};

/// A move on the ice.
pub type Action = Direction;

/// The moves in RAGEN's order: 1 = Left, 2 = Down, 3 = Right, 4 = Up.
pub const ACTIONS: [Action; 4] = [Left, Down, Right, Up];

/// Parse one action: a direction name (case-insensitive, surrounding
/// whitespace ignored) or RAGEN's index `1`–`4` (Left, Down, Right, Up).
pub fn parse_action(text: &str) -> Result<Action, ActionError> {
    parse_direction(text, &ACTIONS)
}
