//! Sequential multi-environment training: stage 1 trains on one
//! environment, stage 2 on the next, … each stage an ordinary run that
//! starts from the previous stage's final policy (a fresh optimizer, no
//! second warm start). After every stage every environment of the sequence
//! is evaluated, which gives the forgetting table: how much an environment
//! trained earlier loses by the end.
//!
//! ```text
//! SEQ_DIR/stage-1-ENV/     the first stage's run (warm start, tokenizer for every stage's env)
//! SEQ_DIR/stage-2-ENV/     the second stage's run (model.path = stage 1's final checkpoint)
//! SEQ_DIR/matrix.jsonl     one line per (row, cell): the start policy, then after each stage
//! SEQ_DIR/forgetting.md    the table
//! ```

use std::path::{Path, PathBuf};

use agentrl_env_core::{EnvParams, Split};
use serde::{Deserialize, Serialize};

use crate::config::{ConfigError, TrainConfig};
use crate::eval_matrix::{evaluate_cell, Cell, CellFigures, MatrixError, MatrixPlan, Player};
use crate::evaluate::EnvMaker;
use crate::policy_dir::TrainedPolicy;
use crate::run_dir::RunDir;
use crate::trainer::{Progress, Summary, Trainer};
use crate::TrainError;

/// One stage: the environment it trains on and for how long.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SequenceStage {
    pub env: String,
    pub difficulty: String,
    #[serde(default)]
    pub params: EnvParams,
    pub steps: usize,
}

impl SequenceStage {
    /// `env:difficulty:steps` (difficulty and steps optional: the env's
    /// first difficulty, `default_steps`).
    pub fn parse(text: &str, default_steps: usize) -> Result<Self, String> {
        let parts: Vec<&str> = text.split(':').map(str::trim).collect();
        let env = parts[0];
        let desc = agentrl_envs::find(env).map_err(|e| format!("stage {text:?}: {e}"))?;
        let difficulty = match parts.get(1) {
            Some(d) if !d.is_empty() => d.to_string(),
            _ => desc.difficulties[0].to_string(),
        };
        if !desc.difficulties.contains(&difficulty.as_str()) {
            return Err(format!(
                "stage {text:?}: {difficulty:?} is not a difficulty of {env} (one of: {})",
                desc.difficulties.join(", ")
            ));
        }
        let steps = match parts.get(2) {
            Some(s) => s
                .parse()
                .map_err(|_| format!("stage {text:?}: steps {s:?} is not a count"))?,
            None => default_steps,
        };
        if steps == 0 || parts.len() > 3 {
            return Err(format!(
                "stage {text:?} must be ENV[:DIFFICULTY[:STEPS]] with STEPS at least 1"
            ));
        }
        Ok(Self {
            env: env.to_string(),
            difficulty,
            params: EnvParams::new(),
            steps,
        })
    }

    /// `env/difficulty`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.env, self.difficulty)
    }
}

/// The config of stage `i` (0-based): `base` on the stage's environment for
/// its steps. The first stage trains the tiny tokenizer on every stage's
/// environment; later ones start from `previous` (the last stage's final
/// checkpoint) without a warm start.
pub fn stage_config(
    base: &TrainConfig,
    stages: &[SequenceStage],
    i: usize,
    previous: Option<&Path>,
) -> Result<TrainConfig, ConfigError> {
    let stage = &stages[i];
    let mut cfg = base.clone();
    cfg.name = format!("{}-stage-{}-{}", base.name, i + 1, stage.env);
    if cfg.env.name != stage.env {
        // The base's params belong to its own environment.
        cfg.env.params = EnvParams::new();
    }
    cfg.env.name = stage.env.clone();
    cfg.env.difficulty = stage.difficulty.clone();
    cfg.env.params.extend(stage.params.clone());
    cfg.trainer.total_training_steps = stage.steps;
    match previous {
        None => {
            if cfg.model.path.is_empty() {
                for s in stages {
                    if s.env != stage.env && !cfg.model.tokenizer_envs.contains(&s.env) {
                        cfg.model.tokenizer_envs.push(s.env.clone());
                    }
                }
            }
        }
        Some(dir) => {
            cfg.model.path = dir.display().to_string();
            cfg.model.tokenizer_envs.clear();
            cfg.sft.demos = 0;
        }
    }
    cfg.validate()?;
    Ok(cfg)
}

/// The cells every row of the table is evaluated on: each stage's
/// environment at its difficulty, once, with its params.
pub fn sequence_cells(stages: &[SequenceStage], base: &TrainConfig) -> Vec<Cell> {
    let mut cells: Vec<Cell> = Vec::new();
    for s in stages {
        if cells
            .iter()
            .any(|c| c.env == s.env && c.difficulty == s.difficulty)
        {
            continue;
        }
        let mut params = match base.env.name == s.env {
            true => base.env.params.clone(),
            false => EnvParams::new(),
        };
        params.extend(s.params.clone());
        cells.push(Cell {
            env: s.env.clone(),
            difficulty: s.difficulty.clone(),
            params,
        });
    }
    cells
}

/// One row of the table: a policy (the start, or after a stage) on every
/// cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SequenceRow {
    /// `start`, or `after stage N (ENV)`.
    pub row: String,
    /// The checkpoint evaluated.
    pub checkpoint: PathBuf,
    pub cells: Vec<CellFigures>,
}

/// Forgetting of each column after the last row: the best avg@k any
/// earlier row after training (rows `1..last`) reached, minus the last
/// row's. Positive means the later stages made the policy forget. `None`
/// for a column with no earlier trained row.
pub fn forgetting(avg: &[Vec<f64>]) -> Vec<Option<f64>> {
    let Some(last) = avg.last() else {
        return Vec::new();
    };
    (0..last.len())
        .map(|c| {
            avg.iter()
                .skip(1)
                .take(avg.len().saturating_sub(2))
                .map(|row| row[c])
                .fold(None, |best: Option<f64>, v| {
                    Some(best.map_or(v, |b| b.max(v)))
                })
                .map(|best| best - last[c])
        })
        .collect()
}

/// The forgetting table in Markdown: avg@k per row and cell, Δ of the last
/// row against the start, and the forgetting of each cell.
pub fn forgetting_markdown(rows: &[SequenceRow]) -> String {
    let Some(first) = rows.first() else {
        return String::new();
    };
    let k = first.cells.first().map_or(1, |c| c.k);
    let mut s = format!("| avg@{k} | ");
    s.push_str(
        &first
            .cells
            .iter()
            .map(|c| format!("{}/{}", c.env, c.difficulty))
            .collect::<Vec<_>>()
            .join(" | "),
    );
    s.push_str(" |\n|---|");
    s.push_str(&"---|".repeat(first.cells.len()));
    s.push('\n');
    let avg: Vec<Vec<f64>> = rows
        .iter()
        .map(|r| r.cells.iter().map(|c| c.avg_at_k.mean).collect())
        .collect();
    for (r, values) in rows.iter().zip(&avg) {
        s.push_str(&format!("| {} | ", r.row));
        s.push_str(
            &values
                .iter()
                .map(|v| format!("{:.1}%", 100.0 * v))
                .collect::<Vec<_>>()
                .join(" | "),
        );
        s.push_str(" |\n");
    }
    if let (Some(start), Some(end)) = (avg.first(), avg.last()) {
        s.push_str("| Δ end − start | ");
        s.push_str(
            &start
                .iter()
                .zip(end)
                .map(|(a, b)| format!("{:+.1}", 100.0 * (b - a)))
                .collect::<Vec<_>>()
                .join(" | "),
        );
        s.push_str(" |\n");
    }
    s.push_str("| forgetting (best earlier − end) | ");
    s.push_str(
        &forgetting(&avg)
            .iter()
            .map(|f| match f {
                Some(f) => format!("{:+.1}", 100.0 * f),
                None => "–".to_string(),
            })
            .collect::<Vec<_>>()
            .join(" | "),
    );
    s.push_str(" |\n");
    s
}

/// How the rows are evaluated.
pub struct SequenceEval<'a> {
    pub make: &'a EnvMaker<'a>,
    /// Validation tasks `0..tasks` of the val split.
    pub tasks: u64,
    pub k: usize,
    pub temperature: f64,
    pub seed: u64,
}

/// Evaluate the policy at `checkpoint` (a run or checkpoint directory) on
/// every cell.
pub fn evaluate_row(
    row: &str,
    checkpoint: &Path,
    cells: &[Cell],
    eval: &SequenceEval<'_>,
) -> Result<SequenceRow, SequenceError> {
    let policy = TrainedPolicy::open(checkpoint)?;
    let player = Player::Model {
        policy: &policy,
        temperature: eval.temperature,
    };
    let plan = MatrixPlan {
        make: eval.make,
        split: Split::Val,
        seeds: 0..eval.tasks,
        samples: eval.k,
        k: eval.k,
        seed: eval.seed,
    };
    let mut figures = Vec::new();
    for cell in cells {
        figures.push(evaluate_cell(&player, cell, &plan)?.0);
    }
    Ok(SequenceRow {
        row: row.to_string(),
        checkpoint: checkpoint.to_path_buf(),
        cells: figures,
    })
}

/// Train the stages one after another under `dir` and evaluate the start
/// and every stage's end on every cell. Returns the stage summaries and the
/// rows (also written to `matrix.jsonl` and `forgetting.md`).
pub fn run_sequence(
    base: &TrainConfig,
    stages: &[SequenceStage],
    dir: &Path,
    eval: &SequenceEval<'_>,
    progress: &mut dyn Progress,
) -> Result<(Vec<Summary>, Vec<SequenceRow>), SequenceError> {
    if stages.is_empty() {
        return Err(SequenceError::NoStages);
    }
    // Every stage's config is checked before any work (later stages with a
    // placeholder for the checkpoint they will start from).
    for i in 0..stages.len() {
        let placeholder = (i > 0).then(|| dir.join("stage-previous"));
        stage_config(base, stages, i, placeholder.as_deref())?;
    }
    let cells = sequence_cells(stages, base);
    let mut summaries = Vec::new();
    let mut rows = Vec::new();
    let mut previous: Option<PathBuf> = None;
    for (i, stage) in stages.iter().enumerate() {
        let cfg = stage_config(base, stages, i, previous.as_deref())?;
        let run = dir.join(format!("stage-{}-{}", i + 1, stage.env));
        progress.message(&format!(
            "stage {} of {}: {} for {} steps ({})",
            i + 1,
            stages.len(),
            stage.key(),
            stage.steps,
            run.display()
        ));
        let mut trainer = Trainer::start(cfg, &run, progress)?;
        summaries.push(trainer.train(progress)?);
        drop(trainer);
        if i == 0 {
            let start = RunDir::open(&run)?.checkpoint_dir(0);
            progress.message("evaluating the starting policy on every stage's env");
            rows.push(evaluate_row("start", &start, &cells, eval)?);
        }
        let end = RunDir::open(&run)?.latest_checkpoint()?;
        progress.message(&format!(
            "evaluating after stage {} on every stage's env",
            i + 1
        ));
        rows.push(evaluate_row(
            &format!("after stage {} ({})", i + 1, stage.key()),
            &end,
            &cells,
            eval,
        )?);
        previous = Some(end);
    }
    let lines: String = rows
        .iter()
        .map(|r| serde_json::to_string(r).map(|l| l + "\n"))
        .collect::<Result<_, _>>()
        .map_err(|e| SequenceError::Write(format!("matrix.jsonl: {e}")))?;
    write(&dir.join("matrix.jsonl"), &lines)?;
    write(&dir.join("forgetting.md"), &forgetting_markdown(&rows))?;
    Ok((summaries, rows))
}

fn write(path: &Path, text: &str) -> Result<(), SequenceError> {
    agentrl_durable::write(path, text)
        .map_err(|e| SequenceError::Write(format!("{}: {e}", path.display())))
}

/// Why a sequence stopped.
#[derive(Debug, thiserror::Error)]
pub enum SequenceError {
    #[error("a sequence needs at least one stage")]
    NoStages,
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Train(#[from] TrainError),
    #[error(transparent)]
    Matrix(#[from] MatrixError),
    #[error("run directory: {0}")]
    RunDir(#[from] crate::run_dir::RunDirError),
    #[error("{0}")]
    Write(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forgetting_is_the_best_earlier_trained_row_minus_the_last() {
        // Rows: start, after A, after B. Column A: 0.1 → 0.6 → 0.5 forgot
        // 0.1; column B: 0.0 → 0.1 → 0.7 gained (forgetting −0.6).
        let avg = vec![vec![0.1, 0.0], vec![0.6, 0.1], vec![0.5, 0.7]];
        let f = forgetting(&avg);
        assert!((f[0].unwrap() - 0.1).abs() < 1e-12);
        assert!((f[1].unwrap() + 0.6).abs() < 1e-12);
        // Three stages: the best of both earlier stages counts.
        let avg = vec![vec![0.0], vec![0.4], vec![0.8], vec![0.3]];
        assert!((forgetting(&avg)[0].unwrap() - 0.5).abs() < 1e-12);
        // One stage: no earlier trained row.
        assert_eq!(forgetting(&[vec![0.1], vec![0.5]]), vec![None]);
        assert!(forgetting(&[]).is_empty());
    }

    #[test]
    fn stages_parse_with_defaults_and_name_their_errors() {
        let s = SequenceStage::parse("frozenlake", 20).unwrap();
        assert_eq!(
            (s.env.as_str(), s.difficulty.as_str(), s.steps),
            ("frozenlake", "easy", 20)
        );
        let s = SequenceStage::parse("sokoban:hard:5", 20).unwrap();
        assert_eq!((s.difficulty.as_str(), s.steps), ("hard", 5));
        for bad in [
            "chess",
            "frozenlake:nightmare",
            "frozenlake:easy:0",
            "frozenlake:easy:x",
            "a:b:c:d",
        ] {
            assert!(SequenceStage::parse(bad, 20).is_err(), "{bad}");
        }
    }

    #[test]
    fn later_stages_start_from_the_previous_policy_without_a_warm_start() {
        let base = TrainConfig::load(None, &[]).unwrap();
        let stages = vec![
            SequenceStage::parse("frozenlake:easy:3", 1).unwrap(),
            SequenceStage::parse("sokoban:easy:4", 1).unwrap(),
        ];
        let first = stage_config(&base, &stages, 0, None).unwrap();
        assert_eq!(first.env.name, "frozenlake");
        assert_eq!(
            first.env.params, base.env.params,
            "the base's own env keeps its params"
        );
        assert_eq!(first.trainer.total_training_steps, 3);
        assert_eq!(first.model.tokenizer_envs, ["sokoban"]);
        assert!(first.sft.demos > 0);
        let second = stage_config(
            &base,
            &stages,
            1,
            Some(Path::new("/runs/a/checkpoints/step-3")),
        )
        .unwrap();
        assert_eq!(second.env.name, "sokoban");
        assert!(
            second.env.params.is_empty(),
            "frozenlake's params do not follow"
        );
        assert_eq!(second.model.path, "/runs/a/checkpoints/step-3");
        assert_eq!(second.sft.demos, 0);
        assert!(second.model.tokenizer_envs.is_empty());
        assert_eq!(second.trainer.total_training_steps, 4);
        let cells = sequence_cells(&stages, &base);
        assert_eq!(cells.len(), 2);
        assert_eq!(cells[0].params, base.env.params);
    }
}
