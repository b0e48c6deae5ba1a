//! [`OpenAiPolicy`]: a rollout [`Policy`] whose model lives on an
//! OpenAI-compatible server (vLLM, SGLang, `agentrl serve-policy`).
//!
//! Each prompt is one `/v1/completions` request with the prompt as token
//! ids, `return_token_ids` and `logprobs: 0`, so a rollout gets back exactly
//! the tokens the server sampled and their log-probs, as from the local
//! model. Requests run on at most `max_in_flight` threads at once (the
//! server batches them); a connection error, a timeout or a 5xx/429 answer
//! is retried with exponential backoff, at most `max_retries` times. A
//! completion request is safe to resend: with its seed it samples the same
//! tokens again.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use agentrl_rollout::{
    Followup, Generation, Generations, Policy, PolicyError, PromptBatch, SamplingParams,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use reqwest::blocking::{Client, RequestBuilder};
use reqwest::StatusCode;

use crate::protocol::{
    CompletionRequest, CompletionResponse, ErrorResponse, LoadLoraAdapterRequest, ModelList,
    Prompt, UnloadLoraAdapterRequest,
};

/// How [`OpenAiPolicy`] reaches its server.
#[derive(Clone, PartialEq)]
pub struct OpenAiOptions {
    /// The server's root URL (`http://host:8000`; a trailing `/v1` is accepted).
    pub endpoint: String,
    /// The served model to ask for; `None`: the only one the server lists.
    pub model: Option<String>,
    /// Sent as `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Requests in flight at once, at most.
    pub max_in_flight: usize,
    /// Retries of a request after a connection error, a timeout or a
    /// 5xx/429 answer (so `max_retries + 1` attempts in all).
    pub max_retries: u32,
    /// Wait before the first retry; doubles on each retry, up to [`MAX_BACKOFF`].
    pub backoff: Duration,
    /// Time one request may take, answer included.
    pub timeout: Duration,
}

impl std::fmt::Debug for OpenAiOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiOptions")
            .field("endpoint", &self.endpoint)
            .field("model", &self.model)
            // Never print the key itself.
            .field("api_key", &self.api_key.as_ref().map(|_| "<set>"))
            .field("max_in_flight", &self.max_in_flight)
            .field("max_retries", &self.max_retries)
            .field("backoff", &self.backoff)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// The longest wait between two attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);

impl OpenAiOptions {
    /// Options for `endpoint` with the defaults of the `[policy]` section.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            model: None,
            api_key: None,
            max_in_flight: 64,
            max_retries: 5,
            backoff: Duration::from_millis(100),
            timeout: Duration::from_secs(600),
        }
    }
}

/// Why the remote policy could not be reached or used.
#[derive(Debug, thiserror::Error)]
pub enum OpenAiError {
    /// The options are unusable (the message names the option).
    #[error("{0}")]
    Options(String),
    /// Every attempt failed with a connection error, a timeout or a 5xx/429.
    #[error("{url}: no answer after {attempts} attempts; last failure: {last}")]
    GaveUp {
        url: String,
        attempts: u32,
        last: String,
    },
    /// The server refused the request (4xx other than 429): resending cannot help.
    #[error("{url} answered {status}: {message}")]
    Refused {
        url: String,
        status: StatusCode,
        message: String,
    },
    /// The answer is not what a rollout needs (no token ids, no log-probs, …).
    #[error("{url}: {message}")]
    Answer { url: String, message: String },
    /// The model asked for is not served, or the server serves several.
    #[error("{url}: {message}")]
    Model { url: String, message: String },
}

/// The local model's seam, served remotely: see the module documentation.
#[derive(Debug)]
pub struct OpenAiPolicy {
    /// `…/v1`, without a trailing slash.
    base: String,
    model: String,
    client: Client,
    opts: OpenAiOptions,
}

/// What one attempt came to.
enum Attempt {
    /// A 2xx answer's body.
    Answered(Vec<u8>),
    /// Worth another try (connection error, timeout, 5xx, 429).
    Retry(String),
    /// Final (any other status).
    Refused(StatusCode, String),
}

impl OpenAiPolicy {
    /// Check the options, ask the server which models it serves
    /// (`GET /v1/models`) and settle on one.
    pub fn connect(opts: OpenAiOptions) -> Result<Self, OpenAiError> {
        let base = api_base(&opts.endpoint)?;
        if opts.max_in_flight == 0 {
            return Err(OpenAiError::Options(
                "max_in_flight must be at least 1".into(),
            ));
        }
        if opts.api_key.as_deref().is_some_and(str::is_empty) {
            return Err(OpenAiError::Options("the API key is empty".into()));
        }
        let client = Client::builder()
            .timeout(opts.timeout)
            .build()
            .map_err(|e| OpenAiError::Options(format!("cannot build the HTTP client: {e}")))?;
        let mut policy = Self {
            base,
            model: String::new(),
            client,
            opts,
        };
        let list = policy.model_list()?;
        policy.model = pick_model(&list, policy.opts.model.as_deref()).map_err(|message| {
            OpenAiError::Model {
                url: policy.url("models"),
                message,
            }
        })?;
        Ok(policy)
    }

    /// The served model's name this policy asks for.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// `GET /v1/models`.
    fn model_list(&self) -> Result<ModelList, OpenAiError> {
        let url = self.url("models");
        let body = self.send(&url, || self.client.get(&url))?;
        serde_json::from_slice(&body).map_err(|e| OpenAiError::Answer {
            url,
            message: format!("not a model list: {e}"),
        })
    }

    /// The names of every model the server serves now (`GET /v1/models`):
    /// its base model and the LoRA adapters loaded since it started.
    pub fn served_models(&self) -> Result<Vec<String>, OpenAiError> {
        Ok(self.model_list()?.data.into_iter().map(|m| m.id).collect())
    }

    /// Ask the server to load the PEFT adapter in `lora_path` (vLLM's `POST
    /// /v1/load_lora_adapter`) under the model name `lora_name`. The path is
    /// read by the server, on its own machine: it must see the directory
    /// at that path. Not retried: a load the server did but whose answer
    /// was lost would be refused the second time as a name taken.
    pub fn load_lora_adapter(&self, lora_name: &str, lora_path: &str) -> Result<(), OpenAiError> {
        let url = self.url("load_lora_adapter");
        let request = LoadLoraAdapterRequest {
            lora_name: lora_name.to_string(),
            lora_path: lora_path.to_string(),
        };
        self.post_once(url, &request)
    }

    /// Ask the server to drop the adapter loaded as `lora_name` (vLLM's
    /// `POST /v1/unload_lora_adapter`). Not retried, like the load: an
    /// unload the server did but whose answer was lost would be refused the
    /// second time as an unknown name.
    pub fn unload_lora_adapter(&self, lora_name: &str) -> Result<(), OpenAiError> {
        let url = self.url("unload_lora_adapter");
        let request = UnloadLoraAdapterRequest {
            lora_name: lora_name.to_string(),
        };
        self.post_once(url, &request)
    }

    /// POST `request` to `url` once, without retries (for requests that
    /// are not idempotent); the answer's body is not needed.
    fn post_once(&self, url: String, request: &impl serde::Serialize) -> Result<(), OpenAiError> {
        match self.attempt(&|| self.client.post(&url).json(request)) {
            Attempt::Answered(_) => Ok(()),
            Attempt::Refused(status, message) => Err(OpenAiError::Refused {
                url,
                status,
                message,
            }),
            Attempt::Retry(last) => Err(OpenAiError::GaveUp {
                url,
                attempts: 1,
                last,
            }),
        }
    }

    /// Generate with the served model `name` from now on (a LoRA adapter
    /// just loaded, say), checking that the server lists it.
    pub fn use_model(&mut self, name: &str) -> Result<(), OpenAiError> {
        let list = self.model_list()?;
        self.model = pick_model(&list, Some(name)).map_err(|message| OpenAiError::Model {
            url: self.url("models"),
            message,
        })?;
        Ok(())
    }

    /// The `/v1` base URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    fn url(&self, route: &str) -> String {
        format!("{}/{route}", self.base)
    }

    /// One attempt of the request `build` makes.
    fn attempt(&self, build: &impl Fn() -> RequestBuilder) -> Attempt {
        let mut rb = build();
        if let Some(key) = &self.opts.api_key {
            rb = rb.bearer_auth(key);
        }
        let resp = match rb.send() {
            Ok(r) => r,
            // Connection refused or dropped, timeouts, a body cut short: the
            // request may be resent (completions are idempotent with a seed).
            Err(e) => return Attempt::Retry(error_chain(&e)),
        };
        let status = resp.status();
        let body = match resp.bytes() {
            Ok(b) => b.to_vec(),
            Err(e) => {
                return Attempt::Retry(format!("{status}, reading the answer: {}", error_chain(&e)))
            }
        };
        if status.is_success() {
            return Attempt::Answered(body);
        }
        let message = error_message(&body);
        if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
            Attempt::Retry(format!("{status}: {message}"))
        } else {
            Attempt::Refused(status, message)
        }
    }

    /// Send with retries and exponential backoff; the 2xx answer's body.
    fn send(&self, url: &str, build: impl Fn() -> RequestBuilder) -> Result<Vec<u8>, OpenAiError> {
        let mut wait = self.opts.backoff;
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.attempt(&build) {
                Attempt::Answered(body) => return Ok(body),
                Attempt::Refused(status, message) => {
                    return Err(OpenAiError::Refused {
                        url: url.to_string(),
                        status,
                        message,
                    })
                }
                Attempt::Retry(last) if attempts > self.opts.max_retries => {
                    return Err(OpenAiError::GaveUp {
                        url: url.to_string(),
                        attempts,
                        last,
                    })
                }
                Attempt::Retry(last) => {
                    tracing::debug!(%url, attempts, failure = %last, "retrying");
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// The continuation of one prompt.
    pub fn complete(
        &self,
        prompt: &[u32],
        params: &SamplingParams,
        seed: Option<u64>,
    ) -> Result<Generation, OpenAiError> {
        let url = self.url("completions");
        let request = completion_request(&self.model, prompt, params, seed);
        let body = self.send(&url, || self.client.post(&url).json(&request))?;
        let answer: CompletionResponse =
            serde_json::from_slice(&body).map_err(|e| OpenAiError::Answer {
                url: url.clone(),
                message: format!("not a completion: {e}"),
            })?;
        read_generation(answer, params).map_err(|message| OpenAiError::Answer { url, message })
    }
}

impl Policy for OpenAiPolicy {
    fn generate_batch(&mut self, batch: PromptBatch<'_>, rng: &mut ChaCha8Rng) -> Generations {
        let PromptBatch { prompts, params } = batch;
        // One seed per prompt, drawn in order, so the same rollout seed
        // samples the same tokens; greedy decoding draws none, as locally.
        let seeds: Vec<Option<u64>> = prompts
            .iter()
            .map(|_| (params.temperature > 0.0).then(|| rng.random::<u64>() >> 1))
            .collect();
        let results: Vec<Mutex<Option<Generation>>> =
            prompts.iter().map(|_| Mutex::new(None)).collect();
        let first_error: Mutex<Option<OpenAiError>> = Mutex::new(None);
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let workers = self.opts.max_in_flight.min(prompts.len());
        let this = &*self;
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= prompts.len() || failed.load(Ordering::Relaxed) {
                        break;
                    }
                    match this.complete(&prompts[i], params, seeds[i]) {
                        Ok(g) => *lock(&results[i]) = Some(g),
                        Err(e) => {
                            failed.store(true, Ordering::Relaxed);
                            lock(&first_error).get_or_insert(e);
                            break;
                        }
                    }
                });
            }
        });
        if let Some(e) = lock(&first_error).take() {
            return Err(PolicyError(e.to_string()));
        }
        results
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                r.into_inner()
                    .unwrap_or_else(|p| p.into_inner())
                    .ok_or_else(|| PolicyError(format!("prompt {i} got no continuation")))
            })
            .collect()
    }

    /// Continuous batching over HTTP: a sequence's next request is sent as
    /// soon as its last answer is in, whatever the others wait for (the
    /// server batches what is in flight), at most `max_in_flight` at once.
    /// Turn `k` of sequence `i` samples with a seed of its own, drawn from
    /// a stream that sequence `i` takes from `rng` at the start, so the
    /// same rollout seed samples the same tokens in whatever order the
    /// server answers; greedy decoding draws none.
    fn generate_continuous(
        &mut self,
        prompts: Vec<Vec<u32>>,
        params: &SamplingParams,
        rng: &mut ChaCha8Rng,
        next: &mut dyn FnMut(usize, Generation) -> Followup,
    ) -> Result<(), PolicyError> {
        let streams: Vec<Option<u64>> = prompts
            .iter()
            .map(|_| (params.temperature > 0.0).then(|| rng.random::<u64>()))
            .collect();
        let seed = |i: usize, turn: u64| streams[i].map(|s| turn_seed(s, turn));
        let mut turns = vec![0u64; prompts.len()];
        let (job_tx, job_rx) = mpsc::channel::<(usize, Vec<u32>, Option<u64>)>();
        let (done_tx, done_rx) = mpsc::channel();
        let jobs = Mutex::new(job_rx);
        let workers = self.opts.max_in_flight.min(prompts.len());
        let this = &*self;
        std::thread::scope(|s| {
            for _ in 0..workers {
                let done_tx = done_tx.clone();
                let jobs = &jobs;
                s.spawn(move || loop {
                    // The lock is held while waiting: one worker waits, the
                    // others wait for it; all leave once the sender is gone.
                    let Ok((i, prompt, seed)) = lock(jobs).recv() else {
                        break;
                    };
                    if done_tx
                        .send((i, this.complete(&prompt, params, seed)))
                        .is_err()
                    {
                        break;
                    }
                });
            }
            // The workers hold the only senders: if they all stop, so does the wait.
            drop(done_tx);
            let mut pending = prompts.len();
            for (i, prompt) in prompts.into_iter().enumerate() {
                let _ = job_tx.send((i, prompt, seed(i, 0)));
            }
            while pending > 0 {
                let Ok((i, answer)) = done_rx.recv() else {
                    break;
                };
                pending -= 1;
                let generation = answer.map_err(|e| PolicyError(e.to_string()))?;
                match next(i, generation) {
                    Followup::Continue(context) => {
                        turns[i] += 1;
                        let _ = job_tx.send((i, context, seed(i, turns[i])));
                        pending += 1;
                    }
                    Followup::Done => {}
                    Followup::Abort => break,
                }
            }
            // Dropping the sender lets the workers go once their request
            // in flight is answered.
            drop(job_tx);
            Ok(())
        })
    }
}

/// The seed of turn `turn` of the sequence whose stream is `stream`.
fn turn_seed(stream: u64, turn: u64) -> u64 {
    let mut rng = ChaCha8Rng::seed_from_u64(stream);
    rng.set_stream(turn);
    rng.random::<u64>() >> 1
}

/// A mutex's content, also after another thread panicked holding it (the
/// data here is written whole or not at all).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `endpoint` as the `/v1` base URL.
fn api_base(endpoint: &str) -> Result<String, OpenAiError> {
    let e = endpoint.trim().trim_end_matches('/');
    if !(e.starts_with("http://") || e.starts_with("https://")) {
        return Err(OpenAiError::Options(format!(
            "policy endpoint {endpoint:?} must start with http:// or https://"
        )));
    }
    Ok(if e.ends_with("/v1") {
        e.to_string()
    } else {
        format!("{e}/v1")
    })
}

/// The model to ask for: `wanted` if served, else the only one served.
fn pick_model(list: &ModelList, wanted: Option<&str>) -> Result<String, String> {
    let served: Vec<&str> = list.data.iter().map(|m| m.id.as_str()).collect();
    match wanted {
        Some(w) if served.contains(&w) => Ok(w.to_string()),
        Some(w) => Err(format!(
            "the server does not serve model {w:?} (it serves: {})",
            served.join(", ")
        )),
        None => match served.as_slice() {
            [one] => Ok(one.to_string()),
            [] => Err("the server lists no model".into()),
            many => Err(format!(
                "the server serves {} models ({}): name one (policy.model, --policy-model)",
                many.len(),
                many.join(", ")
            )),
        },
    }
}

/// The request for one prompt: token ids in, token ids and sampled-token
/// log-probs out, stopping exactly at `params.stop_tokens` (the server's
/// own end-of-sequence tokens are ignored, as the local model ignores them).
fn completion_request(
    model: &str,
    prompt: &[u32],
    params: &SamplingParams,
    seed: Option<u64>,
) -> CompletionRequest {
    CompletionRequest {
        model: Some(model.to_string()),
        prompt: Some(Prompt::Tokens(prompt.to_vec())),
        max_tokens: Some(params.max_new_tokens),
        temperature: Some(params.temperature),
        top_p: Some(params.top_p),
        top_k: (params.top_k > 0).then_some(params.top_k as i64),
        n: Some(1),
        stop_token_ids: Some(params.stop_tokens.clone()),
        ignore_eos: Some(true),
        seed,
        logprobs: Some(0),
        return_token_ids: Some(true),
        ..CompletionRequest::default()
    }
}

/// The one choice of `answer` as a rollout generation, checked.
fn read_generation(
    answer: CompletionResponse,
    params: &SamplingParams,
) -> Result<Generation, String> {
    let [choice] = <[_; 1]>::try_from(answer.choices)
        .map_err(|c: Vec<_>| format!("asked for one choice, got {}", c.len()))?;
    let tokens = choice.token_ids.ok_or(
        "the answer has no `token_ids`: the server must support vLLM's `return_token_ids` \
         (vLLM >= 0.10.2, or `agentrl serve-policy`)",
    )?;
    let logprobs = choice
        .logprobs
        .ok_or("the answer has no `logprobs` (asked for with `logprobs: 0`)")?
        .token_logprobs;
    if logprobs.len() != tokens.len() {
        return Err(format!(
            "{} log-probs for {} token ids",
            logprobs.len(),
            tokens.len()
        ));
    }
    let logprobs = logprobs
        .into_iter()
        .enumerate()
        .map(|(i, lp)| lp.ok_or(format!("token {i} has no log-prob")))
        .collect::<Result<Vec<f32>, _>>()?;
    if tokens.len() > params.max_new_tokens {
        return Err(format!(
            "{} tokens generated, more than max_tokens {}",
            tokens.len(),
            params.max_new_tokens
        ));
    }
    let is_stop = |t: &u32| params.stop_tokens.contains(t);
    if let Some(i) = tokens
        .iter()
        .position(is_stop)
        .filter(|&i| i + 1 < tokens.len())
    {
        return Err(format!(
            "generation went on past stop token {} at position {i}: the server ignored `stop_token_ids`",
            tokens[i]
        ));
    }
    let stopped = tokens.last().is_some_and(is_stop);
    Ok(Generation {
        tokens,
        logprobs,
        stopped,
    })
}

/// An error answer's message (OpenAI's `error.message`, else the body).
fn error_message(body: &[u8]) -> String {
    match serde_json::from_slice::<ErrorResponse>(body) {
        Ok(e) => match e.error.param {
            Some(p) => format!("{} (param: {p})", e.error.message),
            None => e.error.message,
        },
        Err(_) => {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            if text.is_empty() {
                "(empty body)".into()
            } else {
                text.chars().take(500).collect()
            }
        }
    }
}

/// An error with its causes ("error sending request: connection closed
/// before message completed"): reqwest's own message alone hides the cause.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{CompletionChoice, CompletionLogprobs, ModelCard};

    /// Greedy, four tokens, stopping at id 2.
    fn params() -> SamplingParams {
        SamplingParams {
            stop_tokens: vec![2],
            ..SamplingParams::greedy(4)
        }
    }

    fn answer(token_ids: Option<Vec<u32>>, logprobs: Vec<Option<f32>>) -> CompletionResponse {
        CompletionResponse {
            choices: vec![CompletionChoice {
                token_ids,
                logprobs: Some(CompletionLogprobs {
                    token_logprobs: logprobs,
                    ..CompletionLogprobs::default()
                }),
                ..CompletionChoice::default()
            }],
            ..CompletionResponse::default()
        }
    }

    #[test]
    fn endpoints_get_one_v1_base() {
        assert_eq!(api_base("http://h:8000").unwrap(), "http://h:8000/v1");
        assert_eq!(api_base("http://h:8000/v1/").unwrap(), "http://h:8000/v1");
        assert!(api_base("h:8000")
            .unwrap_err()
            .to_string()
            .contains("http://"));
    }

    #[test]
    fn the_model_is_the_one_named_or_the_only_one() {
        let list = |ids: &[&str]| ModelList {
            object: "list".into(),
            data: ids
                .iter()
                .map(|id| ModelCard {
                    id: id.to_string(),
                    ..ModelCard::default()
                })
                .collect(),
        };
        assert_eq!(pick_model(&list(&["a"]), None).unwrap(), "a");
        assert_eq!(pick_model(&list(&["a", "b"]), Some("b")).unwrap(), "b");
        assert!(pick_model(&list(&["a", "b"]), None)
            .unwrap_err()
            .contains("policy.model"));
        assert!(pick_model(&list(&["a"]), Some("c"))
            .unwrap_err()
            .contains("serves: a"));
    }

    #[test]
    fn a_generation_is_read_from_token_ids_and_logprobs() {
        let g = read_generation(
            answer(Some(vec![7, 2]), vec![Some(-0.5), Some(-0.25)]),
            &params(),
        )
        .unwrap();
        assert_eq!(
            g,
            Generation {
                tokens: vec![7, 2],
                logprobs: vec![-0.5, -0.25],
                stopped: true
            }
        );
        let cut =
            read_generation(answer(Some(vec![7, 8]), vec![Some(-1.0); 2]), &params()).unwrap();
        assert!(!cut.stopped);
    }

    #[test]
    fn answers_a_rollout_cannot_use_are_errors() {
        let e = read_generation(answer(None, vec![]), &params()).unwrap_err();
        assert!(e.contains("return_token_ids"), "{e}");
        let e = read_generation(answer(Some(vec![7]), vec![]), &params()).unwrap_err();
        assert!(e.contains("0 log-probs for 1 token ids"), "{e}");
        let e = read_generation(answer(Some(vec![7]), vec![None]), &params()).unwrap_err();
        assert!(e.contains("no log-prob"), "{e}");
        let e =
            read_generation(answer(Some(vec![2, 7]), vec![Some(-1.0); 2]), &params()).unwrap_err();
        assert!(e.contains("ignored `stop_token_ids`"), "{e}");
        let e =
            read_generation(answer(Some(vec![7; 5]), vec![Some(-1.0); 5]), &params()).unwrap_err();
        assert!(e.contains("more than max_tokens 4"), "{e}");
    }

    #[test]
    fn the_request_asks_for_token_ids_logprobs_and_exact_stops() {
        let r = completion_request("m", &[1, 5], &params(), None);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "model": "m", "prompt": [1, 5], "max_tokens": 4, "temperature": 0.0,
                "top_p": 1.0, "n": 1, "stop_token_ids": [2], "ignore_eos": true,
                "logprobs": 0, "return_token_ids": true
            })
        );
    }

    #[test]
    fn error_messages_name_the_param() {
        let body = br#"{"error":{"message":"too long","type":"invalid_request_error","param":"max_tokens","code":null}}"#;
        assert_eq!(error_message(body), "too long (param: max_tokens)");
        assert_eq!(error_message(b""), "(empty body)");
        assert_eq!(error_message(b"oops"), "oops");
    }
}
