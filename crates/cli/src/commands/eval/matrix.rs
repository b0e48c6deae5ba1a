//! `agentrl eval --envs a,b --difficulty easy,hard --k 8 [--json]`: the
//! evaluation matrix. Every (environment, difficulty) cell plays the same
//! task indices of the held-out split (`--split val` or `test`, disjoint
//! from the training seeds) `--samples` times each (default k), and reports
//! avg@k and pass@k with 95% intervals, turns, tokens, invalid-action and
//! format-error rates and the failure labels of the unsuccessful plays.

use std::collections::BTreeMap;

use agentrl_env_client::DataIdxRanges;
use agentrl_env_core::{EnvParams, Split, TaskSpec};
use agentrl_rollout::{failure_labels, FailureLabel, Trajectory};
use agentrl_trainer::eval_matrix::{
    evaluate_cell, Cell, CellFigures, MatrixPlan, Player, INTERVAL_METHOD,
};
use agentrl_trainer::evaluate::EnvMaker;
use agentrl_trainer::pass_at_k::Estimate;
use agentrl_trainer::remote_env::remote_maker;
use agentrl_trainer::{TrainConfig, TrainedPolicy};
use anyhow::Context;
use serde::Serialize;
use serde_json::json;

use super::{cell_difficulty, policy_kind, remote_section, task_range, EvalArgs, PolicyKind};
use crate::commands::play::parse_params;

/// What `agentrl eval --json` prints for the matrix.
#[derive(Debug, Serialize)]
pub struct MatrixReport {
    pub policy: String,
    pub split: String,
    /// The task indices of the split every cell played.
    pub seed_start: u64,
    pub tasks: u64,
    pub k: usize,
    pub samples: usize,
    /// A model's sampling temperature (absent for the expert and random play).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    pub interval: &'static str,
    pub cells: Vec<CellFigures>,
}

pub(super) fn run(args: &EvalArgs) -> anyhow::Result<()> {
    let envs: Vec<String> = match (&args.envs, &args.env) {
        (Some(list), _) => list.iter().map(|e| e.trim().to_string()).collect(),
        (None, Some(env)) => vec![env.clone()],
        (None, None) => anyhow::bail!("--env or --envs names the environments to evaluate"),
    };
    if envs.iter().any(String::is_empty) {
        anyhow::bail!("--envs {:?} has an empty name", envs.join(","));
    }
    let k = args.k.unwrap_or(1);
    let samples = args.samples.unwrap_or(k);
    if k == 0 {
        anyhow::bail!("--k must be at least 1");
    }
    if samples < k {
        anyhow::bail!(
            "--samples {samples} is fewer than --k {k}: pass@k needs k samples of every task"
        );
    }
    let split: Split = args.split.parse()?;
    let seeds = task_range(args.seed_start, args.n)?;
    let kind = policy_kind(args);
    if kind == PolicyKind::Expert && args.protocol == agentrl_trainer::config::EnvProtocol::Agentgym
    {
        anyhow::bail!(
            "AgentGym's servers have no expert: evaluate a model (--policy RUN_DIR) or random play"
        );
    }
    let trained = match &kind {
        PolicyKind::Model(path) => Some(
            TrainedPolicy::open(path).with_context(|| format!("--policy {}", path.display()))?,
        ),
        _ => None,
    };
    let run_config = trained.as_ref().and_then(|p| p.config.as_ref());
    let cells = matrix_cells(args, &envs, run_config)?;
    let player = match (&kind, &trained) {
        (PolicyKind::Expert, _) => Player::Expert,
        (PolicyKind::Random, _) => Player::Random {
            seed: args.policy_seed,
        },
        (PolicyKind::Model(_), Some(policy)) => Player::Model {
            policy,
            temperature: args.temperature,
        },
        (PolicyKind::Model(p), None) => anyhow::bail!("{} was not opened", p.display()),
    };
    let mut figures = Vec::new();
    let mut dump = String::new();
    for cell in &cells {
        let make = cell_maker(args, &cell.env, run_config)?;
        let plan = MatrixPlan {
            make: make.as_ref(),
            split,
            seeds: seeds.clone(),
            samples,
            k,
            seed: args.policy_seed,
        };
        if !args.json {
            eprintln!(
                "evaluating {}/{}: {} tasks x {samples} samples",
                cell.env, cell.difficulty, args.n
            );
        }
        let (f, trajs) = evaluate_cell(&player, cell, &plan)
            .with_context(|| format!("evaluating {}/{}", cell.env, cell.difficulty))?;
        if args.trajectories.is_some() {
            let max_turns = match &trained {
                Some(p) => p.rollout.max_turns,
                None => usize::MAX,
            };
            for t in &trajs {
                dump.push_str(&trajectory_line(t, max_turns).to_string());
                dump.push('\n');
            }
        }
        figures.push(f);
    }
    if let Some(path) = &args.trajectories {
        std::fs::write(path, dump).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let report = MatrixReport {
        policy: args.policy.clone(),
        split: split.to_string(),
        seed_start: args.seed_start,
        tasks: args.n,
        k,
        samples,
        temperature: trained.as_ref().map(|_| args.temperature),
        interval: INTERVAL_METHOD,
        cells: figures,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", matrix_text(&report));
    }
    Ok(())
}

/// The cells: every environment at every `--difficulty` (default: its
/// first), with its params: the `--param`s for it, else those a run was
/// trained with on that environment.
fn matrix_cells(
    args: &EvalArgs,
    envs: &[String],
    run: Option<&TrainConfig>,
) -> anyhow::Result<Vec<Cell>> {
    let difficulties: Vec<Option<&str>> = match &args.difficulty {
        None => vec![None],
        Some(list) => list.split(',').map(|d| Some(d.trim())).collect(),
    };
    let mut params = scoped_params(&args.params, envs)?;
    let mut cells = Vec::new();
    for env in envs {
        let env_params = match params.remove(env) {
            Some(p) => p,
            None => trained_params(run, env).unwrap_or_default(),
        };
        for d in &difficulties {
            let difficulty = cell_difficulty(args, env, *d)?;
            if let Ok(desc) = agentrl_envs::find(env) {
                if !desc.difficulties.contains(&difficulty.as_str()) {
                    anyhow::bail!(
                        "--difficulty {difficulty} is not a difficulty of {env} (one of: {})",
                        desc.difficulties.join(", ")
                    );
                }
            }
            cells.push(Cell {
                env: env.clone(),
                difficulty,
                params: env_params.clone(),
            });
        }
    }
    Ok(cells)
}

/// The env params a run was trained with on `env`, if it trained there.
fn trained_params(run: Option<&TrainConfig>, env: &str) -> Option<EnvParams> {
    let run = run?;
    (run.env.name == env).then(|| run.env.params.clone())
}

/// `--param [ENV.]KEY=VALUE` per environment: `ENV.KEY` for that one, a
/// bare `KEY` for every environment that has the key (every one agentrl does
/// not ship: its server judges). A key no environment has is an error.
fn scoped_params(items: &[String], envs: &[String]) -> anyhow::Result<BTreeMap<String, EnvParams>> {
    let mut out: BTreeMap<String, EnvParams> = BTreeMap::new();
    for (key, value) in parse_params(items)? {
        let scoped = key
            .split_once('.')
            .filter(|(env, _)| envs.iter().any(|e| e == env));
        let targets: Vec<(&String, &str)> = match scoped {
            Some((env, k)) => envs.iter().filter(|e| *e == env).map(|e| (e, k)).collect(),
            None => envs
                .iter()
                .filter(|e| agentrl_envs::find(e).map_or(true, |d| d.knows_param(&key)))
                .map(|e| (e, key.as_str()))
                .collect(),
        };
        if targets.is_empty() {
            anyhow::bail!(
                "--param {key}: none of {} has this parameter (ENV.KEY names one environment)",
                envs.join(", ")
            );
        }
        for (env, k) in targets {
            out.entry(env.clone())
                .or_default()
                .insert(k.to_string(), value.clone());
        }
    }
    Ok(out)
}

/// Makes `env`'s environments: in-process, or on `--endpoint`.
fn cell_maker(
    args: &EvalArgs,
    env: &str,
    run: Option<&TrainConfig>,
) -> anyhow::Result<Box<EnvMaker<'static>>> {
    match &args.endpoint {
        None => Ok(Box::new(|spec: &TaskSpec, params: &EnvParams| {
            agentrl_envs::make_env(spec, params)
        })),
        Some(url) => {
            let section = remote_section(args, env, url, run.map(|c| &c.env))?;
            // The task indices are the server's own (its data_idx for AgentGym).
            Ok(remote_maker(&section, DataIdxRanges::identity())?)
        }
    }
}

/// One play as a JSON line: the task, the outcome, its failure labels and
/// every turn (observation, reply, actions and what the env made of them).
fn trajectory_line(t: &Trajectory, max_turns: usize) -> serde_json::Value {
    json!({
        "task": t.spec.to_string(),
        "success": t.success,
        "labels": failure_labels(t, max_turns),
        "env_done": t.env_done,
        "env_steps": t.env_steps,
        "turns": t.turns.iter().map(|x| json!({
            "observation": x.observation,
            "reply": x.reply,
            "actions": x.actions,
            "invalid_actions": x.invalid_actions,
            "format_error": x.format_error,
        })).collect::<Vec<_>>(),
        "final_observation": t.final_observation,
    })
}

/// `0.231 [0.180, 0.282]`.
fn estimate_text(e: &Estimate) -> String {
    match e.ci95 {
        Some([lo, hi]) => format!("{:.3} [{lo:.3}, {hi:.3}]", e.mean),
        None => format!("{:.3} [-]", e.mean),
    }
}

/// The matrix as text: one row per cell, then the failure-label shares.
pub fn matrix_text(r: &MatrixReport) -> String {
    let mut s = format!(
        "policy {} on {} tasks {}..{} of the {} split, {} samples per task; {}\n",
        r.policy,
        r.tasks,
        r.seed_start,
        r.seed_start + r.tasks,
        r.split,
        r.samples,
        r.interval
    );
    let width = r
        .cells
        .iter()
        .map(|c| c.env.len() + c.difficulty.len() + 1)
        .max()
        .unwrap_or(0)
        .max(14);
    let (avg, pass) = (format!("avg@{}", r.k), format!("pass@{}", r.k));
    s.push_str(&format!(
        "{:<width$}  {avg:<22}  {pass:<22}  {:>6}  {:>7}  {:>7}  {:>7}\n",
        "env/difficulty", "turns", "tokens", "invalid", "format"
    ));
    for c in &r.cells {
        s.push_str(&format!(
            "{:<width$}  {:<22}  {:<22}  {:>6.2}  {:>7.1}  {:>7.3}  {:>7.3}\n",
            format!("{}/{}", c.env, c.difficulty),
            estimate_text(&c.avg_at_k),
            estimate_text(&c.pass_at_k),
            c.mean_turns,
            c.mean_generated_tokens,
            c.invalid_action_rate,
            c.format_error_rate,
        ));
    }
    s.push_str("failure labels (share of unsuccessful plays; a play may carry several):\n");
    s.push_str(&format!("{:<width$}  {:>6}", "env/difficulty", "failed"));
    for l in FailureLabel::ALL {
        s.push_str(&format!("  {:>w$}", l.as_str(), w = l.as_str().len()));
    }
    s.push_str("  unlabelled\n");
    for c in &r.cells {
        let f = &c.failures;
        s.push_str(&format!(
            "{:<width$}  {:>6}",
            format!("{}/{}", c.env, c.difficulty),
            f.failed
        ));
        for l in FailureLabel::ALL {
            s.push_str(&format!("  {:>w$.2}", f.share(l), w = l.as_str().len()));
        }
        let unlabelled = match f.failed {
            0 => 0.0,
            n => f.unlabelled as f64 / n as f64,
        };
        s.push_str(&format!("  {unlabelled:>10.2}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::owned_strings;

    #[test]
    fn params_go_to_the_named_env_or_every_env_that_has_the_key() {
        let e = owned_strings(&["frozenlake", "sokoban"]);
        let p = scoped_params(
            &["frozenlake.is_slippery=false".into(), "max_steps=20".into()],
            &e,
        )
        .unwrap();
        assert_eq!(p["frozenlake"]["is_slippery"], false);
        assert_eq!(p["frozenlake"]["max_steps"], 20);
        assert_eq!(p["sokoban"]["max_steps"], 20);
        assert!(!p["sokoban"].contains_key("is_slippery"));
        let err = scoped_params(&["slip=0.1".into()], &owned_strings(&["sokoban"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--param slip"), "{err}");
    }
}
