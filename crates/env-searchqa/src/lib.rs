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

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use agentrl_env_core::{
    stable_hash, task_rng, Env, EnvDescriptor, EnvError, EnvParams, Step, StepError, StepInfo,
    TaskSpec,
};
use agentrl_search_index::{data_hash, shared_index, DocRef, IndexLocation, SearchIndex};
use rand::seq::IndexedRandom;
use rand::Rng;

use crate::kb::{Kb, Passage, Question};
use crate::loader::QaItem;
use crate::parser::Action;

const DEFAULT_CORPUS_SIZE: usize = 5_000;
const DEFAULT_MAX_STEPS: usize = 10;
const DEFAULT_TOP_K: usize = 3;

/// The registry entry.
pub fn descriptor() -> EnvDescriptor {
    EnvDescriptor {
        name: "searchqa",
        summary: "Multi-hop questions over a corpus with a BM25 search tool: search[query], answer[text]; exact-match reward",
        difficulties: &["easy", "hard"],
        default_max_turns: 5,
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
}

impl Corpus {
    /// BM25 search: passage indices, best first.
    pub fn search(&self, query: &str, k: usize) -> Vec<usize> {
        // An I/O failure of a cached index reads as "no results", not a crash.
        self.index
            .search(query, 0, k)
            .map(|h| h.into_iter().map(|h| h.doc).collect())
            .unwrap_or_default()
    }
}

type CorpusMap = Mutex<BTreeMap<String, Arc<Corpus>>>;

/// Corpora by source. Global state for the same reason as the index cache:
/// every task of a run builds an env, and none may regenerate or reload the corpus.
fn corpora() -> &'static CorpusMap {
    static MAP: OnceLock<CorpusMap> = OnceLock::new();
    MAP.get_or_init(|| Mutex::new(BTreeMap::new()))
}

#[derive(Debug, Clone)]
struct Params {
    corpus_size: usize,
    files: Option<(PathBuf, PathBuf)>,
    retry: bool,
    top_k: usize,
    location: IndexLocation,
    max_steps: usize,
}

fn param_err(key: &str, reason: impl Into<String>) -> EnvError {
    EnvError::InvalidParam {
        env: "searchqa".into(),
        key: key.into(),
        reason: reason.into(),
    }
}

fn int_param(key: &str, v: &serde_json::Value, lo: u64, hi: u64) -> Result<usize, EnvError> {
    let n = v
        .as_u64()
        .ok_or_else(|| param_err(key, "expected an integer"))?;
    if !(lo..=hi).contains(&n) {
        return Err(param_err(key, format!("must be between {lo} and {hi}")));
    }
    Ok(n as usize)
}

fn parse_params(params: &EnvParams) -> Result<Params, EnvError> {
    let mut corpus_size = None;
    let (mut corpus, mut qa) = (None, None);
    let mut p = Params {
        corpus_size: DEFAULT_CORPUS_SIZE,
        files: None,
        retry: true,
        top_k: DEFAULT_TOP_K,
        location: IndexLocation::default_cache(),
        max_steps: DEFAULT_MAX_STEPS,
    };
    for (key, v) in params {
        match key.as_str() {
            "corpus_size" => corpus_size = Some(int_param(key, v, 100, 200_000)?),
            "corpus" => corpus = Some(PathBuf::from(v.as_str().ok_or_else(|| param_err(key, "expected a path"))?)),
            "qa_file" => qa = Some(PathBuf::from(v.as_str().ok_or_else(|| param_err(key, "expected a path"))?)),
            "retry_wrong_answer" => p.retry = v.as_bool().ok_or_else(|| param_err(key, "expected true or false"))?,
            "top_k" => p.top_k = int_param(key, v, 1, 10)?,
            "max_steps" => p.max_steps = int_param(key, v, 1, 1000)?,
            "cache_dir" => {
                p.location = IndexLocation::from_param(
                    v.as_str().ok_or_else(|| param_err(key, "expected a path string or \"memory\""))?,
                )
            }
            _ => {
                return Err(param_err(
                    key,
                    "unknown parameter (known: corpus_size, corpus, qa_file, retry_wrong_answer, top_k, cache_dir, max_steps)",
                ))
            }
        }
    }
    match (corpus, qa) {
        (Some(c), Some(q)) => {
            if corpus_size.is_some() {
                return Err(param_err("corpus_size", "not used with a corpus file"));
            }
            p.files = Some((c, q));
        }
        (None, None) => p.corpus_size = corpus_size.unwrap_or(DEFAULT_CORPUS_SIZE),
        _ => {
            return Err(param_err(
                "corpus",
                "give both corpus and qa_file, or neither",
            ))
        }
    }
    Ok(p)
}

fn corpus_for(p: &Params) -> Result<Arc<Corpus>, EnvError> {
    let key = match &p.files {
        Some((c, q)) => format!("files:{}:{}", c.display(), q.display()),
        None => format!("gen:{}", p.corpus_size),
    };
    let mut map = corpora().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = map.get(&key) {
        return Ok(Arc::clone(c));
    }
    let (passages, source) = match &p.files {
        Some((c, q)) => (loader::load_corpus(c)?, Source::Files(loader::load_qa(q)?)),
        None => {
            let kb = Kb::generate(p.corpus_size);
            (kb.passages.clone(), Source::Generated(kb))
        }
    };
    let docs: Vec<DocRef<'_>> = passages
        .iter()
        .map(|d| DocRef {
            title: &d.title,
            body: &d.text,
        })
        .collect();
    let index = shared_index(&docs, data_hash(&docs), &p.location).map_err(|e| EnvError::Data {
        env: "searchqa".into(),
        path: "search index".into(),
        reason: e.to_string(),
    })?;
    let corpus = Arc::new(Corpus {
        passages,
        index,
        source,
    });
    map.insert(key, Arc::clone(&corpus));
    Ok(corpus)
}

/// One SearchQA task.
pub struct SearchQaEnv {
    spec: TaskSpec,
    corpus: Arc<Corpus>,
    question: Question,
    retry: bool,
    top_k: usize,
    max_steps: usize,
    steps: usize,
    invalid: usize,
    done: bool,
    success: bool,
    /// Titles of every passage shown so far.
    retrieved: BTreeSet<String>,
    /// Queries issued so far, in order.
    queries: Vec<String>,
    wrong_answers: BTreeSet<String>,
    last_obs: String,
}

impl std::fmt::Debug for SearchQaEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SearchQaEnv")
            .field("spec", &self.spec)
            .field("question", &self.question)
            .finish()
    }
}

impl SearchQaEnv {
    /// Create the env for a spec (see the crate docs for parameters).
    pub fn new(spec: &TaskSpec, params: &EnvParams) -> Result<Self, EnvError> {
        let p = parse_params(params)?;
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
            retry: p.retry,
            top_k: p.top_k,
            max_steps: p.max_steps,
            steps: 0,
            invalid: 0,
            done: false,
            success: false,
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
    fn information(&mut self, query: &str) -> String {
        let hits = self.corpus.search(query, self.top_k);
        if hits.is_empty() {
            return "<information>No results found.</information>".into();
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
        s
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
            self.max_steps
        )
    }

    fn reset(&mut self) -> String {
        self.steps = 0;
        self.invalid = 0;
        self.done = false;
        self.success = false;
        self.retrieved.clear();
        self.queries.clear();
        self.wrong_answers.clear();
        self.last_obs = self.first_observation();
        self.last_obs.clone()
    }

    fn step(&mut self, action: &str) -> Result<Step, StepError> {
        if self.done {
            return Err(StepError::EpisodeOver);
        }
        let parsed = match parser::parse(action) {
            Ok(a) => a,
            Err(e) => {
                self.invalid += 1;
                return Err(e.into());
            }
        };
        self.steps += 1;
        let mut reward = 0.0;
        let mut extra = serde_json::Map::new();
        let effective;
        let mut observation = match parsed {
            Action::Search(q) => {
                let before = self.retrieved.len();
                let info = self.information(&q);
                effective = self.retrieved.len() > before;
                self.queries.push(q);
                info
            }
            Action::Answer(a) => {
                if reward::exact_match(&a, &self.question.answers) {
                    reward = 1.0;
                    self.done = true;
                    self.success = true;
                    effective = true;
                    format!("Your answer '{a}' is correct.")
                } else {
                    effective = self.wrong_answers.insert(reward::normalize_answer(&a));
                    extra.insert("wrong_answer".into(), true.into());
                    if self.retry {
                        format!(
                            "Your answer '{a}' is incorrect. You may search more and answer again."
                        )
                    } else {
                        self.done = true;
                        format!("Your answer '{a}' is incorrect.")
                    }
                }
            }
        };
        if !self.done && self.steps >= self.max_steps {
            self.done = true;
            observation.push_str("\nThe action budget is exhausted.");
        }
        self.last_obs = observation.clone();
        Ok(Step {
            observation,
            reward,
            done: self.done,
            success: self.success,
            info: StepInfo { effective, extra },
        })
    }

    fn observation(&self) -> String {
        self.last_obs.clone()
    }

    fn available_actions(&self) -> Vec<String> {
        if self.done {
            return Vec::new();
        }
        // Free-text grammar: the question itself is the representative query.
        vec![format!("search[{}]", self.question.question)]
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
            &[u8::from(self.done)],
        ])
    }

    fn expert_action(&mut self) -> Option<String> {
        if self.done {
            return None;
        }
        Some(expert::next_action(
            &self.question,
            &self.retrieved,
            &self.queries,
        ))
    }

    fn steps(&self) -> usize {
        self.steps
    }

    fn invalid_actions(&self) -> usize {
        self.invalid
    }

    fn max_steps(&self) -> usize {
        self.max_steps
    }

    fn is_done(&self) -> bool {
        self.done
    }

    fn is_success(&self) -> bool {
        self.success
    }
}
