//! Env params by origin. A request may set only its env's `request_params`
//! (bounded knobs that touch nothing outside the env); file paths and cache
//! locations come from the operator's `agentrl serve --env-param`, whose
//! values lie under each request's params.

use std::collections::BTreeMap;

use agentrl_env_core::{EnvDescriptor, EnvParams};
use axum::http::StatusCode;

use crate::error::{ApiError, ServerError};
use agentrl_env_client::protocol::ErrorKind;

/// The key of `--env-param ENV.difficulty=NAME`: not an env param but the
/// difficulty a session gets when its client names none (AgentGym's clients
/// cannot send one).
pub(crate) const DIFFICULTY_KEY: &str = "difficulty";

/// The operator's env params and default difficulties, per served env.
#[derive(Debug, Clone, Default)]
pub(crate) struct OperatorParams {
    params: BTreeMap<&'static str, EnvParams>,
    difficulties: BTreeMap<&'static str, &'static str>,
}

impl OperatorParams {
    /// Read `[ENV.]KEY=VALUE` settings for the `served` envs. VALUE is read
    /// as JSON (a number, `true`, `"text"`), else taken as a bare string. A
    /// KEY without ENV applies to every served env that has that param, and
    /// at least one must; `ENV.KEY` to that env, which must be served and
    /// have it. `ENV.difficulty=NAME` sets ENV's default difficulty, one of
    /// its difficulties.
    pub(crate) fn parse(
        settings: &[String],
        served: &[EnvDescriptor],
    ) -> Result<Self, ServerError> {
        let mut out: BTreeMap<&'static str, EnvParams> = BTreeMap::new();
        let mut difficulties: BTreeMap<&'static str, &'static str> = BTreeMap::new();
        for setting in settings {
            let bad = |why: String| ServerError::EnvParam(format!("'{setting}': {why}"));
            let (target, raw) = setting
                .split_once('=')
                .ok_or_else(|| bad("expected [ENV.]KEY=VALUE".into()))?;
            let (env, key) = match target.trim().split_once('.') {
                Some((env, key)) => (Some(env), key),
                None => (None, target.trim()),
            };
            if key.is_empty() || env.is_some_and(str::is_empty) {
                return Err(bad("expected [ENV.]KEY=VALUE".into()));
            }
            let value = parse_value(raw.trim());
            if key == DIFFICULTY_KEY {
                let name = env.ok_or_else(|| {
                    bad("a default difficulty needs its env: ENV.difficulty=NAME".into())
                })?;
                let d = served
                    .iter()
                    .find(|d| d.name == name)
                    .ok_or_else(|| bad(format!("'{name}' is not a served environment")))?;
                let wanted = value.as_str().unwrap_or(raw.trim());
                let known = d
                    .difficulties
                    .iter()
                    .find(|x| **x == wanted)
                    .ok_or_else(|| {
                        bad(format!(
                            "{name} has no difficulty '{wanted}' (it has: {})",
                            d.difficulties.join(", ")
                        ))
                    })?;
                difficulties.insert(d.name, known);
                continue;
            }
            let targets: Vec<&EnvDescriptor> = match env {
                Some(name) => {
                    let d = served
                        .iter()
                        .find(|d| d.name == name)
                        .ok_or_else(|| bad(format!("'{name}' is not a served environment")))?;
                    if !d.knows_param(key) {
                        return Err(bad(format!(
                            "{name} has no parameter '{key}' (it has: {})",
                            param_list(d)
                        )));
                    }
                    vec![d]
                }
                None => {
                    let ds: Vec<&EnvDescriptor> =
                        served.iter().filter(|d| d.knows_param(key)).collect();
                    if ds.is_empty() {
                        return Err(bad(format!(
                            "no served environment has a parameter '{key}'"
                        )));
                    }
                    ds
                }
            };
            for d in targets {
                out.entry(d.name)
                    .or_default()
                    .insert(key.to_string(), value.clone());
            }
        }
        Ok(Self {
            params: out,
            difficulties,
        })
    }

    /// The envs the operator set params for, with those params.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&'static str, &EnvParams)> {
        self.params.iter().map(|(name, p)| (*name, p))
    }

    /// The operator's default difficulty of `env`, if set.
    pub(crate) fn difficulty(&self, env: &str) -> Option<&'static str> {
        self.difficulties.get(env).copied()
    }

    /// The difficulty a session of `desc` gets when its request names none:
    /// the operator's, else the env's first.
    pub(crate) fn default_difficulty(&self, desc: &EnvDescriptor) -> String {
        self.difficulty(desc.name)
            .or_else(|| desc.difficulties.first().copied())
            .unwrap_or_default()
            .to_string()
    }

    /// The params a session of `desc` is built with: the operator's, then
    /// the request's over them, after checking the request's keys.
    pub(crate) fn merge(
        &self,
        desc: &EnvDescriptor,
        request: EnvParams,
    ) -> Result<EnvParams, ApiError> {
        check_request(desc, &request)?;
        let mut params = self.params.get(desc.name).cloned().unwrap_or_default();
        params.extend(request);
        Ok(params)
    }
}

/// A JSON literal, or the text itself (a path needs no quotes).
fn parse_value(raw: &str) -> serde_json::Value {
    serde_json::from_str(raw).unwrap_or_else(|_| serde_json::Value::String(raw.to_string()))
}

fn param_list(d: &EnvDescriptor) -> String {
    let all: Vec<&str> = d
        .request_params
        .iter()
        .chain(d.operator_params)
        .copied()
        .collect();
    if all.is_empty() {
        "none".into()
    } else {
        all.join(", ")
    }
}

/// Refuses any key of a request's params that is not in `desc`'s
/// `request_params`: 403 for an operator's param, 400 for an unknown one.
fn check_request(desc: &EnvDescriptor, request: &EnvParams) -> Result<(), ApiError> {
    for key in request.keys() {
        if desc.request_params.contains(&key.as_str()) {
            continue;
        }
        if desc.operator_params.contains(&key.as_str()) {
            return Err(ApiError::forbidden_param(desc.name, key));
        }
        let allowed = if desc.request_params.is_empty() {
            "none".to_string()
        } else {
            desc.request_params.join(", ")
        };
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorKind::InvalidSpec,
            format!(
                "invalid parameter '{key}' for {}: not a parameter a client may send \
                 (a client may send: {allowed})",
                desc.name
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn served() -> Vec<EnvDescriptor> {
        agentrl_envs::descriptors()
    }

    fn parse(settings: &[&str]) -> Result<OperatorParams, ServerError> {
        let settings: Vec<String> = settings.iter().map(|s| s.to_string()).collect();
        OperatorParams::parse(&settings, &served())
    }

    #[test]
    fn scoped_and_unscoped_settings_reach_the_envs_that_have_the_key() {
        let p = parse(&[
            "searchqa.corpus=/data/wiki.jsonl",
            "data_dir=/srv/data",
            "webshop.catalog_size=500",
            "searchqa.retry_wrong_answer=false",
        ])
        .unwrap();
        let by_env: BTreeMap<&str, &EnvParams> = p.iter().collect();
        assert_eq!(by_env["searchqa"]["corpus"], json!("/data/wiki.jsonl"));
        assert_eq!(by_env["searchqa"]["retry_wrong_answer"], json!(false));
        // data_dir is a textcraft and a webshop param, not a searchqa one.
        assert_eq!(by_env["textcraft"]["data_dir"], json!("/srv/data"));
        assert_eq!(by_env["webshop"]["data_dir"], json!("/srv/data"));
        assert!(!by_env["searchqa"].contains_key("data_dir"));
        assert_eq!(by_env["webshop"]["catalog_size"], json!(500));
    }

    /// Each setting alone is refused with an error naming it and saying `says`.
    fn assert_refused(cases: &[(&str, &str)]) {
        for &(setting, says) in cases {
            let e = parse(&[setting]).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains(setting), "{setting}: {e}");
        }
    }

    #[test]
    fn a_scoped_difficulty_is_a_default_not_a_param() {
        let p = parse(&["babyai.difficulty=hard", "textcraft.difficulty=\"depth2\""]).unwrap();
        assert_eq!(p.difficulty("babyai"), Some("hard"));
        assert_eq!(p.difficulty("textcraft"), Some("depth2"));
        assert_eq!(p.difficulty("sokoban"), None);
        assert_eq!(p.iter().count(), 0, "no env gets a 'difficulty' param");
        let sokoban = agentrl_envs::find("sokoban").unwrap();
        assert_eq!(p.default_difficulty(&sokoban), sokoban.difficulties[0]);
        assert_refused(&[
            ("difficulty=hard", "needs its env"),
            ("babyai.difficulty=impossible", "no difficulty 'impossible'"),
            ("chess.difficulty=hard", "not a served environment"),
        ]);
    }

    #[test]
    fn bad_settings_name_what_is_wrong() {
        assert_refused(&[
            ("corpus", "KEY=VALUE"),
            ("=3", "KEY=VALUE"),
            ("chess.size=3", "not a served environment"),
            ("frozenlake.corpus=/x", "has no parameter 'corpus'"),
            ("no_such_key=1", "no served environment"),
        ]);
    }

    #[test]
    fn requests_may_not_set_operator_params_and_lie_over_the_operator_ones() {
        let searchqa = agentrl_envs::find("searchqa").unwrap();
        let op = parse(&["searchqa.corpus_size=500", "searchqa.cache_dir=memory"]).unwrap();
        let request: EnvParams = serde_json::from_value(json!({"corpus_size": 200})).unwrap();
        let merged = op.merge(&searchqa, request).unwrap();
        assert_eq!(merged["corpus_size"], json!(200));
        assert_eq!(merged["cache_dir"], json!("memory"));
        for key in ["corpus", "qa_file", "cache_dir"] {
            let request: EnvParams = serde_json::from_value(json!({ key: "/etc/passwd" })).unwrap();
            let e = op.merge(&searchqa, request).unwrap_err();
            assert_eq!(e.status, StatusCode::FORBIDDEN);
            assert_eq!(e.body.kind, ErrorKind::ForbiddenParam);
            assert!(
                e.body.error.contains(&format!("'{key}'")),
                "{}",
                e.body.error
            );
        }
        let request: EnvParams = serde_json::from_value(json!({"sise": 1})).unwrap();
        let e = op.merge(&searchqa, request).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.body.error.contains("'sise'") && e.body.error.contains("top_k"));
    }
}
