//! The action grammar: `search[query]` and `answer[text]` (AgentGym's
//! SearchQA), also accepted in Search-R1's tag form `<search>q</search>`,
//! `<answer>a</answer>`.

use agentrl_env_core::action::{bracket_call, trimmed_action, BracketCall};
use agentrl_env_core::ActionError;

/// Longest accepted action text, in bytes.
pub const MAX_ACTION_LEN: usize = 1024;

const EXPECTED: &str = "search[query] or answer[text]";
/// The verbs, each with why an empty argument is refused.
const VERBS: [(&str, &str); 2] = [("search", "empty search query"), ("answer", "empty answer")];

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
    let call = if let Some(call) = bracket_call(t)? {
        call
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
        BracketCall {
            verb,
            argument: body[..end].trim(),
        }
    } else {
        return Err(ActionError::unknown(t, EXPECTED));
    };
    match call.verb_of(t, &VERBS, EXPECTED)? {
        ("search", query) => Ok(Action::Search(query.to_string())),
        (_, answer) => Ok(Action::Answer(answer.to_string())),
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
