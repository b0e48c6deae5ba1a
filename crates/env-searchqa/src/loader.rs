//! Loads a user corpus and QA file in the Search-R1 layout:
//! - corpus JSONL, one passage a line: `{"id", "title", "text"}` or
//!   `{"id", "contents"}` where contents is `"Title"\ntext` (Search-R1's wiki dump);
//! - QA JSONL, one question a line: `{"question", "golden_answers": [..]}`
//!   (a string `golden_answers` or `answer` is accepted too).

use std::path::Path;

use agentrl_env_core::{stable_hash, EnvError, Split};
use serde_json::Value;

use crate::kb::Passage;

/// One question from a QA file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QaItem {
    pub question: String,
    pub answers: Vec<String>,
}

fn data_err(path: &Path, reason: impl Into<String>) -> EnvError {
    EnvError::Data {
        env: "searchqa".into(),
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

fn lines(path: &Path) -> Result<Vec<(usize, Value)>, EnvError> {
    let text = std::fs::read_to_string(path).map_err(|e| data_err(path, e.to_string()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line)
            .map_err(|e| data_err(path, format!("line {}: invalid JSON: {e}", i + 1)))?;
        out.push((i + 1, v));
    }
    Ok(out)
}

fn id_string(v: Option<&Value>, line: usize) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => format!("line{line}"),
    }
}

/// Read a corpus JSONL file.
pub fn load_corpus(path: &Path) -> Result<Vec<Passage>, EnvError> {
    let mut out = Vec::new();
    for (line, v) in lines(path)? {
        let id = id_string(v.get("id"), line);
        let (title, text) = match (v.get("title"), v.get("text"), v.get("contents")) {
            (Some(Value::String(t)), Some(Value::String(x)), _) => (t.clone(), x.clone()),
            (_, _, Some(Value::String(c))) => {
                let (t, x) = c.split_once('\n').unwrap_or(("", c.as_str()));
                (t.trim().trim_matches('"').to_string(), x.trim().to_string())
            }
            _ => {
                return Err(data_err(
                    path,
                    format!("line {line}: need \"title\" and \"text\", or \"contents\""),
                ))
            }
        };
        out.push(Passage { id, title, text });
    }
    if out.is_empty() {
        return Err(data_err(path, "empty corpus"));
    }
    Ok(out)
}

/// Read a QA JSONL file.
pub fn load_qa(path: &Path) -> Result<Vec<QaItem>, EnvError> {
    let mut out = Vec::new();
    for (line, v) in lines(path)? {
        let question = v
            .get("question")
            .and_then(|q| q.as_str())
            .unwrap_or("")
            .trim()
            .to_string();
        let answers: Vec<String> = match v.get("golden_answers").or_else(|| v.get("answer")) {
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(|x| x.as_str().map(|s| s.to_string()))
                .collect(),
            Some(Value::String(s)) => vec![s.clone()],
            _ => Vec::new(),
        };
        if question.is_empty() || answers.is_empty() {
            return Err(data_err(
                path,
                format!("line {line}: need \"question\" and \"golden_answers\""),
            ));
        }
        out.push(QaItem { question, answers });
    }
    if out.is_empty() {
        return Err(data_err(path, "no questions"));
    }
    Ok(out)
}

/// Files with fewer questions than this are too small to split.
pub const MIN_QUESTIONS_TO_SPLIT: usize = 20;

/// The questions a split draws from: a stable partition by question hash (1 in
/// 10 test, 1 in 10 validation, the rest train); tiny files use every question.
pub fn split_questions(items: &[QaItem], split: Split) -> Vec<usize> {
    let all: Vec<usize> = (0..items.len()).collect();
    if items.len() < MIN_QUESTIONS_TO_SPLIT {
        return all;
    }
    let chosen: Vec<usize> = all
        .iter()
        .copied()
        .filter(|&i| {
            let b = stable_hash(&[items[i].question.as_bytes()]) % 10;
            match split {
                Split::Test => b == 0,
                Split::Val => b == 1,
                Split::Train => b >= 2,
            }
        })
        .collect();
    if chosen.is_empty() {
        all
    } else {
        chosen
    }
}
