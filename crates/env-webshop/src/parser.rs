//! The action grammar: `search[query]`, `click[target]` (WebShop's), plus
//! `buy now` / `buy` as a shorthand for `click[buy now]`.

use agentrl_env_core::action::{bracket_call, trimmed_action};
use agentrl_env_core::ActionError;

/// Longest accepted action text, in bytes.
pub const MAX_ACTION_LEN: usize = 512;

const EXPECTED: &str = "search[query] or click[target]";
/// The bracket verbs, each with why an empty argument is refused.
const VERBS: [(&str, &str); 2] = [
    ("search", "empty search query"),
    ("click", "nothing to click"),
];

/// A parsed action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `search[query]`: the query as typed (trimmed).
    Search(String),
    /// `click[target]`: the target lower-cased with whitespace collapsed.
    Click(String),
}

/// Lower-case and collapse whitespace, the form click targets are compared in.
pub fn normalize_target(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// Parse one action text.
pub fn parse(text: &str) -> Result<Action, ActionError> {
    let t = trimmed_action(text, MAX_ACTION_LEN)?;
    let lower = t.to_lowercase();
    if lower == "buy" || lower == "buy now" {
        return Ok(Action::Click("buy now".into()));
    }
    let call = bracket_call(t)?.ok_or_else(|| ActionError::unknown(t, EXPECTED))?;
    match call.verb_of(t, &VERBS, EXPECTED)? {
        ("search", query) => Ok(Action::Search(query.to_string())),
        (_, target) => Ok(Action::Click(normalize_target(target))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentrl_env_core::testing::refusal_of;
    use proptest::prelude::*;

    #[test]
    fn parses_webshop_grammar() {
        use Action::{Click, Search};
        let coffee = "dark roast coffee";
        assert_eq!(
            parse(&format!("search[ {coffee} ]")),
            Ok(Search(coffee.into()))
        );
        assert_eq!(parse("Click[Next >]"), Ok(Click("next >".into())));
        assert_eq!(parse("click[< Prev]"), Ok(Click("< prev".into())));
        assert_eq!(parse("click[Buy  Now]"), Ok(Click("buy now".into())));
        assert_eq!(parse("buy"), Ok(Click("buy now".into())));
        // Brackets inside a query are kept.
        let large = "size [large]";
        assert_eq!(parse(&format!("search[{large}]")), Ok(Search(large.into())));
    }

    #[test]
    fn rejects_malformed_actions_with_typed_errors() {
        assert_eq!(parse("   "), Err(ActionError::Empty));
        for text in ["search[]", "search[coffee"] {
            assert_eq!(refusal_of(parse(text)), Some("Malformed"), "{text}");
        }
        for text in ["jump[x]", "hello"] {
            assert_eq!(refusal_of(parse(text)), Some("Unknown"), "{text}");
        }
        assert_eq!(refusal_of(parse(&"x".repeat(600))), Some("TooLong"));
    }

    proptest! {
        #[test]
        fn parser_never_panics(s in "\\PC{0,80}") {
            let _ = parse(&s);
        }

        #[test]
        fn search_round_trips(q in "[a-z0-9 ]{1,40}") {
            prop_assume!(!q.trim().is_empty());
            prop_assert_eq!(parse(&format!("search[{q}]")).unwrap(), Action::Search(q.trim().to_string()));
        }
    }
}
