//! What a request asks of the model, checked: every bad value is a 400
//! naming its field (`max_tokens`, `prompt[1]`, `messages[0].content`, …),
//! found before the model is queued.

use agentrl_model::{LogitAdjustment, SamplingParams};
use agentrl_policy_client::protocol::{
    ChatCompletionRequest, CompletionRequest, MessageContent, Prompt, PromptItem, SamplingFields,
    Stop,
};
use agentrl_tokenizer::{ChatMessage, ChatTokenizer};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

use crate::error::ApiError;
use crate::options::{self, StreamPlan, ToolPlan};

/// Sequences (prompts × `n`) one request may ask for at most.
pub const MAX_SEQUENCES_PER_REQUEST: usize = 1024;

/// What the server knows of its model when it checks a request.
#[derive(Debug, Clone)]
pub struct ModelLimits {
    /// Token ids must be below this.
    pub vocab_size: usize,
    /// Prompt plus generated tokens at most.
    pub max_model_len: usize,
    /// Where generation stops unless `ignore_eos`: the checkpoint's
    /// end-of-sequence ids (`generation_config.json`'s `eos_token_id`, with
    /// `<|im_end|>` and `<|endoftext|>`).
    pub eos_ids: Vec<u32>,
    /// The most bytes of text one token stands for
    /// ([`crate::bounds::max_token_bytes`]): a longer text cannot fit.
    pub max_token_bytes: usize,
}

/// Stop strings one request may give at most (vLLM and OpenAI take a few).
pub const MAX_STOP_STRINGS: usize = 64;
/// Bytes of one stop string at most.
pub const MAX_STOP_STRING_BYTES: usize = 1024;
/// `stop_token_ids` one request may give at most.
pub const MAX_STOP_TOKEN_IDS: usize = 1024;
/// The chat roles a request may use (OpenAI's).
pub const CHAT_ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

/// A checked request: the prompts as token ids and how to continue them.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The distinct prompts, in order.
    pub prompts: Vec<Vec<u32>>,
    /// Choices per prompt.
    pub n: usize,
    pub params: SamplingParams,
    /// Choice `i` samples from stream `i` of this seed.
    pub seed: u64,
    /// Stop strings, cut from the text (with the tokens after them).
    pub stop_strings: Vec<String>,
    /// Answer each sampled token's log-prob.
    pub logprobs: bool,
    /// Answer token ids (vLLM's `return_token_ids`).
    pub return_token_ids: bool,
    /// Choices generated per prompt (`best_of`, at least `n`): the `n`
    /// with the highest total log-prob are answered.
    pub best_of: usize,
    /// Top alternatives answered per token (0: none).
    pub top_logprobs: usize,
    /// Penalties and logit bias applied while sampling.
    pub adjust: LogitAdjustment,
    /// Answer each prompt before its choices (`echo`): its text as sent
    /// (token-id prompts decoded), per prompt; empty without `echo`.
    pub echo: Vec<String>,
    /// vLLM's `prompt_logprobs`: this many alternatives per prompt token.
    pub prompt_logprobs: Option<usize>,
    /// Answer as server-sent events.
    pub stream: Option<StreamPlan>,
    /// The request's own `stop_token_ids` (a stop on one of them is its
    /// `stop_reason`; a stop on the model's end-of-sequence is `null`).
    pub request_stop_ids: Vec<u32>,
    /// Read the answer for tool calls (a chat with tools).
    pub tools: Option<ToolPlan>,
}

impl Plan {
    /// Every sequence to generate with its random stream: prompt `p`'s
    /// choice `j` is choice index `p·best_of + j` (`p·n + j` as in vLLM's
    /// answers when `best_of` is `n`).
    pub fn sequences(&self) -> (Vec<Vec<u32>>, Vec<ChaCha8Rng>) {
        let mut prompts = Vec::with_capacity(self.prompts.len() * self.best_of);
        let mut rngs = Vec::with_capacity(prompts.capacity());
        for (p, prompt) in self.prompts.iter().enumerate() {
            for j in 0..self.best_of {
                prompts.push(prompt.clone());
                let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
                rng.set_stream((p * self.best_of + j) as u64);
                rngs.push(rng);
            }
        }
        (prompts, rngs)
    }

    /// Whether the prompts' own tokens are scored on the model thread
    /// (`echo` with `logprobs`, or `prompt_logprobs`), with how many
    /// alternatives per position.
    pub fn prompt_scoring(&self) -> Option<usize> {
        let echoed = (!self.echo.is_empty() && self.logprobs).then_some(self.top_logprobs);
        match (echoed, self.prompt_logprobs) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).max(b.unwrap_or(0))),
        }
    }
}

/// A `/v1/completions` request as a plan.
pub fn completion(
    req: &CompletionRequest,
    tokenizer: &ChatTokenizer,
    limits: &ModelLimits,
) -> Result<Plan, ApiError> {
    let top_logprobs = req
        .logprobs
        .map(|k| options::top_count("logprobs", k))
        .transpose()?;
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid(
            "suffix",
            "a suffix (text after the completion) is not supported: leave it out",
        ));
    }
    let echo = req.echo == Some(true);
    let items = req
        .prompt
        .as_ref()
        .ok_or_else(|| {
            ApiError::invalid("prompt", "required: text, token ids, or a list of either")
        })?
        .items();
    if items.is_empty() {
        return Err(ApiError::invalid("prompt", "the list of prompts is empty"));
    }
    let batch = matches!(req.prompt, Some(Prompt::Batch(_)));
    let mut prompts = Vec::with_capacity(items.len());
    let mut echoed = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let field = if batch {
            format!("prompt[{i}]")
        } else {
            "prompt".to_string()
        };
        let ids = match item {
            PromptItem::Text(t) => crate::bounds::encode_bounded(tokenizer, t, &field, limits)?,
            PromptItem::Tokens(ids) => ids.clone(),
        };
        check_prompt(&field, &ids, limits)?;
        if echo {
            echoed.push(match item {
                PromptItem::Text(t) => t.clone(),
                PromptItem::Tokens(ids) => tokenizer
                    .decode(ids, false)
                    .map_err(|e| ApiError::invalid(&field, format!("cannot decode: {e}")))?,
            });
        }
        prompts.push(ids);
    }
    // `echo` with `max_tokens: 0` scores the prompt alone (lm-eval's way).
    let score_only = echo && req.max_tokens == Some(0);
    let knobs = SamplingFields {
        max_tokens: if score_only { None } else { req.max_tokens },
        ..req.sampling()
    };
    let mut p = plan(
        prompts,
        &knobs,
        top_logprobs.is_some(),
        req.return_token_ids == Some(true),
        limits,
    )?;
    if score_only {
        p.params.max_new_tokens = 0;
    }
    p.top_logprobs = top_logprobs.unwrap_or(0);
    p.echo = echoed;
    if let Some(best_of) = req.best_of {
        if best_of < p.n {
            return Err(ApiError::invalid(
                "best_of",
                format!("best_of {best_of} must be at least n {}", p.n),
            ));
        }
        if best_of > p.n && p.stream.is_some() {
            return Err(ApiError::invalid(
                "best_of",
                "best_of above n cannot be streamed (the best choices are known at the end)",
            ));
        }
        if p.prompts.len().saturating_mul(best_of) > MAX_SEQUENCES_PER_REQUEST {
            return Err(ApiError::invalid(
                "best_of",
                format!(
                    "{} prompts × best_of {best_of} is more than the {MAX_SEQUENCES_PER_REQUEST} sequences one request may ask for",
                    p.prompts.len()
                ),
            ));
        }
        p.best_of = best_of;
    }
    Ok(p)
}

/// A `/v1/chat/completions` request as a plan: the messages rendered with
/// the checkpoint's chat template, ready for the assistant's turn.
pub fn chat(
    req: &ChatCompletionRequest,
    tokenizer: &ChatTokenizer,
    limits: &ModelLimits,
) -> Result<Plan, ApiError> {
    let top_logprobs = options::top_count("top_logprobs", req.top_logprobs.unwrap_or(0))?;
    if top_logprobs > 0 && req.logprobs != Some(true) {
        return Err(ApiError::invalid(
            "top_logprobs",
            "top_logprobs needs logprobs: true",
        ));
    }
    options::check_response_format(req.response_format.as_ref())?;
    let tools = options::tool_plan(req)?;
    let max_tokens = match (req.max_tokens, req.max_completion_tokens) {
        (Some(a), Some(b)) if a != b => {
            return Err(ApiError::invalid(
                "max_completion_tokens",
                format!("{b} disagrees with max_tokens {a}: give one of them"),
            ))
        }
        (a, b) => a.or(b),
    };
    let messages = req
        .messages
        .as_ref()
        .ok_or_else(|| ApiError::invalid("messages", "required: a list of {role, content}"))?;
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "the list of messages is empty",
        ));
    }
    let mut chat = Vec::with_capacity(messages.len());
    let mut json_messages = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        if !CHAT_ROLES.contains(&m.role.as_str()) {
            return Err(ApiError::invalid(
                &format!("messages[{i}].role"),
                format!(
                    "{:?} is not a chat role (one of {})",
                    m.role,
                    CHAT_ROLES.join(", ")
                ),
            ));
        }
        let content = match &m.content {
            None if m.role == "assistant" && m.tool_calls.is_some() => String::new(),
            None => {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].content"),
                    "required (null only on an assistant message with tool_calls)",
                ))
            }
            Some(MessageContent::Text(t)) => t.clone(),
            Some(MessageContent::Parts(parts)) => {
                let mut text = String::new();
                for (j, part) in parts.iter().enumerate() {
                    match (part.kind.as_str(), &part.text) {
                        ("text", Some(t)) => text.push_str(t),
                        ("text", None) => {
                            return Err(ApiError::invalid(
                                &format!("messages[{i}].content[{j}].text"),
                                "a text part needs its text",
                            ))
                        }
                        (other, _) => {
                            return Err(ApiError::invalid(
                                &format!("messages[{i}].content[{j}].type"),
                                format!("{other:?} parts are not served (text only)"),
                            ))
                        }
                    }
                }
                text
            }
        };
        json_messages.push(message_json(m, &content));
        chat.push(ChatMessage::new(m.role.clone(), content));
    }
    // Tools, tool calls and tool results go through the template's tools
    // support (or are written into the messages for a template without it);
    // a plain chat renders exactly as before.
    let uses_tools = tools.is_some()
        || messages
            .iter()
            .any(|m| m.role == "tool" || m.tool_calls.is_some() || m.tool_call_id.is_some());
    let text = if uses_tools {
        tokenizer.render_chat_with_tools(
            &json_messages,
            tools.as_ref().map(|t| t.tools.as_slice()),
            true,
        )
    } else {
        tokenizer.render_chat(&chat, true)
    }
    .map_err(|e| ApiError::invalid("messages", format!("cannot render the chat template: {e}")))?;
    let ids = crate::bounds::encode_bounded(tokenizer, &text, "messages", limits)?;
    check_prompt("messages", &ids, limits)?;
    let knobs = SamplingFields {
        max_tokens,
        ..req.sampling()
    };
    let mut p = plan(
        vec![ids],
        &knobs,
        req.logprobs == Some(true),
        req.return_token_ids == Some(true),
        limits,
    )?;
    p.top_logprobs = top_logprobs;
    p.tools = tools;
    Ok(p)
}

/// A chat message as the template reads it (OpenAI's JSON shape): its
/// text, and its tool calls or the call it answers.
fn message_json(m: &agentrl_policy_client::protocol::RequestMessage, content: &str) -> Value {
    let mut v = serde_json::json!({ "role": m.role, "content": content });
    if let Some(calls) = &m.tool_calls {
        v["tool_calls"] = serde_json::to_value(calls).unwrap_or(Value::Null);
    }
    if let Some(id) = &m.tool_call_id {
        v["tool_call_id"] = Value::from(id.clone());
    }
    if let Some(name) = &m.name {
        v["name"] = Value::from(name.clone());
    }
    v
}

/// A prompt must hold at least one token, ids in the vocabulary, and leave
/// room for one generated token.
fn check_prompt(field: &str, ids: &[u32], limits: &ModelLimits) -> Result<(), ApiError> {
    if ids.is_empty() {
        return Err(ApiError::invalid(field, "the prompt is empty"));
    }
    if let Some(bad) = ids.iter().find(|&&t| t as usize >= limits.vocab_size) {
        return Err(ApiError::invalid(
            field,
            format!(
                "token id {bad} is not below the vocabulary size {}",
                limits.vocab_size
            ),
        ));
    }
    if ids.len() >= limits.max_model_len {
        return Err(ApiError::invalid(
            field,
            format!(
                "the prompt has {} tokens: it leaves no room in the model's context of {} tokens",
                ids.len(),
                limits.max_model_len
            ),
        ));
    }
    Ok(())
}

/// The sampling parameters and the rest of the plan.
fn plan(
    prompts: Vec<Vec<u32>>,
    k: &SamplingFields<'_>,
    logprobs: bool,
    return_token_ids: bool,
    limits: &ModelLimits,
) -> Result<Plan, ApiError> {
    let stream = options::stream_plan(k.stream, k.stream_options)?;
    let adjust = options::adjustment(k, limits.vocab_size)?;
    let prompt_logprobs = k
        .prompt_logprobs
        .map(|n| options::top_count("prompt_logprobs", n))
        .transpose()?;
    let n = k.n.unwrap_or(1);
    if n == 0 {
        return Err(ApiError::invalid("n", "must be at least 1"));
    }
    if prompts.len().saturating_mul(n) > MAX_SEQUENCES_PER_REQUEST {
        return Err(ApiError::invalid(
            "n",
            format!(
                "{} prompts × n {n} is more than the {MAX_SEQUENCES_PER_REQUEST} sequences one request may ask for",
                prompts.len()
            ),
        ));
    }
    let temperature = k.temperature.unwrap_or(1.0);
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err(ApiError::invalid(
            "temperature",
            format!("{temperature} must be a finite number >= 0 (0 is greedy)"),
        ));
    }
    let top_p = k.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid(
            "top_p",
            format!("{top_p} must be in (0, 1]"),
        ));
    }
    let top_k = match k.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(t) if t > 0 => t as usize,
        Some(t) => {
            return Err(ApiError::invalid(
                "top_k",
                format!("{t} must be positive, or 0 or -1 (off)"),
            ))
        }
    };
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let room = limits.max_model_len.saturating_sub(longest);
    let max_new_tokens = match k.max_tokens {
        None => room,
        Some(0) => return Err(ApiError::invalid("max_tokens", "must be at least 1")),
        Some(m) if m > room => {
            return Err(ApiError::invalid(
                "max_tokens",
                format!(
                    "a prompt of {longest} tokens + max_tokens {m} is more than the model's context of {} tokens",
                    limits.max_model_len
                ),
            ))
        }
        Some(m) => m,
    };
    let stop_strings = k.stop.map(Stop::strings).unwrap_or_default();
    let stop_field = |i: usize| match k.stop {
        Some(Stop::Many(_)) => format!("stop[{i}]"),
        _ => "stop".to_string(),
    };
    if stop_strings.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "{} stop strings: at most {MAX_STOP_STRINGS}",
                stop_strings.len()
            ),
        ));
    }
    if let Some(i) = stop_strings.iter().position(String::is_empty) {
        return Err(ApiError::invalid(
            &stop_field(i),
            "a stop string must not be empty",
        ));
    }
    if let Some(i) = stop_strings
        .iter()
        .position(|s| s.len() > MAX_STOP_STRING_BYTES)
    {
        return Err(ApiError::invalid(
            &stop_field(i),
            format!(
                "a stop string of {} bytes: at most {MAX_STOP_STRING_BYTES}",
                stop_strings[i].len()
            ),
        ));
    }
    let stop_ids = k.stop_token_ids.unwrap_or_default();
    if stop_ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(ApiError::invalid(
            "stop_token_ids",
            format!("{} ids: at most {MAX_STOP_TOKEN_IDS}", stop_ids.len()),
        ));
    }
    let mut stop_tokens = Vec::new();
    for (i, &id) in stop_ids.iter().enumerate() {
        if id as usize >= limits.vocab_size {
            return Err(ApiError::invalid(
                &format!("stop_token_ids[{i}]"),
                format!(
                    "token id {id} is not below the vocabulary size {}",
                    limits.vocab_size
                ),
            ));
        }
        if !stop_tokens.contains(&id) {
            stop_tokens.push(id);
        }
    }
    let request_stop_ids = stop_tokens.clone();
    if k.ignore_eos != Some(true) {
        for &id in &limits.eos_ids {
            if !stop_tokens.contains(&id) {
                stop_tokens.push(id);
            }
        }
    }
    Ok(Plan {
        prompts,
        n,
        params: SamplingParams {
            max_new_tokens,
            temperature,
            top_p,
            top_k,
            stop_tokens,
        },
        // No seed: a fresh one, so unseeded requests differ as OpenAI's do.
        seed: k.seed.unwrap_or_else(rand::random::<u64>),
        stop_strings,
        logprobs,
        return_token_ids,
        best_of: n,
        top_logprobs: 0,
        adjust,
        echo: Vec::new(),
        prompt_logprobs,
        stream,
        request_stop_ids,
        tools: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ModelLimits {
        ModelLimits {
            vocab_size: 100,
            max_model_len: 10,
            eos_ids: vec![2],
            max_token_bytes: 16,
        }
    }

    /// No sampling field set but the seed.
    fn knobs() -> SamplingFields<'static> {
        SamplingFields {
            seed: Some(1),
            ..SamplingFields::default()
        }
    }

    fn param_of(e: ApiError) -> String {
        e.body.error.param.unwrap_or_default()
    }

    #[test]
    fn defaults_fill_the_context_and_stop_at_eos() {
        let p = plan(vec![vec![5, 6, 7]], &knobs(), false, false, &limits()).unwrap();
        assert_eq!(p.params.max_new_tokens, 7);
        assert_eq!(p.params.temperature, 1.0);
        assert_eq!(p.params.stop_tokens, vec![2]);
        let k = SamplingFields {
            ignore_eos: Some(true),
            stop_token_ids: Some(&[9, 9][..]),
            top_k: Some(-1),
            ..knobs()
        };
        let p = plan(vec![vec![5]], &k, false, false, &limits()).unwrap();
        assert_eq!((p.params.stop_tokens, p.params.top_k), (vec![9], 0));
    }

    /// The field a plan of one 4-token prompt with `k` is refused for.
    fn refused(k: SamplingFields<'_>) -> String {
        param_of(plan(vec![vec![5; 4]], &k, false, false, &limits()).unwrap_err())
    }

    #[test]
    fn each_bad_knob_is_named() {
        assert_eq!(
            refused(SamplingFields {
                n: Some(0),
                ..knobs()
            }),
            "n"
        );
        assert_eq!(
            refused(SamplingFields {
                n: Some(100_000),
                ..knobs()
            }),
            "n"
        );
        assert_eq!(
            refused(SamplingFields {
                temperature: Some(-1.0),
                ..knobs()
            }),
            "temperature"
        );
        assert_eq!(
            refused(SamplingFields {
                temperature: Some(f64::NAN),
                ..knobs()
            }),
            "temperature"
        );
        assert_eq!(
            refused(SamplingFields {
                top_p: Some(0.0),
                ..knobs()
            }),
            "top_p"
        );
        assert_eq!(
            refused(SamplingFields {
                top_k: Some(-2),
                ..knobs()
            }),
            "top_k"
        );
        assert_eq!(
            refused(SamplingFields {
                max_tokens: Some(0),
                ..knobs()
            }),
            "max_tokens"
        );
        // 4 prompt tokens + 7 > a context of 10.
        assert_eq!(
            refused(SamplingFields {
                max_tokens: Some(7),
                ..knobs()
            }),
            "max_tokens"
        );
        let opts = agentrl_policy_client::protocol::StreamOptions::default();
        assert_eq!(
            refused(SamplingFields {
                stream_options: Some(&opts),
                ..knobs()
            }),
            "stream_options"
        );
        assert_eq!(
            refused(SamplingFields {
                frequency_penalty: Some(-3.0),
                ..knobs()
            }),
            "frequency_penalty"
        );
        assert_eq!(
            refused(SamplingFields {
                prompt_logprobs: Some(21),
                ..knobs()
            }),
            "prompt_logprobs"
        );
        let ids = [3, 100];
        assert_eq!(
            refused(SamplingFields {
                stop_token_ids: Some(&ids),
                ..knobs()
            }),
            "stop_token_ids[1]"
        );
        let stop = Stop::Many(vec!["x".into(), String::new()]);
        assert_eq!(
            refused(SamplingFields {
                stop: Some(&stop),
                ..knobs()
            }),
            "stop[1]"
        );
        let stop = Stop::One(String::new());
        assert_eq!(
            refused(SamplingFields {
                stop: Some(&stop),
                ..knobs()
            }),
            "stop"
        );
        // Lists and strings past their bounds are refused, not kept.
        let stop = Stop::Many(vec!["x".into(); MAX_STOP_STRINGS + 1]);
        assert_eq!(
            refused(SamplingFields {
                stop: Some(&stop),
                ..knobs()
            }),
            "stop"
        );
        let stop = Stop::Many(vec!["x".into(), "y".repeat(MAX_STOP_STRING_BYTES + 1)]);
        assert_eq!(
            refused(SamplingFields {
                stop: Some(&stop),
                ..knobs()
            }),
            "stop[1]"
        );
        let ids = vec![3; MAX_STOP_TOKEN_IDS + 1];
        assert_eq!(
            refused(SamplingFields {
                stop_token_ids: Some(&ids),
                ..knobs()
            }),
            "stop_token_ids"
        );
        // At the bounds: accepted.
        let stop = Stop::Many(vec!["y".repeat(MAX_STOP_STRING_BYTES); MAX_STOP_STRINGS]);
        let ids = vec![3; MAX_STOP_TOKEN_IDS];
        let k = SamplingFields {
            stop: Some(&stop),
            stop_token_ids: Some(&ids),
            ..knobs()
        };
        assert!(plan(vec![vec![5; 4]], &k, false, false, &limits()).is_ok());
    }

    #[test]
    fn prompts_must_fit_the_vocabulary_and_the_context() {
        let l = limits();
        assert_eq!(
            param_of(check_prompt("prompt[1]", &[], &l).unwrap_err()),
            "prompt[1]"
        );
        let e = check_prompt("prompt", &[1, 100], &l).unwrap_err();
        assert!(e.body.error.message.contains("token id 100"), "{e:?}");
        assert!(check_prompt("prompt", &[1; 10], &l).is_err());
        assert!(check_prompt("prompt", &[1; 9], &l).is_ok());
    }

    #[test]
    fn stop_reason_ids_are_the_requests_own() {
        let ids = [9, 2];
        let k = SamplingFields {
            stop_token_ids: Some(&ids),
            stream: Some(true),
            ..knobs()
        };
        let p = plan(vec![vec![5]], &k, false, false, &limits()).unwrap();
        assert_eq!(p.request_stop_ids, vec![9, 2]);
        assert_eq!(p.params.stop_tokens, vec![9, 2]);
        assert_eq!(p.stream, Some(options::StreamPlan::default()));
        let p = plan(vec![vec![5]], &knobs(), false, false, &limits()).unwrap();
        assert!(p.request_stop_ids.is_empty());
        assert_eq!(p.params.stop_tokens, vec![2]);
    }

    #[test]
    fn choices_get_their_own_streams_of_the_seed() {
        let p = plan(
            vec![vec![1], vec![2]],
            &SamplingFields {
                n: Some(2),
                ..knobs()
            },
            false,
            false,
            &limits(),
        )
        .unwrap();
        let (prompts, rngs) = p.sequences();
        assert_eq!(prompts, vec![vec![1], vec![1], vec![2], vec![2]]);
        let streams: Vec<u64> = rngs.iter().map(ChaCha8Rng::get_stream).collect();
        assert_eq!(streams, vec![0, 1, 2, 3]);
    }
}
