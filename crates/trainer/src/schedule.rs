//! What RL trains on at each step: ScalingInter-RL's growing turn budget
//! (AgentGym-RL's `scaling_inter_stepwise`) and the easy → hard difficulty
//! curriculum. Stages by step count are pure functions of the step, so a
//! resumed run continues mid-stage exactly; stages reached by a validation
//! threshold are kept in the checkpoint's trainer state.

use agentrl_rollout::RolloutConfig;
use serde::{Deserialize, Serialize};

/// The stage of RL step `step` (1-based) when stages last `interval` steps:
/// `step / interval`, the last of `stages` holding once reached. This is
/// AgentGym-RL's `StepRoundsScheduler` (its steps start at 1 too, so the
/// first stage has `interval − 1` steps and every later one `interval`).
/// With no stage or no interval, stage 0.
pub fn stage_at(step: usize, interval: usize, stages: usize) -> usize {
    if stages == 0 || interval == 0 {
        return 0;
    }
    (step / interval).min(stages - 1)
}

/// The turn budget of RL step `step`: `rollout.max_turns_schedule` at the
/// step's stage, or `rollout.max_turns` without a schedule.
pub fn max_turns_at(rollout: &RolloutConfig, step: usize) -> usize {
    let schedule = &rollout.max_turns_schedule;
    match schedule.is_empty() {
        true => rollout.max_turns,
        false => schedule[stage_at(step, rollout.max_turns_stage_steps, schedule.len())],
    }
}

/// Problems with `[rollout] max_turns_schedule` / `max_turns_stage_steps`,
/// as (key, message).
pub fn max_turns_schedule_problems(rollout: &RolloutConfig) -> Vec<(String, String)> {
    let mut p = Vec::new();
    let schedule = &rollout.max_turns_schedule;
    if schedule.is_empty() {
        if rollout.max_turns_stage_steps != 0 {
            p.push((
                "rollout.max_turns_stage_steps".to_string(),
                "applies to rollout.max_turns_schedule, which is empty".to_string(),
            ));
        }
        return p;
    }
    if schedule.contains(&0) {
        p.push((
            "rollout.max_turns_schedule".to_string(),
            format!("{schedule:?}: every turn budget must be at least 1"),
        ));
    }
    if rollout.max_turns_stage_steps == 0 {
        p.push((
            "rollout.max_turns_stage_steps".to_string(),
            "must be at least 1 with a rollout.max_turns_schedule (steps per stage)".to_string(),
        ));
    }
    p
}

/// The easy → hard curriculum (`[curriculum]`): RL trains on `difficulties`
/// in turn, advancing every `stage_steps` steps (as ScalingInter-RL's
/// stages), or when validation success on the current difficulty reaches
/// `advance_at`. Validation itself stays on `env.difficulty`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CurriculumSection {
    /// Difficulties in training order; empty = `env.difficulty` throughout.
    pub difficulties: Vec<String>,
    /// Steps per stage (stage = step / stage_steps); 0 = by `advance_at`.
    pub stage_steps: usize,
    /// Advance when the validation success rate on the current difficulty
    /// (every `trainer.test_freq` steps) reaches this; 0 = by `stage_steps`.
    pub advance_at: f64,
}

impl CurriculumSection {
    /// Whether a curriculum is configured.
    pub fn is_on(&self) -> bool {
        !self.difficulties.is_empty()
    }

    /// Whether the section is left at its default (not written to a run's
    /// `config.toml` then).
    pub fn is_off(&self) -> bool {
        *self == Self::default()
    }

    /// Whether stages advance on validation success (kept in the trainer
    /// state) rather than by step count.
    pub fn by_threshold(&self) -> bool {
        self.is_on() && self.advance_at > 0.0
    }

    /// The training difficulty at RL step `step`: the stage by step count,
    /// or `threshold_stage` (the trainer state's) with `advance_at`;
    /// `default` without a curriculum.
    pub fn difficulty_at<'a>(
        &'a self,
        step: usize,
        threshold_stage: usize,
        default: &'a str,
    ) -> &'a str {
        if !self.is_on() {
            return default;
        }
        let last = self.difficulties.len() - 1;
        let stage = match self.by_threshold() {
            true => threshold_stage.min(last),
            false => stage_at(step, self.stage_steps, self.difficulties.len()),
        };
        &self.difficulties[stage]
    }

    /// Problems as (key, message); `known` are the env's difficulties
    /// (None when the env is remote and its levels unknown here), and
    /// `test_freq` how often validation runs.
    pub fn problems(&self, known: Option<&[&str]>, test_freq: usize) -> Vec<(String, String)> {
        let mut p = Vec::new();
        let mut add = |k: &str, m: String| p.push((format!("curriculum.{k}"), m));
        if !self.is_on() {
            if self.stage_steps != 0 || self.advance_at != 0.0 {
                add(
                    "difficulties",
                    "is empty: set it, or leave out stage_steps and advance_at".into(),
                );
            }
            return p;
        }
        if let Some(known) = known {
            for d in &self.difficulties {
                if !known.contains(&d.as_str()) {
                    add(
                        "difficulties",
                        format!(
                            "{d:?} is not a difficulty of the env (one of: {})",
                            known.join(", ")
                        ),
                    );
                }
            }
        }
        let threshold = self.advance_at;
        if !(threshold.is_finite() && (0.0..=1.0).contains(&threshold)) {
            add("advance_at", format!("{threshold} must be in [0, 1]"));
        }
        match (self.stage_steps > 0, threshold > 0.0) {
            (true, true) => add(
                "advance_at",
                "set stage_steps or advance_at, not both".into(),
            ),
            (false, false) if self.difficulties.len() > 1 => add(
                "stage_steps",
                "set stage_steps (steps per stage) or advance_at (a validation success rate)"
                    .into(),
            ),
            (false, true) if test_freq == 0 => add(
                "advance_at",
                "advances on validation, which trainer.test_freq = 0 never runs".into(),
            ),
            _ => {}
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_are_step_over_interval_and_the_last_holds() {
        // Interval 20, three stages: steps 1..=19 stage 0, 20..=39 stage 1, 40.. stage 2.
        let stages: Vec<usize> = [1, 19, 20, 39, 40, 41, 1000]
            .iter()
            .map(|&s| stage_at(s, 20, 3))
            .collect();
        assert_eq!(stages, [0, 0, 1, 1, 2, 2, 2]);
        assert_eq!(stage_at(5, 0, 3), 0);
        assert_eq!(stage_at(5, 2, 0), 0);
        assert_eq!(stage_at(5, 1, 1), 0);
    }

    #[test]
    fn scaling_inter_rl_grows_the_turn_budget() {
        let r = RolloutConfig {
            max_turns: 8,
            max_turns_schedule: vec![2, 4, 8],
            max_turns_stage_steps: 20,
            ..RolloutConfig::default()
        };
        let turns: Vec<usize> = [1, 19, 20, 40, 60, 500]
            .iter()
            .map(|&s| max_turns_at(&r, s))
            .collect();
        assert_eq!(turns, [2, 2, 4, 8, 8, 8]);
        let fixed = RolloutConfig {
            max_turns: 5,
            ..RolloutConfig::default()
        };
        assert_eq!(max_turns_at(&fixed, 100), 5);
    }

    #[test]
    fn a_schedule_needs_positive_budgets_and_an_interval() {
        let keys = |schedule: Vec<usize>, steps: usize| -> Vec<String> {
            let r = RolloutConfig {
                max_turns_schedule: schedule,
                max_turns_stage_steps: steps,
                ..RolloutConfig::default()
            };
            max_turns_schedule_problems(&r)
                .into_iter()
                .map(|p| p.0)
                .collect()
        };
        assert!(keys(vec![2, 4, 8], 20).is_empty());
        assert!(keys(vec![], 0).is_empty());
        assert_eq!(keys(vec![2, 0], 20), ["rollout.max_turns_schedule"]);
        assert_eq!(keys(vec![2, 4], 0), ["rollout.max_turns_stage_steps"]);
        assert_eq!(keys(vec![], 5), ["rollout.max_turns_stage_steps"]);
    }

    fn curriculum(stage_steps: usize, advance_at: f64) -> CurriculumSection {
        CurriculumSection {
            difficulties: vec!["easy".into(), "hard".into()],
            stage_steps,
            advance_at,
        }
    }

    #[test]
    fn the_curriculum_advances_by_steps_or_by_the_kept_stage() {
        let by_steps = curriculum(10, 0.0);
        let at: Vec<&str> = [1, 9, 10, 30]
            .iter()
            .map(|&s| by_steps.difficulty_at(s, 0, "medium"))
            .collect();
        assert_eq!(at, ["easy", "easy", "hard", "hard"]);
        let by_threshold = curriculum(0, 0.5);
        assert_eq!(by_threshold.difficulty_at(100, 0, "medium"), "easy");
        assert_eq!(by_threshold.difficulty_at(1, 1, "medium"), "hard");
        assert_eq!(by_threshold.difficulty_at(1, 7, "medium"), "hard");
        let off = CurriculumSection::default();
        assert_eq!(off.difficulty_at(50, 3, "medium"), "medium");
    }

    #[test]
    fn curriculum_problems_name_their_keys() {
        let known: &[&str] = &["easy", "hard"];
        let keys = |c: CurriculumSection, freq: usize| -> Vec<String> {
            c.problems(Some(known), freq)
                .into_iter()
                .map(|p| p.0)
                .collect()
        };
        assert!(keys(curriculum(10, 0.0), 0).is_empty());
        assert!(keys(curriculum(0, 0.5), 5).is_empty());
        assert_eq!(keys(curriculum(10, 0.5), 5), ["curriculum.advance_at"]);
        assert_eq!(keys(curriculum(0, 0.0), 5), ["curriculum.stage_steps"]);
        assert_eq!(keys(curriculum(0, 0.5), 0), ["curriculum.advance_at"]);
        assert_eq!(keys(curriculum(0, 1.5), 5), ["curriculum.advance_at"]);
        let mut bad = curriculum(10, 0.0);
        bad.difficulties.push("nightmare".into());
        assert_eq!(keys(bad, 0), ["curriculum.difficulties"]);
        let stray = CurriculumSection {
            stage_steps: 3,
            ..CurriculumSection::default()
        };
        assert_eq!(keys(stray, 0), ["curriculum.difficulties"]);
    }
}
