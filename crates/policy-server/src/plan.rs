//! What a request asks of the model, checked: every bad value is a 400
//! naming its field (`max_tokens`, `prompt[1]`, `messages[0].content`, …),
//! found before the model is queued.

use agentrl_model::SamplingParams;
use agentrl_policy_client::protocol::{
    ChatCompletionRequest, CompletionRequest, MessageContent, Prompt, PromptItem, SamplingFields,
    Stop,
};
use agentrl_tokenizer::{ChatMessage, ChatTokenizer};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::error::ApiError;

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
}

impl Plan {
    /// Every sequence to generate with its random stream: prompt `p`'s
    /// choice `j` is choice index `p·n + j`, as in vLLM's answers.
    pub fn sequences(&self) -> (Vec<Vec<u32>>, Vec<ChaCha8Rng>) {
        let mut prompts = Vec::with_capacity(self.prompts.len() * self.n);
        let mut rngs = Vec::with_capacity(prompts.capacity());
        for (p, prompt) in self.prompts.iter().enumerate() {
            for j in 0..self.n {
                prompts.push(prompt.clone());
                let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
                rng.set_stream((p * self.n + j) as u64);
                rngs.push(rng);
            }
        }
        (prompts, rngs)
    }
}

/// A `/v1/completions` request as a plan.
pub fn completion(
    req: &CompletionRequest,
    tokenizer: &ChatTokenizer,
    limits: &ModelLimits,
) -> Result<Plan, ApiError> {
    refuse_flag("echo", req.echo, "echo")?;
    let logprobs = match req.logprobs {
        None => false,
        Some(0) => true,
        Some(k) => {
            return Err(ApiError::invalid(
                "logprobs",
                format!("{k} top alternatives per token are not computed: send 0 to get each sampled token's log-prob"),
            ))
        }
    };
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
        prompts.push(ids);
    }
    plan(
        prompts,
        &req.sampling(),
        logprobs,
        req.return_token_ids == Some(true),
        limits,
    )
}

/// A `/v1/chat/completions` request as a plan: the messages rendered with
/// the checkpoint's chat template, ready for the assistant's turn.
pub fn chat(
    req: &ChatCompletionRequest,
    tokenizer: &ChatTokenizer,
    limits: &ModelLimits,
) -> Result<Plan, ApiError> {
    if req.top_logprobs.is_some_and(|k| k > 0) {
        return Err(ApiError::invalid(
            "top_logprobs",
            "top alternatives are not computed: send 0 or leave it out (logprobs: true gives each sampled token's log-prob)",
        ));
    }
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
            MessageContent::Text(t) => t.clone(),
            MessageContent::Parts(parts) => {
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
        chat.push(ChatMessage::new(m.role.clone(), content));
    }
    let text = tokenizer.render_chat(&chat, true).map_err(|e| {
        ApiError::invalid("messages", format!("cannot render the chat template: {e}"))
    })?;
    let ids = crate::bounds::encode_bounded(tokenizer, &text, "messages", limits)?;
    check_prompt("messages", &ids, limits)?;
    let knobs = SamplingFields {
        max_tokens,
        ..req.sampling()
    };
    plan(
        vec![ids],
        &knobs,
        req.logprobs == Some(true),
        req.return_token_ids == Some(true),
        limits,
    )
}

/// A flag the server does not support (`what`) passes only as `false` or
/// left out.
fn refuse_flag(field: &str, value: Option<bool>, what: &str) -> Result<(), ApiError> {
    match value {
        Some(true) => Err(ApiError::invalid(
            field,
            format!("{what} is not supported: send false or leave it out"),
        )),
        _ => Ok(()),
    }
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
    refuse_flag("stream", k.stream, "streaming")?;
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
        assert_eq!(
            refused(SamplingFields {
                stream: Some(true),
                ..knobs()
            }),
            "stream"
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
