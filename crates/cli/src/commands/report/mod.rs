//! `agentrl report DIR`: `report.md` (with `figures/*.png`) and a
//! self-contained `report.html` for a run directory, a sequence directory
//! (`agentrl sequence`) or a study directory (`agentrl study
//! generalisation`): learning curves, success by difficulty, the
//! held-in/held-out heatmap, failure-label bars, turns and tokens over
//! training, and the tables behind them.

mod document;
pub mod plots;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use agentrl_rollout::{FailureCounts, FailureLabel};
use agentrl_trainer::eval_matrix::CellFigures;
use agentrl_trainer::pass_at_k::Estimate;
use agentrl_trainer::sequence::{forgetting, SequenceRow};
use anyhow::Context;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use document::{Figure, Report, Section, Table};
use plots::{grouped_bars, heatmap, line_panels, LinePanel, Series};

#[derive(clap::Args)]
pub struct ReportArgs {
    /// A run directory, a sequence directory or a study directory.
    dir: PathBuf,
}

/// A study's results (`study.json`), as `agentrl study generalisation`
/// writes them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StudyFile {
    pub title: String,
    /// Samples per task of avg@k.
    pub k: usize,
    /// Validation tasks per cell.
    pub tasks: u64,
    pub interval: String,
    pub experiments: Vec<Experiment>,
}

/// One question of a study: rows of policies evaluated on the same cells.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Experiment {
    pub name: String,
    pub question: String,
    pub rows: Vec<MatrixRow>,
    /// The row every other is compared with (Δ), usually the start policy.
    #[serde(default)]
    pub baseline: Option<String>,
    /// Rows are sequential stages: add the forgetting row.
    #[serde(default)]
    pub forgetting: bool,
    /// What the figures say, in a sentence or two.
    #[serde(default)]
    pub finding: String,
}

/// A policy (a run's end, or its start) on every cell.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MatrixRow {
    pub row: String,
    /// The run whose training curves belong to this row.
    #[serde(default)]
    pub run_dir: Option<PathBuf>,
    pub cells: Vec<CellFigures>,
}

pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    let report = build(&args.dir)?;
    report.write(&args.dir)?;
    println!(
        "{} and {} ({} figures in {})",
        args.dir.join("report.md").display(),
        args.dir.join("report.html").display(),
        report.figures().count(),
        args.dir.join("figures").display()
    );
    Ok(())
}

/// The report of `dir`, by what it holds.
pub fn build(dir: &Path) -> anyhow::Result<Report> {
    if dir.join("study.json").is_file() {
        let path = dir.join("study.json");
        let text =
            fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let study: StudyFile = serde_json::from_str(&text)
            .with_context(|| format!("{} does not parse", path.display()))?;
        study_report(&study)
    } else if dir.join("matrix.jsonl").is_file() {
        sequence_report(dir)
    } else if dir.join("metrics.jsonl").is_file() {
        run_report(dir)
    } else {
        anyhow::bail!(
            "{}: neither a run (metrics.jsonl), a sequence (matrix.jsonl) nor a study (study.json)",
            dir.display()
        )
    }
}

/// Every JSON line of `dir/metrics.jsonl`.
fn metrics(dir: &Path) -> anyhow::Result<Vec<Value>> {
    let path = dir.join("metrics.jsonl");
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    text.lines()
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| format!("{} line {}", path.display(), i + 1))
        })
        .collect()
}

fn kind(v: &Value) -> &str {
    v["kind"].as_str().unwrap_or_default()
}

fn pct(v: f64) -> String {
    format!("{:.1}%", 100.0 * v)
}

/// `(step, key)` points of the train lines.
fn train_points(lines: &[Value], key: &str) -> Vec<(f64, f64)> {
    lines
        .iter()
        .filter(|v| kind(v) == "train")
        .filter_map(|v| Some((v["step"].as_f64()?, v[key].as_f64()?)))
        .collect()
}

/// Validation success points (sampled validation: not the greedy phases
/// nor the curriculum's checks).
fn validation_points(lines: &[Value]) -> Vec<(f64, f64)> {
    lines
        .iter()
        .filter(|v| {
            kind(v) == "eval" && !v["phase"].as_str().unwrap_or_default().ends_with("greedy")
        })
        .filter_map(|v| Some((v["step"].as_f64()?, v["success_rate"].as_f64()?)))
        .collect()
}

/// A run's report.
pub fn run_report(dir: &Path) -> anyhow::Result<Report> {
    let lines = metrics(dir)?;
    let summary: Option<Value> = fs::read_to_string(dir.join("summary.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let mut sections = Vec::new();

    let mut overview = Section {
        heading: "Run".into(),
        ..Section::default()
    };
    match &summary {
        Some(s) => overview.paragraphs.push(format!(
            "{}/{}: held-out success {} -> {} after {} RL steps in {:.0} s.",
            s["env"].as_str().unwrap_or("?"),
            s["difficulty"].as_str().unwrap_or("?"),
            pct(s["before"]["success_rate"].as_f64().unwrap_or(0.0)),
            pct(s["after"]["success_rate"].as_f64().unwrap_or(0.0)),
            s["steps"],
            s["wall_seconds"].as_f64().unwrap_or(0.0)
        )),
        None => overview.paragraphs.push(
            "No summary.json yet: the run has not finished; figures show what it logged.".into(),
        ),
    }
    let evals: Vec<&Value> = lines.iter().filter(|v| kind(v) == "eval").collect();
    overview.tables.push(Table {
        headers: [
            "phase",
            "step",
            "success",
            "turns",
            "tokens",
            "invalid",
            "format errors",
        ]
        .map(String::from)
        .to_vec(),
        rows: evals
            .iter()
            .map(|v| {
                vec![
                    v["phase"].as_str().unwrap_or_default().to_string(),
                    v["step"].to_string(),
                    pct(v["success_rate"].as_f64().unwrap_or(0.0)),
                    format!("{:.2}", v["mean_turns"].as_f64().unwrap_or(0.0)),
                    format!("{:.1}", v["mean_generated_tokens"].as_f64().unwrap_or(0.0)),
                    format!("{:.3}", v["invalid_action_rate"].as_f64().unwrap_or(0.0)),
                    format!("{:.3}", v["format_error_rate"].as_f64().unwrap_or(0.0)),
                ]
            })
            .collect(),
    });
    sections.push(overview);

    // Learning curves: training success per step, validation per env.
    let mut validation = vec![Series {
        name: "validation".into(),
        points: validation_points(&lines),
    }];
    let mut per_env: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for v in lines.iter().filter(|v| kind(v) == "eval_env") {
        if v["phase"].as_str().unwrap_or_default().ends_with("greedy") {
            continue;
        }
        let key = format!(
            "{}/{}",
            v["env"].as_str().unwrap_or("?"),
            v["difficulty"].as_str().unwrap_or("?")
        );
        if let (Some(s), Some(y)) = (v["step"].as_f64(), v["success_rate"].as_f64()) {
            per_env.entry(key).or_default().push((s, y));
        }
    }
    validation.extend(
        per_env
            .into_iter()
            .map(|(name, points)| Series { name, points }),
    );
    let curves = line_panels(
        &[
            LinePanel {
                title: "training success".into(),
                x_label: "RL step".into(),
                series: vec![Series {
                    name: "train".into(),
                    points: train_points(&lines, "success"),
                }],
            },
            LinePanel {
                title: "validation success (held-out seeds)".into(),
                x_label: "RL step".into(),
                series: validation,
            },
        ],
        2,
    )?;
    sections.push(Section {
        heading: "Learning curves".into(),
        figures: vec![Figure {
            file: "learning-curves.png".into(),
            caption: "Success on the step's training tasks, and on the validation seeds".into(),
            png: curves,
        }],
        ..Section::default()
    });

    // Turns and tokens, with the turn budget (ScalingInter-RL's stages).
    let turns = line_panels(
        &[
            LinePanel {
                title: "turns per episode".into(),
                x_label: "RL step".into(),
                series: vec![
                    Series {
                        name: "turns".into(),
                        points: train_points(&lines, "turns"),
                    },
                    Series {
                        name: "turn budget".into(),
                        points: train_points(&lines, "max_turns"),
                    },
                ],
            },
            LinePanel {
                title: "generated tokens per episode".into(),
                x_label: "RL step".into(),
                series: vec![Series {
                    name: "tokens".into(),
                    points: train_points(&lines, "generated_tokens"),
                }],
            },
        ],
        2,
    )?;
    sections.push(Section {
        heading: "Turns and tokens over training".into(),
        figures: vec![Figure {
            file: "turns-tokens.png".into(),
            caption:
                "Mean turns (and the step's turn budget) and generated tokens per training episode"
                    .into(),
            png: turns,
        }],
        ..Section::default()
    });

    // Training success by difficulty (the curriculum's stages, a mixture's envs).
    let mut by_difficulty: Vec<(String, f64, usize)> = Vec::new();
    let mut add =
        |key: String, success: f64| match by_difficulty.iter_mut().find(|(k, ..)| *k == key) {
            Some((_, sum, n)) => {
                *sum += success;
                *n += 1;
            }
            None => by_difficulty.push((key, success, 1)),
        };
    for v in lines.iter().filter(|v| kind(v) == "train") {
        match v["per_env"].as_object() {
            Some(envs) if !envs.is_empty() => {
                for (key, f) in envs {
                    add(key.clone(), f["success_rate"].as_f64().unwrap_or(0.0));
                }
            }
            _ => add(
                v["difficulty"].as_str().unwrap_or("?").to_string(),
                v["success"].as_f64().unwrap_or(0.0),
            ),
        }
    }
    if !by_difficulty.is_empty() {
        let categories: Vec<String> = by_difficulty.iter().map(|(k, ..)| k.clone()).collect();
        let means: Vec<f64> = by_difficulty
            .iter()
            .map(|(_, s, n)| s / *n as f64)
            .collect();
        let png = grouped_bars(
            "mean training success by difficulty",
            &categories,
            &[("training success".into(), means.clone())],
            1.0,
            true,
        )?;
        sections.push(Section {
            heading: "Success by difficulty".into(),
            paragraphs: vec![
                "Mean success of the training episodes at each difficulty the run trained on (a curriculum's stages, a mixture's environments).".into(),
            ],
            tables: vec![Table {
                headers: vec!["difficulty".into(), "steps".into(), "mean training success".into()],
                rows: by_difficulty
                    .iter()
                    .zip(&means)
                    .map(|((k, _, n), m)| vec![k.clone(), n.to_string(), pct(*m)])
                    .collect(),
            }],
            figures: vec![Figure {
                file: "success-by-difficulty.png".into(),
                caption: "Mean training success by difficulty".into(),
                png,
            }],
        });
    }

    // Failure labels of the last validation that has them.
    let last = lines
        .iter()
        .rev()
        .filter(|v| {
            kind(v) == "eval" && !v["phase"].as_str().unwrap_or_default().ends_with("greedy")
        })
        .find_map(|v| {
            let f: FailureCounts = serde_json::from_value(v.get("failures")?.clone()).ok()?;
            Some((v["phase"].as_str().unwrap_or_default().to_string(), f))
        });
    if let Some((phase, f)) = last {
        let mut envs = BTreeMap::new();
        envs.insert(format!("validation ({phase})"), f);
        sections.push(failure_section(&envs)?);
    }
    let title = match &summary {
        Some(s) => format!("agentrl run: {}", s["env"].as_str().unwrap_or("?")),
        None => format!("agentrl run: {}", dir.display()),
    };
    Ok(Report { title, sections })
}

/// The failure-label table and bars of `groups` (a name and its counts).
fn failure_section(groups: &BTreeMap<String, FailureCounts>) -> anyhow::Result<Section> {
    let mut headers = vec!["".to_string(), "failed".to_string()];
    headers.extend(FailureLabel::ALL.iter().map(|l| l.as_str().to_string()));
    headers.push("unlabelled".into());
    let rows = groups
        .iter()
        .map(|(name, f)| {
            let mut row = vec![name.clone(), format!("{} of {}", f.failed, f.episodes)];
            row.extend(FailureLabel::ALL.iter().map(|l| pct(f.share(*l))));
            row.push(pct(match f.failed {
                0 => 0.0,
                n => f.unlabelled as f64 / n as f64,
            }));
            row
        })
        .collect();
    let categories: Vec<String> = FailureLabel::ALL
        .iter()
        .map(|l| l.as_str().replace('_', " "))
        .collect();
    let series: Vec<(String, Vec<f64>)> = groups
        .iter()
        .map(|(name, f)| {
            (
                name.clone(),
                FailureLabel::ALL.iter().map(|l| f.share(*l)).collect(),
            )
        })
        .collect();
    let png = grouped_bars(
        "failure labels (share of unsuccessful plays)",
        &categories,
        &series,
        1.0,
        true,
    )?;
    Ok(Section {
        heading: "Failure labels".into(),
        paragraphs: vec![
            "Share of the unsuccessful plays carrying each rule-based label (a play may carry several; see the failure taxonomy in docs/src/evaluation.md).".into(),
        ],
        tables: vec![Table { headers, rows }],
        figures: vec![Figure {
            file: "failure-labels.png".into(),
            caption: "Failure labels of the unsuccessful plays".into(),
            png,
        }],
    })
}

fn estimate_text(e: &Estimate) -> String {
    match e.ci95 {
        Some([lo, hi]) => format!("{} [{:.1}, {:.1}]", pct(e.mean), 100.0 * lo, 100.0 * hi),
        None => pct(e.mean),
    }
}

fn cell_name(c: &CellFigures) -> String {
    format!("{}/{}", c.env, c.difficulty)
}

/// The table, heatmap and bars of one experiment.
fn experiment_section(e: &Experiment, index: usize) -> anyhow::Result<Section> {
    let columns: Vec<String> = e
        .rows
        .first()
        .map(|r| r.cells.iter().map(cell_name).collect())
        .unwrap_or_default();
    let k = e
        .rows
        .first()
        .and_then(|r| r.cells.first())
        .map_or(1, |c| c.k);
    let avg: Vec<Vec<f64>> = e
        .rows
        .iter()
        .map(|r| r.cells.iter().map(|c| c.avg_at_k.mean).collect())
        .collect();
    let base = e
        .baseline
        .as_ref()
        .and_then(|b| e.rows.iter().position(|r| &r.row == b));
    let mut headers = vec![format!("avg@{k} [95% CI]")];
    headers.extend(columns.iter().cloned());
    // One table row per matrix row: its name, then `figure` of each cell.
    let estimate_rows = |figure: fn(&CellFigures) -> &Estimate| -> Vec<Vec<String>> {
        let row = |r: &MatrixRow| {
            let cells = r.cells.iter().map(|c| estimate_text(figure(c)));
            std::iter::once(r.row.clone()).chain(cells).collect()
        };
        e.rows.iter().map(row).collect()
    };
    let mut rows = estimate_rows(|c| &c.avg_at_k);
    if let Some(b) = base {
        for (i, r) in e.rows.iter().enumerate().filter(|(i, _)| *i != b) {
            let mut row = vec![format!("Δ {} − {}", r.row, e.rows[b].row)];
            row.extend(
                avg[i]
                    .iter()
                    .zip(&avg[b])
                    .map(|(a, s)| format!("{:+.1}", 100.0 * (a - s))),
            );
            rows.push(row);
        }
    }
    if e.forgetting {
        let mut row = vec!["forgetting (best earlier − end)".to_string()];
        row.extend(forgetting(&avg).iter().map(|f| match f {
            Some(f) => format!("{:+.1}", 100.0 * f),
            None => "–".into(),
        }));
        rows.push(row);
    }
    let mut pass_headers = vec![format!("pass@{k}")];
    pass_headers.extend(columns.iter().cloned());
    let pass_rows = estimate_rows(|c| &c.pass_at_k);
    let mut figures = Vec::new();
    // The heatmap: Δ against the baseline where there is one, else avg@k.
    let (map_rows, map_values, diverging, what) = match base {
        Some(b) => {
            let rows: Vec<usize> = (0..e.rows.len()).filter(|&i| i != b).collect();
            (
                rows.iter()
                    .map(|&i| e.rows[i].row.clone())
                    .collect::<Vec<_>>(),
                rows.iter()
                    .map(|&i| {
                        avg[i]
                            .iter()
                            .zip(&avg[b])
                            .map(|(a, s)| Some(a - s))
                            .collect()
                    })
                    .collect::<Vec<Vec<Option<f64>>>>(),
                true,
                format!("avg@{k} Δ against {} (points)", e.rows[b].row),
            )
        }
        None => (
            e.rows.iter().map(|r| r.row.clone()).collect(),
            avg.iter()
                .map(|r| r.iter().map(|v| Some(*v)).collect())
                .collect(),
            false,
            format!("avg@{k}"),
        ),
    };
    figures.push(Figure {
        file: format!("{:02}-{}-heatmap.png", index + 1, slug(&e.name)),
        caption: format!(
            "{}: {what}, rows = policies, columns = env/difficulty",
            e.name
        ),
        png: heatmap(
            &format!("{}: {what}", e.name),
            &map_rows,
            &columns,
            &map_values,
            diverging,
        )?,
    });
    figures.push(Figure {
        file: format!("{:02}-{}-bars.png", index + 1, slug(&e.name)),
        caption: format!("{}: avg@{k} by env and difficulty", e.name),
        png: grouped_bars(
            &format!("{}: avg@{k} by env/difficulty", e.name),
            &columns,
            &e.rows
                .iter()
                .map(|r| {
                    (
                        r.row.clone(),
                        r.cells.iter().map(|c| c.avg_at_k.mean).collect(),
                    )
                })
                .collect::<Vec<_>>(),
            1.0,
            true,
        )?,
    });
    let mut paragraphs = vec![e.question.clone()];
    if !e.finding.is_empty() {
        paragraphs.push(e.finding.clone());
    }
    Ok(Section {
        heading: e.name.clone(),
        paragraphs,
        tables: vec![
            Table { headers, rows },
            Table {
                headers: pass_headers,
                rows: pass_rows,
            },
        ],
        figures,
    })
}

fn slug(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect::<String>()
        .split('-')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

/// Reads a series' points from a run's metrics lines.
type Points = dyn Fn(&[Value]) -> Vec<(f64, f64)>;

/// Training curves of every run of `rows` (one series per run).
fn runs_sections(rows: &[&MatrixRow]) -> anyhow::Result<Vec<Section>> {
    let mut runs: Vec<(String, Vec<Value>)> = Vec::new();
    let mut seen: Vec<&PathBuf> = Vec::new();
    for r in rows {
        let Some(dir) = &r.run_dir else { continue };
        if seen.contains(&dir) || !dir.join("metrics.jsonl").is_file() {
            continue;
        }
        seen.push(dir);
        let name = dir
            .file_name()
            .map_or_else(|| r.row.clone(), |n| n.to_string_lossy().into_owned());
        runs.push((name, metrics(dir)?));
    }
    if runs.is_empty() {
        return Ok(Vec::new());
    }
    let series = |f: &Points| -> Vec<Series> {
        runs.iter()
            .map(|(name, lines)| Series {
                name: name.clone(),
                points: f(lines),
            })
            .collect()
    };
    let curves = line_panels(
        &[
            LinePanel {
                title: "validation success".into(),
                x_label: "RL step".into(),
                series: series(&|l| validation_points(l)),
            },
            LinePanel {
                title: "training success".into(),
                x_label: "RL step".into(),
                series: series(&|l| train_points(l, "success")),
            },
        ],
        2,
    )?;
    let turns = line_panels(
        &[
            LinePanel {
                title: "turns per episode".into(),
                x_label: "RL step".into(),
                series: series(&|l| train_points(l, "turns")),
            },
            LinePanel {
                title: "generated tokens per episode".into(),
                x_label: "RL step".into(),
                series: series(&|l| train_points(l, "generated_tokens")),
            },
        ],
        2,
    )?;
    Ok(vec![
        Section {
            heading: "Learning curves".into(),
            paragraphs: vec!["Every trained arm: validation success on its own validation seeds, and success on each step's training tasks.".into()],
            figures: vec![Figure {
                file: "learning-curves.png".into(),
                caption: "Learning curves of every arm".into(),
                png: curves,
            }],
            ..Section::default()
        },
        Section {
            heading: "Turns and tokens over training".into(),
            figures: vec![Figure {
                file: "turns-tokens.png".into(),
                caption: "Mean turns and generated tokens per training episode, every arm".into(),
                png: turns,
            }],
            ..Section::default()
        },
    ])
}

/// A study's report: one section per experiment, then the failure labels
/// by environment and every arm's curves.
pub fn study_report(study: &StudyFile) -> anyhow::Result<Report> {
    let mut sections = vec![Section {
        heading: "Setup".into(),
        paragraphs: vec![format!(
            "Every policy is evaluated on the first {} validation tasks of each env/difficulty, {} samples per task: avg@{} and pass@{} with the {}.",
            study.tasks, study.k, study.k, study.k, study.interval
        )],
        ..Section::default()
    }];
    for (i, e) in study.experiments.iter().enumerate() {
        sections.push(experiment_section(e, i)?);
    }
    // Failure labels by environment over every trained policy's plays.
    let mut by_env: BTreeMap<String, FailureCounts> = BTreeMap::new();
    for e in &study.experiments {
        for r in e
            .rows
            .iter()
            .filter(|r| Some(&r.row) != e.baseline.as_ref())
        {
            for c in &r.cells {
                by_env.entry(c.env.clone()).or_default().merge(&c.failures);
            }
        }
    }
    if !by_env.is_empty() {
        sections.push(failure_section(&by_env)?);
    }
    let rows: Vec<&MatrixRow> = study
        .experiments
        .iter()
        .flat_map(|e| e.rows.iter())
        .collect();
    sections.extend(runs_sections(&rows)?);
    Ok(Report {
        title: study.title.clone(),
        sections,
    })
}

/// A sequence's report: its forgetting table and heatmap, and each stage's curves.
pub fn sequence_report(dir: &Path) -> anyhow::Result<Report> {
    let path = dir.join("matrix.jsonl");
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let rows: Vec<SequenceRow> = text
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .with_context(|| format!("{} does not parse", path.display()))?;
    let k = rows
        .first()
        .and_then(|r| r.cells.first())
        .map_or(1, |c| c.k);
    let tasks = rows
        .first()
        .and_then(|r| r.cells.first())
        .map_or(0, |c| c.tasks);
    let matrix_rows: Vec<MatrixRow> = rows
        .iter()
        .map(|r| MatrixRow {
            row: r.row.clone(),
            // A stage's final checkpoint is RUN/checkpoints/step-N.
            run_dir: r
                .checkpoint
                .parent()
                .and_then(Path::parent)
                .map(Path::to_path_buf),
            cells: r.cells.clone(),
        })
        .collect();
    let study = StudyFile {
        title: format!("agentrl sequence: {}", dir.display()),
        k,
        tasks: tasks as u64,
        interval: agentrl_trainer::eval_matrix::INTERVAL_METHOD.into(),
        experiments: vec![Experiment {
            name: "Sequential training and forgetting".into(),
            question: "Each stage trains on one environment starting from the previous stage's policy; every row evaluates the policy after a stage on every stage's environment.".into(),
            baseline: matrix_rows.first().map(|r| r.row.clone()),
            rows: matrix_rows,
            forgetting: true,
            finding: String::new(),
        }],
    };
    study_report(&study)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_report_has_curves_difficulty_failures_and_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let failures = r#"{"episodes":4,"failed":3,"unlabelled":1,"labels":{"action_loop":2}}"#;
        let lines = [
            format!(r#"{{"kind":"eval","phase":"before","step":0,"success_rate":0.1,"mean_turns":3,"mean_generated_tokens":20,"invalid_action_rate":0,"format_error_rate":0.1,"failures":{failures}}}"#),
            r#"{"kind":"train","step":1,"success":0.2,"turns":2,"max_turns":2,"generated_tokens":14,"difficulty":"easy"}"#.to_string(),
            r#"{"kind":"train","step":2,"success":0.4,"turns":3,"max_turns":4,"generated_tokens":18,"difficulty":"hard"}"#.to_string(),
            format!(r#"{{"kind":"eval","phase":"after","step":2,"success_rate":0.25,"mean_turns":3,"mean_generated_tokens":20,"invalid_action_rate":0,"format_error_rate":0,"failures":{failures}}}"#),
        ];
        fs::write(dir.path().join("metrics.jsonl"), lines.join("\n") + "\n").unwrap();
        let r = build(dir.path()).unwrap();
        let headings: Vec<&str> = r.sections.iter().map(|s| s.heading.as_str()).collect();
        assert_eq!(
            headings,
            [
                "Run",
                "Learning curves",
                "Turns and tokens over training",
                "Success by difficulty",
                "Failure labels"
            ]
        );
        assert!(r.figures().count() >= 4);
        let md = r.markdown();
        assert!(
            md.contains("| easy | 1 | 20.0% |") && md.contains("| hard | 1 | 40.0% |"),
            "{md}"
        );
        assert!(md.contains("| validation (after) | 3 of 4 |"), "{md}");
        assert!(md.contains("66.7%"), "2 of 3 failures loop: {md}");
        r.write(dir.path()).unwrap();
        let html = fs::read_to_string(dir.path().join("report.html")).unwrap();
        assert_eq!(
            html.matches("data:image/png;base64,").count(),
            r.figures().count()
        );
    }

    fn cell(env: &str, avg: f64) -> CellFigures {
        CellFigures {
            env: env.into(),
            difficulty: "easy".into(),
            split: "val".into(),
            tasks: 4,
            samples: 2,
            k: 2,
            avg_at_k: Estimate {
                mean: avg,
                ci95: Some([avg / 2.0, avg]),
            },
            pass_at_k: Estimate {
                mean: avg,
                ci95: None,
            },
            mean_reward: 0.0,
            mean_turns: 1.0,
            mean_generated_tokens: 1.0,
            invalid_action_rate: 0.0,
            format_error_rate: 0.0,
            failures: FailureCounts::default(),
        }
    }

    #[test]
    fn a_study_report_has_a_table_delta_heatmap_and_forgetting_per_experiment() {
        let row = |name: &str, a: f64, b: f64| MatrixRow {
            row: name.into(),
            run_dir: None,
            cells: vec![cell("a", a), cell("b", b)],
        };
        let study = StudyFile {
            title: "study".into(),
            k: 2,
            tasks: 4,
            interval: "t".into(),
            experiments: vec![Experiment {
                name: "A then B".into(),
                question: "Does B make it forget A?".into(),
                rows: vec![
                    row("start", 0.1, 0.0),
                    row("after A", 0.6, 0.1),
                    row("after B", 0.5, 0.7),
                ],
                baseline: Some("start".into()),
                forgetting: true,
                finding: "A little.".into(),
            }],
        };
        let r = study_report(&study).unwrap();
        let md = r.markdown();
        assert!(md.contains("| Δ after B − start | +40.0 | +70.0 |"), "{md}");
        assert!(
            md.contains("| forgetting (best earlier − end) | +10.0 | -60.0 |"),
            "{md}"
        );
        assert!(md.contains("01-a-then-b-heatmap.png"), "{md}");
        assert!(md.contains("Does B make it forget A?") && md.contains("A little."));
    }
}
