//! The action grammar: `search[query]` and `answer[text]` (AgentGym's
//! SearchQA), also accepted in Search-R1's tag form `<search>q</search>`,
//! `<answer>a</answer>`.

use agentrl_env_core::action::{bracket_call, trimmed_action};
use agentrl_env_core::ActionError;

/// Longest accepted action text, in bytes.
pub const MAX_ACTION_LEN: usize = 1024;

/// A parsed action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Search(String),
    Answer(String),
}

/// Parse one action text.
pub fn parse(text: &str) -> Result<Action, ActionError> {
    let t = trimmed_action(text, MAX_ACTION_LEN)?;
    let malformed = |reason: &str| ActionError::malformed(t, reason);
    let unknown = || ActionError::unknown(t, "search[query] or answer[text]");
    let (verb, arg) = if let Some(call) = bracket_call(t)? {
        (call.verb, call.argument)
    } else if let Some(rest) = t.strip_prefix('<') {
        // <search>q</search> / <answer>a</answer>
        let Some(close) = rest.find('>') else {
            return Err(malformed("unclosed tag"));
        };
        let verb = rest[..close].trim().to_lowercase();
        let body = &rest[close + 1..];
        let Some(end) = body.rfind("</") else {
            return Err(malformed("missing closing tag"));
        };
        if body[end..].to_lowercase() != format!("</{verb}>") {
            return Err(malformed("closing tag does not match"));
        }
        (verb, body[..end].trim())
    } else {
        return Err(unknown());
    };
    match (verb.as_str(), arg) {
        ("search", "") => Err(malformed("empty search query")),
        ("answer", "") => Err(malformed("empty answer")),
        ("search", query) => Ok(Action::Search(query.to_string())),
        ("answer", answer) => Ok(Action::Answer(answer.to_string())),
        _ => Err(unknown()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentrl_env_core::testing::refusal_of;
    use proptest::prelude::*;

    #[test]
    fn parses_both_forms() {
        use Action::{Answer, Search};
        let who = "who founded Velkor Systems";
        assert_eq!(parse(&format!("search[ {who} ]")), Ok(Search(who.into())));
        assert_eq!(parse("Answer[Kalonford]"), Ok(Answer("Kalonford".into())));
        assert_eq!(
            parse("<search>velkor</search>"),
            Ok(Search("velkor".into()))
        );
        assert_eq!(parse("<answer> 1987 </answer>"), Ok(Answer("1987".into())));
    }

    #[test]
    fn rejects_malformed_actions_with_typed_errors() {
        assert_eq!(parse(""), Err(ActionError::Empty));
        for text in ["answer[]", "search[x", "<search>x", "<search>x</answer>"] {
            assert_eq!(refusal_of(parse(text)), Some("Malformed"), "{text}");
        }
        for text in ["look[x]", "the answer is 4"] {
            assert_eq!(refusal_of(parse(text)), Some("Unknown"), "{text}");
        }
    }

    proptest! {
        #[test]
        fn parser_never_panics(s in "\\PC{0,80}") {
            let _ = parse(&s);
        }

        #[test]
        fn parser_never_panics_on_tag_shapes(a in "\\PC{0,10}", b in "\\PC{0,10}", c in "\\PC{0,10}") {
            let _ = parse(&format!("<{a}>{b}</{c}>"));
            let _ = parse(&format!("<{a}>{b}"));
        }
    }
}
