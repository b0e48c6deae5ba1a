//! The OpenAI-compatible wire types: `/v1/completions`,
//! `/v1/chat/completions`, `/v1/models` and the error body, with the vLLM
//! extensions rollouts need (`return_token_ids`, `stop_token_ids`,
//! `ignore_eos`, `top_k`).
//!
//! Requests are strict (`deny_unknown_fields`: `agentrl serve-policy`
//! rejects a field it would otherwise ignore); answers are lenient (vLLM and
//! SGLang add fields of their own).

use serde::{Deserialize, Serialize};

/// `prompt` of a completions request: text, token ids, or a list of either.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// One prompt as text.
    Text(String),
    /// One prompt as token ids.
    Tokens(Vec<u32>),
    /// Several prompts, each text or token ids.
    Batch(Vec<PromptItem>),
}

/// One prompt of a [`Prompt::Batch`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PromptItem {
    Text(String),
    Tokens(Vec<u32>),
}

impl Prompt {
    /// The prompts, in order.
    pub fn items(&self) -> Vec<PromptItem> {
        match self {
            Prompt::Text(t) => vec![PromptItem::Text(t.clone())],
            Prompt::Tokens(t) => vec![PromptItem::Tokens(t.clone())],
            Prompt::Batch(items) => items.clone(),
        }
    }
}

/// `stop`: one string or a list of strings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    /// The stop strings, in order.
    pub fn strings(&self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s.clone()],
            Stop::Many(v) => v.clone(),
        }
    }
}

/// The fields completions and chat completions share, borrowed from either
/// request ([`CompletionRequest::sampling`], [`ChatCompletionRequest::sampling`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SamplingFields<'a> {
    /// New tokens per choice at most.
    pub max_tokens: Option<usize>,
    /// 0 is greedy.
    pub temperature: Option<f64>,
    /// Nucleus threshold.
    pub top_p: Option<f64>,
    /// 0 or -1 is off.
    pub top_k: Option<i64>,
    /// Choices per prompt.
    pub n: Option<usize>,
    /// Stop strings.
    pub stop: Option<&'a Stop>,
    /// Stop token ids.
    pub stop_token_ids: Option<&'a [u32]>,
    /// Do not stop at the model's end-of-sequence tokens.
    pub ignore_eos: Option<bool>,
    /// The request's seed.
    pub seed: Option<u64>,
    /// Streaming asked for.
    pub stream: Option<bool>,
}

/// Request structs: each has `model`, the fields given (first the input, then what
/// only this request has), then the sampling fields both requests share;
/// every field is optional, and left out of the JSON when unset but for the
/// input; unknown fields are refused. Each also gets `sampling`, the shared
/// fields as [`SamplingFields`].
macro_rules! sampling_request {
    ($(
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(#[$input_meta:meta])* pub $input:ident: $input_ty:ty,
            $($(#[$field_meta:meta])* pub $field:ident: $ty:ty,)*
        }
    )*) => {$(
        $(#[$meta])*
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct $name {
            /// The served model's name; optional for `agentrl serve-policy` (one model).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub model: Option<String>,
            $(#[$input_meta])*
            pub $input: $input_ty,
            $(
                $(#[$field_meta])*
                #[serde(skip_serializing_if = "Option::is_none")]
                pub $field: $ty,
            )*
            /// New tokens per choice at most (default: up to the context length).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub max_tokens: Option<usize>,
            /// Default 1; 0 is greedy.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub temperature: Option<f64>,
            /// Default 1 (off).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub top_p: Option<f64>,
            /// vLLM's extension; 0 or -1 is off.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub top_k: Option<i64>,
            /// Choices per prompt (default 1).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub n: Option<usize>,
            /// Generation of a choice ends at the first of these strings
            /// (excluded from the text).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub stop: Option<Stop>,
            /// vLLM's extension: generation ends after any of these token ids
            /// (included).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub stop_token_ids: Option<Vec<u32>>,
            /// vLLM's extension: do not stop at the model's end-of-sequence
            /// tokens (`stop_token_ids` still apply).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub ignore_eos: Option<bool>,
            /// The same seed and request give the same choices.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub seed: Option<u64>,
            /// vLLM's extension: answer the prompt's and each choice's token ids.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub return_token_ids: Option<bool>,
            /// Streaming is not supported: only `false` is accepted.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub stream: Option<bool>,
            /// An end-user id (OpenAI's abuse monitoring); not used.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub user: Option<String>,
        }

        impl $name {
            /// The sampling fields, as both requests have them.
            pub fn sampling(&self) -> SamplingFields<'_> {
                SamplingFields {
                    max_tokens: self.max_tokens,
                    temperature: self.temperature,
                    top_p: self.top_p,
                    top_k: self.top_k,
                    n: self.n,
                    stop: self.stop.as_ref(),
                    stop_token_ids: self.stop_token_ids.as_deref(),
                    ignore_eos: self.ignore_eos,
                    seed: self.seed,
                    stream: self.stream,
                }
            }
        }
    )*};
}

sampling_request! {
    /// `POST /v1/completions`.
    pub struct CompletionRequest {
        pub prompt: Option<Prompt>,
        /// Return log-probs: 0 gives each sampled token's own (top
        /// alternatives are not computed by `agentrl serve-policy`).
        pub logprobs: Option<u32>,
        /// Echoing the prompt is not supported: only `false` is accepted.
        pub echo: Option<bool>,
    }

    /// `POST /v1/chat/completions`.
    pub struct ChatCompletionRequest {
        pub messages: Option<Vec<RequestMessage>>,
        /// OpenAI's newer name for `max_tokens` (give one of them).
        pub max_completion_tokens: Option<usize>,
        /// Return each sampled token's log-prob.
        pub logprobs: Option<bool>,
        /// Top alternatives per token: only 0 is served.
        pub top_logprobs: Option<u32>,
    }
}

/// Token usage of a request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

/// The legacy completions `logprobs` object.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionLogprobs {
    /// Each generated token's text.
    #[serde(default)]
    pub tokens: Vec<String>,
    /// Each generated token's log-probability.
    #[serde(default)]
    pub token_logprobs: Vec<Option<f32>>,
    /// Top alternatives per token; `null` from `agentrl serve-policy`.
    #[serde(default)]
    pub top_logprobs: Option<serde_json::Value>,
}

/// One choice of a completion.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    #[serde(default)]
    pub logprobs: Option<CompletionLogprobs>,
    /// `stop` (a stop token or string) or `length` (`max_tokens` reached).
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// The stop token id or string that ended the choice (vLLM's field).
    #[serde(default)]
    pub stop_reason: Option<serde_json::Value>,
    /// The generated token ids (with `return_token_ids`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
    /// The prompt's token ids (with `return_token_ids`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// The answer to `POST /v1/completions`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionResponse {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(default)]
    pub usage: Option<Usage>,
}

/// A chat message's content: text, or a list of text parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One part of a [`MessageContent::Parts`]; only `{"type": "text"}` parts are served.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// A message of a chat request (strict, like the request: an unknown key
/// is refused, not ignored).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestMessage {
    pub role: String,
    pub content: MessageContent,
    /// A participant's name; not used by the chat template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// The assistant's message in a chat answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResponseMessage {
    pub role: String,
    pub content: String,
}

/// One token of a chat answer's `logprobs.content`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    /// The token text's UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// Top alternatives: always empty (not computed).
    #[serde(default)]
    pub top_logprobs: Vec<serde_json::Value>,
}

/// A chat choice's `logprobs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

/// One choice of a chat answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: ResponseMessage,
    #[serde(default)]
    pub logprobs: Option<ChatLogprobs>,
    #[serde(default)]
    pub finish_reason: Option<String>,
    #[serde(default)]
    pub stop_reason: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// The answer to `POST /v1/chat/completions`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionResponse {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    #[serde(default)]
    pub usage: Option<Usage>,
    /// The rendered chat's token ids (with `return_token_ids`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// One served model in `GET /v1/models`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelCard {
    pub id: String,
    #[serde(default)]
    pub object: String,
    #[serde(default)]
    pub created: u64,
    #[serde(default)]
    pub owned_by: String,
    /// Prompt plus generated tokens at most (vLLM's field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<usize>,
}

/// The answer to `GET /v1/models`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelList {
    #[serde(default)]
    pub object: String,
    pub data: Vec<ModelCard>,
}

/// vLLM's `POST /v1/load_lora_adapter` body: load the PEFT adapter in the
/// directory `lora_path` (a path on the server's machine) to generate with
/// under the model name `lora_name`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadLoraAdapterRequest {
    pub lora_name: String,
    pub lora_path: String,
}

/// vLLM's `POST /v1/unload_lora_adapter` body: drop the adapter loaded as
/// `lora_name`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnloadLoraAdapterRequest {
    pub lora_name: String,
}

/// OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorResponse {
    pub error: ErrorDetail,
}

/// What went wrong, and with which request field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault (`max_tokens`, `prompt[1]`, …), if one is.
    pub param: Option<String>,
    pub code: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_parse_as_text_ids_or_lists_of_either() {
        let p = |v: serde_json::Value| serde_json::from_value::<Prompt>(v).unwrap().items();
        assert_eq!(
            p(serde_json::json!("hi")),
            vec![PromptItem::Text("hi".into())]
        );
        assert_eq!(
            p(serde_json::json!([1, 2])),
            vec![PromptItem::Tokens(vec![1, 2])]
        );
        assert_eq!(
            p(serde_json::json!(["a", [3]])),
            vec![PromptItem::Text("a".into()), PromptItem::Tokens(vec![3])]
        );
        assert!(serde_json::from_value::<Prompt>(serde_json::json!([-1])).is_err());
    }

    #[test]
    fn a_request_serialises_only_the_fields_set() {
        let r = CompletionRequest {
            prompt: Some(Prompt::Tokens(vec![5])),
            max_tokens: Some(3),
            ..CompletionRequest::default()
        };
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            serde_json::json!({"prompt": [5], "max_tokens": 3})
        );
    }
}
