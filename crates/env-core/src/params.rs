//! Typed `[env]` params: each env declares its params as a
//! `#[derive(Deserialize)] #[serde(deny_unknown_fields)]` struct whose
//! defaults are the env's defaults, and reads them with [`parse_params`].

use std::fmt::Display;
use std::ops::RangeInclusive;

use serde::de::DeserializeOwned;

use crate::{EnvError, EnvParams, TaskSpec};

/// The largest `max_steps` param any env accepts: every LLM turn budget in
/// use (RAGEN, AgentGym) is far below it, and a bound keeps a request from
/// asking for endless episodes.
pub const MAX_STEPS_PARAM: usize = 1000;

/// Read `params` into an env's typed params struct. A wrong type, an unknown
/// key (serde's message lists the known ones), a null or a value the struct's
/// own deserializer refuses is an [`EnvError::InvalidParam`] naming `env` and
/// the key.
pub fn parse_params<P: DeserializeOwned>(env: &str, params: &EnvParams) -> Result<P, EnvError> {
    // An optional key given as null must not read as "not given".
    if let Some((key, _)) = params.iter().find(|(_, v)| v.is_null()) {
        return Err(param_error(env, key, "expected a value, got null"));
    }
    let value = serde_json::Value::Object(params.clone());
    serde_path_to_error::deserialize(value).map_err(|e| {
        let key = e.path().to_string();
        param_error(env, &key, e.into_inner().to_string())
    })
}

/// The error for a parameter `key` of `env` that is refused for `reason`.
pub fn param_error(env: &str, key: &str, reason: impl Into<String>) -> EnvError {
    EnvError::InvalidParam {
        env: env.to_string(),
        key: key.to_string(),
        reason: reason.into(),
    }
}

/// `value` when it lies in `range`, else an error naming `env`, `key` and the range.
pub fn param_in_range<T: PartialOrd + Display>(
    env: &str,
    key: &str,
    value: T,
    range: RangeInclusive<T>,
) -> Result<T, EnvError> {
    if range.contains(&value) {
        return Ok(value);
    }
    Err(param_error(
        env,
        key,
        format!("must be between {} and {}", range.start(), range.end()),
    ))
}

/// An environment's typed task config: a preset per difficulty with the
/// `[env]` params on top. One trait so every env builds its config from a
/// spec the same way.
pub trait TaskConfig: Sized {
    /// The preset of a difficulty; an unknown one is an error naming it.
    fn for_difficulty(difficulty: &str) -> Result<Self, EnvError>;
    /// This config with `[env]` params applied; absent keys keep their value.
    fn with_params(self, params: &EnvParams) -> Result<Self, EnvError>;
    /// The config of `spec`'s difficulty with `params` applied.
    fn for_task(spec: &TaskSpec, params: &EnvParams) -> Result<Self, EnvError> {
        Self::for_difficulty(&spec.difficulty)?.with_params(params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Demo {
        #[serde(default = "three")]
        size: usize,
        #[serde(default)]
        slippery: bool,
    }

    fn three() -> usize {
        3
    }

    fn parse(json: &str) -> Result<Demo, EnvError> {
        parse_params("demo", &serde_json::from_str(json).unwrap())
    }

    #[test]
    fn defaults_fill_missing_keys() {
        assert_eq!(
            parse("{}").unwrap(),
            Demo {
                size: 3,
                slippery: false
            }
        );
        assert_eq!(parse(r#"{"slippery": true}"#).unwrap().size, 3);
    }

    #[test]
    fn errors_name_the_env_and_the_key() {
        let Err(EnvError::InvalidParam { env, key, reason }) = parse(r#"{"size": "big"}"#) else {
            panic!("a string size must be refused");
        };
        assert_eq!((env.as_str(), key.as_str()), ("demo", "size"));
        assert!(reason.contains("invalid type"), "{reason}");
        let Err(EnvError::InvalidParam { key, reason, .. }) = parse(r#"{"sise": 4}"#) else {
            panic!("an unknown key must be refused");
        };
        assert_eq!(key, "sise");
        assert!(reason.contains("`size`"), "known keys listed: {reason}");
        assert!(matches!(
            parse(r#"{"slippery": null}"#),
            Err(EnvError::InvalidParam { key, .. }) if key == "slippery"
        ));
    }

    #[test]
    fn range_check_names_the_bounds() {
        assert_eq!(param_in_range("demo", "size", 4, 2..=16), Ok(4));
        let e = param_in_range("demo", "size", 1, 2..=16).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid parameter 'size' for demo: must be between 2 and 16"
        );
    }
}
