//! Generations as OpenAI answers: stop strings cut, text decoded, finish
//! reasons, log-probs with top alternatives and text offsets, an echoed
//! prompt, vLLM's `prompt_logprobs`, `best_of`, tool calls, token ids and usage.

use std::collections::BTreeMap;

use agentrl_model::PromptTokenLogprob;
use agentrl_policy_client::protocol::{
    ChatChoice, ChatCompletionResponse, ChatLogprobs, ChatTokenLogprob, CompletionChoice,
    CompletionLogprobs, CompletionResponse, FunctionCall, PromptLogprob, PromptLogprobs,
    ResponseMessage, ToolCall, TopLogprob, Usage,
};
use agentrl_tokenizer::tools::parse_tool_calls;
use agentrl_tokenizer::{ChatTokenizer, TokenizerError};
use serde_json::Value;

use crate::batcher::{GenerateOutput, SequenceOutput};
use crate::plan::Plan;

/// Why a choice ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Finish {
    /// It generated one of the model's end-of-sequence tokens (included in
    /// its tokens): vLLM's `stop_reason` is then `null`.
    Eos(u32),
    /// It generated one of the request's `stop_token_ids` (included).
    StopToken(u32),
    /// Its text reached this stop string (cut from the text).
    StopString(String),
    /// It reached `max_tokens`.
    Length,
}

impl Finish {
    /// How a generation that `stopped` (or not) on `last` ended, before stop
    /// strings: the request's own stop ids are named in `stop_reason`.
    pub fn of(stopped: bool, last: Option<u32>, plan: &Plan) -> Self {
        match (stopped, last) {
            (true, Some(t)) if plan.request_stop_ids.contains(&t) => Finish::StopToken(t),
            (true, Some(t)) => Finish::Eos(t),
            _ => Finish::Length,
        }
    }

    /// OpenAI's `finish_reason`.
    pub fn reason(&self) -> &'static str {
        match self {
            Finish::Eos(_) | Finish::StopToken(_) | Finish::StopString(_) => "stop",
            Finish::Length => "length",
        }
    }

    /// vLLM's `stop_reason`: the stop token id or string that was asked
    /// for; `null` at the model's end of sequence or at the length limit.
    pub fn stop_reason(&self) -> Option<Value> {
        match self {
            Finish::StopToken(t) => Some(Value::from(*t)),
            Finish::StopString(s) => Some(Value::from(s.clone())),
            Finish::Eos(_) | Finish::Length => None,
        }
    }
}

/// One finished choice.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    /// Per token, its top alternatives (empty unless asked for).
    pub top: Vec<Vec<(u32, f32)>>,
    /// The text of `tokens` without special tokens, cut before a stop string.
    pub text: String,
    pub finish: Finish,
}

impl Choice {
    /// The total log-prob `best_of` ranks choices by.
    fn cumulative_logprob(&self) -> f64 {
        self.logprobs.iter().map(|&l| l as f64).sum()
    }
}

/// A generation with the plan's stop strings applied: at the earliest stop
/// string in its text, the text ends before it and the tokens end with the
/// token that completed it (as vLLM cuts them).
pub fn finish(
    tokenizer: &ChatTokenizer,
    out: SequenceOutput,
    plan: &Plan,
) -> Result<Choice, TokenizerError> {
    let SequenceOutput {
        generation: gen,
        mut top,
    } = out;
    top.resize(gen.tokens.len(), Vec::new());
    let text = tokenizer.decode(&gen.tokens, true)?;
    let earliest = plan
        .stop_strings
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
        top.truncate(keep);
        return Ok(Choice {
            tokens: gen.tokens[..keep].to_vec(),
            logprobs: gen.logprobs[..keep].to_vec(),
            top,
            text: text[..at].to_string(),
            finish: Finish::StopString(stop.clone()),
        });
    }
    let finish = Finish::of(gen.stopped, gen.tokens.last().copied(), plan);
    Ok(Choice {
        text,
        tokens: gen.tokens,
        logprobs: gen.logprobs,
        top,
        finish,
    })
}

/// Each token's own text (special tokens spelled out).
pub fn token_texts(
    tokenizer: &ChatTokenizer,
    tokens: &[u32],
) -> Result<Vec<String>, TokenizerError> {
    tokens
        .iter()
        .map(|&t| tokenizer.decode(&[t], false))
        .collect()
}

/// One token of a legacy `logprobs` object: its log-prob (none for an
/// echoed prompt's first token) and its top alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenRow {
    pub token: u32,
    pub logprob: Option<f32>,
    pub top: Option<Vec<(u32, f32)>>,
}

/// The legacy completions `logprobs` object of `rows`, offsets starting at
/// `offset` characters; also the offset after the last token. With
/// `with_top`, each row's alternatives (and the token itself, as vLLM
/// answers) as `{text: log-prob}`.
pub fn completion_logprobs(
    tokenizer: &ChatTokenizer,
    rows: &[TokenRow],
    with_top: bool,
    offset: usize,
) -> Result<(CompletionLogprobs, usize), TokenizerError> {
    let texts = token_texts(tokenizer, &rows.iter().map(|r| r.token).collect::<Vec<_>>())?;
    let mut offsets = Vec::with_capacity(rows.len());
    let mut at = offset;
    for t in &texts {
        offsets.push(at);
        // Offsets count characters, as Python's len() does.
        at += t.chars().count();
    }
    let top_logprobs = if with_top {
        let mut all = Vec::with_capacity(rows.len());
        for (r, text) in rows.iter().zip(&texts) {
            all.push(match (&r.top, r.logprob) {
                (Some(top), Some(lp)) => {
                    let mut map = serde_json::Map::new();
                    // The legacy format keys alternatives by their text:
                    // tokens that decode alike (byte pieces of one
                    // character) share a key, which keeps the likeliest.
                    for &(t, l) in top {
                        map.entry(tokenizer.decode(&[t], false)?)
                            .or_insert(f32_value(l));
                    }
                    map.entry(text.clone()).or_insert(f32_value(lp));
                    Value::Object(map)
                }
                _ => Value::Null,
            });
        }
        Some(Value::Array(all))
    } else {
        None
    };
    Ok((
        CompletionLogprobs {
            tokens: texts,
            token_logprobs: rows.iter().map(|r| r.logprob).collect(),
            top_logprobs,
            text_offset: Some(offsets),
        },
        at,
    ))
}

/// `x` as a JSON number written as f32 writes it (`-3.305683`, not the
/// f64 widening `-3.305682897567749`), so a top alternative's log-prob
/// reads the same as the sampled token's in `token_logprobs`.
fn f32_value(x: f32) -> Value {
    x.to_string()
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(Value::Null, Value::Number)
}

/// The rows of a generated choice's tokens.
pub fn choice_rows(tokens: &[u32], logprobs: &[f32], top: &[Vec<(u32, f32)>]) -> Vec<TokenRow> {
    tokens
        .iter()
        .zip(logprobs)
        .enumerate()
        .map(|(i, (&token, &lp))| TokenRow {
            token,
            logprob: Some(lp),
            top: Some(top.get(i).cloned().unwrap_or_default()),
        })
        .collect()
}

/// The rows of an echoed prompt: its first token has no log-prob; each
/// later one its score (alternatives cut to `k`).
pub fn prompt_rows(
    prompt: &[u32],
    scores: Option<&[PromptTokenLogprob]>,
    k: usize,
) -> Vec<TokenRow> {
    prompt
        .iter()
        .enumerate()
        .map(|(i, &token)| {
            let score = i.checked_sub(1).and_then(|j| scores.and_then(|s| s.get(j)));
            TokenRow {
                token,
                logprob: score.map(|s| s.logprob),
                top: score.map(|s| s.top.iter().take(k).copied().collect()),
            }
        })
        .collect()
}

/// A chat answer's `logprobs` of a choice's tokens, with `k` alternatives each.
pub fn chat_logprobs(
    tokenizer: &ChatTokenizer,
    tokens: &[u32],
    logprobs: &[f32],
    top: &[Vec<(u32, f32)>],
    k: usize,
) -> Result<ChatLogprobs, TokenizerError> {
    let mut content = Vec::with_capacity(tokens.len());
    for (i, (token, &logprob)) in token_texts(tokenizer, tokens)?
        .into_iter()
        .zip(logprobs)
        .enumerate()
    {
        let mut alternatives = Vec::new();
        for &(t, l) in top
            .get(i)
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .take(k)
        {
            let text = tokenizer.decode(&[t], false)?;
            alternatives.push(TopLogprob {
                bytes: text.as_bytes().to_vec(),
                token: text,
                logprob: l,
            });
        }
        content.push(ChatTokenLogprob {
            bytes: token.as_bytes().to_vec(),
            token,
            logprob,
            top_logprobs: alternatives,
        });
    }
    Ok(ChatLogprobs { content })
}

/// vLLM's `prompt_logprobs` of `prompt`: `null` for the first token, then
/// per token `{id: {logprob, rank, decoded_token}}` of the token itself and
/// its position's `k` most likely tokens.
pub fn prompt_logprobs(
    tokenizer: &ChatTokenizer,
    prompt: &[u32],
    scores: &[PromptTokenLogprob],
    k: usize,
) -> Result<PromptLogprobs, TokenizerError> {
    let mut out: PromptLogprobs = Vec::with_capacity(prompt.len());
    if !prompt.is_empty() {
        out.push(None);
    }
    for s in scores {
        let mut map = BTreeMap::new();
        for (r, &(t, l)) in s.top.iter().take(k).enumerate() {
            map.insert(
                t.to_string(),
                PromptLogprob {
                    logprob: l,
                    rank: r + 1,
                    decoded_token: tokenizer.decode(&[t], false)?,
                },
            );
        }
        map.insert(
            s.token.to_string(),
            PromptLogprob {
                logprob: s.logprob,
                rank: s.rank,
                decoded_token: tokenizer.decode(&[s.token], false)?,
            },
        );
        out.push(Some(map));
    }
    Ok(out)
}

/// Prompt and completion tokens of a request.
pub fn usage(plan: &Plan, completion_tokens: usize) -> Usage {
    let prompt_tokens = plan.prompts.iter().map(Vec::len).sum();
    Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens + completion_tokens,
    }
}

/// Seconds since the Unix epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A random id with OpenAI's prefix (`cmpl`, `chatcmpl`, `call`).
pub fn request_id(prefix: &str) -> String {
    format!("{prefix}-{:032x}", rand::random::<u128>())
}

/// The choices answered and their prompt: per prompt, the `n` of its
/// `best_of` choices with the highest total log-prob (all `n` when
/// `best_of` is `n`, in order).
fn answered(plan: &Plan, choices: Vec<Choice>) -> Vec<(usize, Choice)> {
    let mut out = Vec::with_capacity(plan.prompts.len() * plan.n);
    let mut all = choices.into_iter();
    for p in 0..plan.prompts.len() {
        let mut mine: Vec<Choice> = all.by_ref().take(plan.best_of).collect();
        if plan.best_of > plan.n {
            // Stable: equal totals keep their order.
            mine.sort_by(|a, b| b.cumulative_logprob().total_cmp(&a.cumulative_logprob()));
            mine.truncate(plan.n);
        }
        out.extend(mine.into_iter().map(|c| (p, c)));
    }
    out
}

/// The `/v1/completions` answer: choice `i` is prompt `i / n`'s choice `i % n`.
pub fn completion_response(
    tokenizer: &ChatTokenizer,
    model: &str,
    plan: &Plan,
    output: GenerateOutput,
) -> Result<CompletionResponse, TokenizerError> {
    let scores = output.prompt_scores;
    let choices = output
        .sequences
        .into_iter()
        .map(|s| finish(tokenizer, s, plan))
        .collect::<Result<Vec<_>, _>>()?;
    let choices = answered(plan, choices);
    let usage = usage(plan, choices.iter().map(|(_, c)| c.tokens.len()).sum());
    let mut out = Vec::with_capacity(choices.len());
    for (index, (p, c)) in choices.into_iter().enumerate() {
        let prompt = &plan.prompts[p];
        let echoed = plan.echo.get(p);
        let logprobs = if plan.logprobs {
            let mut rows = match echoed {
                Some(_) => prompt_rows(prompt, scores.get(p).map(Vec::as_slice), plan.top_logprobs),
                None => Vec::new(),
            };
            rows.extend(choice_rows(&c.tokens, &c.logprobs, &c.top));
            Some(completion_logprobs(tokenizer, &rows, plan.top_logprobs > 0, 0)?.0)
        } else {
            None
        };
        let prompt_logprobs = match plan.prompt_logprobs {
            Some(k) => Some(prompt_logprobs(
                tokenizer,
                prompt,
                scores.get(p).map(Vec::as_slice).unwrap_or_default(),
                k,
            )?),
            None => None,
        };
        out.push(CompletionChoice {
            index,
            text: match echoed {
                Some(e) => format!("{e}{}", c.text),
                None => c.text,
            },
            logprobs,
            finish_reason: Some(c.finish.reason().to_string()),
            stop_reason: c.finish.stop_reason(),
            prompt_token_ids: plan.return_token_ids.then(|| prompt.clone()),
            token_ids: plan.return_token_ids.then_some(c.tokens),
            prompt_logprobs,
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

/// A chat reply's message: with tools, read for calls (vLLM's `hermes`
/// parser); returns it with whether it made calls.
pub fn reply_message(text: String, plan: &Plan) -> (ResponseMessage, bool) {
    let Some(tools) = &plan.tools else {
        return (
            ResponseMessage {
                role: "assistant".into(),
                content: Some(text),
                tool_calls: None,
            },
            false,
        );
    };
    let parsed = parse_tool_calls(&text);
    if parsed.tool_calls.is_empty() {
        return (
            ResponseMessage {
                role: "assistant".into(),
                content: Some(text),
                tool_calls: None,
            },
            false,
        );
    }
    let keep = if tools.parallel {
        parsed.tool_calls.len()
    } else {
        1
    };
    let calls = parsed
        .tool_calls
        .into_iter()
        .take(keep)
        .map(|c| ToolCall {
            id: format!("call_{:024x}", rand::random::<u128>() >> 32),
            kind: "function".into(),
            function: FunctionCall {
                name: c.name,
                arguments: c.arguments,
            },
        })
        .collect();
    (
        ResponseMessage {
            role: "assistant".into(),
            content: parsed.content,
            tool_calls: Some(calls),
        },
        true,
    )
}

/// The `/v1/chat/completions` answer.
pub fn chat_response(
    tokenizer: &ChatTokenizer,
    model: &str,
    plan: &Plan,
    output: GenerateOutput,
) -> Result<ChatCompletionResponse, TokenizerError> {
    let prompt_logprobs = match plan.prompt_logprobs {
        Some(k) => Some(prompt_logprobs(
            tokenizer,
            &plan.prompts[0],
            output
                .prompt_scores
                .first()
                .map(Vec::as_slice)
                .unwrap_or_default(),
            k,
        )?),
        None => None,
    };
    let choices = output
        .sequences
        .into_iter()
        .map(|s| finish(tokenizer, s, plan))
        .collect::<Result<Vec<_>, _>>()?;
    let usage = usage(plan, choices.iter().map(|c| c.tokens.len()).sum());
    let mut out = Vec::with_capacity(choices.len());
    for (index, c) in choices.into_iter().enumerate() {
        let logprobs = if plan.logprobs {
            Some(chat_logprobs(
                tokenizer,
                &c.tokens,
                &c.logprobs,
                &c.top,
                plan.top_logprobs,
            )?)
        } else {
            None
        };
        let (message, called) = reply_message(c.text, plan);
        let finish_reason = match (&c.finish, called) {
            (Finish::Length, _) | (_, false) => c.finish.reason(),
            (_, true) => "tool_calls",
        };
        out.push(ChatChoice {
            index,
            message,
            logprobs,
            finish_reason: Some(finish_reason.to_string()),
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
        prompt_logprobs,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::options::ToolPlan;
    use agentrl_model::{Generation, LogitAdjustment, SamplingParams};

    pub(crate) fn fixture_tokenizer() -> ChatTokenizer {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/data/qwen2-tiny");
        ChatTokenizer::load(dir).expect("the qwen2-tiny fixture's tokenizer")
    }

    /// A chat plan with `tools` (or none), ending at `<|im_end|>`.
    pub(crate) fn plan(tools: Option<ToolPlan>, im_end: u32) -> Plan {
        Plan {
            prompts: vec![vec![1, 2, 3]],
            n: 1,
            params: SamplingParams {
                max_new_tokens: 200,
                stop_tokens: vec![im_end],
                ..SamplingParams::default()
            },
            seed: 0,
            stop_strings: Vec::new(),
            logprobs: false,
            return_token_ids: false,
            best_of: 1,
            top_logprobs: 0,
            adjust: LogitAdjustment::default(),
            echo: Vec::new(),
            prompt_logprobs: None,
            stream: None,
            request_stop_ids: Vec::new(),
            tools,
        }
    }

    /// The model's reply as the model thread returns it: its tokens, then
    /// the end of its turn.
    fn output(tok: &ChatTokenizer, reply: &str, im_end: u32) -> GenerateOutput {
        let mut tokens = tok.encode(reply).expect("encode");
        tokens.push(im_end);
        GenerateOutput {
            sequences: vec![SequenceOutput {
                generation: Generation {
                    logprobs: vec![-0.5; tokens.len()],
                    tokens,
                    stopped: true,
                },
                top: Vec::new(),
            }],
            prompt_scores: Vec::new(),
        }
    }

    #[test]
    fn a_tool_call_reply_is_answered_as_tool_calls_with_their_finish_reason() {
        let tok = fixture_tokenizer();
        let im_end = tok.token_id("<|im_end|>").expect("<|im_end|>");
        let reply = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let tools = ToolPlan {
            tools: vec![
                serde_json::json!({"type": "function", "function": {"name": "get_weather"}}),
            ],
            parallel: true,
        };
        let answer = chat_response(
            &tok,
            "tiny",
            &plan(Some(tools), im_end),
            output(&tok, reply, im_end),
        )
        .expect("answer");
        let choice = &answer.choices[0];
        assert_eq!(choice.finish_reason.as_deref(), Some("tool_calls"));
        // An end of turn at the model's own end of sequence: no stop_reason.
        assert_eq!(choice.stop_reason, None);
        assert_eq!(choice.message.content.as_deref(), Some("Let me look.\n"));
        let calls = choice.message.tool_calls.as_ref().expect("tool_calls");
        assert_eq!(calls.len(), 1);
        assert!(calls[0].id.starts_with("call_"), "{}", calls[0].id);
        assert_eq!(calls[0].kind, "function");
        assert_eq!(calls[0].function.name, "get_weather");
        let args: Value = serde_json::from_str(&calls[0].function.arguments).expect("JSON");
        assert_eq!(args, serde_json::json!({"city": "Paris"}));
        // Without tools the same reply is plain content.
        let answer = chat_response(
            &tok,
            "tiny",
            &plan(None, im_end),
            output(&tok, reply, im_end),
        )
        .expect("answer");
        let choice = &answer.choices[0];
        assert_eq!(choice.finish_reason.as_deref(), Some("stop"));
        assert_eq!(choice.message.content.as_deref(), Some(reply));
        assert!(choice.message.tool_calls.is_none());
    }
}
