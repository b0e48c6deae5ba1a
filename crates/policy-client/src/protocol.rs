//! The OpenAI-compatible wire types: `/v1/completions`,
//! `/v1/chat/completions`, `/v1/models` and the error body, with the vLLM
//! extensions rollouts need (`return_token_ids`, `stop_token_ids`,
//! `ignore_eos`, `top_k`).
//!
//! Requests are strict (`deny_unknown_fields`: `agentrl serve-policy`
//! rejects a field it would otherwise ignore); answers are lenient (vLLM and
//! SGLang add fields of their own).

use std::collections::BTreeMap;

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
    /// What a stream sends besides the choices.
    pub stream_options: Option<&'a StreamOptions>,
    /// OpenAI's frequency penalty (−2 to 2).
    pub frequency_penalty: Option<f64>,
    /// OpenAI's presence penalty (−2 to 2).
    pub presence_penalty: Option<f64>,
    /// Token id (as a string, OpenAI's JSON) → bias added to its logit.
    pub logit_bias: Option<&'a BTreeMap<String, f64>>,
    /// vLLM's extension: log-probs of the prompt's tokens with this many
    /// top alternatives.
    pub prompt_logprobs: Option<u32>,
}

/// `stream_options`: what a stream sends besides the choices.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StreamOptions {
    /// A last chunk, before `[DONE]`, with the request's usage (and
    /// `"usage": null` in every other chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub include_usage: Option<bool>,
    /// vLLM's extension: the usage so far in every chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub continuous_usage_stats: Option<bool>,
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
            /// Answer as server-sent events, one chunk per step.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub stream: Option<bool>,
            /// With `stream`: `include_usage` adds a usage chunk at the end.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub stream_options: Option<StreamOptions>,
            /// Lowers a token's logit by this much per earlier occurrence in
            /// the choice (−2 to 2; 0 is off).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub frequency_penalty: Option<f64>,
            /// Lowers the logit of every token already in the choice by this
            /// much (−2 to 2; 0 is off).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub presence_penalty: Option<f64>,
            /// Token id (a string, as JSON keys are) → a bias (−100 to 100)
            /// added to its logit at every step.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub logit_bias: Option<BTreeMap<String, f64>>,
            /// vLLM's extension: the log-prob of every prompt token, with
            /// this many top alternatives (0 to 20).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub prompt_logprobs: Option<u32>,
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
                    stream_options: self.stream_options.as_ref(),
                    frequency_penalty: self.frequency_penalty,
                    presence_penalty: self.presence_penalty,
                    logit_bias: self.logit_bias.as_ref(),
                    prompt_logprobs: self.prompt_logprobs,
                }
            }
        }
    )*};
}

sampling_request! {
    /// `POST /v1/completions`.
    pub struct CompletionRequest {
        pub prompt: Option<Prompt>,
        /// Return log-probs: each token's own, with this many top
        /// alternatives (0 to 20, vLLM's bound).
        pub logprobs: Option<u32>,
        /// Answer the prompt before the completion (its text, and with
        /// `logprobs` its tokens' log-probs); with `max_tokens: 0`, only it.
        pub echo: Option<bool>,
        /// Choices generated per prompt, of which the `n` with the highest
        /// total log-prob are answered (at least `n`; not with `stream`).
        pub best_of: Option<usize>,
        /// Text after the completion: not served (only empty is accepted).
        pub suffix: Option<String>,
    }

    /// `POST /v1/chat/completions`.
    pub struct ChatCompletionRequest {
        pub messages: Option<Vec<RequestMessage>>,
        /// OpenAI's newer name for `max_tokens` (give one of them).
        pub max_completion_tokens: Option<usize>,
        /// Return each sampled token's log-prob.
        pub logprobs: Option<bool>,
        /// Top alternatives per token (0 to 20; needs `logprobs`).
        pub top_logprobs: Option<u32>,
        /// `{"type": "text"}` is served; the JSON modes (`json_object`,
        /// `json_schema`) are refused (no constrained decoding).
        pub response_format: Option<ResponseFormat>,
        /// Functions the model may call.
        pub tools: Option<Vec<Tool>>,
        /// `"auto"` (the default with tools) or `"none"`; forcing a call
        /// (`"required"`, a named function) is refused.
        pub tool_choice: Option<serde_json::Value>,
        /// `false` answers at most one call.
        pub parallel_tool_calls: Option<bool>,
    }
}

/// Token usage of a request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

/// `response_format` of a chat request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseFormat {
    /// `text`, `json_object` or `json_schema`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The schema of `json_schema`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_schema: Option<serde_json::Value>,
}

/// A tool of a chat request: a function the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    /// `function`, the only kind.
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDefinition,
}

/// A function's name, description and JSON Schema of its parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionDefinition {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<serde_json::Value>,
    /// OpenAI's strict schema adherence; accepted, not enforced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// A call the model made (an answer's `tool_calls`, or an assistant
/// message's in the history).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id, which the tool message answering it names.
    #[serde(default)]
    pub id: String,
    /// `function`.
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    pub function: FunctionCall,
}

fn function_kind() -> String {
    "function".into()
}

/// The function a call names and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// The legacy completions `logprobs` object.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionLogprobs {
    /// Each token's text.
    #[serde(default)]
    pub tokens: Vec<String>,
    /// Each token's log-probability (`null` for an echoed prompt's first).
    #[serde(default)]
    pub token_logprobs: Vec<Option<f32>>,
    /// Per token, `{token text: log-prob}` of its top alternatives (with
    /// the token itself, as vLLM answers); `null` when none were asked for.
    #[serde(default)]
    pub top_logprobs: Option<serde_json::Value>,
    /// Each token's offset in characters in the choice's text.
    #[serde(default)]
    pub text_offset: Option<Vec<usize>>,
}

/// One entry of vLLM's `prompt_logprobs`, keyed by token id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptLogprob {
    pub logprob: f32,
    /// 1 = the most likely token at that position.
    pub rank: usize,
    pub decoded_token: String,
}

/// vLLM's `prompt_logprobs`: per prompt token, `null` for the first, then
/// `{token id: entry}` of the token itself and the top alternatives.
pub type PromptLogprobs = Vec<Option<BTreeMap<String, PromptLogprob>>>;

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
    /// vLLM's `prompt_logprobs` (when asked for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<PromptLogprobs>,
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
    /// The text; may be `null` (or left out) on an assistant message that
    /// made tool calls.
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// The calls an assistant message made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A participant's name; not used by the chat template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// The assistant's message in a chat answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResponseMessage {
    pub role: String,
    /// The reply's text; `null` when the reply is only tool calls.
    pub content: Option<String>,
    /// The calls the reply made (with `tools`), left out when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// One token of a chat answer's `logprobs.content`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    /// The token text's UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The top alternatives at this step, most likely first.
    #[serde(default)]
    pub top_logprobs: Vec<TopLogprob>,
}

/// One top alternative of a chat answer's token.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
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
    /// vLLM's `prompt_logprobs` of the rendered chat (when asked for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<PromptLogprobs>,
}

/// `usage` of a stream chunk: left out without `include_usage`, `null` in
/// every chunk but the last with it, the request's usage in the last.
pub type ChunkUsage = Option<Option<Usage>>;

/// One server-sent event of a streamed `/v1/completions` answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionChunk {
    pub id: String,
    /// `text_completion`, as OpenAI and vLLM name a chunk too.
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChunkChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: ChunkUsage,
}

/// One choice's step in a [`CompletionChunk`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionChunkChoice {
    pub index: usize,
    /// The text this step adds.
    pub text: String,
    /// The log-probs of this step's tokens (offsets continue the choice's).
    #[serde(default)]
    pub logprobs: Option<CompletionLogprobs>,
    /// Set in the choice's last chunk.
    #[serde(default)]
    pub finish_reason: Option<String>,
    #[serde(default)]
    pub stop_reason: Option<serde_json::Value>,
    /// This step's token ids (with `return_token_ids`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
    /// The prompt's token ids, in the choice's first chunk (with `return_token_ids`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// vLLM's `prompt_logprobs`, in the choice's first chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<PromptLogprobs>,
}

/// One server-sent event of a streamed `/v1/chat/completions` answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionChunk {
    pub id: String,
    /// `chat.completion.chunk`.
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: ChunkUsage,
}

/// One choice's step in a [`ChatCompletionChunk`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    #[serde(default)]
    pub logprobs: Option<ChatLogprobs>,
    #[serde(default)]
    pub finish_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<serde_json::Value>,
    /// This step's token ids (with `return_token_ids`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// What a chat chunk adds to the assistant's message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatDelta {
    /// `assistant`, in each choice's first chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// A tool call in a chat chunk: whole, in one chunk, with its place among
/// the reply's calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallDelta {
    pub index: usize,
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
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
