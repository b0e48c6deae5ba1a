//! SearchQA (AgentGym-RL's Deep Search): answer a question by searching a
//! document corpus with a real BM25 index (tantivy, through
//! `agentrl-search-index`).
//!
//! `search[query]` returns the top passages (3 by default) as
//! `<information>Doc 1 (Title: …) …</information>`; `answer[text]` is judged
//! by exact match after SQuAD normalisation (reward 1 and the episode ends
//! when right). A wrong answer may be retried (`retry_wrong_answer`, default
//! true as AgentGym); with `false` it ends the episode.
//!
//! Data: a built-in synthetic knowledge base (default; 1-hop questions on
//! `easy`, 2–3-hop on `hard`), or a user corpus and QA file in the Search-R1
//! layout (`corpus`, `qa_file`; see [`loader`]).
//!
//! Parameters (`[env]` keys): `corpus_size` (100–200000, built-in KB),
//! `corpus`, `qa_file`, `retry_wrong_answer`, `top_k` (1–10), `cache_dir`
//! (index cache directory, or `memory`), `max_steps`.

mod expert;
pub mod kb;
pub mod loader;
pub mod parser;
pub mod reward;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use agentrl_env_core::{
    param_error, param_in_range, parse_params, stable_hash, task_rng, Env, EnvDescriptor, EnvError,
    EnvParams, Episode, Outcome, Reservation, SharedCache, Step, StepError, TaskSpec,
    MAX_STEPS_PARAM, SHARED_DATA,
};
use agentrl_search_index::{data_hash, shared_index, IndexError, IndexLocation, SearchIndex};
use rand::seq::IndexedRandom;
use rand::Rng;
use serde::Deserialize;

use crate::kb::{Kb, Passage, Question};
use crate::loader::QaItem;
use crate::parser::Action;

/// Registry name.
pub const NAME: &str = "searchqa";
const DEFAULT_CORPUS_SIZE: usize = 5_000;

/// The registry entry.
pub fn descriptor() -> EnvDescriptor {
    EnvDescriptor {
        name: NAME,
        summary: "Multi-hop questions over a corpus with a BM25 search tool: search[query], answer[text]; exact-match reward",
        difficulties: &["easy", "hard"],
        default_max_turns: 5,
        request_params: &["corpus_size", "retry_wrong_answer", "top_k", "max_steps"],
        operator_params: &["corpus", "qa_file", "cache_dir"],
        factory: |spec, params| Ok(Box::new(SearchQaEnv::new(spec, params)?)),
    }
}

#[derive(Debug)]
enum Source {
    Generated(Kb),
    Files(Vec<QaItem>),
}

/// A corpus with its index and its questions, shared by every env over it.
#[derive(Debug)]
pub struct Corpus {
    pub passages: Vec<Passage>,
    index: Arc<SearchIndex>,
    source: Source,
    /// Its share of the process's shared-data budget, held while it lives.
    _charge: Reservation,
}

impl Corpus {
    /// BM25 search: passage indices, best first.
    pub fn search(&self, query: &str, k: usize) -> Result<Vec<usize>, IndexError> {
        self.index.top_docs(query, k)
    }
}

/// The `[env]` params (see the crate docs).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    corpus_size: Option<usize>,
    corpus: Option<PathBuf>,
    qa_file: Option<PathBuf>,
    #[serde(default = "retry_by_default")]
    retry_wrong_answer: bool,
    #[serde(default = "default_top_k")]
    top_k: usize,
    #[serde(default = "IndexLocation::default_cache")]
    cache_dir: IndexLocation,
    #[serde(default = "default_max_steps")]
    max_steps: usize,
}

fn retry_by_default() -> bool {
    true
}

fn default_top_k() -> usize {
    3
}

fn default_max_steps() -> usize {
    10
}

impl Params {
    fn new(params: &EnvParams) -> Result<Self, EnvError> {
        let p: Params = parse_params(NAME, params)?;
        if let Some(n) = p.corpus_size {
            param_in_range(NAME, "corpus_size", n, 100..=200_000)?;
        }
        param_in_range(NAME, "top_k", p.top_k, 1..=10)?;
        param_in_range(NAME, "max_steps", p.max_steps, 1..=MAX_STEPS_PARAM)?;
        match (&p.corpus, &p.qa_file) {
            (Some(_), Some(_)) if p.corpus_size.is_some() => Err(param_error(
                NAME,
                "corpus_size",
                "not used with a corpus file",
            )),
            (Some(_), None) | (None, Some(_)) => Err(param_error(
                NAME,
                "corpus",
                "give both corpus and qa_file, or neither",
            )),
            _ => Ok(p),
        }
    }
}

/// Memory one passage of a generated corpus holds, with its share of the
/// search index and the knowledge base: measured as the RSS growth of
/// `agentrl serve` per passage created.
const CORPUS_BYTES_PER_PASSAGE: usize = 3_000;

/// What the corpus of `p` holds in memory, for the shared-data budget: a
/// generated one by its size, one from files by the files' size.
fn corpus_bytes(p: &Params, size: usize) -> usize {
    match (&p.corpus, &p.qa_file) {
        (Some(c), Some(q)) => [c, q]
            .iter()
            .filter_map(|f| std::fs::metadata(f).ok())
            .map(|m| m.len() as usize)
            .sum(),
        _ => size.saturating_mul(CORPUS_BYTES_PER_PASSAGE),
    }
}

/// The shared corpus and index for the parameters. Corpora are cached by
/// source: every task of a run builds an env, and none may regenerate or
/// reload the corpus. Every corpus alive counts against [`SHARED_DATA`].
fn corpus_for(p: &Params) -> Result<Arc<Corpus>, EnvError> {
    // A few corpus sizes; a client cycling through sizes evicts the oldest
    // instead of growing memory.
    static CORPORA: SharedCache<String, Corpus> = SharedCache::new(4);
    let size = p.corpus_size.unwrap_or(DEFAULT_CORPUS_SIZE);
    let key = match (&p.corpus, &p.qa_file) {
        (Some(c), Some(q)) => format!("files:{}:{}", c.display(), q.display()),
        _ => format!("gen:{size}"),
    };
    let bytes = corpus_bytes(p, size);
    let over_budget = |over| EnvError::Busy {
        env: NAME.to_string(),
        reason: format!("no room for a corpus of {size} passages: {over}"),
    };
    CORPORA.get_or_try_build_charged(
        key,
        bytes,
        &SHARED_DATA,
        |charge| {
            let (passages, source) = match (&p.corpus, &p.qa_file) {
                (Some(c), Some(q)) => (loader::load_corpus(c)?, Source::Files(loader::load_qa(q)?)),
                _ => {
                    let kb = Kb::generate(size).ok_or_else(|| {
                        EnvError::generation(NAME, "the name tables ran out of fresh names")
                    })?;
                    (kb.passages.clone(), Source::Generated(kb))
                }
            };
            let docs = kb::search_docs(&passages);
            let index = shared_index(&docs, data_hash(&docs), &p.cache_dir)
                .map_err(|e| e.into_env_error(NAME))?;
            Ok(Corpus {
                passages,
                index,
                source,
                _charge: charge,
            })
        },
        over_budget,
    )
}

/// One SearchQA task.
pub struct SearchQaEnv {
    spec: TaskSpec,
    corpus: Arc<Corpus>,
    question: Question,
    retry: bool,
    top_k: usize,
    episode: Episode,
    /// Titles of every passage shown so far.
    retrieved: BTreeSet<String>,
    /// Queries issued so far, in order.
    queries: Vec<String>,
    wrong_answers: BTreeSet<String>,
    last_obs: String,
}

agentrl_env_core::debug_fields!(SearchQaEnv { spec, question });

impl SearchQaEnv {
    /// Create the env for a spec (see the crate docs for parameters).
    pub fn new(spec: &TaskSpec, params: &EnvParams) -> Result<Self, EnvError> {
        let p = Params::new(params)?;
        let corpus = corpus_for(&p)?;
        let mut rng = task_rng(spec)?;
        let question = match &corpus.source {
            Source::Generated(kb) => {
                let hops = if spec.difficulty == "hard" {
                    rng.random_range(2..=3)
                } else {
                    1
                };
                kb.question(hops, &mut rng)
            }
            Source::Files(items) => {
                let ids = loader::split_questions(items, spec.split);
                let i = *ids
                    .choose(&mut rng)
                    .ok_or_else(|| EnvError::InvalidSpec("no questions".into()))?;
                Question {
                    question: items[i].question.clone(),
                    answers: items[i].answers.clone(),
                    chain: Vec::new(),
                }
            }
        };
        let mut env = SearchQaEnv {
            spec: spec.clone(),
            corpus,
            question,
            retry: p.retry_wrong_answer,
            top_k: p.top_k,
            episode: Episode::new(p.max_steps),
            retrieved: BTreeSet::new(),
            queries: Vec::new(),
            wrong_answers: BTreeSet::new(),
            last_obs: String::new(),
        };
        env.reset();
        Ok(env)
    }

    /// The question, gold answers and (built-in KB) the passages to retrieve.
    pub fn question(&self) -> &Question {
        &self.question
    }

    /// The shared corpus.
    pub fn corpus(&self) -> &Corpus {
        &self.corpus
    }

    fn first_observation(&self) -> String {
        format!("Question: {}\n", self.question.question)
    }

    /// The `<information>` block for a query.
    fn information(&mut self, query: &str) -> Result<String, IndexError> {
        let hits = self.corpus.search(query, self.top_k)?;
        if hits.is_empty() {
            return Ok("<information>No results found.</information>".into());
        }
        let mut s = String::from("<information>");
        for (i, &h) in hits.iter().enumerate() {
            let d = &self.corpus.passages[h];
            self.retrieved.insert(d.title.clone());
            if i > 0 {
                s.push('\n');
            }
            s.push_str(&format!("Doc {} (Title: {}) {}", i + 1, d.title, d.text));
        }
        s.push_str("</information>");
        Ok(s)
    }
}

impl Env for SearchQaEnv {
    fn spec(&self) -> &TaskSpec {
        &self.spec
    }

    fn instructions(&self) -> String {
        format!(
            "Answer the question. You may search a document collection as often as you need.\n\
             Actions (one per turn):\n\
             - search[query]: returns the top {} passages as <information>Doc 1 (Title: ...) ...</information>.\n\
             - answer[text]: your final answer, a short phrase (a name, a place or a year). {}\n\
             You have at most {} actions.",
            self.top_k,
            if self.retry { "A wrong answer may be retried." } else { "Only one answer is accepted." },
            self.episode.max_steps()
        )
    }

    fn reset(&mut self) -> String {
        self.episode.reset();
        self.retrieved.clear();
        self.queries.clear();
        self.wrong_answers.clear();
        self.last_obs = self.first_observation();
        self.last_obs.clone()
    }

    fn step(&mut self, action: &str) -> Result<Step, StepError> {
        let parsed = self.episode.begin(action, parser::parse)?;
        let mut reward = 0.0;
        let mut extra = serde_json::Map::new();
        let (effective, outcome);
        let mut observation = match parsed {
            Action::Search(q) => {
                let before = self.retrieved.len();
                // An index that fails to answer refuses the search with its
                // error; it is never shown as "no results".
                let info = self
                    .information(&q)
                    .map_err(|e| self.episode.reject(e.into_refusal(&format!("search[{q}]"))))?;
                effective = self.retrieved.len() > before;
                outcome = Outcome::Running;
                self.queries.push(q);
                info
            }
            Action::Answer(a) => {
                if reward::exact_match(&a, &self.question.answers) {
                    reward = 1.0;
                    effective = true;
                    outcome = Outcome::Won;
                    format!("Your answer '{a}' is correct.")
                } else {
                    effective = self.wrong_answers.insert(reward::normalize_answer(&a));
                    extra.insert("wrong_answer".into(), true.into());
                    if self.retry {
                        outcome = Outcome::Running;
                        format!(
                            "Your answer '{a}' is incorrect. You may search more and answer again."
                        )
                    } else {
                        outcome = Outcome::Lost;
                        format!("Your answer '{a}' is incorrect.")
                    }
                }
            }
        };
        if self.episode.settle(outcome) {
            observation.push_str("\nThe action budget is exhausted.");
        }
        self.last_obs = observation.clone();
        Ok(self
            .episode
            .step_result(observation, reward, effective, extra))
    }

    fn observation(&self) -> String {
        self.last_obs.clone()
    }

    fn available_actions(&self) -> Vec<String> {
        // Free-text grammar: the question itself is the representative query.
        self.episode
            .offer(|| vec![format!("search[{}]", self.question.question)])
    }

    fn state_key(&self) -> u64 {
        let seed = self.spec.seed.to_le_bytes();
        let retrieved: Vec<&str> = self.retrieved.iter().map(|s| s.as_str()).collect();
        let wrong: Vec<&str> = self.wrong_answers.iter().map(|s| s.as_str()).collect();
        stable_hash(&[
            self.spec.env.as_bytes(),
            self.spec.split.as_str().as_bytes(),
            self.spec.difficulty.as_bytes(),
            &seed,
            retrieved.join("\u{1f}").as_bytes(),
            wrong.join("\u{1f}").as_bytes(),
            self.last_obs.as_bytes(),
            &[u8::from(self.episode.is_done())],
        ])
    }

    fn expert_action(&mut self) -> Option<String> {
        if self.episode.is_done() {
            return None;
        }
        Some(expert::next_action(
            &self.question,
            &self.retrieved,
            &self.queries,
        ))
    }

    fn episode(&self) -> Option<&Episode> {
        Some(&self.episode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentrl_env_core::Split;

    #[test]
    fn corpora_of_many_sizes_do_not_stay_in_memory() {
        // A client asking for one corpus size after another, closing each
        // session at once: only the cache's few corpora stay alive.
        let mut freed = Vec::new();
        for size in 100..112u64 {
            let mut p = EnvParams::new();
            p.insert("corpus_size".into(), size.into());
            p.insert("cache_dir".into(), "memory".into());
            let env = SearchQaEnv::new(&TaskSpec::new(NAME, Split::Train, "easy", 0), &p).unwrap();
            freed.push((
                Arc::downgrade(&env.corpus),
                Arc::downgrade(&env.corpus.index),
            ));
        }
        let alive_corpora = freed.iter().filter(|(c, _)| c.strong_count() > 0).count();
        let alive_indexes = freed.iter().filter(|(_, i)| i.strong_count() > 0).count();
        assert!(
            alive_corpora <= 4,
            "{alive_corpora} corpora still in memory"
        );
        assert!(
            alive_indexes <= 8,
            "{alive_indexes} indexes still in memory"
        );
        assert_eq!(freed[0].0.strong_count(), 0, "the oldest corpus was freed");
        assert_eq!(freed[0].1.strong_count(), 0, "and its index with it");
    }
}
