//! `AgentGymEnv` against test doubles of AgentGym's TextCraft, BabyAI and
//! SciWorld servers (answering as the recorded transcripts show): create,
//! reset, valid and invalid steps, done, close, `{"error"}` under 200, score
//! and reward scale, one reset per episode.

mod agentgym_double;

use agentgym_double::{DoubleServer, Kind, SCIWORLD_TASKS};
use agentrl_env_client::{AgentGymEnv, AgentGymOptions};
use agentrl_env_core::{ActionError, Env, EnvError, Split, StepError, TaskSpec};

fn options(env: &str, scale: f64) -> AgentGymOptions {
    AgentGymOptions::new(
        env,
        "You are an agent. Answer with one action.",
        None,
        scale,
    )
    .unwrap()
}

fn spec(env: &str, seed: u64) -> TaskSpec {
    TaskSpec::new(env, Split::Train, "default", seed)
}

/// A session of `env` (seed `seed`, AgentGym's `data_idx`) on the double,
/// its rewards scaled by `scale`.
fn connect(
    d: &DoubleServer,
    env: &str,
    seed: u64,
    data_idx: u64,
    scale: f64,
) -> Result<AgentGymEnv, EnvError> {
    AgentGymEnv::connect(&d.url(), &spec(env, seed), data_idx, options(env, scale))
}

#[test]
fn textcraft_episode_from_create_to_close() {
    let d = DoubleServer::start(Kind::TextCraft);
    let mut env = connect(&d, "textcraft", 0, 7, 1.0).unwrap();
    assert_eq!(
        env.instructions(),
        "You are an agent. Answer with one action."
    );
    // TextCraft's create needs a body; the task is the reset's data_idx, not the id.
    assert_eq!(d.sent("create"), vec![serde_json::json!({})]);
    assert!(env.reset().ends_with("Goal: craft item7."));
    assert_eq!(d.reset_indices(), vec![7], "one reset for connect + reset");

    let e = env.step("fly to the moon").unwrap_err();
    assert_eq!(
        e,
        StepError::InvalidAction(ActionError::not_possible(
            "fly to the moon",
            "Could not execute fly to the moon"
        ))
    );
    assert_eq!((env.steps(), env.invalid_actions()), (0, 1));
    assert!(
        env.observation().ends_with("Goal: craft item7."),
        "an invalid action leaves the observation"
    );
    let s = env.step("get 1 part7").unwrap();
    assert_eq!(
        (s.observation.as_str(), s.reward, s.done),
        ("Got 1 part7", 0.0, false)
    );
    let s = env.step("craft 1 item7 using 1 part7").unwrap();
    assert!(s.done && s.success && s.reward == 1.0);
    assert_eq!((env.steps(), env.invalid_actions()), (2, 1));
    // TextCraft would keep answering after done; the client ends the episode.
    let steps_sent = d.sent("step").len();
    assert_eq!(env.step("inventory"), Err(StepError::EpisodeOver));
    assert_eq!(d.sent("step").len(), steps_sent, "nothing sent after done");

    // A second episode resets once more; dropping closes the session.
    assert!(env.reset().ends_with("Goal: craft item7."));
    assert_eq!(d.reset_indices(), vec![7, 7]);
    assert_eq!(
        (env.steps(), env.invalid_actions(), env.is_done()),
        (0, 0, false)
    );
    drop(env);
    assert_eq!(d.sent("close"), vec![serde_json::json!({"id": 0})]);
    assert_eq!(d.open_sessions(), 0);
}

#[test]
fn sciworld_shows_the_task_scales_the_score_and_rejects_out_of_range_tasks() {
    let d = DoubleServer::start(Kind::SciWorld);
    let mut env = connect(&d, "sciworld", 0, 3236, 0.01).unwrap();
    let first = env.reset();
    assert!(
        first.starts_with("Your task is to find a(n) non-living thing (variation 3236).")
            && first.contains("\nThis room is called the hallway."),
        "the task description comes first, as AgentGym's client shows it: {first}"
    );
    assert!(env.available_actions().is_empty());
    let s = env.step("focus on picture").unwrap();
    assert_eq!(s.reward, 0.5);
    assert!(matches!(
        env.step("jump around"),
        Err(StepError::InvalidAction(ActionError::NotPossible { .. }))
    ));
    let s = env.step("look around").unwrap();
    assert_eq!(s.reward, 0.0, "score unchanged, reward 0");
    let s = env.step("move picture to red box").unwrap();
    assert!(s.done && s.success);
    assert_eq!(s.reward, 0.5, "50 → 100, scaled by 0.01");
    assert_eq!((env.steps(), env.invalid_actions()), (3, 1));

    // A failing end: −100, not a success.
    assert!(env.reset().starts_with("Your task"));
    let s = env.step("focus on agent").unwrap();
    assert!(s.done && !s.success);
    assert_eq!(s.reward, -1.0);

    // data_idx out of range: a 200 {"error"} that is an error of the creation.
    let e = connect(&d, "sciworld", 1, SCIWORLD_TASKS, 0.01)
        .err()
        .expect("an out-of-range task is an error")
        .to_string();
    assert!(
        e.contains("POST /reset") && e.contains("list index out of range"),
        "{e}"
    );
    drop(env);
    // The refused session and the played one are both closed.
    assert_eq!(d.open_sessions(), 0);
}

#[test]
fn babyai_lists_actions_counts_invalid_ones_and_ends_on_a_server_error() {
    let d = DoubleServer::start(Kind::BabyAi);
    let mut env = connect(&d, "babyai", 0, 42, 1.0).unwrap();
    assert_eq!(
        env.available_actions(),
        [
            "turn left",
            "turn right",
            "go to red ball 1",
            "check available actions"
        ]
    );
    assert!(env.step("jump").is_err());
    assert_eq!(env.invalid_actions(), 1);
    env.step("turn left").unwrap();
    let s = env.step("go to red ball 1").unwrap();
    assert!(s.done && s.success);
    assert_eq!(s.reward, 0.859375, "the server's score");

    // Mid-episode the server forgets the session: 200 {"error"} ends the episode.
    let mut env = connect(&d, "babyai", 1, 43, 1.0).unwrap();
    env.step("turn left").unwrap();
    d.forget(env.id().as_u64().unwrap());
    assert_eq!(env.step("turn right"), Err(StepError::EpisodeOver));
    assert!(env.is_done());
    let e = env.last_error().unwrap().to_string();
    assert!(
        e.contains("POST /step") && e.contains("The id 1 is not valid."),
        "{e}"
    );
    assert!(
        !env.is_success(),
        "an episode cut short by the server is not a success"
    );
}

/// AgentGym's servers never end an episode on their own step count: the
/// client's `max_steps` does, unsuccessfully, so a scripted player stops.
#[test]
fn the_step_limit_ends_an_episode_without_success() {
    let d = DoubleServer::start(Kind::TextCraft);
    let mut opts = options("textcraft", 1.0);
    opts.max_steps = 1;
    let mut env = AgentGymEnv::connect(&d.url(), &spec("textcraft", 0), 7, opts).unwrap();
    env.reset();
    let s = env.step("get 1 part7").unwrap();
    assert!(s.done && !s.success, "{s:?}");
    assert!(env.is_done() && !env.is_success());
    assert_eq!(env.max_steps(), 1);
}
