//! Generations as OpenAI answers: stop strings cut, text decoded, finish
//! reasons, log-probs, token ids and usage.

use agentrl_model::Generation;
use agentrl_policy_client::protocol::{
    ChatChoice, ChatCompletionResponse, ChatLogprobs, ChatTokenLogprob, CompletionChoice,
    CompletionLogprobs, CompletionResponse, ResponseMessage, Usage,
};
use agentrl_tokenizer::{ChatTokenizer, TokenizerError};
use serde_json::Value;

use crate::plan::Plan;

/// Why a choice ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Finish {
    /// It generated this stop token (included in its tokens).
    StopToken(u32),
    /// Its text reached this stop string (cut from the text).
    StopString(String),
    /// It reached `max_tokens`.
    Length,
}

impl Finish {
    /// OpenAI's `finish_reason`.
    pub fn reason(&self) -> &'static str {
        match self {
            Finish::StopToken(_) | Finish::StopString(_) => "stop",
            Finish::Length => "length",
        }
    }

    /// vLLM's `stop_reason`: the stop token id or string.
    pub fn stop_reason(&self) -> Option<Value> {
        match self {
            Finish::StopToken(t) => Some(Value::from(*t)),
            Finish::StopString(s) => Some(Value::from(s.clone())),
            Finish::Length => None,
        }
    }
}

/// One finished choice.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    /// The text of `tokens` without special tokens, cut before a stop string.
    pub text: String,
    pub finish: Finish,
}

/// A generation with `stop_strings` applied: at the earliest stop string in
/// its text, the text ends before it and the tokens end with the token that
/// completed it (as vLLM cuts them).
pub fn finish(
    tokenizer: &ChatTokenizer,
    gen: Generation,
    stop_strings: &[String],
) -> Result<Choice, TokenizerError> {
    let text = tokenizer.decode(&gen.tokens, true)?;
    let earliest = stop_strings
        .iter()
        .filter_map(|s| text.find(s.as_str()).map(|at| (at, s)))
        .min_by_key(|&(at, s)| (at, std::cmp::Reverse(s.len())));
    if let Some((at, stop)) = earliest {
        let end = at + stop.len();
        let mut keep = gen.tokens.len();
        for k in 1..=gen.tokens.len() {
            if tokenizer.decode(&gen.tokens[..k], true)?.len() >= end {
                keep = k;
                break;
            }
        }
        return Ok(Choice {
            tokens: gen.tokens[..keep].to_vec(),
            logprobs: gen.logprobs[..keep].to_vec(),
            text: text[..at].to_string(),
            finish: Finish::StopString(stop.clone()),
        });
    }
    let finish = match (gen.stopped, gen.tokens.last()) {
        (true, Some(&t)) => Finish::StopToken(t),
        _ => Finish::Length,
    };
    Ok(Choice {
        text,
        tokens: gen.tokens,
        logprobs: gen.logprobs,
        finish,
    })
}

/// Each token's own text (special tokens spelled out).
fn token_texts(tokenizer: &ChatTokenizer, tokens: &[u32]) -> Result<Vec<String>, TokenizerError> {
    tokens
        .iter()
        .map(|&t| tokenizer.decode(&[t], false))
        .collect()
}

/// Prompt and completion tokens of a request.
fn usage(plan: &Plan, choices: &[Choice]) -> Usage {
    let prompt_tokens = plan.prompts.iter().map(Vec::len).sum();
    let completion_tokens = choices.iter().map(|c| c.tokens.len()).sum();
    Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens + completion_tokens,
    }
}

/// Seconds since the Unix epoch.
fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A random request id with OpenAI's prefix.
fn request_id(prefix: &str) -> String {
    format!("{prefix}-{:032x}", rand::random::<u128>())
}

/// The `/v1/completions` answer: choice `i` is prompt `i / n`'s choice `i % n`.
pub fn completion_response(
    tokenizer: &ChatTokenizer,
    model: &str,
    plan: &Plan,
    choices: Vec<Choice>,
) -> Result<CompletionResponse, TokenizerError> {
    let usage = usage(plan, &choices);
    let mut out = Vec::with_capacity(choices.len());
    for (index, c) in choices.into_iter().enumerate() {
        let logprobs = match plan.logprobs {
            true => Some(CompletionLogprobs {
                tokens: token_texts(tokenizer, &c.tokens)?,
                token_logprobs: c.logprobs.iter().map(|&l| Some(l)).collect(),
                top_logprobs: None,
            }),
            false => None,
        };
        out.push(CompletionChoice {
            index,
            text: c.text,
            logprobs,
            finish_reason: Some(c.finish.reason().to_string()),
            stop_reason: c.finish.stop_reason(),
            prompt_token_ids: plan
                .return_token_ids
                .then(|| plan.prompts[index / plan.n].clone()),
            token_ids: plan.return_token_ids.then_some(c.tokens),
        });
    }
    Ok(CompletionResponse {
        id: request_id("cmpl"),
        object: "text_completion".into(),
        created: now(),
        model: model.to_string(),
        choices: out,
        usage: Some(usage),
    })
}

/// The `/v1/chat/completions` answer.
pub fn chat_response(
    tokenizer: &ChatTokenizer,
    model: &str,
    plan: &Plan,
    choices: Vec<Choice>,
) -> Result<ChatCompletionResponse, TokenizerError> {
    let usage = usage(plan, &choices);
    let mut out = Vec::with_capacity(choices.len());
    for (index, c) in choices.into_iter().enumerate() {
        let logprobs = match plan.logprobs {
            true => Some(ChatLogprobs {
                content: token_texts(tokenizer, &c.tokens)?
                    .into_iter()
                    .zip(&c.logprobs)
                    .map(|(token, &logprob)| ChatTokenLogprob {
                        bytes: token.as_bytes().to_vec(),
                        token,
                        logprob,
                        top_logprobs: Vec::new(),
                    })
                    .collect(),
            }),
            false => None,
        };
        out.push(ChatChoice {
            index,
            message: ResponseMessage {
                role: "assistant".into(),
                content: c.text,
            },
            logprobs,
            finish_reason: Some(c.finish.reason().to_string()),
            stop_reason: c.finish.stop_reason(),
            token_ids: plan.return_token_ids.then_some(c.tokens),
        });
    }
    Ok(ChatCompletionResponse {
        id: request_id("chatcmpl"),
        object: "chat.completion".into(),
        created: now(),
        model: model.to_string(),
        choices: out,
        usage: Some(usage),
        prompt_token_ids: plan.return_token_ids.then(|| plan.prompts[0].clone()),
    })
}
