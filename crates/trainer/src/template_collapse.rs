//! RAGEN-2's template-collapse diagnostics on a step's rollouts: the
//! (prompt X, reasoning Z) pairs of every trajectory's first turn, each Z
//! scored under every distinct prompt, then [`algos::template_collapse()`].

use std::collections::BTreeMap;

use agentrl_algos as algos;
use agentrl_model::PolicyModel;
use agentrl_rollout::Trajectory;
use agentrl_tokenizer::ChatTokenizer;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::TrainError;

/// What Z is (`collapse.mi_target`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum MiTarget {
    /// RAGEN-2's definition: the tokens between `<think>` and `</think>`
    /// (X ends with `<think>`); a turn with an empty reasoning is left out.
    #[default]
    Reasoning,
    /// The whole first reply (X ends where the assistant turn starts): for
    /// agents that answer without reasoning, whether the *action* depends
    /// on the input.
    Reply,
}

/// One (X, Z) pair: prompt tokens and reasoning tokens.
#[derive(Debug, Clone, PartialEq)]
struct Pair {
    prompt: Vec<u32>,
    reasoning: Vec<u32>,
}

/// Start of `needle` in `hay`, if any.
fn find(hay: &[u32], needle: &[u32]) -> Option<usize> {
    if needle.is_empty() || needle.len() > hay.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The first turn's (X, Z) of `t`, if it has one.
fn first_turn_pair(t: &Trajectory, target: MiTarget, open: &[u32], close: &[u32]) -> Option<Pair> {
    let turn = t.turns.first()?;
    let reply = t.tokens.get(turn.start..turn.end)?;
    let (x_end, z) = match target {
        MiTarget::Reply => (turn.start, reply),
        MiTarget::Reasoning => {
            let o = find(reply, open)? + open.len();
            let c = find(&reply[o..], close)? + o;
            (turn.start + o, &reply[o..c])
        }
    };
    (!z.is_empty()).then(|| Pair {
        prompt: t.tokens[..x_end].to_vec(),
        reasoning: z.to_vec(),
    })
}

/// The diagnostics of `trajs`' first turns: up to `samples` pairs drawn with
/// `rng`, each scored under every distinct prompt. `None` when fewer than two
/// distinct prompts have a non-empty Z (nothing to tell apart).
pub fn measure(
    model: &PolicyModel,
    tokenizer: &ChatTokenizer,
    trajs: &[Trajectory],
    target: MiTarget,
    samples: usize,
    rng: &mut ChaCha8Rng,
) -> Result<Option<algos::TemplateCollapse>, TrainError> {
    let tok = |s: &str| {
        tokenizer
            .encode(s)
            .map_err(|e| TrainError::Tokenizer(e.to_string()))
    };
    let (open, close) = (tok("<think>")?, tok("</think>")?);
    let mut pairs: Vec<Pair> = trajs
        .iter()
        .filter_map(|t| first_turn_pair(t, target, &open, &close))
        .collect();
    let mut columns: BTreeMap<Vec<u32>, usize> = BTreeMap::new();
    for p in &pairs {
        let next = columns.len();
        columns.entry(p.prompt.clone()).or_insert(next);
    }
    if columns.len() < 2 || samples == 0 {
        return Ok(None);
    }
    pairs.shuffle(rng);
    pairs.truncate(samples);
    let mut prompts: Vec<(&Vec<u32>, usize)> = columns.iter().map(|(p, &c)| (p, c)).collect();
    prompts.sort_by_key(|&(_, c)| c);

    // Row i, column j: Σ log p(z_i | x_j), one no-grad pass per pair chunk.
    let mut cross = vec![vec![0.0f64; prompts.len()]; pairs.len()];
    let jobs: Vec<(usize, usize)> = (0..pairs.len())
        .flat_map(|i| (0..prompts.len()).map(move |j| (i, j)))
        .collect();
    for chunk in jobs.chunks(32) {
        let seqs: Vec<Vec<u32>> = chunk
            .iter()
            .map(|&(i, j)| [prompts[j].0.as_slice(), &pairs[i].reasoning].concat())
            .collect();
        let rows = model
            .sequence_logprobs(&seqs)?
            .logprobs
            .detach()
            .to_vec2::<f32>()?;
        for (&(i, j), row) in chunk.iter().zip(&rows) {
            // Entry t scores token t + 1: Z's tokens start at len(x).
            let from = prompts[j].0.len() - 1;
            let z = pairs[i].reasoning.len();
            cross[i][j] = row[from..from + z].iter().map(|&v| v as f64).sum();
        }
    }
    let own: Vec<usize> = pairs.iter().map(|p| columns[&p.prompt]).collect();
    let z_len: Vec<usize> = pairs.iter().map(|p| p.reasoning.len()).collect();
    Ok(Some(algos::template_collapse(&cross, &z_len, &own)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentrl_env_core::{Split, TaskSpec};
    use agentrl_rollout::Turn;

    fn traj(tokens: Vec<u32>, start: usize, end: usize) -> Trajectory {
        Trajectory {
            loss_mask: vec![0; tokens.len()],
            tokens,
            turns: vec![Turn {
                start,
                end,
                ..Turn::default()
            }],
            env_done: true,
            env_steps: 1,
            ..Trajectory::new(TaskSpec::new("bandit", Split::Train, "easy", 0), 0)
        }
    }

    #[test]
    fn pairs_cut_the_reasoning_between_the_tags() {
        // prompt [1, 2], reply [10=<think>, 5, 6, 11=</think>, 7]
        let t = traj(vec![1, 2, 10, 5, 6, 11, 7], 2, 7);
        let p = first_turn_pair(&t, MiTarget::Reasoning, &[10], &[11]).unwrap();
        assert_eq!(p.prompt, vec![1, 2, 10]);
        assert_eq!(p.reasoning, vec![5, 6]);
        let r = first_turn_pair(&t, MiTarget::Reply, &[10], &[11]).unwrap();
        assert_eq!(r.prompt, vec![1, 2]);
        assert_eq!(r.reasoning, vec![10, 5, 6, 11, 7]);
        // An empty reasoning, or no tags, gives no pair.
        let empty = traj(vec![1, 2, 10, 11, 7], 2, 5);
        assert!(first_turn_pair(&empty, MiTarget::Reasoning, &[10], &[11]).is_none());
        let untagged = traj(vec![1, 2, 7, 7], 2, 4);
        assert!(first_turn_pair(&untagged, MiTarget::Reasoning, &[10], &[11]).is_none());
    }
}
