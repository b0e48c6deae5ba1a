//! Training on several environments at once (`[[mixture]]`): every RL step
//! draws its tasks from each environment in set proportions, validation
//! covers each, and one tokenizer is trained on all of their text.
//!
//! A run without a mixture has one task source, its `[env]`.

use agentrl_env_core::EnvParams;
use serde::{Deserialize, Serialize};

use crate::config::TrainConfig;

/// One environment of a mixture.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MixtureEntry {
    /// The environment's registry name.
    pub name: String,
    /// Its share of each step's tasks, relative to the other entries'.
    #[serde(default = "default_weight")]
    pub weight: f64,
    /// Difficulty of its tasks (default: the environment's first).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub difficulty: String,
    /// Its environment-specific params.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub params: EnvParams,
}

fn default_weight() -> f64 {
    1.0
}

/// Where a run's tasks come from: an environment at a difficulty with its
/// params, and its share of the training tasks.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSource {
    pub env: String,
    pub difficulty: String,
    pub params: EnvParams,
    pub weight: f64,
}

impl TaskSource {
    /// `env/difficulty`, the key of its figures in metrics and summaries.
    pub fn key(&self) -> String {
        format!("{}/{}", self.env, self.difficulty)
    }
}

/// The task sources of `cfg`: its mixture's entries (an entry without a
/// difficulty takes its environment's first), or its `[env]` alone.
pub fn task_sources(cfg: &TrainConfig) -> Vec<TaskSource> {
    if cfg.mixture.is_empty() {
        return vec![TaskSource {
            env: cfg.env.name.clone(),
            difficulty: cfg.env.difficulty.clone(),
            params: cfg.env.params.clone(),
            weight: 1.0,
        }];
    }
    cfg.mixture
        .iter()
        .map(|e| TaskSource {
            env: e.name.clone(),
            difficulty: match e.difficulty.is_empty() {
                false => e.difficulty.clone(),
                true => agentrl_envs::find(&e.name)
                    .ok()
                    .and_then(|d| d.difficulties.first().map(|d| d.to_string()))
                    .unwrap_or_else(|| cfg.env.difficulty.clone()),
            },
            params: e.params.clone(),
            weight: e.weight,
        })
        .collect()
}

/// The mixture's entries, or the one env (a one-entry mixture too) at
/// `difficulty`. The warm start and the perception examples use
/// `env.difficulty`.
pub fn sources_at(cfg: &TrainConfig, difficulty: &str) -> Vec<TaskSource> {
    let mut sources = task_sources(cfg);
    if let [one] = sources.as_mut_slice() {
        one.difficulty = difficulty.to_string();
    }
    sources
}

/// How many of a step's `groups` tasks each source gets at RL step `step`
/// (1-based): a smooth weighted round robin, each task going to the source
/// furthest behind its share of all tasks dealt since step 1. Every step
/// deals exactly `groups`, each source's count over steps stays within one
/// task of its share, and the deal is a pure function of the step (a
/// resumed run deals the same).
pub fn groups_per_source(weights: &[f64], groups: usize, step: usize) -> Vec<usize> {
    let n = weights.len();
    let total: f64 = weights.iter().sum();
    let mut dealt = vec![0usize; n];
    let mut this_step = vec![0usize; n];
    if n == 0 || total <= 0.0 {
        return this_step;
    }
    for s in 1..=step.max(1) {
        this_step.iter_mut().for_each(|c| *c = 0);
        for _ in 0..groups {
            // The source whose share of everything dealt by the end of this
            // step is furthest ahead of what it has had (ties: the first).
            let target = |i: usize| (s * groups) as f64 * weights[i] / total;
            let mut best = 0;
            for i in 1..n {
                if target(i) - dealt[i] as f64 > target(best) - dealt[best] as f64 + 1e-12 {
                    best = i;
                }
            }
            dealt[best] += 1;
            this_step[best] += 1;
        }
    }
    this_step
}

/// What is wrong with playing `name` (at `difficulty`, when given) in
/// process: the field at fault (`name` or `difficulty`) and why; `None`
/// when the registry has the env and the difficulty.
pub(crate) fn registry_problem(
    name: &str,
    difficulty: Option<&str>,
) -> Option<(&'static str, String)> {
    match (agentrl_envs::find(name), difficulty) {
        (Err(err), _) => Some(("name", err.to_string())),
        (Ok(d), Some(difficulty)) if !d.difficulties.contains(&difficulty) => Some((
            "difficulty",
            format!(
                "{difficulty:?} is not a difficulty of {name} (one of: {})",
                d.difficulties.join(", ")
            ),
        )),
        (Ok(_), _) => None,
    }
}

/// Problems with `[[mixture]]` as (key, message): names, weights,
/// difficulties (checked against the registry for in-process envs, where
/// `in_process` is true).
pub fn mixture_problems(
    entries: &[MixtureEntry],
    env_name: &str,
    in_process: bool,
) -> Vec<(String, String)> {
    let mut p = Vec::new();
    if entries.is_empty() {
        return p;
    }
    if entries[0].name != env_name {
        p.push((
            "env.name".to_string(),
            format!(
                "{env_name:?} must be the first mixture entry's name ({:?}): a mixture's run is named for its first environment",
                entries[0].name
            ),
        ));
    }
    for (i, e) in entries.iter().enumerate() {
        let key = |k: &str| format!("mixture[{i}].{k}");
        if !(e.weight.is_finite() && e.weight > 0.0) {
            p.push((
                key("weight"),
                format!("{} must be a finite number > 0", e.weight),
            ));
        }
        if in_process {
            // An empty difficulty is the env's default.
            let difficulty = Some(e.difficulty.as_str()).filter(|d| !d.is_empty());
            if let Some((field, why)) = registry_problem(&e.name, difficulty) {
                p.push((key(field), why));
            }
        }
        let same = entries[..i]
            .iter()
            .any(|o| o.name == e.name && o.difficulty == e.difficulty);
        if same {
            p.push((
                key("name"),
                format!("{}/{} is already in the mixture", e.name, e.difficulty),
            ));
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_step_deals_every_group_in_proportion() {
        // 1:1 over 8 groups: 4 and 4 every step.
        for step in 1..5 {
            assert_eq!(groups_per_source(&[1.0, 1.0], 8, step), [4, 4]);
        }
        // 3:1 over 8: 6 and 2.
        assert_eq!(groups_per_source(&[3.0, 1.0], 8, 1), [6, 2]);
        // 1:1:1 over 8: the odd groups rotate, so three steps deal 8 each.
        let steps: Vec<Vec<usize>> = (1..=3)
            .map(|s| groups_per_source(&[1.0; 3], 8, s))
            .collect();
        assert_eq!(steps, [vec![3, 3, 2], vec![3, 2, 3], vec![2, 3, 3]]);
        // 0.7 : 0.3 over 4 groups: 2.8 and 1.2 a step on average.
        let total: Vec<usize> = (1..=10)
            .map(|s| groups_per_source(&[0.7, 0.3], 4, s))
            .fold(vec![0, 0], |acc, c| vec![acc[0] + c[0], acc[1] + c[1]]);
        assert_eq!(total, [28, 12]);
        for s in 1..=10 {
            assert_eq!(
                groups_per_source(&[0.7, 0.3], 4, s).iter().sum::<usize>(),
                4
            );
        }
    }

    #[test]
    fn a_deal_is_a_pure_function_of_the_step() {
        assert_eq!(
            groups_per_source(&[2.0, 1.0, 1.0], 5, 7),
            groups_per_source(&[2.0, 1.0, 1.0], 5, 7)
        );
        assert_eq!(groups_per_source(&[1.0], 8, 3), [8]);
        assert!(groups_per_source(&[], 8, 3).is_empty());
    }

    fn entry(name: &str, difficulty: &str, weight: f64) -> MixtureEntry {
        MixtureEntry {
            name: name.into(),
            weight,
            difficulty: difficulty.into(),
            params: EnvParams::new(),
        }
    }

    #[test]
    fn mixture_problems_name_each_entry() {
        let keys = |entries: &[MixtureEntry], env: &str| -> Vec<String> {
            mixture_problems(entries, env, true)
                .into_iter()
                .map(|p| p.0)
                .collect()
        };
        let good = [entry("frozenlake", "easy", 1.0), entry("sokoban", "", 2.0)];
        assert!(keys(&good, "frozenlake").is_empty());
        assert_eq!(keys(&good, "sokoban"), ["env.name"]);
        assert_eq!(
            keys(&[entry("frozenlake", "easy", 0.0)], "frozenlake"),
            ["mixture[0].weight"]
        );
        assert_eq!(
            keys(
                &[entry("frozenlake", "easy", 1.0), entry("chess", "", 1.0)],
                "frozenlake"
            ),
            ["mixture[1].name"]
        );
        assert_eq!(
            keys(&[entry("frozenlake", "nightmare", 1.0)], "frozenlake"),
            ["mixture[0].difficulty"]
        );
        assert_eq!(
            keys(
                &[
                    entry("frozenlake", "easy", 1.0),
                    entry("frozenlake", "easy", 1.0)
                ],
                "frozenlake"
            ),
            ["mixture[1].name"]
        );
    }
}
