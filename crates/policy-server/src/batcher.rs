//! The model's own thread and the queue in front of it: requests that
//! arrive while the model is busy (or within a short window of an idle
//! model) are generated together in one batched call per set of sampling
//! parameters. The model never runs on the async runtime.
//!
//! Every sequence samples from its own random stream, so a choice makes the
//! same draws whatever other requests shared its batch: a seeded request
//! repeats its tokens (its log-probs up to the float rounding of the batch's
//! shape). Per-request options (penalties, logit bias, top alternatives)
//! ride along each sequence ([`SequenceOptions`]), so requests that differ
//! only in them still share a batch.
//!
//! Work is tied to its request: a job whose client has gone (its answer's
//! receiver dropped: a closed connection, a timed-out request, a stream
//! nobody reads) is skipped if it has not started, and its sequences leave
//! the batch at their next token if it has.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use agentrl_model::steering::top_logprobs;
use agentrl_model::{
    Generation, LogitAdjustment, PolicyModel, PromptTokenLogprob, SamplingParams, Steering,
};
use rand_chacha::ChaCha8Rng;
use tokio::sync::{mpsc as tokio_mpsc, oneshot};

/// How requests are gathered into batches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchLimits {
    /// Sequences (prompts × choices) per model call at most.
    pub max_batch_sequences: usize,
    /// How long an idle model waits for more requests after the first one
    /// before it starts (requests arriving while it works wait anyway).
    pub window: Duration,
    /// Requests waiting for the model at most; beyond, requests answer 503.
    pub max_queued: usize,
}

impl Default for BatchLimits {
    fn default() -> Self {
        Self {
            max_batch_sequences: 256,
            window: Duration::from_millis(5),
            max_queued: 4096,
        }
    }
}

/// Why a generation did not happen.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GenerateError {
    /// The queue is full.
    #[error("the queue of {0} requests is full")]
    Busy(usize),
    /// The model thread is gone (the server is shutting down).
    #[error("the model thread has stopped")]
    Stopped,
    /// The model failed (non-finite logits, a bug).
    #[error("generation failed: {0}")]
    Failed(String),
    /// A LoRA adapter could not be loaded (bad files, a name taken).
    #[error("{0}")]
    Adapter(String),
}

/// What one request asks of each of its sequences beyond the sampling
/// parameters.
#[derive(Debug, Clone, Default)]
pub struct SequenceOptions {
    /// Penalties and logit bias applied before each token is chosen.
    pub adjust: LogitAdjustment,
    /// Top alternatives (with their log-probs) kept per generated token.
    pub top_logprobs: usize,
    /// Score these prompts' own tokens (OpenAI's `echo`, vLLM's
    /// `prompt_logprobs`), with this many alternatives per position.
    pub score_prompts: Option<(Vec<Vec<u32>>, usize)>,
    /// One flag per sequence: once set, the sequence ends at its next token
    /// (a stream reached a stop string).
    pub stop_flags: Option<Arc<[AtomicBool]>>,
}

/// A request's sequences and how to generate them.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompts: Vec<Vec<u32>>,
    /// Prompt `i` samples from `rngs[i]` alone.
    pub rngs: Vec<ChaCha8Rng>,
    pub params: SamplingParams,
    /// The LoRA adapter to generate with (by its loaded name), or the base model.
    pub adapter: Option<String>,
    pub options: SequenceOptions,
}

/// One generated sequence with the top alternatives of each of its steps
/// (empty lists unless asked for).
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceOutput {
    pub generation: Generation,
    pub top: Vec<Vec<(u32, f32)>>,
}

/// What a request gets back: its sequences, and its prompts' scores when asked.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GenerateOutput {
    pub sequences: Vec<SequenceOutput>,
    /// Per prompt of [`SequenceOptions::score_prompts`], its tokens' log-probs.
    pub prompt_scores: Vec<Vec<PromptTokenLogprob>>,
}

/// What a streamed request receives, in order: its prompts' scores (when
/// asked), each token as it is chosen, then the whole result.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// Per prompt of [`SequenceOptions::score_prompts`], its tokens' log-probs.
    PromptScores(Vec<Vec<PromptTokenLogprob>>),
    /// Sequence `seq` chose `token`.
    Token {
        seq: usize,
        token: u32,
        logprob: f32,
        top: Vec<(u32, f32)>,
    },
    /// Generation ended (every sequence), or failed.
    Done(Result<GenerateOutput, GenerateError>),
}

/// Where a job's answer goes.
enum Reply {
    Once(oneshot::Sender<Result<GenerateOutput, GenerateError>>),
    Stream(tokio_mpsc::UnboundedSender<StreamEvent>),
}

impl Reply {
    /// The client stopped waiting (its receiver is gone).
    fn is_closed(&self) -> bool {
        match self {
            Reply::Once(tx) => tx.is_closed(),
            Reply::Stream(tx) => tx.is_closed(),
        }
    }

    fn send(self, answer: Result<GenerateOutput, GenerateError>) {
        // The receiver is gone when the client hung up or timed out.
        match self {
            Reply::Once(tx) => {
                let _ = tx.send(answer);
            }
            Reply::Stream(tx) => {
                let _ = tx.send(StreamEvent::Done(answer));
            }
        }
    }
}

/// The sequences of one request, generated together.
struct Job {
    prompts: Vec<Vec<u32>>,
    rngs: Vec<ChaCha8Rng>,
    params: SamplingParams,
    /// The LoRA adapter to generate with (by its loaded name), or the base model.
    adapter: Option<String>,
    options: SequenceOptions,
    reply: Reply,
}

/// What the model thread is asked to do.
enum Message {
    Generate(Job),
    /// Load the PEFT adapter at `path` under `name`.
    LoadAdapter {
        name: String,
        path: PathBuf,
        reply: oneshot::Sender<Result<(), GenerateError>>,
    },
    /// Drop the adapter loaded as `name`.
    UnloadAdapter {
        name: String,
        reply: oneshot::Sender<Result<(), GenerateError>>,
    },
}

/// The queue's sending end; cloning it is cheap.
#[derive(Debug, Clone)]
pub struct Generator {
    jobs: SyncSender<Message>,
    max_queued: usize,
    stats: GenerationStats,
}

/// What the model thread is doing and has done, readable from any thread
/// while it works; clones share the counts.
#[derive(Debug, Clone, Default)]
pub struct GenerationStats(Arc<Counts>);

/// The counters behind [`GenerationStats`], written by the model thread.
#[derive(Debug, Default)]
struct Counts {
    /// Sequences of the model calls under way.
    running: AtomicUsize,
    /// Tokens chosen, every sequence's.
    generated: AtomicU64,
}

impl GenerationStats {
    /// Sequences in the model calls under way: back to 0 once every
    /// sequence has ended, by its own end or because its client left.
    pub fn running_sequences(&self) -> usize {
        self.0.running.load(Ordering::Acquire)
    }

    /// Tokens generated since the model thread started, every request's.
    pub fn generated_tokens(&self) -> u64 {
        self.0.generated.load(Ordering::Acquire)
    }
}

impl Generator {
    /// Start the model thread; it ends when every `Generator` clone is dropped.
    pub fn start(
        model: PolicyModel,
        limits: BatchLimits,
    ) -> std::io::Result<(Self, JoinHandle<()>)> {
        let (jobs, queue) = mpsc::sync_channel(limits.max_queued.max(1));
        let stats = GenerationStats::default();
        let counts = Arc::clone(&stats.0);
        let thread = std::thread::Builder::new()
            .name("agentrl-policy-model".into())
            .spawn(move || {
                let mut models = Models {
                    base: model,
                    adapters: HashMap::new(),
                };
                model_loop(&mut models, &queue, limits, &counts)
            })?;
        Ok((
            Self {
                jobs,
                max_queued: limits.max_queued,
                stats,
            },
            thread,
        ))
    }

    /// The model thread's counts (a handle that reads them as they change).
    pub fn stats(&self) -> GenerationStats {
        self.stats.clone()
    }

    /// Generate a continuation of each prompt, prompt `i` sampling from
    /// `rngs[i]`, with the LoRA adapter loaded as `adapter` or the base model.
    pub async fn generate(
        &self,
        prompts: Vec<Vec<u32>>,
        rngs: Vec<ChaCha8Rng>,
        params: SamplingParams,
        adapter: Option<String>,
    ) -> Result<Vec<Generation>, GenerateError> {
        let out = self
            .generate_with(GenerateRequest {
                prompts,
                rngs,
                params,
                adapter,
                options: SequenceOptions::default(),
            })
            .await?;
        Ok(out.sequences.into_iter().map(|s| s.generation).collect())
    }

    /// Generate `request`'s sequences with its options. Dropping the future
    /// before it resolves abandons the work (see the module doc).
    pub async fn generate_with(
        &self,
        request: GenerateRequest,
    ) -> Result<GenerateOutput, GenerateError> {
        let (reply, answer) = oneshot::channel();
        self.send(Message::Generate(Job::of(request, Reply::Once(reply))))?;
        answer.await.unwrap_or(Err(GenerateError::Stopped))
    }

    /// Queue `request` and receive its tokens as they are chosen
    /// ([`StreamEvent`]). Dropping the receiver abandons the work.
    pub fn stream(
        &self,
        request: GenerateRequest,
    ) -> Result<tokio_mpsc::UnboundedReceiver<StreamEvent>, GenerateError> {
        let (tx, rx) = tokio_mpsc::unbounded_channel();
        self.send(Message::Generate(Job::of(request, Reply::Stream(tx))))?;
        Ok(rx)
    }

    /// Load the PEFT adapter in `path` on the model thread, to generate with as `name`.
    pub async fn load_adapter(&self, name: String, path: PathBuf) -> Result<(), GenerateError> {
        let (reply, answer) = oneshot::channel();
        self.send(Message::LoadAdapter { name, path, reply })?;
        answer.await.unwrap_or(Err(GenerateError::Stopped))
    }

    /// Drop the adapter loaded as `name` on the model thread, after the jobs
    /// queued before this call.
    pub async fn unload_adapter(&self, name: String) -> Result<(), GenerateError> {
        let (reply, answer) = oneshot::channel();
        self.send(Message::UnloadAdapter { name, reply })?;
        answer.await.unwrap_or(Err(GenerateError::Stopped))
    }

    fn send(&self, message: Message) -> Result<(), GenerateError> {
        match self.jobs.try_send(message) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(GenerateError::Busy(self.max_queued)),
            Err(TrySendError::Disconnected(_)) => Err(GenerateError::Stopped),
        }
    }
}

impl Job {
    fn of(r: GenerateRequest, reply: Reply) -> Self {
        Job {
            prompts: r.prompts,
            rngs: r.rngs,
            params: r.params,
            adapter: r.adapter,
            options: r.options,
            reply,
        }
    }
}

/// The base model and the LoRA adapters loaded over it, by name.
struct Models {
    base: PolicyModel,
    adapters: HashMap<String, PolicyModel>,
}

impl Models {
    /// The model of `adapter` (the base when none).
    fn get(&self, adapter: Option<&str>) -> Result<&PolicyModel, GenerateError> {
        match adapter {
            None => Ok(&self.base),
            Some(name) => self.adapters.get(name).ok_or_else(|| {
                GenerateError::Failed(format!("no LoRA adapter `{name}` is loaded"))
            }),
        }
    }

    fn load(&mut self, name: String, path: &Path) -> Result<(), GenerateError> {
        if self.adapters.contains_key(&name) {
            return Err(GenerateError::Adapter(format!(
                "the LoRA adapter `{name}` has already been loaded"
            )));
        }
        let model = self
            .base
            .with_adapter(path)
            .map_err(|e| GenerateError::Adapter(e.to_string()))?;
        self.adapters.insert(name, model);
        Ok(())
    }

    fn unload(&mut self, name: &str) -> Result<(), GenerateError> {
        self.adapters
            .remove(name)
            .map(drop)
            .ok_or_else(|| GenerateError::Adapter(format!("no LoRA adapter `{name}` is loaded")))
    }
}

/// Take the jobs that are waiting (after the window, up to the batch
/// size), generate them, answer; until the queue closes.
/// An adapter load is done when it arrives: the client waits for its answer
/// before it sends requests naming the adapter.
fn model_loop(
    models: &mut Models,
    queue: &Receiver<Message>,
    limits: BatchLimits,
    counts: &Counts,
) {
    let take = |models: &mut Models, message: Message| match message {
        Message::Generate(job) => Some(job),
        Message::LoadAdapter { name, path, reply } => {
            // The receiver is gone when the client hung up.
            let _ = reply.send(models.load(name, &path));
            None
        }
        Message::UnloadAdapter { name, reply } => {
            let _ = reply.send(models.unload(&name));
            None
        }
    };
    while let Ok(first) = queue.recv() {
        let Some(first) = take(models, first) else {
            continue;
        };
        let mut jobs = vec![first];
        let mut sequences = jobs[0].prompts.len();
        let deadline = Instant::now() + limits.window;
        while sequences < limits.max_batch_sequences {
            let left = deadline.saturating_duration_since(Instant::now());
            let next = if left.is_zero() {
                queue.try_recv().map_err(|_| RecvTimeoutError::Timeout)
            } else {
                queue.recv_timeout(left)
            };
            match next {
                Ok(message) => {
                    if let Some(job) = take(models, message) {
                        sequences += job.prompts.len();
                        jobs.push(job);
                    }
                }
                Err(_) if left.is_zero() => break,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        run_jobs(models, jobs, limits.max_batch_sequences, counts);
    }
}

/// Generate `jobs`: one model call per adapter and set of sampling
/// parameters (split at `max_batch` sequences), each job answered with its
/// own sequences. A job whose client has gone is dropped unstarted.
fn run_jobs(models: &Models, jobs: Vec<Job>, max_batch: usize, counts: &Counts) {
    type Key = (SamplingParams, Option<String>);
    let mut groups: Vec<(Key, Vec<Job>)> = Vec::new();
    for job in jobs {
        if job.reply.is_closed() {
            tracing::debug!("skipped a request whose client has gone");
            continue;
        }
        match groups
            .iter_mut()
            .find(|((p, a), _)| *p == job.params && *a == job.adapter)
        {
            Some((_, g)) => g.push(job),
            None => groups.push(((job.params.clone(), job.adapter.clone()), vec![job])),
        }
    }
    for ((params, adapter), group) in groups {
        run_group(
            models,
            &params,
            adapter.as_deref(),
            group,
            max_batch,
            counts,
        );
    }
}

/// A job while its sequences are generated.
struct Running {
    options: SequenceOptions,
    reply: Reply,
    output: Result<GenerateOutput, GenerateError>,
    /// Each sequence's generation once its chunk has run.
    gens: Vec<Option<Generation>>,
    tops: Vec<Vec<Vec<(u32, f32)>>>,
}

/// One group's jobs (same parameters and adapter) through the model.
fn run_group(
    models: &Models,
    params: &SamplingParams,
    adapter: Option<&str>,
    group: Vec<Job>,
    max_batch: usize,
    counts: &Counts,
) {
    // (job, sequence) of every sequence, in order.
    let mut owners: Vec<(usize, usize)> = Vec::new();
    let mut prompts: Vec<Vec<u32>> = Vec::new();
    let mut rngs: Vec<ChaCha8Rng> = Vec::new();
    let mut running: Vec<Running> = Vec::new();
    for (j, job) in group.into_iter().enumerate() {
        let n = job.prompts.len();
        for (s, (p, r)) in job.prompts.into_iter().zip(job.rngs).enumerate() {
            owners.push((j, s));
            prompts.push(p);
            rngs.push(r);
        }
        running.push(Running {
            options: job.options,
            reply: job.reply,
            output: Ok(GenerateOutput::default()),
            gens: vec![None; n],
            tops: vec![Vec::new(); n],
        });
    }
    let model = models.get(adapter);
    for job in &mut running {
        job.output = match (&model, &job.options.score_prompts) {
            (Err(e), _) => Err(e.clone()),
            (Ok(_), None) => Ok(GenerateOutput::default()),
            (Ok(model), Some((scored, k))) => score_guarded(model, scored, *k).map(|scores| {
                if let Reply::Stream(tx) = &job.reply {
                    let _ = tx.send(StreamEvent::PromptScores(scores.clone()));
                }
                GenerateOutput {
                    sequences: Vec::new(),
                    prompt_scores: scores,
                }
            }),
        };
    }
    let chunk = max_batch.max(1);
    for start in (0..prompts.len()).step_by(chunk) {
        let end = (start + chunk).min(prompts.len());
        counts.running.fetch_add(end - start, Ordering::AcqRel);
        let result = model.clone().and_then(|model| {
            let mut steering = BatchSteering {
                jobs: &running,
                owners: &owners[start..end],
                tops: vec![Vec::new(); end - start],
                counts,
            };
            let gens = generate_guarded(
                model,
                &prompts[start..end],
                params,
                &mut rngs[start..end],
                &mut steering,
            )?;
            Ok((gens, steering.tops))
        });
        // The call is over (a panic inside it was caught): its sequences
        // have all ended.
        counts.running.fetch_sub(end - start, Ordering::AcqRel);
        tracing::debug!(sequences = end - start, "generated a batch");
        match result {
            Ok((gens, tops)) => {
                for ((g, top), &(j, s)) in gens.into_iter().zip(tops).zip(&owners[start..end]) {
                    running[j].gens[s] = Some(g);
                    running[j].tops[s] = top;
                }
            }
            Err(e) => {
                for &(j, _) in &owners[start..end] {
                    running[j].output = Err(e.clone());
                }
            }
        }
    }
    for job in running {
        let answer = job.output.and_then(|mut out| {
            out.sequences = job
                .gens
                .into_iter()
                .zip(job.tops)
                .map(|(g, top)| g.map(|generation| SequenceOutput { generation, top }))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| GenerateError::Failed("a sequence got no continuation".into()))?;
            Ok(out)
        });
        job.reply.send(answer);
    }
}

/// The per-sequence options of one model call: row `i` of the call is
/// sequence `owners[i].1` of job `owners[i].0`.
struct BatchSteering<'a> {
    jobs: &'a [Running],
    owners: &'a [(usize, usize)],
    /// Per row, the top alternatives of each step.
    tops: Vec<Vec<Vec<(u32, f32)>>>,
    counts: &'a Counts,
}

impl Steering for BatchSteering<'_> {
    fn adjusts(&self, seq: usize) -> bool {
        !self.jobs[self.owners[seq].0].options.adjust.is_neutral()
    }

    fn adjust(&self, seq: usize, generated: &[u32], logits: &mut [f32]) {
        self.jobs[self.owners[seq].0]
            .options
            .adjust
            .apply(logits, generated);
    }

    fn chosen(&mut self, seq: usize, token: u32, logprob: f32, logits: &[f32]) -> bool {
        let (j, s) = self.owners[seq];
        let job = &self.jobs[j];
        self.counts.generated.fetch_add(1, Ordering::AcqRel);
        let k = job.options.top_logprobs;
        let top = if k > 0 {
            top_logprobs(logits, k)
        } else {
            Vec::new()
        };
        let mut go_on = match &job.reply {
            Reply::Once(tx) => !tx.is_closed(),
            Reply::Stream(tx) => tx
                .send(StreamEvent::Token {
                    seq: s,
                    token,
                    logprob,
                    top: top.clone(),
                })
                .is_ok(),
        };
        if let Some(flags) = &job.options.stop_flags {
            go_on &= !flags.get(s).is_some_and(|f| f.load(Ordering::Relaxed));
        }
        self.tops[seq].push(top);
        go_on
    }
}

/// Scores of `prompts` with `k` alternatives; a panic fails the job, not the thread.
fn score_guarded(
    model: &PolicyModel,
    prompts: &[Vec<u32>],
    k: usize,
) -> Result<Vec<Vec<PromptTokenLogprob>>, GenerateError> {
    let run = AssertUnwindSafe(|| {
        prompts
            .iter()
            .map(|p| model.prompt_logprobs(p, k))
            .collect::<Result<Vec<_>, _>>()
    });
    match std::panic::catch_unwind(run) {
        Ok(Ok(scores)) => Ok(scores),
        Ok(Err(e)) => Err(GenerateError::Failed(e.to_string())),
        Err(panic) => Err(GenerateError::Failed(format!(
            "the model panicked: {}",
            panic_message(&panic)
        ))),
    }
}

/// A panic's message.
fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

/// One model call; a panic inside it fails the call's requests, not the thread.
fn generate_guarded(
    model: &PolicyModel,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
    rngs: &mut [ChaCha8Rng],
    steering: &mut dyn Steering,
) -> Result<Vec<Generation>, GenerateError> {
    let run = AssertUnwindSafe(|| model.generate_steered(prompts, params, rngs, steering));
    match std::panic::catch_unwind(run) {
        Ok(Ok(gens)) => Ok(gens),
        Ok(Err(e)) => Err(GenerateError::Failed(e.to_string())),
        Err(panic) => {
            let msg = panic_message(&panic);
            tracing::error!(panic = %msg, "generation panicked");
            Err(GenerateError::Failed(format!("the model panicked: {msg}")))
        }
    }
}
