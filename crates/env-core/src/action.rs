//! The action-text checks the environments' grammars share: length and
//! emptiness, normalisation, a choice among named actions, and the
//! `verb[argument]` form.
//!
//! Every length limit is checked before any other work, so a runaway reply
//! costs nothing and is never echoed back.

use crate::ActionError;

fn too_long(len: usize, max_len: usize) -> Result<(), ActionError> {
    if len > max_len {
        return Err(ActionError::TooLong { len, max: max_len });
    }
    Ok(())
}

/// The action text without surrounding whitespace; it must be non-empty and
/// at most `max_len` bytes once trimmed.
pub fn trimmed_action(text: &str, max_len: usize) -> Result<&str, ActionError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(ActionError::Empty);
    }
    too_long(t.len(), max_len)?;
    Ok(t)
}

/// The canonical form of a free-text command (ALFWorld, BabyAI, TextCraft):
/// lower-cased, trimmed, without a trailing full stop, whitespace runs
/// collapsed to one space. The text as typed may be at most `max_len` bytes;
/// a text that normalises to nothing is [`ActionError::Empty`].
pub fn normalized_action(text: &str, max_len: usize) -> Result<String, ActionError> {
    too_long(text.len(), max_len)?;
    let t = text.trim().trim_end_matches('.').to_lowercase();
    let t = t.split_whitespace().collect::<Vec<_>>().join(" ");
    if t.is_empty() {
        return Err(ActionError::Empty);
    }
    Ok(t)
}

/// One of a few named actions, as RAGEN's grid games and the bandit take
/// them: a name (case-insensitive, surrounding whitespace ignored) or its
/// 1-based index. Returns the index into `names`; an unknown text is
/// [`ActionError::Unknown`] listing `expected`.
pub fn choose_action<S: AsRef<str>>(
    text: &str,
    names: &[S],
    max_len: usize,
    expected: impl FnOnce() -> String,
) -> Result<usize, ActionError> {
    let t = trimmed_action(text, max_len)?;
    let index = names.iter().enumerate().position(|(i, name)| {
        t.eq_ignore_ascii_case(name.as_ref()) || (i < 9 && t.as_bytes() == [b'1' + i as u8])
    });
    index.ok_or_else(|| ActionError::unknown(t, expected()))
}

/// An action of the form `verb[argument]` (WebShop, SearchQA).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BracketCall<'a> {
    /// The text before the first `[`, trimmed and lower-cased.
    pub verb: String,
    /// The text between the first `[` and the final `]`, trimmed; brackets
    /// inside it are kept (`search[size [large]]`).
    pub argument: &'a str,
}

impl<'a> BracketCall<'a> {
    /// Which of `verbs` this call names, with its argument. Each verb comes
    /// with the reason an empty argument is refused; any other verb is
    /// [`ActionError::Unknown`] listing `expected`. `action` is the text the
    /// errors quote.
    pub fn verb_of(
        &self,
        action: &str,
        verbs: &[(&'static str, &str)],
        expected: &str,
    ) -> Result<(&'static str, &'a str), ActionError> {
        let Some(&(verb, empty)) = verbs.iter().find(|(v, _)| *v == self.verb) else {
            return Err(ActionError::unknown(action, expected));
        };
        if self.argument.is_empty() {
            return Err(ActionError::malformed(action, empty));
        }
        Ok((verb, self.argument))
    }
}

/// Split a trimmed action text of the form `verb[argument]`. `Ok(None)` when
/// it has no `[` at all (not this form); a text with a `[` that does not end
/// with `]` is [`ActionError::Malformed`].
pub fn bracket_call(text: &str) -> Result<Option<BracketCall<'_>>, ActionError> {
    let Some(open) = text.find('[') else {
        return Ok(None);
    };
    if !text.ends_with(']') {
        return Err(ActionError::malformed(text, "missing closing ']'"));
    }
    Ok(Some(BracketCall {
        verb: text[..open].trim().to_lowercase(),
        argument: text[open + 1..text.len() - 1].trim(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MOVES: [&str; 4] = ["Left", "Down", "Right", "Up"];

    fn choose(text: &str) -> Result<usize, ActionError> {
        choose_action(text, &MOVES, 64, || "Left, Down, Right, Up (or 1-4)".into())
    }

    #[test]
    fn choose_takes_names_in_any_case_and_one_based_indices() {
        assert_eq!(choose("left"), Ok(0));
        assert_eq!(choose("  DOWN\n"), Ok(1));
        assert_eq!(choose("uP"), Ok(3));
        assert_eq!(choose("3"), Ok(2));
        let padded = format!("{}Up{}", " ".repeat(100_000), " ".repeat(100_000));
        assert_eq!(choose(&padded), Ok(3));
    }

    #[test]
    fn choose_rejects_empty_unknown_and_huge_text() {
        assert_eq!(choose(" \t\n"), Err(ActionError::Empty));
        for bad in ["0", "5", "12", "north", "Left Up", "Lef", "Up!", "١"] {
            assert!(
                matches!(choose(bad), Err(ActionError::Unknown { .. })),
                "{bad}"
            );
        }
        let lossy = String::from_utf8_lossy(&[0xff, 0xfe, b'U', b'p', 0xc3]);
        assert!(matches!(choose(&lossy), Err(ActionError::Unknown { .. })));
        assert_eq!(
            choose(&"Up".repeat(1_000_000)),
            Err(ActionError::TooLong {
                len: 2_000_000,
                max: 64
            })
        );
    }

    #[test]
    fn normalized_action_checks_the_typed_length_first() {
        assert_eq!(
            normalized_action("  Go   To\tCabinet 3. ", 64).unwrap(),
            "go to cabinet 3"
        );
        assert_eq!(normalized_action(" . ", 64), Err(ActionError::Empty));
        assert!(matches!(
            normalized_action(&format!("look{}", " ".repeat(100)), 64),
            Err(ActionError::TooLong { len: 104, max: 64 })
        ));
    }

    #[test]
    fn bracket_call_splits_verb_and_argument() {
        assert_eq!(
            bracket_call("Search[ size [large] ]"),
            Ok(Some(BracketCall {
                verb: "search".into(),
                argument: "size [large]"
            }))
        );
        assert_eq!(bracket_call("buy now"), Ok(None));
        assert!(matches!(
            bracket_call("search[coffee"),
            Err(ActionError::Malformed { .. })
        ));
        assert_eq!(
            bracket_call("[]").map(|c| c.map(|c| c.argument)),
            Ok(Some(""))
        );
    }

    #[test]
    fn verb_of_names_the_verb_or_says_what_is_wrong() {
        const VERBS: [(&str, &str); 2] = [("search", "empty query"), ("click", "nothing to click")];
        let verb = |text: &'static str| {
            let call = bracket_call(text).unwrap().unwrap();
            call.verb_of(text, &VERBS, "search[q] or click[x]")
        };
        assert_eq!(verb("Click[ Next > ]"), Ok(("click", "Next >")));
        assert_eq!(
            verb("search[ ]"),
            Err(ActionError::malformed("search[ ]", "empty query"))
        );
        assert_eq!(
            verb("look[x]"),
            Err(ActionError::unknown("look[x]", "search[q] or click[x]"))
        );
    }

    proptest! {
        #[test]
        fn checks_never_panic(s in "\\PC{0,80}") {
            let _ = choose(&s);
            let _ = normalized_action(&s, 40);
            let _ = bracket_call(s.trim());
        }
    }
}
