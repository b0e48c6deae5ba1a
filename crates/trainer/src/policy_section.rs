//! The `[policy]` section: a policy served by an OpenAI-compatible server
//! (vLLM, SGLang, `agentrl serve-policy`) and the client options it makes.

use serde::{Deserialize, Serialize};

use crate::config::ConfigError;

/// A policy served by an OpenAI-compatible server (vLLM, SGLang, `agentrl
/// serve-policy`): `agentrl eval --policy-endpoint` fills it from flags.
/// In a training config with `[lora]` on, the rollouts are generated there:
/// after each update the trainer writes its adapter and hot-loads it onto
/// the server (see [`crate::remote_generation`]); without LoRA an endpoint
/// is refused (see `TrainConfig::problems`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PolicySection {
    /// Root URL of the server (`http://host:8000`; `/v1` is added); empty =
    /// the local model.
    pub endpoint: String,
    /// The served model's name; empty = the only model the server lists.
    pub model: String,
    /// The NAME of an environment variable holding the API key (sent as
    /// `Authorization: Bearer`); empty = no key.
    pub api_key_env: String,
    /// Requests in flight at once, at most.
    pub max_in_flight: usize,
    /// Retries of a request after a connection error, a timeout or a
    /// 5xx/429 answer.
    pub max_retries: u32,
    /// Wait before the first retry, in milliseconds; it doubles on each
    /// retry, up to 10 s.
    pub retry_backoff_ms: u64,
    /// Training through the server: where the trainer writes each LoRA
    /// adapter it asks the server to load (`<adapter_dir>/<run>/step-N`).
    /// The server reads the path itself, so it must see the directory at
    /// the same path (shared storage when it runs on another machine).
    /// Empty = `<run dir>/adapters/`, only for a server on this machine
    /// (a loopback endpoint).
    pub adapter_dir: String,
}

impl Default for PolicySection {
    fn default() -> Self {
        let d = agentrl_policy_client::OpenAiOptions::new("");
        Self {
            endpoint: String::new(),
            model: String::new(),
            api_key_env: String::new(),
            max_in_flight: d.max_in_flight,
            max_retries: d.max_retries,
            retry_backoff_ms: d.backoff.as_millis() as u64,
            adapter_dir: String::new(),
        }
    }
}

impl PolicySection {
    /// Values out of range, as `(policy.key, why)`. Reads no environment.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let e = &self.endpoint;
        if !(e.is_empty() || e.starts_with("http://") || e.starts_with("https://")) {
            out.push((
                "policy.endpoint".to_string(),
                format!("{e:?} must start with http:// or https://"),
            ));
        }
        if self.max_in_flight == 0 {
            out.push((
                "policy.max_in_flight".to_string(),
                "must be at least 1".to_string(),
            ));
        }
        let name = &self.api_key_env;
        let valid_name = name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit());
        if !valid_name {
            out.push((
                "policy.api_key_env".to_string(),
                format!("{name:?} is not an environment variable name (it names the variable that holds the key, not the key)"),
            ));
        }
        out
    }

    /// The client's options: the key read from the variable `api_key_env`
    /// names (unset or empty is an error naming it).
    pub fn client_options(&self) -> Result<agentrl_policy_client::OpenAiOptions, ConfigError> {
        if let Some((key, why)) = self.problems().into_iter().next() {
            return Err(ConfigError::Invalid(format!("{key}: {why}")));
        }
        if self.endpoint.is_empty() {
            return Err(ConfigError::Invalid(
                "policy.endpoint: empty (the server's URL is needed)".into(),
            ));
        }
        let api_key = match self.api_key_env.as_str() {
            "" => None,
            var => match std::env::var(var) {
                Ok(k) if !k.is_empty() => Some(k),
                _ => {
                    return Err(ConfigError::Invalid(format!(
                        "policy.api_key_env: the environment variable {var} is not set (or empty)"
                    )))
                }
            },
        };
        Ok(agentrl_policy_client::OpenAiOptions {
            model: (!self.model.is_empty()).then(|| self.model.clone()),
            api_key,
            max_in_flight: self.max_in_flight,
            max_retries: self.max_retries,
            backoff: std::time::Duration::from_millis(self.retry_backoff_ms),
            ..agentrl_policy_client::OpenAiOptions::new(self.endpoint.clone())
        })
    }
}

/// Whether `endpoint`'s host is this machine's loopback (`localhost`,
/// `127.0.0.0/8`, `::1`): a server there reads the trainer's files.
pub fn is_loopback(endpoint: &str) -> bool {
    let rest = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host_port.split(':').next().unwrap_or_default(),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TrainConfig;

    /// The problems' keys of the default config with `overrides`.
    fn problem_keys(overrides: &[&str]) -> Vec<String> {
        let overrides: Vec<String> = overrides.iter().map(|o| o.to_string()).collect();
        match TrainConfig::load(None, &overrides) {
            Ok(_) => Vec::new(),
            Err(crate::config::ConfigError::Problems(p)) => p.into_iter().map(|p| p.key).collect(),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn training_through_a_server_needs_lora_its_base_and_a_shared_path() {
        let e = TrainConfig::load(None, &["policy.endpoint=\"http://127.0.0.1:8000\"".into()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("policy.endpoint")
                && e.contains("lora.enabled")
                && e.contains("--policy-endpoint"),
            "{e}"
        );
        // The default section is the local model and passes.
        assert!(problem_keys(&[]).is_empty());
        let local = [
            "policy.endpoint=\"http://localhost:8000\"",
            "lora.enabled=true",
            "model.path=\"/models/base\"",
            "sft.demos=0",
        ];
        assert!(problem_keys(&local).is_empty());
        // A tiny model made here, or a warm start here: not the server's base.
        assert_eq!(problem_keys(&local[..3]), ["sft.demos"]);
        assert_eq!(
            problem_keys(&[local[0], local[1], local[3]]),
            ["model.path"]
        );
        // Another machine cannot read <run>/adapters: a shared directory is named.
        let remote = [
            "policy.endpoint=\"http://gpu7:8000\"",
            local[1],
            local[2],
            local[3],
        ];
        assert_eq!(problem_keys(&remote), ["policy.adapter_dir"]);
        let shared = [&remote[..], &["policy.adapter_dir=\"/shared/adapters\""]].concat();
        assert!(problem_keys(&shared).is_empty());
    }

    #[test]
    fn loopback_hosts_are_recognised() {
        for e in [
            "http://127.0.0.1:8000",
            "http://localhost:1/v1",
            "https://LOCALHOST",
            "http://[::1]:8000",
            "http://user@127.0.0.2:9",
        ] {
            assert!(is_loopback(e), "{e}");
        }
        for e in [
            "http://10.0.0.1:8000",
            "http://gpu7:8000",
            "http://localhost.example.com",
            "http://[fe80::1]:1",
        ] {
            assert!(!is_loopback(e), "{e}");
        }
    }

    #[test]
    fn bad_values_are_named() {
        let s = PolicySection {
            endpoint: "localhost:8000".into(),
            max_in_flight: 0,
            api_key_env: "sk-secret key".into(),
            ..PolicySection::default()
        };
        let keys: Vec<String> = s.problems().into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "policy.endpoint",
                "policy.max_in_flight",
                "policy.api_key_env"
            ]
        );
        let e = s.client_options().unwrap_err().to_string();
        assert!(e.contains("policy.endpoint"), "{e}");
    }

    #[test]
    fn the_key_comes_from_the_named_variable() {
        let var = "AGENTRL_TEST_POLICY_KEY_UNSET_7f3a";
        let s = PolicySection {
            endpoint: "http://h:1".into(),
            model: "m".into(),
            api_key_env: var.into(),
            ..PolicySection::default()
        };
        let e = s.client_options().unwrap_err().to_string();
        assert!(e.contains(var) && e.contains("not set"), "{e}");
        let o = PolicySection {
            api_key_env: String::new(),
            ..s
        }
        .client_options()
        .unwrap();
        assert_eq!((o.model.as_deref(), o.api_key), (Some("m"), None));
        assert_eq!((o.max_in_flight, o.max_retries), (64, 5));
        assert_eq!(o.backoff, std::time::Duration::from_millis(100));
    }
}
