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
    use agentrl_env_core::testing::check_named_actions;

    /// RAGEN's names and indices (1 = Up, 2 = Down, 3 = Left, 4 = Right); the shared rules
    /// (trimming, case, length) are tested in env-core.
    #[test]
    fn parses_names_in_any_case_and_ragen_indices() {
        check_named_actions(parse_action, &Action::ALL, &["Up", "Down", "Left", "Right"]);
    }
}
