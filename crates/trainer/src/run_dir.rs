//! The run directory: resolved config, metrics, trajectories, checkpoints,
//! summary. A killed run resumes from its last checkpoint.
//!
//! ```text
//! RUN_DIR/config.toml            resolved config
//! RUN_DIR/metrics.jsonl          one JSON object per RL step ("kind":"train") and evaluation ("kind":"eval")
//! RUN_DIR/trajectories.jsonl     sampled trajectories
//! RUN_DIR/tensorboard/           the metrics as TensorBoard event files (one per start or resume)
//! RUN_DIR/checkpoints/step-N/    model (HF layout) + tokenizer + optimizer.safetensors
//!                                (+ critic_optimizer.safetensors with a value head) + trainer_state.json
//! RUN_DIR/checkpoints/latest     name of the newest complete checkpoint
//! RUN_DIR/summary.json           before/after success on held-out seeds
//! ```
//!
//! Every file that is rewritten (checkpoint files, `latest`, `summary.json`,
//! `config.toml`, the logs when a resumed run drops the lines of steps after
//! its checkpoint) is replaced atomically: a kill at any moment leaves each
//! either as it was or fully written. Log lines are appended, and synced to
//! disk before `latest` names a checkpoint, so a checkpoint never refers to
//! lines that could be lost.

use std::sync::Mutex;

use crate::tensorboard::{EventWriter, TENSORBOARD_DIR};
use std::fs::{self, File};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::evaluate::EvalStats;
use crate::ppo::SpikeGuard;

/// Progress that a checkpoint carries besides weights and optimizer state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// RL steps completed.
    pub step: usize,
    /// Validation before RL (after the warm start).
    pub before: Option<EvalStats>,
    /// Wall seconds spent in earlier sessions of this run.
    pub wall_seconds: f64,
    /// Greedy validation before RL (with `trainer.val_greedy`).
    #[serde(default)]
    pub before_greedy: Option<EvalStats>,
    /// The best validation so far, whose weights are in `checkpoints/best`.
    #[serde(default)]
    pub best: Option<BestCheckpoint>,
    /// The curriculum's stage when it advances on validation success
    /// (`curriculum.advance_at`; by step count the stage is a function of
    /// the step and this stays 0).
    #[serde(default)]
    pub curriculum_stage: usize,
    /// Validation before RL of each task source, with a mixture.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub before_per_env: std::collections::BTreeMap<String, EvalStats>,
    /// The gradient-spike guard's running norm (`actor.grad_spike_factor`).
    #[serde(default, skip_serializing_if = "SpikeGuard::is_unused")]
    pub spike_guard: SpikeGuard,
}

/// The run's best validation so far (`checkpoints/best/` holds its weights
/// and tokenizer; `agentrl eval --policy RUN_DIR/checkpoints/best` plays it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BestCheckpoint {
    /// RL step of the evaluation (0 = the starting policy).
    pub step: usize,
    /// Its validation success rate (at `trainer.val_temperature`).
    pub success_rate: f64,
}

/// A run's directory (see the module documentation for its layout).
pub struct RunDir {
    pub path: PathBuf,
    /// The run's writer also feeds TensorBoard ([`RunDir::watch_in_tensorboard`]).
    events: Option<Mutex<EventWriter>>,
}

/// The logs a run appends to.
const LOG_FILES: [&str; 2] = ["metrics.jsonl", "trajectories.jsonl"];

/// What [`RunDir::create_for_start`] made, removed when this guard is
/// dropped before [`UnfinishedStart::first_checkpoint`] (an error or a panic
/// during the start): the run directory if it did not exist (and the
/// parent directories created for it, when they are still empty), or the
/// files written into it if it existed empty. A directory that existed
/// before is never removed.
#[derive(Debug)]
pub struct UnfinishedStart {
    path: PathBuf,
    existed: bool,
    new_ancestors: Vec<PathBuf>,
    done: bool,
}

impl UnfinishedStart {
    /// The run has its first checkpoint: from now on it is resumed, not
    /// removed.
    pub fn first_checkpoint(mut self) {
        self.done = true;
    }

    fn undo(&self) -> std::io::Result<()> {
        if self.existed {
            // It was empty when the start checked it: all of it is ours.
            for entry in fs::read_dir(&self.path)? {
                let entry = entry?;
                if entry.file_type()?.is_dir() {
                    fs::remove_dir_all(entry.path())?;
                } else {
                    fs::remove_file(entry.path())?;
                }
            }
            return Ok(());
        }
        fs::remove_dir_all(&self.path)?;
        for dir in &self.new_ancestors {
            // Only while empty: another run may have started in it meanwhile.
            if fs::remove_dir(dir).is_err() {
                break;
            }
        }
        Ok(())
    }
}

impl Drop for UnfinishedStart {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // A drop has no caller to return an error to: say it where the
        // user reads the start's own error.
        if let Err(e) = self.undo() {
            eprintln!(
                "warning: the start failed and {} could not be cleaned up ({e}); delete it before starting the run there again",
                self.path.display()
            );
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct RunDirError {
    pub path: String,
    pub reason: String,
}

fn err(path: &Path, e: impl std::fmt::Display) -> RunDirError {
    RunDirError {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

impl RunDir {
    /// Create the directory of a new run. A directory that already holds
    /// files is refused: writing a second run into it would mix the two runs'
    /// logs and checkpoints (an existing run is continued with
    /// [`RunDir::open`]).
    pub fn create(path: &Path) -> Result<Self, RunDirError> {
        Self::check_new(path)?;
        fs::create_dir_all(path.join("checkpoints")).map_err(|e| err(path, e))?;
        Ok(Self {
            path: path.to_path_buf(),
            events: None,
        })
    }

    /// [`RunDir::create`], and the guard that removes what it made if the
    /// start fails before the run's first checkpoint: a failed start must
    /// not leave a directory that refuses the same command again (not a new
    /// run: it is not empty) and cannot be resumed (no checkpoint).
    pub fn create_for_start(path: &Path) -> Result<(Self, UnfinishedStart), RunDirError> {
        let existed = path.exists();
        // The ancestors create_dir_all will make, nearest first.
        let new_ancestors = path
            .ancestors()
            .skip(1)
            .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
            .map(Path::to_path_buf)
            .collect();
        let run = Self::create(path)?;
        Ok((
            run,
            UnfinishedStart {
                path: path.to_path_buf(),
                existed,
                new_ancestors,
                done: false,
            },
        ))
    }

    /// Whether a new run may be created at `path`: it does not exist or is
    /// an empty directory.
    pub fn check_new(path: &Path) -> Result<(), RunDirError> {
        if path.exists() {
            let mut entries = fs::read_dir(path).map_err(|e| err(path, e))?;
            if entries.next().is_some() {
                return Err(err(
                    path,
                    "already exists and is not empty (a run directory is only continued by resuming it)",
                ));
            }
        }
        Ok(())
    }

    /// Open an existing run directory (one with a `config.toml`).
    pub fn open(path: &Path) -> Result<Self, RunDirError> {
        if !path.join("config.toml").is_file() {
            return Err(err(path, "not a run directory (no config.toml)"));
        }
        Ok(Self {
            path: path.to_path_buf(),
            events: None,
        })
    }

    /// Remove the temporary files a killed writer left behind (named
    /// `.NAME.XXXXXX.tmp` by agentrl-durable) in the run directory, its
    /// `checkpoints/` and each checkpoint. Only the run's one writer may call
    /// this: it would remove a file another process is about to rename.
    pub fn remove_temporaries(&self) -> Result<usize, RunDirError> {
        let checkpoints = self.path.join("checkpoints");
        let mut dirs = vec![self.path.clone(), checkpoints.clone()];
        if checkpoints.is_dir() {
            for entry in fs::read_dir(&checkpoints).map_err(|e| err(&checkpoints, e))? {
                let entry = entry.map_err(|e| err(&checkpoints, e))?;
                if entry.path().is_dir() {
                    dirs.push(entry.path());
                }
            }
        }
        let mut removed = 0;
        for dir in dirs.iter().filter(|d| d.is_dir()) {
            for entry in fs::read_dir(dir).map_err(|e| err(dir, e))? {
                let entry = entry.map_err(|e| err(dir, e))?;
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if name.starts_with('.') && name.ends_with(".tmp") && entry.path().is_file() {
                    fs::remove_file(entry.path()).map_err(|e| err(&entry.path(), e))?;
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }

    pub fn config_path(&self) -> PathBuf {
        self.path.join("config.toml")
    }

    pub fn write_config(&self, text: &str) -> Result<(), RunDirError> {
        let p = self.config_path();
        agentrl_durable::write(&p, text).map_err(|e| err(&p, e))
    }

    fn append_line(&self, file: &str, value: &serde_json::Value) -> Result<(), RunDirError> {
        let p = self.path.join(file);
        agentrl_durable::append(&p, format!("{value}\n").as_bytes()).map_err(|e| err(&p, e))
    }

    /// Put the logs' appended lines, and the directory entries of the logs
    /// and checkpoints, on disk (before `latest` names a new checkpoint).
    pub fn sync_logs(&self) -> Result<(), RunDirError> {
        for file in LOG_FILES {
            let p = self.path.join(file);
            if p.exists() {
                agentrl_durable::sync_file(&p).map_err(|e| err(&p, e))?;
            }
        }
        let checkpoints = self.path.join("checkpoints");
        agentrl_durable::sync_dir(&checkpoints).map_err(|e| err(&checkpoints, e))?;
        agentrl_durable::sync_dir(&self.path).map_err(|e| err(&self.path, e))
    }

    /// From now on every metrics record also goes to a new TensorBoard
    /// event file under `tensorboard/` (see [`crate::tensorboard`]). Only
    /// the run's writer calls this.
    pub fn watch_in_tensorboard(mut self) -> Result<Self, RunDirError> {
        let writer = EventWriter::create(&self.path)
            .map_err(|e| err(&self.path.join(TENSORBOARD_DIR), e))?;
        self.events = Some(Mutex::new(writer));
        Ok(self)
    }

    pub fn log_metrics(&self, value: &serde_json::Value) -> Result<(), RunDirError> {
        self.append_line("metrics.jsonl", value)?;
        self.write_events(value)
    }

    /// The record's scalars to TensorBoard, when watched.
    fn write_events(&self, value: &serde_json::Value) -> Result<(), RunDirError> {
        let Some(events) = &self.events else {
            return Ok(());
        };
        // A panic elsewhere while the writer was held leaves it usable: it
        // writes whole records or fails.
        let mut w = events.lock().unwrap_or_else(|p| p.into_inner());
        w.write_metrics(value).map_err(|e| err(w.path(), e))
    }

    /// Append `record` to `metrics.jsonl` as one JSON object with `fields`
    /// added (its `"kind"`, …). A record that does not serialise to an
    /// object is an error, never an empty line.
    pub fn log_record(
        &self,
        record: &impl Serialize,
        fields: &[(&str, serde_json::Value)],
    ) -> Result<(), RunDirError> {
        let p = self.path.join("metrics.jsonl");
        let mut line = match serde_json::to_value(record) {
            Ok(serde_json::Value::Object(o)) => o,
            Ok(other) => {
                return Err(err(
                    &p,
                    format!("a metrics record is not an object: {other}"),
                ))
            }
            Err(e) => return Err(err(&p, format!("cannot serialise a metrics record: {e}"))),
        };
        for (key, value) in fields {
            line.insert(key.to_string(), value.clone());
        }
        self.log_metrics(&serde_json::Value::Object(line))
    }

    /// The `"kind": "train"` records of `metrics.jsonl`, in order (none when
    /// the file does not exist yet).
    pub fn train_records(&self) -> Result<Vec<serde_json::Value>, RunDirError> {
        let p = self.path.join("metrics.jsonl");
        if !p.exists() {
            return Ok(Vec::new());
        }
        let f = File::open(&p).map_err(|e| err(&p, e))?;
        let mut records = Vec::new();
        for (i, line) in BufReader::new(f).lines().enumerate() {
            let line = line.map_err(|e| err(&p, e))?;
            let v: serde_json::Value =
                serde_json::from_str(&line).map_err(|e| err(&p, format!("line {}: {e}", i + 1)))?;
            if v.get("kind").and_then(|k| k.as_str()) == Some("train") {
                records.push(v);
            }
        }
        Ok(records)
    }

    pub fn log_trajectory(&self, value: &serde_json::Value) -> Result<(), RunDirError> {
        self.append_line("trajectories.jsonl", value)
    }

    /// Drop metric and trajectory lines of steps after `step` (they were
    /// written after the last checkpoint by a run that was then killed), so a
    /// resumed run neither loses nor repeats a step. Each log is replaced
    /// atomically: a kill during the rewrite leaves it as it was.
    pub fn truncate_logs_after(&self, step: usize) -> Result<(), RunDirError> {
        for file in LOG_FILES {
            let p = self.path.join(file);
            if !p.exists() {
                continue;
            }
            let f = File::open(&p).map_err(|e| err(&p, e))?;
            let mut kept = String::new();
            for line in BufReader::new(f).lines() {
                let line = line.map_err(|e| err(&p, e))?;
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue; // a half-written last line from a kill
                };
                let s = v.get("step").and_then(|s| s.as_u64()).unwrap_or(0) as usize;
                let phase = v.get("phase").and_then(|s| s.as_str()).unwrap_or("");
                // The final evaluations ("after", "after_greedy") are redone.
                if s <= step && !phase.starts_with("after") {
                    kept.push_str(&line);
                    kept.push('\n');
                }
            }
            agentrl_durable::write(&p, kept).map_err(|e| err(&p, e))?;
        }
        Ok(())
    }

    /// Where the best-validation weights are kept.
    pub fn best_checkpoint_dir(&self) -> PathBuf {
        self.path.join("checkpoints").join("best")
    }

    pub fn checkpoint_dir(&self, step: usize) -> PathBuf {
        self.path.join("checkpoints").join(format!("step-{step}"))
    }

    /// Mark a fully written checkpoint as the one to resume from.
    pub fn set_latest(&self, step: usize) -> Result<(), RunDirError> {
        let p = self.path.join("checkpoints").join("latest");
        agentrl_durable::write(&p, format!("step-{step}\n")).map_err(|e| err(&p, e))
    }

    /// Remove `step-N` checkpoints so that at most `keep` remain, the
    /// newest kept; the steps in `protect` (the latest, a reference model's
    /// step 0) are never removed and count towards `keep`. `best/` is not a
    /// step checkpoint and stays. Returns the steps removed.
    pub fn prune_checkpoints(
        &self,
        keep: usize,
        protect: &[usize],
    ) -> Result<Vec<usize>, RunDirError> {
        let root = self.path.join("checkpoints");
        let mut steps: Vec<usize> = fs::read_dir(&root)
            .map_err(|e| err(&root, e))?
            .filter_map(|entry| {
                let entry = entry.ok()?;
                let name = entry.file_name().into_string().ok()?;
                let step = name.strip_prefix("step-")?.parse::<usize>().ok()?;
                entry.path().is_dir().then_some(step)
            })
            .collect();
        steps.sort_unstable();
        steps.reverse();
        let mut kept = protect.iter().filter(|s| steps.contains(s)).count();
        let mut removed = Vec::new();
        for step in steps {
            if protect.contains(&step) {
                continue;
            }
            if kept < keep {
                kept += 1;
                continue;
            }
            let dir = self.checkpoint_dir(step);
            fs::remove_dir_all(&dir).map_err(|e| err(&dir, e))?;
            removed.push(step);
        }
        Ok(removed)
    }

    pub fn latest_checkpoint(&self) -> Result<PathBuf, RunDirError> {
        let p = self.path.join("checkpoints").join("latest");
        let name = fs::read_to_string(&p).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => err(
                &p,
                "no checkpoint to resume from: the run stopped before its first checkpoint (delete this directory and start the run again, or start it in a new directory)",
            ),
            _ => err(&p, format!("no checkpoint to resume from ({e})")),
        })?;
        let dir = self.path.join("checkpoints").join(name.trim());
        if !dir.is_dir() {
            return Err(err(&dir, "checkpoint named by 'latest' is missing"));
        }
        Ok(dir)
    }

    pub fn write_state(dir: &Path, state: &TrainerState) -> Result<(), RunDirError> {
        let p = dir.join("trainer_state.json");
        let text = serde_json::to_string_pretty(state).map_err(|e| err(&p, e))?;
        agentrl_durable::write(&p, text).map_err(|e| err(&p, e))
    }

    pub fn read_state(dir: &Path) -> Result<TrainerState, RunDirError> {
        let p = dir.join("trainer_state.json");
        let text = fs::read_to_string(&p).map_err(|e| err(&p, e))?;
        serde_json::from_str(&text).map_err(|e| err(&p, e))
    }

    pub fn write_summary(&self, summary: &impl Serialize) -> Result<(), RunDirError> {
        let p = self.path.join("summary.json");
        // Through a `Value` so the keys come out sorted, as they always have.
        let value = serde_json::to_value(summary).map_err(|e| err(&p, e))?;
        let text = serde_json::to_string_pretty(&value).map_err(|e| err(&p, e))?;
        agentrl_durable::write(&p, text + "\n").map_err(|e| err(&p, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_drops_steps_after_checkpoint_and_partial_lines() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path()).unwrap();
        for s in 1..=5 {
            run.log_metrics(&serde_json::json!({"kind": "train", "step": s}))
                .unwrap();
        }
        let p = dir.path().join("metrics.jsonl");
        let mut text = fs::read_to_string(&p).unwrap();
        text.push_str("{\"kind\": \"tra");
        fs::write(&p, text).unwrap();
        run.truncate_logs_after(3).unwrap();
        let steps: Vec<u64> = fs::read_to_string(&p)
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(steps, vec![1, 2, 3]);
    }

    #[test]
    fn a_metrics_record_that_is_not_an_object_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path()).unwrap();
        let e = run.log_record(&5, &[]).unwrap_err().to_string();
        assert!(e.contains("metrics.jsonl"), "{e}");
        // A map with non-string keys cannot be a JSON object.
        let bad: std::collections::BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
        assert!(run.log_record(&bad, &[]).is_err());
        assert!(
            !dir.path().join("metrics.jsonl").exists(),
            "nothing written"
        );
        run.log_record(&serde_json::json!({"a": 1}), &[("kind", "train".into())])
            .unwrap();
        let line = fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
        assert_eq!(line, "{\"a\":1,\"kind\":\"train\"}\n");
    }

    #[test]
    fn a_new_run_is_not_created_over_files() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        fs::create_dir(&empty).unwrap();
        RunDir::create(&empty).unwrap();
        RunDir::create(&dir.path().join("fresh")).unwrap();
        // A run directory (config.toml) and any directory that holds files.
        fs::write(empty.join("config.toml"), "").unwrap();
        let e = RunDir::create(&empty).err().unwrap().to_string();
        assert!(e.contains("empty") && e.contains("not empty"), "{e}");
        let other = dir.path().join("other");
        fs::create_dir(&other).unwrap();
        fs::write(other.join("notes.txt"), "mine").unwrap();
        assert!(RunDir::create(&other).is_err());
        assert_eq!(fs::read_to_string(other.join("notes.txt")).unwrap(), "mine");
    }

    #[test]
    fn rewritten_files_leave_no_temporary_files_behind() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path()).unwrap();
        run.write_config("x = 1\n").unwrap();
        run.log_metrics(&serde_json::json!({"step": 1})).unwrap();
        run.truncate_logs_after(1).unwrap();
        run.set_latest(1).unwrap();
        run.write_summary(&serde_json::json!({"a": 1})).unwrap();
        run.sync_logs().unwrap();
        let mut names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .chain(fs::read_dir(dir.path().join("checkpoints")).unwrap())
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "checkpoints",
                "config.toml",
                "latest",
                "metrics.jsonl",
                "summary.json"
            ]
        );
        assert_eq!(
            fs::read_to_string(dir.path().join("checkpoints/latest")).unwrap(),
            "step-1\n"
        );
    }

    #[test]
    fn temporaries_a_kill_left_are_removed_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path()).unwrap();
        let step = run.checkpoint_dir(3);
        fs::create_dir_all(&step).unwrap();
        for p in [
            dir.path().join(".metrics.jsonl.aB3dEf.tmp"),
            step.join(".model.safetensors.Xy12Zq.tmp"),
            dir.path().join("checkpoints/.latest.Qq1Ww2.tmp"),
        ] {
            fs::write(p, "half").unwrap();
        }
        for keep in ["notes.tmp", ".hidden", "model.safetensors"] {
            fs::write(step.join(keep), "x").unwrap();
        }
        assert_eq!(run.remove_temporaries().unwrap(), 3);
        let mut left: Vec<String> = fs::read_dir(&step)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, [".hidden", "model.safetensors", "notes.tmp"]);
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "checkpoints/ only"
        );
    }

    #[test]
    fn pruning_keeps_the_newest_steps_and_the_protected_ones() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(&dir.path().join("run")).unwrap();
        for step in [0, 10, 20, 30, 40] {
            fs::create_dir_all(run.checkpoint_dir(step)).unwrap();
        }
        fs::create_dir_all(run.best_checkpoint_dir()).unwrap();
        let removed = run.prune_checkpoints(3, &[40, 0]).unwrap();
        assert_eq!(removed, vec![20, 10]);
        for (step, present) in [(0, true), (10, false), (20, false), (30, true), (40, true)] {
            assert_eq!(run.checkpoint_dir(step).is_dir(), present, "step {step}");
        }
        assert!(run.best_checkpoint_dir().is_dir());
        // Fewer than `keep`: nothing goes.
        assert!(run.prune_checkpoints(5, &[40]).unwrap().is_empty());
    }

    #[test]
    fn latest_checkpoint_errors_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path()).unwrap();
        let e = run.latest_checkpoint().unwrap_err().to_string();
        assert!(e.contains("latest"), "{e}");
    }
}
