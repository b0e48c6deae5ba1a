//! The request fields beyond sampling proper, checked: penalties and
//! `logit_bias` (as a [`LogitAdjustment`]), the number of top alternatives,
//! `stream_options`, `response_format`, and `tools` with `tool_choice`.
//! Each bad value is a 400 naming its field, as in [`crate::plan`].

use agentrl_model::steering::{MAX_LOGIT_BIAS, MAX_PENALTY};
use agentrl_model::LogitAdjustment;
use agentrl_policy_client::protocol::{
    ChatCompletionRequest, ResponseFormat, SamplingFields, StreamOptions,
};
use serde_json::Value;

use crate::error::ApiError;

/// Top alternatives per token at most: vLLM's default `max_logprobs` (and
/// OpenAI's bound for chat).
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// How a streamed answer is framed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamPlan {
    /// A last chunk with the usage, and `"usage": null` in the others.
    pub include_usage: bool,
    /// vLLM's `continuous_usage_stats`: the usage so far in every chunk.
    pub continuous_usage: bool,
}

/// How a chat answer treats tools.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolPlan {
    /// The tools' JSON (`{"type": "function", "function": {…}}`), as the
    /// chat template reads them.
    pub tools: Vec<Value>,
    /// More than one call may be answered (`parallel_tool_calls`).
    pub parallel: bool,
}

/// `stream` and `stream_options`: `None` when not streaming.
pub fn stream_plan(
    stream: Option<bool>,
    options: Option<&StreamOptions>,
) -> Result<Option<StreamPlan>, ApiError> {
    let streaming = stream == Some(true);
    match options {
        Some(_) if !streaming => Err(ApiError::invalid(
            "stream_options",
            "stream_options is only allowed with stream: true",
        )),
        _ if !streaming => Ok(None),
        o => Ok(Some(StreamPlan {
            include_usage: o.and_then(|o| o.include_usage) == Some(true),
            continuous_usage: o.and_then(|o| o.continuous_usage_stats) == Some(true),
        })),
    }
}

/// Penalties and `logit_bias` of `k` as the adjustment sampling applies;
/// bias keys must be token ids below `vocab_size`.
pub fn adjustment(k: &SamplingFields<'_>, vocab_size: usize) -> Result<LogitAdjustment, ApiError> {
    let penalty = |field: &str, v: Option<f64>| -> Result<f32, ApiError> {
        match v {
            None => Ok(0.0),
            Some(x) if x.is_finite() && x.abs() <= MAX_PENALTY as f64 => Ok(x as f32),
            Some(x) => Err(ApiError::invalid(
                field,
                format!("{x} must be between -{MAX_PENALTY} and {MAX_PENALTY}"),
            )),
        }
    };
    let mut logit_bias = Vec::new();
    for (key, &bias) in k.logit_bias.into_iter().flatten() {
        let field = format!("logit_bias.{key}");
        let id = key
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|&id| (id as usize) < vocab_size)
            .ok_or_else(|| {
                ApiError::invalid(
                    &field,
                    format!("{key:?} is not a token id below the vocabulary size {vocab_size}"),
                )
            })?;
        if !(bias.is_finite() && bias.abs() <= MAX_LOGIT_BIAS as f64) {
            return Err(ApiError::invalid(
                &field,
                format!("{bias} must be between -{MAX_LOGIT_BIAS} and {MAX_LOGIT_BIAS}"),
            ));
        }
        logit_bias.push((id, bias as f32));
    }
    Ok(LogitAdjustment {
        frequency_penalty: penalty("frequency_penalty", k.frequency_penalty)?,
        presence_penalty: penalty("presence_penalty", k.presence_penalty)?,
        logit_bias,
    })
}

/// A number of top alternatives (`logprobs`, `top_logprobs`,
/// `prompt_logprobs`) within [`MAX_TOP_LOGPROBS`].
pub fn top_count(field: &str, k: u32) -> Result<usize, ApiError> {
    if k > MAX_TOP_LOGPROBS {
        return Err(ApiError::invalid(
            field,
            format!("{k} top alternatives; at most {MAX_TOP_LOGPROBS}"),
        ));
    }
    Ok(k as usize)
}

/// `response_format`: `text` is what is served anyway; the JSON modes need
/// decoding constrained to a grammar, which this server does not do.
pub fn check_response_format(format: Option<&ResponseFormat>) -> Result<(), ApiError> {
    match format.map(|f| f.kind.as_str()) {
        None | Some("text") => Ok(()),
        Some(mode @ ("json_object" | "json_schema")) => Err(ApiError::invalid(
            "response_format",
            format!(
                "response_format {mode:?} is not supported: agentrl serve-policy does not \
                 constrain decoding to JSON; send {{\"type\": \"text\"}} or leave it out, \
                 and ask for JSON in the prompt"
            ),
        )),
        Some(other) => Err(ApiError::invalid(
            "response_format.type",
            format!("{other:?} is not a response format (text, json_object, json_schema)"),
        )),
    }
}

/// The tools a chat request offers and whether its answer is read for
/// calls: with tools and `tool_choice` `"auto"` (or none given) they are
/// rendered and parsed; `"none"` leaves them out of the prompt (as vLLM
/// does); forcing a call (`"required"`, a named function) needs constrained
/// decoding and is refused.
pub fn tool_plan(req: &ChatCompletionRequest) -> Result<Option<ToolPlan>, ApiError> {
    let tools = req.tools.as_deref().unwrap_or_default();
    for (i, t) in tools.iter().enumerate() {
        if t.kind != "function" {
            return Err(ApiError::invalid(
                &format!("tools[{i}].type"),
                format!("{:?} tools are not served (function only)", t.kind),
            ));
        }
        if t.function.name.trim().is_empty() {
            return Err(ApiError::invalid(
                &format!("tools[{i}].function.name"),
                "a function needs a name",
            ));
        }
    }
    let choice = match &req.tool_choice {
        None => "auto",
        Some(Value::String(s)) => s.as_str(),
        Some(_) => "named",
    };
    match choice {
        "none" => Ok(None),
        "auto" if tools.is_empty() => Ok(None),
        "auto" => Ok(Some(ToolPlan {
            tools: tools
                .iter()
                .map(|t| serde_json::to_value(t).unwrap_or(Value::Null))
                .collect(),
            parallel: req.parallel_tool_calls != Some(false),
        })),
        "required" | "named" => Err(ApiError::invalid(
            "tool_choice",
            "forcing a tool call (\"required\" or a named function) needs decoding constrained \
             to the tool's schema, which agentrl serve-policy does not do: send \"auto\" or \"none\"",
        )),
        other => Err(ApiError::invalid(
            "tool_choice",
            format!("{other:?} is not a tool choice (auto, none)"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn param_of(e: ApiError) -> String {
        e.body.error.param.unwrap_or_default()
    }

    #[test]
    fn penalties_and_bias_become_the_adjustment() {
        let bias: BTreeMap<String, f64> = [("7".to_string(), -100.0), ("3".into(), 2.5)].into();
        let k = SamplingFields {
            frequency_penalty: Some(0.5),
            presence_penalty: Some(-1.0),
            logit_bias: Some(&bias),
            ..SamplingFields::default()
        };
        let a = adjustment(&k, 10).unwrap();
        assert_eq!(a.frequency_penalty, 0.5);
        assert_eq!(a.presence_penalty, -1.0);
        assert_eq!(a.logit_bias, vec![(3, 2.5), (7, -100.0)]);
        // Neutral values, as SDKs send them, change nothing.
        let empty = BTreeMap::new();
        let k = SamplingFields {
            frequency_penalty: Some(0.0),
            presence_penalty: Some(0.0),
            logit_bias: Some(&empty),
            ..SamplingFields::default()
        };
        assert!(adjustment(&k, 10).unwrap().is_neutral());
    }

    #[test]
    fn out_of_range_adjustments_are_named() {
        let k = SamplingFields {
            frequency_penalty: Some(2.5),
            ..SamplingFields::default()
        };
        assert_eq!(
            param_of(adjustment(&k, 10).unwrap_err()),
            "frequency_penalty"
        );
        let k = SamplingFields {
            presence_penalty: Some(f64::NAN),
            ..SamplingFields::default()
        };
        assert_eq!(
            param_of(adjustment(&k, 10).unwrap_err()),
            "presence_penalty"
        );
        for (key, v) in [("10", 1.0), ("x", 1.0), ("-1", 1.0), ("2", 101.0)] {
            let bias: BTreeMap<String, f64> = [(key.to_string(), v)].into();
            let k = SamplingFields {
                logit_bias: Some(&bias),
                ..SamplingFields::default()
            };
            assert_eq!(
                param_of(adjustment(&k, 10).unwrap_err()),
                format!("logit_bias.{key}")
            );
        }
    }

    #[test]
    fn json_modes_are_refused_with_the_reason() {
        let f = |kind: &str| ResponseFormat {
            kind: kind.into(),
            json_schema: None,
        };
        assert!(check_response_format(Some(&f("text"))).is_ok());
        for mode in ["json_object", "json_schema"] {
            let e = check_response_format(Some(&f(mode))).unwrap_err();
            assert!(
                e.body.error.message.contains("does not constrain decoding"),
                "{e:?}"
            );
        }
        assert_eq!(
            param_of(check_response_format(Some(&f("xml"))).unwrap_err()),
            "response_format.type"
        );
    }

    #[test]
    fn tool_choice_auto_none_and_forced() {
        let req = |choice: Option<Value>| -> ChatCompletionRequest {
            serde_json::from_value(serde_json::json!({
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                "tool_choice": choice,
            }))
            .unwrap()
        };
        let auto = tool_plan(&req(None)).unwrap().unwrap();
        assert_eq!(auto.tools[0]["function"]["name"], "f");
        assert!(auto.parallel);
        assert!(tool_plan(&req(Some("none".into()))).unwrap().is_none());
        for forced in [
            Value::from("required"),
            serde_json::json!({"type": "function", "function": {"name": "f"}}),
        ] {
            assert_eq!(
                param_of(tool_plan(&req(Some(forced))).unwrap_err()),
                "tool_choice"
            );
        }
        assert_eq!(top_count("logprobs", 20).unwrap(), 20);
        assert_eq!(param_of(top_count("logprobs", 21).unwrap_err()), "logprobs");
        assert_eq!(
            param_of(stream_plan(None, Some(&StreamOptions::default())).unwrap_err()),
            "stream_options"
        );
    }
}
