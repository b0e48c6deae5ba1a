//! RL whose rollouts an OpenAI-compatible server generates (`policy.endpoint`
//! with `[lora]`): the trainer keeps the loss, the server the sampling.
//!
//! Before generating with new weights (at the start, and after each update)
//! the trainer writes its LoRA adapter in PEFT's layout to
//! `<adapter_dir>/<run>/step-N` and asks the server to load it as
//! `<run>-step-N` (vLLM's `POST /v1/load_lora_adapter`); rollouts and
//! validation then ask for that model name, and the adapter it replaces is
//! unloaded (`POST /v1/unload_lora_adapter`), so a long run holds one
//! adapter on the server, not one per step. The server's log-prob of every
//! token it sampled is kept ([`RecordingPolicy`], [`rollout_logprob_rows`])
//! for the importance correction of the loss (`algorithm.rollout_is_cap`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use agentrl_model::PolicyModel;
use agentrl_policy_client::OpenAiPolicy;
use agentrl_rollout::{
    Followup, Generation, Policy, PolicyError, PromptBatch, SamplingParams, Trajectory,
};
use rand_chacha::ChaCha8Rng;

use crate::policy_section::PolicySection;
use crate::TrainError;

/// The server the rollouts come from and the adapter it generates with.
pub struct RemoteGeneration {
    policy: OpenAiPolicy,
    /// Where this run's adapters are written: `<adapter_dir>/<run>`.
    adapters: PathBuf,
    /// The run directory's name: the adapters' names start with it.
    run_name: String,
    /// The weights version (RL steps done) of the adapter loaded last.
    published: Option<usize>,
    /// The served name of the adapter loaded last, to unload once replaced.
    loaded: Option<String>,
}

impl RemoteGeneration {
    /// Connect to `section`'s server (its base model: `policy.model`, or
    /// the only model it lists) for the run in `run_dir`.
    pub fn connect(section: &PolicySection, run_dir: &Path) -> Result<Self, TrainError> {
        let policy = OpenAiPolicy::connect(section.client_options()?)?;
        let run_dir = std::path::absolute(run_dir)
            .map_err(|e| TrainError::Checkpoint(format!("{}: {e}", run_dir.display())))?;
        let run_name = run_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "agentrl".into());
        let adapters = match section.adapter_dir.as_str() {
            "" => run_dir.join("adapters"),
            shared => std::path::absolute(shared)
                .map_err(|e| TrainError::Checkpoint(format!("policy.adapter_dir {shared}: {e}")))?
                .join(&run_name),
        };
        Ok(Self {
            policy,
            adapters,
            run_name,
            published: None,
            loaded: None,
        })
    }

    /// The server's policy, generating with the adapter of `model` after
    /// `version` RL steps: written and loaded onto the server first unless
    /// it was the last one loaded.
    pub fn policy_at(
        &mut self,
        model: &PolicyModel,
        version: usize,
    ) -> Result<&mut OpenAiPolicy, TrainError> {
        if self.published != Some(version) {
            self.publish(model, version)?;
        }
        Ok(&mut self.policy)
    }

    /// The served model name the policy generates with now.
    pub fn model_name(&self) -> &str {
        self.policy.model()
    }

    /// Write `model`'s adapter for `version` and load it onto the server
    /// under a name the server does not list yet (`<run>-step-N`, or
    /// `<run>-step-N.K` when a resumed run, or another run of the same
    /// name, took it: a name is never reused for other weights).
    fn publish(&mut self, model: &PolicyModel, version: usize) -> Result<(), TrainError> {
        let lora = model.lora().ok_or_else(|| {
            TrainError::Checkpoint(
                "training through policy.endpoint needs the LoRA adapter attached".into(),
            )
        })?;
        let served = self.policy.served_models()?;
        let base = format!("{}-step-{version}", self.run_name);
        let name = std::iter::once(base.clone())
            .chain((1..).map(|k| format!("{base}.{k}")))
            .find(|n| !served.contains(n))
            .unwrap_or_else(|| base.clone());
        let dir = self.adapters.join(match name.strip_prefix(&self.run_name) {
            Some(rest) => rest.trim_start_matches('-').to_string(),
            None => name.clone(),
        });
        lora.save(&dir, None)?;
        self.policy
            .load_lora_adapter(&name, &dir.to_string_lossy())?;
        self.policy.use_model(&name)?;
        self.published = Some(version);
        // Every request of the replaced weights has been answered: the
        // trainer generates with one version at a time.
        if let Some(old) = self.loaded.replace(name) {
            self.policy.unload_lora_adapter(&old)?;
        }
        Ok(())
    }
}

/// (prompt, generated tokens) → the log-probs of each generation with
/// them, in the order generated.
type Generations = HashMap<(Vec<u32>, Vec<u32>), Vec<Vec<f32>>>;

/// A policy that keeps every generation's log-probs, by its prompt and
/// tokens, for [`rollout_logprob_rows`]. The rollout engine keeps only the
/// tokens; the log-probs of the policy that sampled them are recovered here.
pub struct RecordingPolicy<'a> {
    inner: &'a mut dyn Policy,
    seen: Generations,
}

impl<'a> RecordingPolicy<'a> {
    pub fn new(inner: &'a mut dyn Policy) -> Self {
        Self {
            inner,
            seen: HashMap::new(),
        }
    }

    /// What was recorded.
    pub fn into_record(self) -> GenerationRecord {
        GenerationRecord { seen: self.seen }
    }
}

impl Policy for RecordingPolicy<'_> {
    fn generate_batch(
        &mut self,
        batch: PromptBatch<'_>,
        rng: &mut ChaCha8Rng,
    ) -> Result<Vec<Generation>, PolicyError> {
        let PromptBatch { prompts, params } = batch;
        let gens = self.inner.generate(prompts, params, rng)?;
        for (prompt, g) in prompts.iter().zip(&gens) {
            self.seen
                .entry((prompt.clone(), g.tokens.clone()))
                .or_default()
                .push(g.logprobs.clone());
        }
        Ok(gens)
    }

    /// The inner policy's continuous batching, each generation recorded
    /// with the prompt its sequence was continuing.
    fn generate_continuous(
        &mut self,
        prompts: Vec<Vec<u32>>,
        params: &SamplingParams,
        rng: &mut ChaCha8Rng,
        next: &mut dyn FnMut(usize, Generation) -> Followup,
    ) -> Result<(), PolicyError> {
        let mut current = prompts.clone();
        let seen = &mut self.seen;
        let mut recorded = |i: usize, g: Generation| {
            // An index out of the batch is the engine's to report.
            if let Some(prompt) = current.get_mut(i).map(std::mem::take) {
                seen.entry((prompt, g.tokens.clone()))
                    .or_default()
                    .push(g.logprobs.clone());
            }
            let followup = next(i, g);
            if let (Followup::Continue(context), Some(slot)) = (&followup, current.get_mut(i)) {
                *slot = context.clone();
            }
            followup
        };
        self.inner
            .generate_continuous(prompts, params, rng, &mut recorded)
    }
}

/// The generations a [`RecordingPolicy`] saw.
pub struct GenerationRecord {
    seen: Generations,
}

/// Each trajectory's rollout log-probs in the shifted frame of the PPO
/// batch (entry `i` scores token `i + 1`; 0 off the policy's tokens): every
/// turn's reply is looked up in `record` by the prompt it was generated
/// from (the turn's sequence up to the reply) and its tokens. A reply with
/// no recorded generation is an error: the loss must not silently go
/// without the correction.
pub fn rollout_logprob_rows(
    trajs: &[Trajectory],
    mut record: GenerationRecord,
) -> Result<Vec<Vec<f32>>, TrainError> {
    let mut rows = Vec::with_capacity(trajs.len());
    for (n, t) in trajs.iter().enumerate() {
        let mut row = vec![0f32; t.tokens.len().saturating_sub(1)];
        let ranges = t.sequence_ranges();
        for (k, turn) in t.turns.iter().enumerate() {
            if turn.end <= turn.start {
                continue;
            }
            let missing = |why: &str| {
                TrainError::RemoteGeneration(format!(
                    "trajectory {n} ({}), turn {k}: {why}",
                    t.spec
                ))
            };
            let seq_start = ranges
                .iter()
                .find(|r| r.contains(&turn.start))
                .map(|r| r.start)
                .ok_or_else(|| missing("the reply lies in no sequence"))?;
            if turn.start == seq_start {
                return Err(missing("the reply opens its sequence (no prompt)"));
            }
            let key = (
                t.tokens[seq_start..turn.start].to_vec(),
                t.tokens[turn.start..turn.end].to_vec(),
            );
            let logprobs = record
                .seen
                .get_mut(&key)
                .filter(|found| !found.is_empty())
                .map(|found| found.remove(0))
                .ok_or_else(|| missing("no generation of this reply was recorded"))?;
            if logprobs.len() != turn.end - turn.start {
                return Err(missing(&format!(
                    "{} log-probs for {} reply tokens",
                    logprobs.len(),
                    turn.end - turn.start
                )));
            }
            row[turn.start - 1..turn.end - 1].copy_from_slice(&logprobs);
        }
        rows.push(row);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentrl_env_core::TaskSpec;
    use agentrl_rollout::{PolicyFn, SamplingParams, Turn};
    use rand::SeedableRng;

    /// Answers each prompt with its own last token + 1, then token 9,
    /// log-probs −(prompt length) and −0.5.
    fn echo() -> impl Policy {
        PolicyFn::new(
            |prompts: &[Vec<u32>], _: &SamplingParams, _: &mut ChaCha8Rng| {
                Ok(prompts
                    .iter()
                    .map(|p| Generation {
                        tokens: vec![p[p.len() - 1] + 1, 9],
                        logprobs: vec![-(p.len() as f32), -0.5],
                        stopped: true,
                    })
                    .collect())
            },
        )
    }

    fn turn(start: usize, end: usize) -> Turn {
        Turn {
            start,
            end,
            ..Turn::default()
        }
    }

    fn traj(tokens: Vec<u32>, starts: Vec<usize>, turns: Vec<Turn>) -> Trajectory {
        let mut loss_mask = vec![0u8; tokens.len()];
        for t in &turns {
            loss_mask[t.start..t.end].fill(1);
        }
        Trajectory {
            spec: TaskSpec::new("bandit", agentrl_env_core::Split::Train, "easy", 0),
            group: 0,
            tokens,
            loss_mask,
            sequence_starts: starts,
            turns,
            success: false,
            env_done: true,
            truncated: false,
            env_steps: 1,
            instructions: String::new(),
            final_observation: String::new(),
            final_state_key: 0,
            env_max_steps: 0,
        }
    }

    #[test]
    fn each_reply_gets_the_log_probs_it_was_generated_with() {
        let mut echo = echo();
        let mut rec = RecordingPolicy::new(&mut echo);
        let rng = &mut ChaCha8Rng::seed_from_u64(0);
        let p = SamplingParams::greedy(2);
        // Dialogue A: prompt [5, 6] → reply [7, 9]; then, in one context,
        // [5, 6, 7, 9, 3] → [4, 9]. Dialogue B (a history window): its second
        // turn's prompt is a sequence of its own, [1, 2].
        rec.generate(&[vec![5, 6], vec![1, 2]], &p, rng).unwrap();
        rec.generate(&[vec![5, 6, 7, 9, 3], vec![1, 2]], &p, rng)
            .unwrap();
        assert_records_dialogues_a_and_b(rec.into_record());
    }

    /// `record` gives dialogues A and B (above) their replies' log-probs.
    fn assert_records_dialogues_a_and_b(record: GenerationRecord) {
        let a = traj(
            vec![5, 6, 7, 9, 3, 4, 9],
            vec![],
            vec![turn(2, 4), turn(5, 7)],
        );
        let b = traj(
            vec![1, 2, 3, 9, 1, 2, 3, 9],
            vec![4],
            vec![turn(2, 4), turn(6, 8)],
        );
        let rows = rollout_logprob_rows(&[a, b], record).unwrap();
        // Shifted frame: token i's log-prob at entry i − 1.
        assert_eq!(rows[0], vec![0.0, -2.0, -0.5, 0.0, -5.0, -0.5]);
        assert_eq!(rows[1], vec![0.0, -2.0, -0.5, 0.0, 0.0, -2.0, -0.5]);
    }

    #[test]
    fn a_continuous_batch_records_each_reply_with_the_prompt_it_continued() {
        // The dialogues of the test above, played as one continuous batch.
        let mut echo = echo();
        let mut rec = RecordingPolicy::new(&mut echo);
        let rng = &mut ChaCha8Rng::seed_from_u64(0);
        let mut turns = [0, 0];
        let mut next = |i: usize, g: Generation| {
            turns[i] += 1;
            match (i, turns[i]) {
                (0, 1) => Followup::Continue([vec![5, 6], g.tokens, vec![3]].concat()),
                (1, 1) => Followup::Continue(vec![1, 2]),
                _ => Followup::Done,
            }
        };
        let prompts = vec![vec![5, 6], vec![1, 2]];
        rec.generate_continuous(prompts, &SamplingParams::greedy(2), rng, &mut next)
            .unwrap();
        assert_records_dialogues_a_and_b(rec.into_record());
    }

    #[test]
    fn a_reply_nobody_generated_is_an_error() {
        let mut echo = echo();
        let mut rec = RecordingPolicy::new(&mut echo);
        rec.generate(
            &[vec![5, 6]],
            &SamplingParams::greedy(2),
            &mut ChaCha8Rng::seed_from_u64(0),
        )
        .unwrap();
        // The same reply twice, generated once: the second has no record.
        let a = traj(vec![5, 6, 7, 9], vec![], vec![turn(2, 4)]);
        let e = rollout_logprob_rows(&[a.clone(), a], rec.into_record())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("trajectory 1") && e.contains("no generation"),
            "{e}"
        );
    }
}
