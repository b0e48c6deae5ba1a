//! A failure taxonomy of unsuccessful trajectories: rule-based labels read
//! from the trajectory alone (its replies, actions, observations, state keys
//! and how it ended), after the generalisation study's (arXiv 2603.12011)
//! categories. A trajectory may carry several labels, or none ("unlabelled":
//! e.g. a FrozenLake agent that walks into a hole on its first moves).
//!
//! Text is compared normalised: lower case, every run of characters other
//! than letters and digits one space, so `Apple 1,` matches `apple 1`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::trajectory::Trajectory;

/// Why an unsuccessful trajectory failed, as far as rules can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureLabel {
    /// Acted on a belief the observations contradicted or never confirmed.
    ConfirmationBias,
    /// The same actions repeated from the same state.
    ActionLoop,
    /// A reply that did not parse in the reply format.
    InvalidFormat,
    /// An action the environment rejected.
    InvalidAction,
    /// Ended the episode itself with a wrong answer while budget was left.
    PrematureAnswer,
    /// A turn, action, step or context budget ran out.
    TurnBudgetExhausted,
    /// Referred to an object the observations never showed.
    StateInconsistency,
}

impl FailureLabel {
    /// Every label, in the order tables list them.
    pub const ALL: [FailureLabel; 7] = [
        FailureLabel::ConfirmationBias,
        FailureLabel::ActionLoop,
        FailureLabel::InvalidFormat,
        FailureLabel::InvalidAction,
        FailureLabel::PrematureAnswer,
        FailureLabel::TurnBudgetExhausted,
        FailureLabel::StateInconsistency,
    ];

    /// The label's name in tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureLabel::ConfirmationBias => "confirmation_bias",
            FailureLabel::ActionLoop => "action_loop",
            FailureLabel::InvalidFormat => "invalid_format",
            FailureLabel::InvalidAction => "invalid_action",
            FailureLabel::PrematureAnswer => "premature_answer",
            FailureLabel::TurnBudgetExhausted => "turn_budget_exhausted",
            FailureLabel::StateInconsistency => "state_inconsistency",
        }
    }
}

/// How often the same (state, actions) pair must occur to be a loop: twice
/// may be one retry, three times is not.
pub const LOOP_REPEATS: usize = 3;

/// Verbs whose action ends the episode with a verdict (an answer, a
/// purchase): an episode that ends on one unsuccessfully committed to a
/// wrong answer.
const COMMIT_VERBS: [&str; 5] = ["answer", "buy", "submit", "finish", "stop"];

/// Bracket verbs whose argument is free text rather than an object in the
/// world: a search query, an answer.
const FREE_TEXT_VERBS: [&str; 2] = ["search", "answer"];

/// Words that join the object phrases of an action (`take apple 1 from
/// countertop 2`, `craft 4 planks using 1 log`, `toggle and go through red
/// door 1`), as in ALFWorld's, BabyAI's and TextCraft's grammars.
const CONNECTIVES: [&str; 14] = [
    "to", "from", "in", "on", "with", "using", "and", "through", "into", "onto", "at", "go", "the",
    "a",
];

/// A labelling rule: whether it holds for a trajectory played under a turn
/// budget.
type Rule = fn(&Trajectory, usize) -> bool;

/// The labels of `t` (none for a successful trajectory). `max_turns` is the
/// turn budget it was played under (`usize::MAX` for none).
pub fn failure_labels(t: &Trajectory, max_turns: usize) -> Vec<FailureLabel> {
    if t.success {
        return Vec::new();
    }
    let rules: [(FailureLabel, Rule); 7] = [
        (FailureLabel::ConfirmationBias, confirmation_bias),
        (FailureLabel::ActionLoop, action_loop),
        (FailureLabel::InvalidFormat, invalid_format),
        (FailureLabel::InvalidAction, invalid_action),
        (FailureLabel::PrematureAnswer, premature_answer),
        (FailureLabel::TurnBudgetExhausted, budget_exhausted),
        (FailureLabel::StateInconsistency, state_inconsistency),
    ];
    rules
        .into_iter()
        .filter(|(_, rule)| rule(t, max_turns))
        .map(|(label, _)| label)
        .collect()
}

/// Confirmation bias: the agent acts on a belief the observations
/// contradicted or never confirmed. Either
/// - *contradicted*: right after a turn whose actions the environment
///   rejected or that left its state unchanged, the agent plays the same
///   actions again from that same state (it keeps believing they work); or
/// - *never confirmed*: the episode ends on a wrong `answer[…]` whose text
///   no observation ever contained (an answer believed, not read).
fn confirmation_bias(t: &Trajectory, _max_turns: usize) -> bool {
    let contradicted = t.turns.windows(2).enumerate().any(|(k, w)| {
        let (a, b) = (&w[0], &w[1]);
        let failed = a.invalid_actions > 0 || t.state_after(k) == a.state_key;
        !a.actions.is_empty() && failed && b.state_key == a.state_key && b.actions == a.actions
    });
    let unconfirmed_answer = t.env_done
        && final_action(t)
            .and_then(|a| bracket_argument(a, "answer"))
            .is_some_and(|answer| {
                let answer = normalise(&answer);
                !answer.trim().is_empty()
                    && !t
                        .turns
                        .iter()
                        .map(|turn| turn.observation.as_str())
                        .chain([t.final_observation.as_str()])
                        .any(|obs| normalise(obs).contains(&answer))
            });
    contradicted || unconfirmed_answer
}

/// Action loop: some (state before the turn, the turn's actions) pair
/// occurs [`LOOP_REPEATS`] times or more: the same actions from the same
/// state, over and over (standing still, or going round a cycle).
fn action_loop(t: &Trajectory, _max_turns: usize) -> bool {
    let mut seen: BTreeMap<(u64, &[String]), usize> = BTreeMap::new();
    t.turns.iter().filter(|x| !x.actions.is_empty()).any(|x| {
        let n = seen.entry((x.state_key, x.actions.as_slice())).or_insert(0);
        *n += 1;
        *n >= LOOP_REPEATS
    })
}

/// Invalid format: at least one reply did not parse in the reply format.
fn invalid_format(t: &Trajectory, _max_turns: usize) -> bool {
    t.turns.iter().any(|x| x.format_error)
}

/// Invalid action: the environment rejected at least one action.
fn invalid_action(t: &Trajectory, _max_turns: usize) -> bool {
    t.turns.iter().any(|x| x.invalid_actions > 0)
}

/// Premature answer: the episode ended on the agent's own commit (an
/// `answer`, `buy`, `submit`, `finish` or `stop` action, WebShop's
/// `click[buy now]` included) that was wrong, while turns and steps were
/// still left: it stopped when it could have kept looking.
fn premature_answer(t: &Trajectory, max_turns: usize) -> bool {
    let budget_left =
        t.turns.len() < max_turns && (t.env_max_steps == 0 || t.env_steps < t.env_max_steps);
    t.env_done && budget_left && final_action(t).is_some_and(is_commit)
}

/// Turn budget exhausted: the episode was cut off rather than ended by the
/// environment (the turn, action or context budget ran out), or the
/// environment ended it at its own step limit.
fn budget_exhausted(t: &Trajectory, _max_turns: usize) -> bool {
    !t.env_done || (t.env_max_steps > 0 && t.env_steps >= t.env_max_steps)
}

/// State inconsistency: an action names an object no observation up to
/// that turn (nor the instructions) showed. The object phrases of an action
/// are its words after the verb, split at [`CONNECTIVES`], with leading
/// quantities dropped (`get 2 oak log` names `oak log`, `take apple 1 from
/// countertop 2` names `apple 1` and `countertop 2`); a bracket action names
/// its argument (`click[blue shirt]`), except free-text ones (`search`,
/// `answer`). One-word actions (`Up`, `inventory`) name nothing. Only
/// well-formed actions count: a turn whose every action the environment
/// rejected is `invalid_action` (unparseable text names no object).
/// (Which actions of a turn were rejected is not recorded, so a turn with
/// some rejected and some not is checked whole.)
fn state_inconsistency(t: &Trajectory, _max_turns: usize) -> bool {
    let mut shown = normalise(&t.instructions);
    t.turns.iter().any(|turn| {
        shown.push_str(&normalise(&turn.observation));
        let all_rejected = turn.invalid_actions >= turn.actions.len();
        !all_rejected
            && turn
                .actions
                .iter()
                .flat_map(|a| object_phrases(a))
                .any(|phrase| !shown.contains(&phrase))
    })
}

/// The last action the agent played, unless the environment rejected
/// every action of its turn (then it committed to nothing).
fn final_action(t: &Trajectory) -> Option<&str> {
    let turn = t.turns.iter().rev().find(|x| !x.actions.is_empty())?;
    match turn.invalid_actions >= turn.actions.len() {
        true => None,
        false => turn.actions.last().map(String::as_str),
    }
}

fn is_commit(action: &str) -> bool {
    let a = normalise(action);
    let first = a.split_whitespace().next().unwrap_or_default();
    COMMIT_VERBS.contains(&first) || a.trim() == "click buy now"
}

/// `verb[arg]`'s argument when the action is that bracket verb.
fn bracket_argument(action: &str, verb: &str) -> Option<String> {
    let (head, rest) = action.trim().split_once('[')?;
    if !head.trim().eq_ignore_ascii_case(verb) {
        return None;
    }
    Some(rest.trim_end().trim_end_matches(']').to_string())
}

/// The object phrases an action names, normalised with a space either side
/// (so a containment test matches whole words).
fn object_phrases(action: &str) -> Vec<String> {
    if let Some((head, rest)) = action.trim().split_once('[') {
        let verb = head.trim().to_ascii_lowercase();
        if FREE_TEXT_VERBS.contains(&verb.as_str()) {
            return Vec::new();
        }
        let arg = normalise(rest.trim_end().trim_end_matches(']'));
        return match arg.trim().is_empty() {
            true => Vec::new(),
            false => vec![arg],
        };
    }
    let norm = normalise(action);
    let mut phrases = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    let mut flush = |current: &mut Vec<&str>| {
        // Leading numbers are quantities (TextCraft's `get 2 oak log`);
        // trailing ones identify an object (ALFWorld's `apple 1`).
        let start = current
            .iter()
            .position(|w| !w.chars().all(|c| c.is_ascii_digit()))
            .unwrap_or(current.len());
        if start < current.len() {
            phrases.push(format!(" {} ", current[start..].join(" ")));
        }
        current.clear();
    };
    for word in norm.split_whitespace().skip(1) {
        if CONNECTIVES.contains(&word) {
            flush(&mut current);
        } else {
            current.push(word);
        }
    }
    flush(&mut current);
    phrases
}

/// Lower case, every run of non-alphanumeric characters one space, with a
/// space at both ends.
fn normalise(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push(' ');
    for c in text.chars() {
        if c.is_alphanumeric() {
            out.extend(c.to_lowercase());
        } else if !out.ends_with(' ') {
            out.push(' ');
        }
    }
    if !out.ends_with(' ') {
        out.push(' ');
    }
    out
}

/// Label frequencies over a set of trajectories.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FailureCounts {
    /// Trajectories counted.
    pub episodes: usize,
    /// Of them, unsuccessful.
    pub failed: usize,
    /// Unsuccessful ones no rule labelled.
    pub unlabelled: usize,
    /// Unsuccessful trajectories carrying each label (one may carry several).
    pub labels: BTreeMap<FailureLabel, usize>,
}

impl FailureCounts {
    /// Label and count `trajs`, played under a budget of `max_turns` turns.
    pub fn add(&mut self, trajs: &[Trajectory], max_turns: usize) {
        for t in trajs {
            self.episodes += 1;
            if t.success {
                continue;
            }
            self.failed += 1;
            let labels = failure_labels(t, max_turns);
            if labels.is_empty() {
                self.unlabelled += 1;
            }
            for l in labels {
                *self.labels.entry(l).or_insert(0) += 1;
            }
        }
    }

    /// The share of unsuccessful trajectories that carry `label` (0 when
    /// none failed).
    pub fn share(&self, label: FailureLabel) -> f64 {
        match self.failed {
            0 => 0.0,
            n => self.labels.get(&label).copied().unwrap_or(0) as f64 / n as f64,
        }
    }

    /// Counts of both sets together.
    pub fn merge(&mut self, other: &FailureCounts) {
        self.episodes += other.episodes;
        self.failed += other.failed;
        self.unlabelled += other.unlabelled;
        for (l, n) in &other.labels {
            *self.labels.entry(*l).or_insert(0) += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trajectory::Turn;
    use agentrl_env_core::{Split, TaskSpec};

    /// A turn from state `state` playing `actions`, seeing `observation`.
    fn turn(state: u64, observation: &str, actions: &[&str]) -> Turn {
        Turn {
            reply: actions.join(" || "),
            actions: actions.iter().map(|a| a.to_string()).collect(),
            state_key: state,
            observation: observation.to_string(),
            ..Turn::default()
        }
    }

    /// An unsuccessful episode the environment ended after `turns`, in
    /// state 99, with 50 steps of budget.
    fn failed(turns: Vec<Turn>) -> Trajectory {
        Trajectory {
            env_steps: turns.len(),
            turns,
            env_done: true,
            instructions: "Actions: go to X, take O from X, put O in/on X, answer[text]."
                .to_string(),
            final_observation: "Nothing happens.".to_string(),
            final_state_key: 99,
            env_max_steps: 50,
            ..Trajectory::new(TaskSpec::new("alfworld", Split::Val, "easy", 0), 0)
        }
    }

    fn labels(t: &Trajectory) -> Vec<FailureLabel> {
        failure_labels(t, 10)
    }

    const ROOM: &str =
        "You are in the kitchen. You see a cabinet 1, a countertop 2 and a fridge 1.";

    #[test]
    fn a_success_has_no_label() {
        let mut t = failed(vec![turn(1, ROOM, &["go to cabinet 9"])]);
        t.success = true;
        assert!(labels(&t).is_empty());
        let mut c = FailureCounts::default();
        c.add(&[t], 10);
        assert_eq!((c.episodes, c.failed), (1, 0));
    }

    #[test]
    fn confirmation_bias_repeats_what_the_environment_contradicted() {
        // The first `go to cabinet 1` left the state as it was (2 → 2), and
        // the agent plays it again from there.
        let t = failed(vec![
            turn(2, ROOM, &["go to cabinet 1"]),
            turn(2, ROOM, &["go to cabinet 1"]),
            turn(5, ROOM, &["go to fridge 1"]),
        ]);
        assert_eq!(labels(&t), [FailureLabel::ConfirmationBias]);
        // A rejected action replayed counts too (with the invalid action).
        let mut t = failed(vec![
            turn(2, ROOM, &["open countertop 2"]),
            turn(2, ROOM, &["open countertop 2"]),
        ]);
        t.turns[0].invalid_actions = 1;
        assert!(labels(&t).contains(&FailureLabel::ConfirmationBias));
        // An action that worked, played again from the new state, is not.
        let t = failed(vec![
            turn(2, ROOM, &["go to cabinet 1"]),
            turn(3, ROOM, &["go to cabinet 1"]),
        ]);
        assert!(!labels(&t).contains(&FailureLabel::ConfirmationBias));
    }

    #[test]
    fn confirmation_bias_answers_what_no_observation_said() {
        let obs = "Doc 1: The Eiffel Tower is in Paris.";
        let t = failed(vec![
            turn(
                1,
                "Question: where is the Eiffel Tower?",
                &["search[eiffel tower]"],
            ),
            turn(2, obs, &["answer[Lyon]"]),
        ]);
        let l = labels(&t);
        assert!(l.contains(&FailureLabel::ConfirmationBias), "{l:?}");
        // A wrong answer the documents did contain was read, not believed.
        let t = failed(vec![
            turn(
                1,
                "Question: where is the Eiffel Tower?",
                &["search[eiffel tower]"],
            ),
            turn(2, obs, &["answer[Paris]"]),
        ]);
        assert!(!labels(&t).contains(&FailureLabel::ConfirmationBias));
    }

    #[test]
    fn action_loop_is_the_same_actions_from_the_same_state_three_times() {
        // A cycle: 1 -A-> 2 -B-> 1 -A-> 2 -B-> 1 -A->.
        let t = failed(vec![
            turn(1, ROOM, &["go to cabinet 1"]),
            turn(2, ROOM, &["go to fridge 1"]),
            turn(1, ROOM, &["go to cabinet 1"]),
            turn(2, ROOM, &["go to fridge 1"]),
            turn(1, ROOM, &["go to cabinet 1"]),
        ]);
        assert_eq!(labels(&t), [FailureLabel::ActionLoop]);
        // Twice is a retry, not a loop.
        let t = failed(vec![
            turn(1, ROOM, &["go to cabinet 1"]),
            turn(2, ROOM, &["go to fridge 1"]),
            turn(1, ROOM, &["go to cabinet 1"]),
        ]);
        assert!(labels(&t).is_empty(), "{:?}", labels(&t));
    }

    #[test]
    fn invalid_format_is_a_reply_that_did_not_parse() {
        let mut bad = turn(1, ROOM, &[]);
        bad.reply = "I think I should go".into();
        bad.format_error = true;
        let t = failed(vec![bad, turn(1, ROOM, &["go to fridge 1"])]);
        assert_eq!(labels(&t), [FailureLabel::InvalidFormat]);
    }

    /// A failed one-turn episode whose only action the environment rejected.
    fn rejected(action: &str) -> Trajectory {
        let mut t = failed(vec![turn(1, ROOM, &[action])]);
        t.turns[0].invalid_actions = 1;
        t
    }

    #[test]
    fn invalid_action_is_one_the_environment_rejected() {
        let t = rejected("fly to fridge 1");
        assert_eq!(labels(&t), [FailureLabel::InvalidAction]);
    }

    #[test]
    fn premature_answer_commits_wrongly_with_budget_left() {
        let t = failed(vec![turn(
            1,
            "Question: who wrote Hamlet?",
            &["answer[who]"],
        )]);
        // `who` is in the question: read, so only premature.
        assert_eq!(labels(&t), [FailureLabel::PrematureAnswer]);
        let t = failed(vec![turn(
            1,
            "[Back to Search] Shirt B01 [Buy Now]",
            &["click[buy now]"],
        )]);
        assert_eq!(labels(&t), [FailureLabel::PrematureAnswer]);
        // On the last turn of the budget the answer was forced, not premature.
        let t = failed(vec![turn(
            1,
            "Question: who wrote Hamlet?",
            &["answer[who]"],
        )]);
        assert!(failure_labels(&t, 1).is_empty());
    }

    #[test]
    fn budget_exhausted_is_a_cut_off_or_the_step_limit() {
        let mut t = failed(vec![
            turn(1, ROOM, &["go to cabinet 1"]),
            turn(2, ROOM, &["go to fridge 1"]),
        ]);
        t.env_done = false;
        assert_eq!(labels(&t), [FailureLabel::TurnBudgetExhausted]);
        let mut t = failed(vec![turn(1, ROOM, &["go to cabinet 1"])]);
        t.env_max_steps = 1;
        assert_eq!(labels(&t), [FailureLabel::TurnBudgetExhausted]);
    }

    #[test]
    fn state_inconsistency_names_an_object_never_shown() {
        // `apple 1` is in no observation; the countertop is.
        let t = failed(vec![
            turn(1, ROOM, &["go to countertop 2"]),
            turn(
                2,
                "On the countertop 2 you see a knife 1.",
                &["take apple 1 from countertop 2"],
            ),
        ]);
        assert_eq!(labels(&t), [FailureLabel::StateInconsistency]);
        // Quantities are not names: `get 2 oak log` names `oak log`.
        let t = failed(vec![turn(
            1,
            "Crafting commands: craft 4 oak planks using 1 oak log. Goal: oak planks.",
            &["get 2 oak log", "craft 4 oak planks using 1 oak log"],
        )]);
        assert!(labels(&t).is_empty(), "{:?}", labels(&t));
        // Search queries are free text, and one-word moves name nothing.
        let t = failed(vec![turn(1, ROOM, &["search[purple unicorn]", "Up"])]);
        assert!(labels(&t).is_empty(), "{:?}", labels(&t));
        // An object shown only later does not ground an earlier mention.
        let t = failed(vec![
            turn(1, ROOM, &["go to drawer 3"]),
            turn(2, "You see a drawer 3.", &["go to fridge 1"]),
        ]);
        assert_eq!(labels(&t), [FailureLabel::StateInconsistency]);
    }

    #[test]
    fn a_rejected_action_is_invalid_not_inconsistent() {
        // `<answer>Right` did not parse as a move: it names no object.
        let t = rejected("<answer>Right");
        assert_eq!(labels(&t), [FailureLabel::InvalidAction]);
    }

    #[test]
    fn counts_share_and_merge() {
        let mut loop_ = failed(vec![turn(1, ROOM, &["go to cabinet 1"]); 3]);
        loop_.final_state_key = 1;
        let plain = failed(vec![turn(1, ROOM, &["go to fridge 1"])]);
        let mut c = FailureCounts::default();
        c.add(&[loop_, plain], 10);
        assert_eq!((c.episodes, c.failed, c.unlabelled), (2, 2, 1));
        // Standing still three times: a loop and a contradicted belief.
        assert_eq!(c.share(FailureLabel::ActionLoop), 0.5);
        assert_eq!(c.share(FailureLabel::ConfirmationBias), 0.5);
        assert_eq!(c.share(FailureLabel::InvalidAction), 0.0);
        let mut d = c.clone();
        d.merge(&c);
        assert_eq!((d.failed, d.labels[&FailureLabel::ActionLoop]), (4, 2));
        let json = serde_json::to_string(&c).unwrap();
        assert!(json.contains("\"action_loop\":1"), "{json}");
    }
}
