//! The action grammar: `search[query]` and `answer[text]` (AgentGym's
//! SearchQA), also accepted in Search-R1's tag form `<search>q</search>`,
//! `<answer>a</answer>`.

use agentrl_env_core::ActionError;

/// Longest accepted action text, in bytes.
pub const MAX_ACTION_LEN: usize = 1024;

/// A parsed action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Search(String),
    Answer(String),
}

fn expected() -> String {
    "search[query] or answer[text]".into()
}

/// Parse one action text.
pub fn parse(text: &str) -> Result<Action, ActionError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(ActionError::Empty);
    }
    if t.len() > MAX_ACTION_LEN {
        return Err(ActionError::TooLong {
            len: t.len(),
            max: MAX_ACTION_LEN,
        });
    }
    let malformed = |reason: &str| ActionError::Malformed {
        action: t.to_string(),
        reason: reason.to_string(),
    };
    let (verb, arg) = if let Some(open) = t.find('[') {
        if !t.ends_with(']') {
            return Err(malformed("missing closing ']'"));
        }
        (
            t[..open].trim().to_lowercase(),
            t[open + 1..t.len() - 1].trim(),
        )
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
        return Err(ActionError::Unknown {
            action: t.to_string(),
            expected: expected(),
        });
    };
    match verb.as_str() {
        "search" if arg.is_empty() => Err(malformed("empty search query")),
        "answer" if arg.is_empty() => Err(malformed("empty answer")),
        "search" => Ok(Action::Search(arg.to_string())),
        "answer" => Ok(Action::Answer(arg.to_string())),
        _ => Err(ActionError::Unknown {
            action: t.to_string(),
            expected: expected(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_both_forms() {
        assert_eq!(
            parse("search[ who founded Velkor Systems ]").unwrap(),
            Action::Search("who founded Velkor Systems".into())
        );
        assert_eq!(
            parse("Answer[Kalonford]").unwrap(),
            Action::Answer("Kalonford".into())
        );
        assert_eq!(
            parse("<search>velkor</search>").unwrap(),
            Action::Search("velkor".into())
        );
        assert_eq!(
            parse("<answer> 1987 </answer>").unwrap(),
            Action::Answer("1987".into())
        );
    }

    #[test]
    fn rejects_malformed_actions_with_typed_errors() {
        assert_eq!(parse(""), Err(ActionError::Empty));
        assert!(matches!(
            parse("answer[]"),
            Err(ActionError::Malformed { .. })
        ));
        assert!(matches!(
            parse("search[x"),
            Err(ActionError::Malformed { .. })
        ));
        assert!(matches!(
            parse("<search>x"),
            Err(ActionError::Malformed { .. })
        ));
        assert!(matches!(
            parse("<search>x</answer>"),
            Err(ActionError::Malformed { .. })
        ));
        assert!(matches!(parse("look[x]"), Err(ActionError::Unknown { .. })));
        assert!(matches!(
            parse("the answer is 4"),
            Err(ActionError::Unknown { .. })
        ));
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
