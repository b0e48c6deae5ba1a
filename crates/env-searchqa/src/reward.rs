//! Exact match after SQuAD / Search-R1 normalisation.

/// ASCII punctuation, as Python's `string.punctuation`.
fn is_punct(c: char) -> bool {
    c.is_ascii_punctuation()
}

/// SQuAD's `normalize_answer`: lower-case, drop punctuation, drop the articles
/// a / an / the, collapse whitespace.
pub fn normalize_answer(s: &str) -> String {
    let lower = s.to_lowercase();
    let no_punct: String = lower.chars().filter(|c| !is_punct(*c)).collect();
    no_punct
        .split_whitespace()
        .filter(|w| !matches!(*w, "a" | "an" | "the"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether `prediction` equals any gold answer after normalisation.
pub fn exact_match(prediction: &str, golden: &[String]) -> bool {
    let p = normalize_answer(prediction);
    golden.iter().any(|g| normalize_answer(g) == p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalisation_follows_squad() {
        assert_eq!(normalize_answer("The  Eiffel Tower!"), "eiffel tower");
        assert_eq!(normalize_answer("an apple, a day"), "apple day");
        // Articles only as whole words.
        assert_eq!(normalize_answer("Theater"), "theater");
        // Punctuation is deleted, not turned into a space (SQuAD).
        assert_eq!(normalize_answer("U.S.A."), "usa");
    }

    #[test]
    fn exact_match_accepts_any_gold_answer() {
        let gold = vec!["Kalonford".to_string(), "Kalon Ford".to_string()];
        assert!(exact_match("kalonford.", &gold));
        assert!(exact_match("the Kalon  ford", &gold));
        assert!(!exact_match("Kalonfordia", &gold));
        assert!(!exact_match("", &gold));
    }
}
