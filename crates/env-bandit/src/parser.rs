//! Action text → the index of the pulled arm.

use agentrl_env_core::action::choose_action;
use agentrl_env_core::ActionError;

/// Longest action text accepted (after trimming).
pub const MAX_ACTION_LEN: usize = 64;

/// Parse one action against the arms' display names: a name
/// (case-insensitive, surrounding whitespace ignored) or its 1-based index.
/// Returns the display index (0 or 1).
pub fn parse_action(text: &str, names: &[String; 2]) -> Result<usize, ActionError> {
    choose_action(text, names, MAX_ACTION_LEN, || {
        format!("{}, {} (or 1, 2)", names[0], names[1])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> [String; 2] {
        ["Phoenix".to_string(), "Dragon".to_string()]
    }

    #[test]
    fn parses_names_case_insensitively_and_indices() {
        assert_eq!(parse_action("phoenix", &names()), Ok(0));
        assert_eq!(parse_action("  DRAGON \n", &names()), Ok(1));
        assert_eq!(parse_action("1", &names()), Ok(0));
        assert_eq!(parse_action("2", &names()), Ok(1));
    }

    #[test]
    fn rejects_empty_unknown_and_other_pairs_names() {
        assert_eq!(parse_action("", &names()), Err(ActionError::Empty));
        assert_eq!(parse_action(" \t", &names()), Err(ActionError::Empty));
        for bad in ["0", "3", "Tortoise", "Phoenix Dragon", "Dragon!", "arm"] {
            assert!(
                matches!(
                    parse_action(bad, &names()),
                    Err(ActionError::Unknown { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn rejects_huge_input() {
        let huge = "Dragon".repeat(100_000);
        assert!(matches!(
            parse_action(&huge, &names()),
            Err(ActionError::TooLong { .. })
        ));
    }

    #[test]
    fn lossy_decoded_bytes_are_an_error_not_a_panic() {
        let text = String::from_utf8_lossy(&[b'D', 0xff, b'r', 0xc0, 0x80]);
        assert!(matches!(
            parse_action(&text, &names()),
            Err(ActionError::Unknown { .. })
        ));
    }
}
