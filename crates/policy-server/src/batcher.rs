//! The model's own thread and the queue in front of it: requests that
//! arrive while the model is busy (or within a short window of an idle
//! model) are generated together in one batched call per set of sampling
//! parameters. The model never runs on the async runtime.
//!
//! Every sequence samples from its own random stream, so a choice makes the
//! same draws whatever other requests shared its batch: a seeded request
//! repeats its tokens (its log-probs up to the float rounding of the batch's
//! shape).

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use agentrl_model::{Generation, PolicyModel, SamplingParams};
use rand_chacha::ChaCha8Rng;
use tokio::sync::oneshot;

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

/// The sequences of one request, generated together.
struct Job {
    prompts: Vec<Vec<u32>>,
    rngs: Vec<ChaCha8Rng>,
    params: SamplingParams,
    /// The LoRA adapter to generate with (by its loaded name), or the base model.
    adapter: Option<String>,
    reply: oneshot::Sender<Result<Vec<Generation>, GenerateError>>,
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
}

impl Generator {
    /// Start the model thread; it ends when every `Generator` clone is dropped.
    pub fn start(
        model: PolicyModel,
        limits: BatchLimits,
    ) -> std::io::Result<(Self, JoinHandle<()>)> {
        let (jobs, queue) = mpsc::sync_channel(limits.max_queued.max(1));
        let thread = std::thread::Builder::new()
            .name("agentrl-policy-model".into())
            .spawn(move || {
                let mut models = Models {
                    base: model,
                    adapters: HashMap::new(),
                };
                model_loop(&mut models, &queue, limits)
            })?;
        Ok((
            Self {
                jobs,
                max_queued: limits.max_queued,
            },
            thread,
        ))
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
        let (reply, answer) = oneshot::channel();
        self.send(Message::Generate(Job {
            prompts,
            rngs,
            params,
            adapter,
            reply,
        }))?;
        answer.await.unwrap_or(Err(GenerateError::Stopped))
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
fn model_loop(models: &mut Models, queue: &Receiver<Message>, limits: BatchLimits) {
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
        run_jobs(models, jobs, limits.max_batch_sequences);
    }
}

/// Generate `jobs`: one model call per adapter and set of sampling
/// parameters (split at `max_batch` sequences), each job answered with its
/// own sequences.
fn run_jobs(models: &Models, jobs: Vec<Job>, max_batch: usize) {
    type Key = (SamplingParams, Option<String>);
    let mut groups: Vec<(Key, Vec<Job>)> = Vec::new();
    for job in jobs {
        match groups
            .iter_mut()
            .find(|((p, a), _)| *p == job.params && *a == job.adapter)
        {
            Some((_, g)) => g.push(job),
            None => groups.push(((job.params.clone(), job.adapter.clone()), vec![job])),
        }
    }
    for ((params, adapter), group) in groups {
        // (job, sequence) of every sequence, in order.
        let mut owners: Vec<(usize, usize)> = Vec::new();
        let mut prompts: Vec<Vec<u32>> = Vec::new();
        let mut rngs: Vec<ChaCha8Rng> = Vec::new();
        let mut replies = Vec::new();
        let mut outputs: Vec<Result<Vec<Option<Generation>>, GenerateError>> = Vec::new();
        for (j, job) in group.into_iter().enumerate() {
            outputs.push(Ok(vec![None; job.prompts.len()]));
            for (s, (p, r)) in job.prompts.into_iter().zip(job.rngs).enumerate() {
                owners.push((j, s));
                prompts.push(p);
                rngs.push(r);
            }
            replies.push(job.reply);
        }
        let chunk = max_batch.max(1);
        for start in (0..prompts.len()).step_by(chunk) {
            let end = (start + chunk).min(prompts.len());
            let result = models.get(adapter.as_deref()).and_then(|model| {
                generate_guarded(model, &prompts[start..end], &params, &mut rngs[start..end])
            });
            tracing::debug!(sequences = end - start, "generated a batch");
            match result {
                Ok(gens) => {
                    for (g, &(j, s)) in gens.into_iter().zip(&owners[start..end]) {
                        if let Ok(out) = &mut outputs[j] {
                            out[s] = Some(g);
                        }
                    }
                }
                Err(e) => {
                    for &(j, _) in &owners[start..end] {
                        outputs[j] = Err(e.clone());
                    }
                }
            }
        }
        for (reply, out) in replies.into_iter().zip(outputs) {
            let answer = out.and_then(|gens| {
                gens.into_iter()
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| GenerateError::Failed("a sequence got no continuation".into()))
            });
            // The receiver is gone when the client hung up or timed out.
            let _ = reply.send(answer);
        }
    }
}

/// One model call; a panic inside it fails the call's requests, not the thread.
fn generate_guarded(
    model: &PolicyModel,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
    rngs: &mut [ChaCha8Rng],
) -> Result<Vec<Generation>, GenerateError> {
    let run = AssertUnwindSafe(|| model.generate_independent(prompts, params, rngs));
    match std::panic::catch_unwind(run) {
        Ok(Ok(gens)) => Ok(gens),
        Ok(Err(e)) => Err(GenerateError::Failed(e.to_string())),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            tracing::error!(panic = %msg, "generation panicked");
            Err(GenerateError::Failed(format!("the model panicked: {msg}")))
        }
    }
}
