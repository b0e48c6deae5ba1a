//! `agentrl study echo-trap [CONFIG] [key=value …] [--quick] [--out DIR]`
//! and `agentrl study generalisation` (see [`generalisation`]).
//!
//! RAGEN's Echo Trap, reproduced or not: the same setup trained twice with
//! the same seed, once as vanilla GRPO (every group kept, symmetric clip, a
//! KL loss to the reference) and once with StarPO-S (the top-std groups
//! only, the asymmetric clip, no KL), then both runs' curves side by side
//! (`curves.jsonl` and `curves.svg`) and the collapse warnings each raised.

use std::fs;
use std::path::{Path, PathBuf};

use agentrl_trainer::run_dir::RunDir;
use agentrl_trainer::{Summary, Trainer};
use anyhow::Context;
use plotters::prelude::*;
use serde_json::{json, Value};

use super::train::{load_config_or, Bars};
use agentrl_trainer::FORMAT_ONLY_CONFIG;

mod generalisation;

#[derive(clap::Args)]
pub struct StudyArgs {
    #[command(subcommand)]
    study: Study,
}

#[derive(clap::Subcommand)]
enum Study {
    /// Vanilla GRPO against StarPO-S on one setup: does the run collapse?
    EchoTrap(EchoTrapArgs),
    /// Easy → hard, held-in vs held-out, sequential vs mixture, the
    /// valid-action list and ScalingInter-RL: one report.
    Generalisation(generalisation::GeneralisationArgs),
}

#[derive(clap::Args)]
struct EchoTrapArgs {
    /// A TOML config (default: configs/frozenlake-format-only.toml, embedded), then
    /// `section.key=value` overrides applied to both arms.
    #[arg(value_name = "CONFIG_OR_OVERRIDE")]
    args: Vec<String>,
    /// 40 steps on 64 validation seeds instead of 200 on the config's.
    #[arg(long)]
    quick: bool,
    /// Study directory (default: `runs/echo-trap-<timestamp>`); must not exist or be empty.
    #[arg(long)]
    out: Option<PathBuf>,
    /// No progress bars.
    #[arg(long)]
    quiet: bool,
}

/// One arm of the study: a name and the overrides that make it.
struct Arm {
    name: &'static str,
    overrides: &'static [&'static str],
}

/// Vanilla GRPO as RAGEN ran it for the Echo Trap, and StarPO-S.
const ARMS: [Arm; 2] = [
    Arm {
        name: "vanilla",
        overrides: &[
            "rollout.rollout_filter_type=std",
            "rollout.rollout_filter_ratio=1.0",
            "rollout.drop_zero_std_groups=false",
            "actor.clip_ratio_low=0.2",
            "actor.clip_ratio_high=0.2",
            "actor.use_kl_loss=true",
            "actor.kl_loss_coef=0.001",
        ],
    },
    Arm {
        name: "starpo-s",
        overrides: &[
            "rollout.rollout_filter_type=std",
            "rollout.rollout_filter_ratio=0.25",
            "actor.clip_ratio_low=0.2",
            "actor.clip_ratio_high=0.28",
            "actor.use_kl_loss=false",
        ],
    },
];

/// What both arms share over the config: RAGEN's Echo Trap is a GRPO
/// phenomenon (`algorithm.adv_estimator=gae` after these makes it PPO's),
/// and the study's length, `--quick` or the full run.
fn study_overrides(quick: bool) -> &'static [&'static str] {
    if quick {
        &[
            "algorithm.adv_estimator=grpo",
            "algorithm.norm_adv_by_std_in_grpo=true",
            "trainer.total_training_steps=40",
            "trainer.test_freq=10",
            "trainer.save_freq=0",
            "trainer.val_tasks=64",
            "trainer.val_greedy=false",
        ]
    } else {
        &[
            "algorithm.adv_estimator=grpo",
            "algorithm.norm_adv_by_std_in_grpo=true",
            "trainer.total_training_steps=200",
            "trainer.test_freq=20",
            "trainer.save_freq=50",
        ]
    }
}

pub fn run(args: StudyArgs) -> anyhow::Result<()> {
    match args.study {
        Study::EchoTrap(a) => echo_trap(a),
        Study::Generalisation(a) => generalisation::run(a),
    }
}

fn echo_trap(args: EchoTrapArgs) -> anyhow::Result<()> {
    // Check both arms' configs before any work.
    let (base, user): (Vec<String>, Vec<String>) = match args.args.split_first() {
        Some((first, rest)) if !first.contains('=') => (vec![first.clone()], rest.to_vec()),
        _ => (Vec::new(), args.args.clone()),
    };
    let mut configs = Vec::new();
    for arm in &ARMS {
        // Order: the config, the study's shared overrides, the arm, then the
        // user's (so `trainer.total_training_steps=…` or
        // `algorithm.adv_estimator=gae` still win).
        let mut a = base.clone();
        a.extend(study_overrides(args.quick).iter().map(|s| s.to_string()));
        a.extend(arm.overrides.iter().map(|s| s.to_string()));
        a.extend(user.iter().cloned());
        let cfg = load_config_or(&a, FORMAT_ONLY_CONFIG)
            .with_context(|| format!("the {} arm's config", arm.name))?;
        configs.push((arm, cfg));
    }
    let out = study_dir(args.out.as_ref(), "echo-trap")?;

    let mut curves = Vec::new();
    let mut summaries = Vec::new();
    for (arm, cfg) in configs {
        let dir = out.join(arm.name);
        eprintln!(
            "arm {}: {} steps of {:?} on {}",
            arm.name, cfg.trainer.total_training_steps, cfg.algorithm.adv_estimator, cfg.env.name
        );
        let mut bars = Bars::new(args.quiet);
        let mut trainer = Trainer::start(cfg, &dir, &mut bars)?;
        let summary = trainer.train(&mut bars)?;
        curves.extend(arm_curve(arm.name, &dir)?);
        summaries.push((arm.name, summary));
    }

    let jsonl: String = curves.iter().map(|v| format!("{v}\n")).collect();
    let curves_path = out.join("curves.jsonl");
    fs::write(&curves_path, jsonl)
        .with_context(|| format!("cannot write {}", curves_path.display()))?;
    let plot_path = out.join("curves.svg");
    plot(&curves, &plot_path)?;

    println!("echo trap study: {}", out.display());
    for (name, s) in &summaries {
        println!("{}", arm_line(name, s));
    }
    println!(
        "curves: {} and {}",
        curves_path.display(),
        plot_path.display()
    );
    Ok(())
}

/// One arm's result in a line: success before → after, best, warnings.
fn arm_line(name: &str, s: &Summary) -> String {
    let warnings = if s.collapse_warnings.is_empty() {
        "no collapse warning".to_string()
    } else {
        s.collapse_warnings
            .iter()
            .map(|w| format!("{:?}@{}", w.signal, w.step))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let best = s
        .best
        .as_ref()
        .map(|b| format!("{:.1}% at step {}", 100.0 * b.success_rate, b.step))
        .unwrap_or_else(|| "-".into());
    format!(
        "  {name:<9} held-out success {:.1}% -> {:.1}% (best {best}); {warnings}",
        100.0 * s.before.success_rate,
        100.0 * s.after.success_rate,
    )
}

/// The per-step rows of one arm: its training figures, plus the validation
/// success at the steps it was measured.
fn arm_curve(arm: &str, dir: &Path) -> anyhow::Result<Vec<Value>> {
    let path = dir.join("metrics.jsonl");
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let v: Value = serde_json::from_str(line)
            .with_context(|| format!("{} line {}", path.display(), i + 1))?;
        let field = |k: &str| v.get(k).cloned().unwrap_or(Value::Null);
        match v.get("kind").and_then(Value::as_str) {
            Some("train") => rows.push(json!({
                "arm": arm,
                "step": field("step"),
                "success": field("success"),
                "in_group_std": field("in_group_std_before"),
                "entropy": field("entropy"),
                "grad_norm": field("grad_norm"),
                "format_error_rate": field("format_error_rate"),
                "collapse": field("collapse"),
            })),
            Some("eval")
                if v.get("phase").and_then(Value::as_str) != Some("after_greedy")
                    && v.get("phase").and_then(Value::as_str) != Some("before_greedy") =>
            {
                rows.push(json!({
                    "arm": arm,
                    "step": field("step"),
                    "val_success": field("success_rate"),
                }))
            }
            _ => {}
        }
    }
    Ok(rows)
}

/// The panels of `curves.svg`: (title, the row key).
const PANELS: [(&str, &str); 6] = [
    ("training success", "success"),
    ("validation success", "val_success"),
    ("in-group reward std", "in_group_std"),
    ("entropy", "entropy"),
    ("gradient norm", "grad_norm"),
    ("format error rate", "format_error_rate"),
];

/// Both arms' curves, one panel per figure.
fn plot(rows: &[Value], path: &Path) -> anyhow::Result<()> {
    // Every text below (captions, ticks, legends) is in plotters' default
    // family, which is the embedded font once registered.
    super::report::plots::register_font();
    let root = SVGBackend::new(path, (1200, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((2, 3));
    let colors = [RED, BLUE];
    for (area, (title, key)) in panels.iter().zip(PANELS) {
        let series: Vec<(&str, Vec<(f64, f64)>)> = ARMS
            .iter()
            .map(|arm| {
                let pts = rows
                    .iter()
                    .filter(|r| r["arm"] == arm.name)
                    .filter_map(|r| Some((r["step"].as_f64()?, r[key].as_f64()?)))
                    .collect();
                (arm.name, pts)
            })
            .collect();
        let all = series.iter().flat_map(|(_, p)| p.iter());
        let x_max = all.clone().map(|p| p.0).fold(1.0, f64::max);
        let y_max = all.map(|p| p.1).fold(0.0, f64::max).max(1e-3) * 1.05;
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 18))
            .margin(8)
            .x_label_area_size(28)
            .y_label_area_size(44)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
        chart.configure_mesh().x_desc("step").draw()?;
        for ((name, pts), color) in series.into_iter().zip(colors) {
            chart
                .draw_series(LineSeries::new(pts, color.stroke_width(2)))?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// A study's new directory: `out`, or `runs/NAME-TIMESTAMP`; never an
/// existing run's.
pub(crate) fn study_dir(out: Option<&PathBuf>, name: &str) -> anyhow::Result<PathBuf> {
    new_output_dir(out, "study", name)
}

/// The new directory of a `what` (a study, a sequence): `out`, or
/// `runs/NAME-TIMESTAMP`; never an existing run's. Created and announced.
pub(crate) fn new_output_dir(
    out: Option<&PathBuf>,
    what: &str,
    name: &str,
) -> anyhow::Result<PathBuf> {
    let out = out.cloned().unwrap_or_else(|| {
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        PathBuf::from("runs").join(format!("{name}-{ts}"))
    });
    RunDir::check_new(&out).with_context(|| {
        format!(
            "--out {}: a {what} is not written into an existing directory",
            out.display()
        )
    })?;
    fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    eprintln!("{what} directory: {}", out.display());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::owned_strings;

    #[test]
    fn arms_differ_only_in_the_echo_trap_knobs_and_both_load() {
        for quick in [true, false] {
            for arm in &ARMS {
                let mut a = owned_strings(study_overrides(quick));
                a.extend(owned_strings(arm.overrides));
                let cfg = load_config_or(&a, FORMAT_ONLY_CONFIG).unwrap();
                assert_eq!(cfg.env.name, "frozenlake");
            }
        }
        let vanilla =
            load_config_or(&owned_strings(ARMS[0].overrides), FORMAT_ONLY_CONFIG).unwrap();
        let starpo = load_config_or(&owned_strings(ARMS[1].overrides), FORMAT_ONLY_CONFIG).unwrap();
        assert_eq!(vanilla.rollout.rollout_filter_ratio, 1.0);
        assert!(vanilla.actor.use_kl_loss);
        assert_eq!(vanilla.actor.clip_ratio_low, vanilla.actor.clip_ratio_high);
        assert!(starpo.rollout.rollout_filter_ratio < 1.0);
        assert!(!starpo.actor.use_kl_loss);
        assert!(starpo.actor.clip_ratio_high > starpo.actor.clip_ratio_low);
        assert_eq!(vanilla.trainer.seed, starpo.trainer.seed);
        let cfg =
            load_config_or(&owned_strings(study_overrides(true)), FORMAT_ONLY_CONFIG).unwrap();
        assert_eq!(
            cfg.algorithm.adv_estimator,
            agentrl_algos::AdvEstimator::Grpo
        );
    }

    #[test]
    fn curves_read_train_and_validation_rows_and_plot() {
        let dir = tempfile::tempdir().unwrap();
        let arm = dir.path().join("vanilla");
        fs::create_dir_all(&arm).unwrap();
        fs::write(
            arm.join("metrics.jsonl"),
            concat!(
                "{\"kind\":\"eval\",\"phase\":\"before\",\"step\":0,\"success_rate\":0.1}\n",
                "{\"kind\":\"eval\",\"phase\":\"before_greedy\",\"step\":0,\"success_rate\":0.0}\n",
                "{\"kind\":\"train\",\"step\":1,\"success\":0.25,\"in_group_std_before\":0.4,\"entropy\":0.5,\"grad_norm\":0.3,\"format_error_rate\":0.0,\"collapse\":[]}\n",
            ),
        )
        .unwrap();
        let rows = arm_curve("vanilla", &arm).unwrap();
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!(rows[0]["val_success"], 0.1);
        assert_eq!(rows[1]["in_group_std"], 0.4);
        let svg = dir.path().join("curves.svg");
        plot(&rows, &svg).unwrap();
        let text = fs::read_to_string(&svg).unwrap();
        assert!(text.contains("<svg") && text.contains("entropy"));
    }

    /// The plot in a process where nothing else drew first: the font is
    /// registered once per process, so in this test binary another test may
    /// have done it (a study once failed at its very end for want of it).
    #[test]
    fn curves_plot_in_a_fresh_process() {
        const CHILD: &str = "AGENTRL_STUDY_PLOT_CHILD";
        let name = "commands::study::tests::curves_plot_in_a_fresh_process";
        if let Some(dir) = std::env::var_os(CHILD) {
            let rows = vec![json!({"arm": ARMS[0].name, "step": 1, "success": 0.5})];
            plot(&rows, &Path::new(&dir).join("curves.svg")).unwrap();
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--test-threads", "1"])
            .env(CHILD, dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let text = fs::read_to_string(dir.path().join("curves.svg")).unwrap();
        assert!(text.contains("training success"), "{text}");
    }
}
