//! Checks of a config that its values alone cannot answer, run with the
//! rest before anything is written (and by `agentrl train --print-config`):
//! each in-process task source builds one task, so a param out of range, an
//! unknown key or a generator setting that can never produce a task (a
//! FrozenLake with almost no ice) is named with its key; the device exists
//! in this build; each env server accepts a connection.

use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use agentrl_env_core::{EnvError, Split, TaskSpec};

use crate::config::{EnvProtocol, TrainConfig, TrainDevice};
use crate::mixture::{registry_problem, task_sources};

/// How long a connection to an env server may take before the server
/// counts as unreachable: a server on the same network answers in
/// milliseconds.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Build one task (train seed 0) of each task source played in process and
/// name the params that fail, as `(key, message)`. Sources behind
/// `env.endpoint` are built by their server (which may hold other data), and
/// a source whose name or difficulty is already wrong is reported by the
/// registry check, not twice.
pub(crate) fn env_task_problems(cfg: &TrainConfig) -> Vec<(String, String)> {
    let in_process = cfg.env.endpoint.is_empty() && cfg.env.protocol == EnvProtocol::Agentrl;
    if !in_process {
        return Vec::new();
    }
    let mut found = Vec::new();
    for (i, source) in task_sources(cfg).into_iter().enumerate() {
        let prefix = if cfg.mixture.is_empty() {
            "env".to_string()
        } else {
            format!("mixture[{i}]")
        };
        if registry_problem(&source.env, Some(&source.difficulty)).is_some() {
            continue;
        }
        let Ok(desc) = agentrl_envs::find(&source.env) else {
            continue;
        };
        let spec = TaskSpec::new(&source.env, Split::Train, &source.difficulty, 0);
        if let Err(e) = desc.create(&spec, &source.params) {
            let key = match &e {
                EnvError::InvalidParam { key, .. } if !key.is_empty() && key != "." => {
                    format!("{prefix}.params.{key}")
                }
                _ => format!("{prefix}.params"),
            };
            found.push((key, e.to_string()));
        }
    }
    found
}

/// `trainer.device` is one this build can open: `cuda` needs a build with
/// CUDA (a machine without a GPU is found when the device opens, still
/// before the run directory exists).
pub(crate) fn device_problem(device: TrainDevice) -> Option<(String, String)> {
    if device == TrainDevice::Cuda && !candle_core::utils::cuda_is_available() {
        return Some((
            "trainer.device".into(),
            "\"cuda\" needs an agentrl built with CUDA (`cargo build --release --features \
             agentrl-model/cuda` on a machine with the CUDA toolkit); this one runs on the CPU \
             only (trainer.device = \"cpu\")"
                .into(),
        ));
    }
    None
}

/// Each `env.endpoint` URL accepts a TCP connection; the problems of those
/// that do not.
pub(crate) fn endpoint_problems(cfg: &TrainConfig) -> Vec<(String, String)> {
    cfg.env
        .endpoint
        .urls()
        .iter()
        .filter_map(|url| {
            let why = unreachable(url)?;
            Some((
                "env.endpoint".to_string(),
                format!(
                    "{url}: {why}; start the env server there (`agentrl serve --port PORT`) \
                     or fix the URL"
                ),
            ))
        })
        .collect()
}

/// Why `url` does not accept a connection, or `None` when it does.
fn unreachable(url: &str) -> Option<String> {
    let (default_port, rest) = if let Some(r) = url.strip_prefix("http://") {
        (80, r)
    } else if let Some(r) = url.strip_prefix("https://") {
        (443, r)
    } else {
        // The scheme is reported by the value checks.
        return None;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    // user:password@host is not ours to connect with, only the host.
    let host_port = authority.rsplit('@').next().unwrap_or_default();
    if host_port.is_empty() {
        return Some("no host in the URL".into());
    }
    let has_port = match host_port.rfind(']') {
        // [v6] or [v6]:port
        Some(end) => host_port[end..].contains(':'),
        None => host_port.contains(':'),
    };
    let target = if has_port {
        host_port.to_string()
    } else {
        format!("{host_port}:{default_port}")
    };
    let addrs = match target.to_socket_addrs() {
        Ok(a) => a.collect::<Vec<_>>(),
        Err(e) => return Some(format!("cannot resolve {target}: {e}")),
    };
    let mut last = format!("{target} resolves to no address");
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
            Ok(_) => return None,
            Err(e) => last = format!("cannot connect to {addr}: {e}"),
        }
    }
    Some(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn a_listening_server_is_reachable_and_a_closed_port_is_not() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(unreachable(&format!("http://127.0.0.1:{port}")), None);
        assert_eq!(
            unreachable(&format!("http://localhost:{port}/babyai")),
            None
        );
        drop(listener);
        let why = unreachable(&format!("http://127.0.0.1:{port}/")).unwrap();
        assert!(why.contains("cannot connect"), "{why}");
        assert!(unreachable("http:///x").unwrap().contains("no host"));
    }

    #[test]
    fn cuda_on_a_cpu_build_is_named() {
        assert_eq!(device_problem(TrainDevice::Cpu), None);
        let problem = device_problem(TrainDevice::Cuda);
        if candle_core::utils::cuda_is_available() {
            assert_eq!(problem, None);
        } else {
            let (key, why) = problem.unwrap();
            assert_eq!(key, "trainer.device");
            assert!(why.contains("built with CUDA"), "{why}");
        }
    }
}
