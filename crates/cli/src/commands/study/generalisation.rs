//! `agentrl study generalisation [CONFIG] [key=value …] [--quick] [--out DIR]`
//!
//! A small version of "Can RL Improve Generalization of LLM Agents?"
//! (arXiv 2603.12011) on CPU. The config's environment is A (FrozenLake by
//! default), B is Sokoban (FrozenLake when A is Sokoban) and the bandit is
//! held out from all training. Every arm starts from the same warm start
//! and tokenizer (trained on all three environments' text), except where
//! the arm itself changes the warm start (a mixture's demonstrations, the
//! valid-action list in the prompt):
//!
//! 1. easy-only vs hard-only vs easy → hard on A;
//! 2. trained on A/easy, evaluated on everything (held-in vs held-out);
//! 3. sequential A → B and the forgetting of A;
//! 4. a mixture of A and B against the sequential end;
//! 5. the same training with and without the valid-action list shown;
//! 6. ScalingInter-RL's growing turn budget against a fixed long one.
//!
//! Every policy (the start and each arm's end) plays the same validation
//! tasks of every cell k times; `study.json` holds the rows and the report
//! (`report.md`, `report.html`) is written at the end.

use std::fs;
use std::path::{Path, PathBuf};

use agentrl_env_core::{EnvParams, TaskSpec};
use agentrl_trainer::eval_matrix::{Cell, CellFigures, INTERVAL_METHOD};
use agentrl_trainer::mixture::MixtureEntry;
use agentrl_trainer::run_dir::RunDir;
use agentrl_trainer::sequence::{evaluate_row, SequenceEval};
use agentrl_trainer::{TrainConfig, Trainer};
use anyhow::Context;

use crate::commands::report::{self, Experiment, MatrixRow, StudyFile};
use crate::commands::train::{load_config_or, Bars};
use agentrl_trainer::FORMAT_ONLY_CONFIG;

#[derive(clap::Args)]
pub struct GeneralisationArgs {
    /// A TOML config (default: configs/frozenlake-format-only.toml, embedded), then
    /// `section.key=value` overrides applied to every arm.
    #[arg(value_name = "CONFIG_OR_OVERRIDE")]
    args: Vec<String>,
    /// A tiny model, 16 steps per arm, 16 tasks x 4 samples per cell
    /// (about 10 minutes on 2 cores) instead of the config's model, 50
    /// steps, 64 tasks x 8 samples.
    #[arg(long)]
    quick: bool,
    /// Validation tasks per cell of the final matrix (default: 16 quick, 64 full).
    #[arg(long)]
    tasks: Option<u64>,
    /// Samples per task of avg@k / pass@k (default: 4 quick, 8 full).
    #[arg(long)]
    k: Option<usize>,
    /// Study directory (default: `runs/generalisation-<timestamp>`); must not exist or be empty.
    #[arg(long)]
    out: Option<PathBuf>,
    /// No progress bars.
    #[arg(long)]
    quiet: bool,
}

/// How big the study is.
struct Scale {
    overrides: &'static [&'static str],
    /// Validation tasks per cell of the final matrix, and samples of each.
    tasks: u64,
    k: usize,
}

/// `--quick`: the 3×3 config's tiny model (d 64, one layer) and recipe on
/// the environments' own sizes, 16 RL steps per arm.
const QUICK: Scale = Scale {
    overrides: &[
        "model.hidden_size=64",
        "model.num_hidden_layers=1",
        "model.num_attention_heads=4",
        "model.num_key_value_heads=2",
        "model.intermediate_size=128",
        "sft.demos=128",
        "sft.epochs=4",
        "sft.lr=3e-3",
        "sft.batch_size=8",
        "algorithm.adv_estimator=grpo",
        "algorithm.norm_adv_by_std_in_grpo=true",
        "actor.lr=3e-3",
        "actor.lr_warmup_steps=0",
        "rollout.n=8",
        "rollout.env_groups=4",
        // 6×6 maps (hard) need 10 moves at least.
        "rollout.max_turns=12",
        "rollout.max_actions=12",
        "rollout.max_actions_per_turn=1",
        "rollout.response_length=12",
        "rollout.rollout_filter_ratio=1.0",
        "trainer.total_training_steps=16",
        "trainer.test_freq=8",
        "trainer.save_freq=0",
        "trainer.val_tasks=32",
        "trainer.val_greedy=false",
        "trainer.val_temperature=1.0",
        "collapse.mi_every=0",
    ],
    tasks: 16,
    k: 4,
};

/// The full study: the config's model and recipe, 50 RL steps per arm.
const FULL: Scale = Scale {
    overrides: &[
        "trainer.total_training_steps=50",
        "trainer.test_freq=10",
        "trainer.save_freq=0",
        "trainer.val_tasks=128",
        "trainer.val_greedy=false",
        "collapse.mi_every=0",
    ],
    tasks: 64,
    k: 8,
};

/// The environments of the study.
struct Envs {
    /// Trained on; its difficulties give the easy/hard pair.
    a: String,
    easy: String,
    hard: String,
    a_params: EnvParams,
    /// The second environment of the sequence and the mixture.
    b: String,
    /// Never trained on.
    held_out: String,
}

impl Envs {
    fn of(cfg: &TrainConfig) -> anyhow::Result<Self> {
        let desc = agentrl_envs::find(&cfg.env.name)
            .context("the study trains in-process on one of agentrl's environments")?;
        anyhow::ensure!(
            desc.difficulties.len() >= 2,
            "{} has a single difficulty: the study needs an easy and a hard one",
            cfg.env.name
        );
        let b = match cfg.env.name.as_str() {
            "sokoban" => "frozenlake",
            _ => "sokoban",
        };
        let held_out = match cfg.env.name.as_str() {
            "bandit" => "frozenlake",
            _ => "bandit",
        };
        anyhow::ensure!(b != held_out, "the study needs three distinct environments");
        Ok(Self {
            a: cfg.env.name.clone(),
            easy: desc.difficulties[0].to_string(),
            hard: desc.difficulties[desc.difficulties.len() - 1].to_string(),
            a_params: cfg.env.params.clone(),
            b: b.to_string(),
            held_out: held_out.to_string(),
        })
    }

    /// Every cell of the final matrix.
    fn cells(&self) -> Vec<Cell> {
        let cell = |env: &str, difficulty: &str, params: &EnvParams| Cell {
            env: env.to_string(),
            difficulty: difficulty.to_string(),
            params: params.clone(),
        };
        let none = EnvParams::new();
        let first = |env: &str| {
            agentrl_envs::find(env)
                .ok()
                .and_then(|d| d.difficulties.first().map(|s| s.to_string()))
                .unwrap_or_else(|| "easy".into())
        };
        vec![
            cell(&self.a, &self.easy, &self.a_params),
            cell(&self.a, &self.hard, &self.a_params),
            cell(&self.b, &first(&self.b), &none),
            cell(&self.held_out, &first(&self.held_out), &none),
        ]
    }
}

/// One trained arm: its name and how its config differs from the base.
struct Arm {
    name: &'static str,
    row: String,
    cfg: TrainConfig,
}

/// The base every arm shares: the user's config, the study's scale, RL on
/// the easy difficulty and validation there, and a tokenizer over every
/// environment of the study.
fn base_config(args: &GeneralisationArgs) -> anyhow::Result<(TrainConfig, Envs)> {
    let (config, user): (Vec<String>, Vec<String>) = match args.args.split_first() {
        Some((first, rest)) if !first.contains('=') => (vec![first.clone()], rest.to_vec()),
        _ => (Vec::new(), args.args.clone()),
    };
    let scale = if args.quick { &QUICK } else { &FULL };
    let mut all = config;
    all.extend(scale.overrides.iter().map(|s| s.to_string()));
    all.extend(user);
    let mut cfg = load_config_or(&all, FORMAT_ONLY_CONFIG)?;
    let envs = Envs::of(&cfg)?;
    cfg.env.difficulty = envs.easy.clone();
    cfg.model.tokenizer_envs = vec![envs.b.clone(), envs.held_out.clone()];
    cfg.validate()?;
    Ok((cfg, envs))
}

/// The arms trained from the warm start (the sequential stage 2 is built
/// once its stage 1 has finished).
fn arms(base: &TrainConfig, envs: &Envs) -> anyhow::Result<Vec<Arm>> {
    let steps = base.trainer.total_training_steps;
    let with =
        |name: &'static str, row: String, f: &dyn Fn(&mut TrainConfig)| -> anyhow::Result<Arm> {
            let mut cfg = base.clone();
            cfg.name = format!("generalisation-{name}");
            f(&mut cfg);
            cfg.validate()
                .with_context(|| format!("the {name} arm's config"))?;
            Ok(Arm { name, row, cfg })
        };
    let (a, easy, hard) = (&envs.a, &envs.easy, &envs.hard);
    let long = base.rollout.max_turns;
    Ok(vec![
        with("easy-only", format!("{a}/{easy} only"), &|c| {
            c.curriculum.difficulties = vec![easy.clone()];
        })?,
        with("hard-only", format!("{a}/{hard} only"), &|c| {
            c.curriculum.difficulties = vec![hard.clone()];
        })?,
        with("easy-to-hard", format!("{a} {easy} -> {hard}"), &|c| {
            c.curriculum.difficulties = vec![easy.clone(), hard.clone()];
            c.curriculum.stage_steps = (steps / 2).max(1);
        })?,
        with(
            "valid-actions",
            format!("{a}/{easy}, valid actions shown"),
            &|c| {
                c.curriculum.difficulties = vec![easy.clone()];
                c.rollout.show_valid_actions = true;
            },
        )?,
        with(
            "scaling-inter",
            format!("{a}/{easy}, ScalingInter-RL"),
            &|c| {
                c.curriculum.difficulties = vec![easy.clone()];
                c.rollout.max_turns_schedule = vec![(long / 3).max(1), (2 * long / 3).max(1), long];
                c.rollout.max_turns_stage_steps = (steps / 3).max(1);
            },
        )?,
        with("mixture", format!("mixture {a} + {}", envs.b), &|c| {
            c.mixture = vec![
                MixtureEntry {
                    name: a.clone(),
                    weight: 1.0,
                    difficulty: easy.clone(),
                    params: envs.a_params.clone(),
                },
                MixtureEntry {
                    name: envs.b.clone(),
                    weight: 1.0,
                    difficulty: String::new(),
                    params: EnvParams::new(),
                },
            ];
        })?,
    ])
}

/// The sequence's second stage: B from the easy-only arm's final policy.
fn sequential_stage(
    base: &TrainConfig,
    envs: &Envs,
    previous: &Path,
) -> anyhow::Result<TrainConfig> {
    let mut cfg = base.clone();
    cfg.name = "generalisation-sequential".into();
    cfg.env.name = envs.b.clone();
    cfg.env.params = EnvParams::new();
    cfg.env.difficulty = agentrl_envs::find(&envs.b)?.difficulties[0].to_string();
    cfg.model.path = previous.display().to_string();
    cfg.model.tokenizer_envs.clear();
    cfg.sft.demos = 0;
    cfg.validate().context("the sequential arm's config")?;
    Ok(cfg)
}

pub fn run(args: GeneralisationArgs) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let (base, envs) = base_config(&args)?;
    let arms = arms(&base, &envs)?;
    let out = super::study_dir(args.out.as_ref(), "generalisation")?;
    let scale = if args.quick { &QUICK } else { &FULL };
    let (tasks, k) = (args.tasks.unwrap_or(scale.tasks), args.k.unwrap_or(scale.k));
    anyhow::ensure!(tasks >= 1 && k >= 1, "--tasks and --k must be at least 1");

    // Train every arm, then the sequence's second stage from easy-only.
    let mut trained: Vec<(String, PathBuf)> = Vec::new();
    for arm in &arms {
        let dir = out.join(arm.name);
        eprintln!(
            "arm {}: {} ({} steps)",
            arm.name, arm.row, arm.cfg.trainer.total_training_steps
        );
        let mut bars = Bars::new(args.quiet);
        Trainer::start(arm.cfg.clone(), &dir, &mut bars)?.train(&mut bars)?;
        trained.push((arm.row.clone(), dir));
    }
    let easy_only = out.join("easy-only");
    let stage_one_end = RunDir::open(&easy_only)?.latest_checkpoint()?;
    let seq_cfg = sequential_stage(&base, &envs, &stage_one_end)?;
    let seq_dir = out.join("sequential");
    let seq_row = format!("{} -> {}", envs.a, envs.b);
    eprintln!("arm sequential: {seq_row} from easy-only's final policy");
    let mut bars = Bars::new(args.quiet);
    Trainer::start(seq_cfg, &seq_dir, &mut bars)?.train(&mut bars)?;
    trained.push((seq_row.clone(), seq_dir));

    // Every policy on every cell.
    let cells = envs.cells();
    let make = |spec: &TaskSpec, params: &EnvParams| agentrl_envs::make_env(spec, params);
    let eval = SequenceEval {
        make: &make,
        tasks,
        k,
        temperature: base.trainer.val_temperature,
        seed: base.trainer.seed,
    };
    let mut rows: Vec<MatrixRow> = Vec::new();
    let start = RunDir::open(&easy_only)?.checkpoint_dir(0);
    eprintln!(
        "evaluating the start and {} trained policies on {} cells",
        trained.len(),
        cells.len()
    );
    let start_row = evaluate_row("start", &start, &cells, &eval)?;
    rows.push(MatrixRow {
        row: "start".into(),
        run_dir: None,
        cells: start_row.cells,
    });
    for (row, dir) in &trained {
        let r = evaluate_row(row, &RunDir::open(dir)?.latest_checkpoint()?, &cells, &eval)?;
        rows.push(MatrixRow {
            row: row.clone(),
            run_dir: Some(dir.clone()),
            cells: r.cells,
        });
    }

    let study = StudyFile {
        title: format!(
            "Generalisation study ({}) on {}, {} and {}",
            if args.quick { "quick" } else { "full" },
            envs.a,
            envs.b,
            envs.held_out
        ),
        k,
        tasks,
        interval: INTERVAL_METHOD.into(),
        experiments: experiments(&envs, &arms, &seq_row, &rows),
    };
    let path = out.join("study.json");
    fs::write(&path, serde_json::to_string_pretty(&study)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    let rendered = report::build(&out)?;
    rendered.write(&out)?;
    println!(
        "generalisation study: {} in {:.0} s",
        out.display(),
        started.elapsed().as_secs_f64()
    );
    for e in &study.experiments {
        println!("- {}: {}", e.name, e.finding);
    }
    println!(
        "{}, {} and {}",
        out.join("study.json").display(),
        out.join("report.md").display(),
        out.join("report.html").display()
    );
    Ok(())
}

/// The row named `name`, on the cells named `columns` (`env/difficulty`).
fn pick(rows: &[MatrixRow], name: &str, columns: &[String]) -> Option<MatrixRow> {
    let r = rows.iter().find(|r| r.row == name)?;
    let cells: Vec<CellFigures> = columns
        .iter()
        .filter_map(|c| {
            r.cells
                .iter()
                .find(|x| format!("{}/{}", x.env, x.difficulty) == *c)
                .cloned()
        })
        .collect();
    Some(MatrixRow {
        row: r.row.clone(),
        run_dir: r.run_dir.clone(),
        cells,
    })
}

/// avg@k of `row` on the cell `column`.
fn avg(rows: &[MatrixRow], row: &str, column: &str) -> f64 {
    rows.iter()
        .find(|r| r.row == row)
        .and_then(|r| {
            r.cells
                .iter()
                .find(|c| format!("{}/{}", c.env, c.difficulty) == column)
        })
        .map_or(f64::NAN, |c| c.avg_at_k.mean)
}

fn pct(v: f64) -> String {
    format!("{:.1}%", 100.0 * v)
}

/// The six questions, each on the rows and cells that answer it, with a
/// finding read off the figures.
fn experiments(envs: &Envs, arms: &[Arm], seq_row: &str, rows: &[MatrixRow]) -> Vec<Experiment> {
    let names: Vec<String> = envs
        .cells()
        .iter()
        .map(|c| format!("{}/{}", c.env, c.difficulty))
        .collect();
    let (a_easy, a_hard, b_cell, held) = (&names[0], &names[1], &names[2], &names[3]);
    let row_of = |arm: &str| {
        arms.iter()
            .find(|a| a.name == arm)
            .map(|a| a.row.clone())
            .unwrap_or_default()
    };
    let (easy_only, hard_only, curriculum) = (
        row_of("easy-only"),
        row_of("hard-only"),
        row_of("easy-to-hard"),
    );
    let (valid, scaling, mixture) = (
        row_of("valid-actions"),
        row_of("scaling-inter"),
        row_of("mixture"),
    );
    let experiment = |name: &str,
                      question: &str,
                      row_names: &[&str],
                      columns: &[&String],
                      forgetting: bool,
                      finding: String| {
        let columns: Vec<String> = columns.iter().map(|c| c.to_string()).collect();
        Experiment {
            name: name.into(),
            question: question.into(),
            rows: row_names
                .iter()
                .filter_map(|r| pick(rows, r, &columns))
                .collect(),
            baseline: Some("start".into()),
            forgetting,
            finding,
        }
    };
    let d = |row: &str, col: &str| 100.0 * (avg(rows, row, col) - avg(rows, "start", col));
    let all_rows: Vec<&str> = rows.iter().map(|r| r.row.as_str()).collect();
    let held_out_gain = |row: &str| (d(row, b_cell) + d(row, held)) / 2.0;
    vec![
        experiment(
            "Easy to hard within an environment",
            &format!("Does training on {} generalise to {}, and does an easy → hard curriculum beat a single difficulty?", a_easy, a_hard),
            &["start", &easy_only, &hard_only, &curriculum],
            &[a_easy, a_hard],
            false,
            format!(
                "On {a_hard}: start {}, easy-only {}, hard-only {}, easy → hard {}; on {a_easy}: {}, {}, {}, {}.",
                pct(avg(rows, "start", a_hard)),
                pct(avg(rows, &easy_only, a_hard)),
                pct(avg(rows, &hard_only, a_hard)),
                pct(avg(rows, &curriculum, a_hard)),
                pct(avg(rows, "start", a_easy)),
                pct(avg(rows, &easy_only, a_easy)),
                pct(avg(rows, &hard_only, a_easy)),
                pct(avg(rows, &curriculum, a_easy)),
            ),
        ),
        experiment(
            "Held-in and held-out environments",
            &format!("Every policy (rows: what it trained on) on every env and difficulty (columns): how much of a gain carries to what it never saw? {held} is held out from every run, {b_cell} from all but the sequence and the mixture."),
            &all_rows,
            &[a_easy, a_hard, b_cell, held],
            false,
            format!(
                "Trained on {a_easy} only, Δ against the start: held-in {a_easy} {:+.1} points, {a_hard} {:+.1}; held-out {b_cell} {:+.1}, {held} {:+.1}. Mean Δ on {held} over every trained policy: {:+.1}.",
                d(&easy_only, a_easy),
                d(&easy_only, a_hard),
                d(&easy_only, b_cell),
                d(&easy_only, held),
                all_rows[1..].iter().map(|r| d(r, held)).sum::<f64>() / (all_rows.len() - 1).max(1) as f64,
            ),
        ),
        experiment(
            "Sequential training and forgetting",
            &format!("Trained on {a_easy}, then on {b_cell} from that policy: does the second stage make it forget the first?"),
            &["start", &easy_only, seq_row],
            &[a_easy, b_cell],
            true,
            format!(
                "{a_easy}: {} after stage 1, {} after stage 2 (forgetting {:+.1} points); {b_cell}: {} -> {}.",
                pct(avg(rows, &easy_only, a_easy)),
                pct(avg(rows, seq_row, a_easy)),
                100.0 * (avg(rows, &easy_only, a_easy) - avg(rows, seq_row, a_easy)),
                pct(avg(rows, &easy_only, b_cell)),
                pct(avg(rows, seq_row, b_cell)),
            ),
        ),
        experiment(
            "Mixture against sequence",
            &format!("Training on {} and {} at once, against the sequence's end.", envs.a, envs.b),
            &["start", seq_row, &mixture],
            &[a_easy, b_cell, held],
            false,
            format!(
                "mixture {a_easy} {} and {b_cell} {}; sequence {} and {}.",
                pct(avg(rows, &mixture, a_easy)),
                pct(avg(rows, &mixture, b_cell)),
                pct(avg(rows, seq_row, a_easy)),
                pct(avg(rows, seq_row, b_cell)),
            ),
        ),
        experiment(
            "Valid-action list shown in training",
            "The same training with the list of valid actions in every observation (each policy evaluated as it was trained): does the list hurt transfer?",
            &["start", &easy_only, &valid],
            &[a_easy, b_cell, held],
            false,
            format!(
                "held-in {a_easy} Δ {:+.1} without the list, {:+.1} with it; mean held-out Δ {:+.1} without, {:+.1} with.",
                d(&easy_only, a_easy),
                d(&valid, a_easy),
                held_out_gain(&easy_only),
                held_out_gain(&valid),
            ),
        ),
        experiment(
            "ScalingInter-RL against a fixed horizon",
            "A turn budget growing in three stages up to the fixed run's, against that fixed budget throughout (both evaluated with the full budget).",
            &["start", &easy_only, &scaling],
            &[a_easy, a_hard],
            false,
            format!(
                "{a_easy}: fixed {}, ScalingInter-RL {}; {a_hard}: {} and {}.",
                pct(avg(rows, &easy_only, a_easy)),
                pct(avg(rows, &scaling, a_easy)),
                pct(avg(rows, &easy_only, a_hard)),
                pct(avg(rows, &scaling, a_hard)),
            ),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(quick: bool, extra: &[&str]) -> GeneralisationArgs {
        GeneralisationArgs {
            args: crate::commands::owned_strings(extra),
            quick,
            tasks: None,
            k: None,
            out: None,
            quiet: true,
        }
    }

    #[test]
    fn every_arm_loads_and_differs_from_easy_only_in_its_own_knob() {
        for quick in [true, false] {
            let (base, envs) = base_config(&args(quick, &[])).unwrap();
            assert_eq!(
                (envs.a.as_str(), envs.b.as_str(), envs.held_out.as_str()),
                ("frozenlake", "sokoban", "bandit")
            );
            assert_eq!(base.model.tokenizer_envs, ["sokoban", "bandit"]);
            let arms = arms(&base, &envs).unwrap();
            let easy = &arms[0].cfg;
            assert_eq!(easy.curriculum.difficulties, ["easy"]);
            let by = |name: &str| &arms.iter().find(|a| a.name == name).unwrap().cfg;
            assert_eq!(by("hard-only").curriculum.difficulties, ["hard"]);
            assert_eq!(by("easy-to-hard").curriculum.difficulties, ["easy", "hard"]);
            assert!(
                by("valid-actions").rollout.show_valid_actions && !easy.rollout.show_valid_actions
            );
            let s = &by("scaling-inter").rollout;
            assert_eq!(s.max_turns_schedule.last(), Some(&easy.rollout.max_turns));
            assert_eq!(by("mixture").mixture.len(), 2);
            // The same seed, model and warm start everywhere.
            for arm in &arms {
                assert_eq!(arm.cfg.trainer.seed, easy.trainer.seed);
                assert_eq!(arm.cfg.model, easy.model);
                assert_eq!(arm.cfg.env.difficulty, "easy");
            }
            let seq = sequential_stage(&base, &envs, Path::new("/x/checkpoints/step-16")).unwrap();
            assert_eq!((seq.env.name.as_str(), seq.sft.demos), ("sokoban", 0));
            assert!(seq.env.params.is_empty() && seq.model.tokenizer_envs.is_empty());
        }
        let (quick, _) = base_config(&args(true, &[])).unwrap();
        assert_eq!(quick.trainer.total_training_steps, 16);
        assert_eq!(quick.model.config.hidden_size, 64);
        // The user's overrides come last.
        let (mine, _) = base_config(&args(true, &["trainer.total_training_steps=3"])).unwrap();
        assert_eq!(mine.trainer.total_training_steps, 3);
    }

    #[test]
    fn the_cells_cover_easy_hard_the_second_env_and_the_held_out_one() {
        let (_, envs) = base_config(&args(true, &[])).unwrap();
        let cells: Vec<String> = envs
            .cells()
            .iter()
            .map(|c| format!("{}/{}", c.env, c.difficulty))
            .collect();
        assert_eq!(
            cells,
            [
                "frozenlake/easy",
                "frozenlake/hard",
                "sokoban/easy",
                "bandit/easy"
            ]
        );
        assert_eq!(envs.cells()[0].params["is_slippery"], false);
        assert!(envs.cells()[2].params.is_empty());
    }
}
