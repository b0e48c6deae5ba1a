//! `HttpEnv` against the real server: same trajectories as in-process, retries,
//! closing on drop, one reset per episode, and a clear refusal of an AgentGym server.

// The server's test helpers (the "counter" env, a loopback config), shared
// rather than copied: these tests drive the same server.
mod agentgym_double;
#[path = "../../server/tests/server/common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::time::Duration;

use agentgym_double::{DoubleServer, Kind};
use agentrl_env_client::{ClientOptions, HttpEnv};
use agentrl_env_core::{Env, EnvDescriptor, EnvParams, Split, StepError, TaskSpec};
use agentrl_server::BackgroundServer;
use common::{all_descriptors, test_config};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn background() -> BackgroundServer {
    BackgroundServer::start(test_config(), all_descriptors(), 2).unwrap()
}

/// Play the same random action sequence (valid and invalid actions, an expert
/// query, a mid-episode reset) on two envs and require identical results.
fn assert_same_trajectory(local: &mut dyn Env, remote: &mut dyn Env, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    assert_eq!(local.instructions(), remote.instructions());
    assert_eq!(local.observation(), remote.observation());
    assert_eq!(local.reset(), remote.reset());
    let reset_at = rng.random_range(3..12);
    for t in 0..40 {
        if t == reset_at {
            assert_eq!(local.reset(), remote.reset(), "reset at {t}");
        }
        let actions = local.available_actions();
        assert_eq!(
            actions,
            remote.available_actions(),
            "available actions at {t}"
        );
        let action = match rng.random_range(0..10) {
            0 => "definitely not an action".to_string(),
            1 => String::new(),
            2 => local
                .expert_action()
                .inspect(|a| assert_eq!(Some(a.clone()), remote.expert_action()))
                .unwrap_or_default(),
            _ if actions.is_empty() => "noop".to_string(),
            _ => actions[rng.random_range(0..actions.len())].clone(),
        };
        let a = local.step(&action);
        let b = remote.step(&action);
        assert_eq!(a, b, "step {t} action {action:?}");
        assert_eq!(local.observation(), remote.observation());
        assert_eq!(local.state_key(), remote.state_key());
        assert_eq!(local.steps(), remote.steps());
        assert_eq!(local.invalid_actions(), remote.invalid_actions());
        assert_eq!(local.max_steps(), remote.max_steps());
        assert_eq!(local.is_done(), remote.is_done());
        assert_eq!(local.is_success(), remote.is_success());
        if local.is_done() {
            assert_eq!(local.step("noop"), Err(StepError::EpisodeOver));
            assert_eq!(remote.step("noop"), Err(StepError::EpisodeOver));
            break;
        }
    }
}

#[test]
fn remote_trajectories_equal_in_process_on_every_env() {
    let server = background();
    let base = server.base_url();
    let params = EnvParams::new();
    let descriptors: Vec<EnvDescriptor> = all_descriptors();
    for d in &descriptors {
        for (i, difficulty) in d.difficulties.iter().enumerate() {
            for seed in 0..4u64 {
                let split = Split::ALL[(seed as usize + i) % 3];
                let spec = TaskSpec::new(d.name, split, *difficulty, seed * 7919);
                let mut local = d.create(&spec, &params).unwrap();
                // Alternate between the root URL and the /{env} mount.
                let url = if seed % 2 == 0 {
                    base.clone()
                } else {
                    format!("{base}/{}", d.name)
                };
                let mut remote = HttpEnv::connect(&url, &spec, &params, None).unwrap();
                assert_eq!(remote.spec(), &spec);
                assert_same_trajectory(local.as_mut(), &mut remote, seed);
            }
        }
    }
    assert_eq!(
        server.live_sessions(),
        0,
        "every HttpEnv closed its session on drop"
    );
}

#[test]
fn remote_env_passes_params_and_reports_create_errors() {
    let server = background();
    let base = server.base_url();
    let spec = TaskSpec::new("counter", Split::Val, "easy", 5);
    let mut params = EnvParams::new();
    params.insert("max_steps".into(), 3.into());
    let env = HttpEnv::connect(&base, &spec, &params, None).unwrap();
    assert_eq!(env.max_steps(), 3);
    env.close().unwrap();
    params.insert("bogus".into(), 1.into());
    let err = HttpEnv::connect(&base, &spec, &params, None).err().unwrap();
    assert!(err.to_string().contains("bogus"), "{err}");
    let err = HttpEnv::connect(
        &base,
        &TaskSpec::new("nosuchenv", Split::Train, "easy", 0),
        &EnvParams::new(),
        None,
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("unknown environment"), "{err}");
    assert!(HttpEnv::connect("localhost:1", &spec, &EnvParams::new(), None).is_err());
    assert_eq!(server.live_sessions(), 0);
}

#[test]
fn client_sends_the_token() {
    let config = agentrl_server::ServerConfig {
        token: Some("tok".into()),
        ..test_config()
    };
    let server = BackgroundServer::start(config, all_descriptors(), 1).unwrap();
    let spec = TaskSpec::new("counter", Split::Train, "easy", 1);
    assert!(HttpEnv::connect(&server.base_url(), &spec, &EnvParams::new(), None).is_err());
    let mut env =
        HttpEnv::connect(&server.base_url(), &spec, &EnvParams::new(), Some("tok")).unwrap();
    assert!(env.step("inc").is_ok());
    assert_eq!(env.available_actions(), ["inc", "noop", "add 2", "dec"]);
    drop(env);
    assert_eq!(server.live_sessions(), 0);
}

#[test]
fn client_retries_until_the_server_comes_up() {
    // Reserve a free port, release it, and start the server there a little later.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let starter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        BackgroundServer::start(
            agentrl_server::ServerConfig {
                addr,
                ..test_config()
            },
            all_descriptors(),
            1,
        )
        .unwrap()
    });
    let mut env = counter_with_retries(&format!("http://{addr}"), 8, 50);
    assert!(env.step("inc").is_ok());
    drop(env);
    let server = starter.join().unwrap();
    assert_eq!(server.live_sessions(), 0);
}

/// A counter session (seed 2) at `url`, connecting up to `retries` times
/// `backoff_ms` apart.
fn counter_with_retries(url: &str, retries: u32, backoff_ms: u64) -> HttpEnv {
    let spec = TaskSpec::new("counter", Split::Train, "easy", 2);
    let opts = ClientOptions {
        connect_retries: retries,
        backoff: Duration::from_millis(backoff_ms),
        ..ClientOptions::default()
    };
    HttpEnv::connect_with(url, &spec, &EnvParams::new(), opts).unwrap()
}

#[test]
fn a_dead_server_marks_the_env_done_with_an_error() {
    let server = background();
    let mut env = counter_with_retries(&server.base_url(), 1, 10);
    server.shutdown().unwrap();
    assert_eq!(env.step("inc"), Err(StepError::EpisodeOver));
    assert!(env.is_done());
    assert!(env.last_error().is_some());
}

#[test]
fn an_agentgym_server_is_refused_with_the_protocol_to_use() {
    let double = DoubleServer::start(Kind::SciWorld);
    let spec = TaskSpec::new("sciworld", Split::Train, "easy", 42);
    let e = HttpEnv::connect(&double.url(), &spec, &EnvParams::new(), None)
        .err()
        .expect("an AgentGym server is not an agentrl server");
    let e = e.to_string();
    assert!(
        e.contains("not an agentrl server") && e.contains("env.protocol = \"agentgym\""),
        "{e}"
    );
    assert_eq!(
        double.open_sessions(),
        0,
        "the session it created was closed"
    );
}
