//! The oracle: it knows which passages hold the facts (the question's chain)
//! and issues the query that should retrieve each one — the entity's name —
//! in hop order, answering only once every passage of the chain has actually
//! been retrieved. Its success therefore measures the search engine: a hop
//! whose passage BM25 does not return after two queries makes it give up.
//! For a user corpus (no chain known) it searches the question and answers
//! the first gold answer.

use std::collections::BTreeSet;

use crate::kb::Question;

/// What the oracle answers when retrieval failed it.
pub const GIVE_UP: &str = "unknown";

pub(crate) fn next_action(
    q: &Question,
    retrieved: &BTreeSet<String>,
    queries: &[String],
) -> String {
    if q.chain.is_empty() {
        if queries.is_empty() {
            return format!("search[{}]", q.question);
        }
        return format!(
            "answer[{}]",
            q.answers.first().map(|s| s.as_str()).unwrap_or(GIVE_UP)
        );
    }
    for title in &q.chain {
        if retrieved.contains(title) {
            continue;
        }
        let plain = title.clone();
        // Second try: the entity name inside the question's wording.
        let with_context = format!("{title} {}", q.question);
        if !queries.contains(&plain) {
            return format!("search[{plain}]");
        }
        if !queries.contains(&with_context) {
            return format!("search[{with_context}]");
        }
        return format!("answer[{GIVE_UP}]");
    }
    format!(
        "answer[{}]",
        q.answers.first().map(|s| s.as_str()).unwrap_or(GIVE_UP)
    )
}
