//! Streamed answers (`"stream": true`) as OpenAI and vLLM frame them:
//! server-sent events `data: {chunk}`, each choice's text as it is
//! generated (held back while it could still become a stop string or a
//! `<tool_call>`), a last chunk per choice with its `finish_reason`, a usage
//! chunk when `stream_options.include_usage`, then `data: [DONE]`.
//!
//! The model thread sends each token as it is chosen ([`StreamEvent`]); this
//! side decodes it incrementally, cuts stop strings and tells the model
//! thread to end a choice that reached one. A client that disconnects drops
//! the stream, and with it the receiver: its sequences leave the model's
//! batch at their next token.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use agentrl_model::PromptTokenLogprob;
use agentrl_policy_client::protocol::{
    ChatChunkChoice, ChatCompletionChunk, ChatDelta, ChunkUsage, CompletionChunk,
    CompletionChunkChoice, ErrorResponse, ToolCallDelta,
};
use agentrl_tokenizer::tools::TOOL_CALL_START;
use agentrl_tokenizer::{ChatTokenizer, TokenizerError};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::answer::{self, Finish, TokenRow};
use crate::batcher::{GenerateError, StreamEvent};
use crate::error::ApiError;
use crate::plan::Plan;
use crate::routes::Shared;

/// Which route is streamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Completion,
    Chat,
}

/// One choice while it streams.
#[derive(Debug, Default)]
struct ChoiceState {
    /// Its prompt's index.
    prompt: usize,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    /// The text decoded so far (special tokens skipped).
    text: String,
    /// Bytes of `text` sent.
    sent: usize,
    /// Incremental decoding, as vLLM does it: the text of
    /// `tokens[prefix..read]` is known; a new token's text is that of
    /// `tokens[prefix..]` past it.
    prefix: usize,
    read: usize,
    /// The next token's `text_offset`.
    offset: usize,
    /// Where a `<tool_call>` starts in `text` (content after it is held).
    tool_call_at: Option<usize>,
    finished: bool,
    /// Its first chunk went out (the chat role, the echoed prompt).
    opened: bool,
}

/// A streamed request's state between events.
struct Streamer {
    tokenizer: Arc<ChatTokenizer>,
    plan: Plan,
    kind: Kind,
    model: String,
    id: String,
    created: u64,
    rx: UnboundedReceiver<StreamEvent>,
    stop_flags: Arc<[AtomicBool]>,
    choices: Vec<ChoiceState>,
    scores: Vec<Vec<PromptTokenLogprob>>,
    /// Events ready to send.
    out: VecDeque<Event>,
    done: bool,
}

/// The SSE answer to `plan`: its sequences queued now, their tokens sent
/// as they come.
pub(crate) fn respond(
    st: Shared,
    plan: Plan,
    adapter: Option<String>,
    kind: Kind,
) -> Result<Response, ApiError> {
    let sequences = plan.prompts.len() * plan.best_of;
    let stop_flags: Arc<[AtomicBool]> = (0..sequences).map(|_| AtomicBool::new(false)).collect();
    let rx = st.start_stream(&plan, adapter.clone(), Arc::clone(&stop_flags))?;
    let model = adapter.unwrap_or_else(|| st.name.clone());
    let s = Streamer::new(Arc::clone(&st.tokenizer), plan, kind, model, rx, stop_flags);
    Ok(s.into_sse())
}

impl Streamer {
    /// The stream of `plan`'s choices, fed by `rx`; `stop_flags` (one per
    /// sequence) tell the model thread which choices a stop string ended.
    fn new(
        tokenizer: Arc<ChatTokenizer>,
        plan: Plan,
        kind: Kind,
        model: String,
        rx: UnboundedReceiver<StreamEvent>,
        stop_flags: Arc<[AtomicBool]>,
    ) -> Self {
        let choices = (0..plan.prompts.len() * plan.best_of)
            .map(|i| ChoiceState {
                prompt: i / plan.best_of,
                offset: 0,
                ..ChoiceState::default()
            })
            .collect();
        let mut s = Streamer {
            tokenizer,
            kind,
            model,
            id: answer::request_id(match kind {
                Kind::Completion => "cmpl",
                Kind::Chat => "chatcmpl",
            }),
            created: answer::now(),
            rx,
            stop_flags,
            choices,
            scores: Vec::new(),
            out: VecDeque::new(),
            done: false,
            plan,
        };
        // The prompts' scores come first when asked for; otherwise the choices
        // open now.
        if s.plan.prompt_scoring().is_none() {
            s.open_all();
        }
        s
    }

    /// The SSE answer: each event as it is ready, until `[DONE]`.
    fn into_sse(self) -> Response {
        let events = futures_util::stream::unfold(self, |mut s| async move {
            loop {
                if let Some(e) = s.out.pop_front() {
                    return Some((Ok::<Event, Infallible>(e), s));
                }
                if s.done {
                    return None;
                }
                let event = s.rx.recv().await;
                s.on(event);
            }
        });
        Sse::new(events).into_response()
    }

    fn tokenizer(&self) -> &ChatTokenizer {
        &self.tokenizer
    }

    /// Handle one event from the model thread (`None`: it hung up).
    fn on(&mut self, event: Option<StreamEvent>) {
        let result = match event {
            Some(StreamEvent::PromptScores(scores)) => {
                self.scores = scores;
                self.open_all();
                Ok(())
            }
            Some(StreamEvent::Token {
                seq,
                token,
                logprob,
                top,
            }) => self.token(seq, token, logprob, top),
            Some(StreamEvent::Done(Ok(out))) => {
                self.finish_all(&out.sequences);
                Ok(())
            }
            Some(StreamEvent::Done(Err(e))) => {
                self.fail(crate::routes::generate_error(e));
                Ok(())
            }
            None => {
                self.fail(crate::routes::generate_error(GenerateError::Stopped));
                Ok(())
            }
        };
        if let Err(e) = result {
            self.fail(ApiError::internal(format!("decoding: {e}")));
        }
    }

    /// An error event (as vLLM sends one mid-stream), then the end.
    fn fail(&mut self, e: ApiError) {
        let body: ErrorResponse = *e.body;
        self.push(&body);
        self.end();
    }

    /// `data: [DONE]` and no more events.
    fn end(&mut self) {
        self.out.push_back(Event::default().data("[DONE]"));
        self.done = true;
        self.rx.close();
    }

    fn push(&mut self, chunk: &impl serde::Serialize) {
        match serde_json::to_string(chunk) {
            Ok(json) => self.out.push_back(Event::default().data(json)),
            Err(e) => tracing::error!(error = %e, "a stream chunk could not be written"),
        }
    }

    /// `usage` of a chunk: none without `include_usage`, else `null` or the
    /// usage so far (`continuous_usage_stats`).
    fn chunk_usage(&self) -> ChunkUsage {
        let stream = self.plan.stream.unwrap_or_default();
        if stream.continuous_usage {
            let generated = self.choices.iter().map(|c| c.tokens.len()).sum();
            return Some(Some(answer::usage(&self.plan, generated)));
        }
        stream.include_usage.then_some(None)
    }

    /// Every choice's first chunk: the chat role, or the echoed prompt.
    fn open_all(&mut self) {
        for i in 0..self.choices.len() {
            if let Err(e) = self.open(i) {
                self.fail(ApiError::internal(format!("decoding: {e}")));
                return;
            }
        }
    }

    fn open(&mut self, i: usize) -> Result<(), TokenizerError> {
        if self.choices[i].opened {
            return Ok(());
        }
        self.choices[i].opened = true;
        let p = self.choices[i].prompt;
        match self.kind {
            Kind::Chat => {
                let chunk = self.chat_chunk(
                    i,
                    ChatDelta {
                        role: Some("assistant".into()),
                        content: Some(String::new()),
                        tool_calls: None,
                    },
                    None,
                    None,
                    None,
                );
                self.push(&chunk);
            }
            Kind::Completion => {
                let echo = self.plan.echo.get(p).cloned();
                let prompt_logprobs = match self.plan.prompt_logprobs {
                    Some(k) => Some(answer::prompt_logprobs(
                        self.tokenizer(),
                        &self.plan.prompts[p],
                        self.scores.get(p).map(Vec::as_slice).unwrap_or_default(),
                        k,
                    )?),
                    None => None,
                };
                if echo.is_none() && prompt_logprobs.is_none() && !self.plan.return_token_ids {
                    return Ok(());
                }
                let logprobs = match (&echo, self.plan.logprobs) {
                    (Some(_), true) => {
                        let rows = answer::prompt_rows(
                            &self.plan.prompts[p],
                            self.scores.get(p).map(Vec::as_slice),
                            self.plan.top_logprobs,
                        );
                        let (lp, next) = answer::completion_logprobs(
                            self.tokenizer(),
                            &rows,
                            self.plan.top_logprobs > 0,
                            0,
                        )?;
                        self.choices[i].offset = next;
                        Some(lp)
                    }
                    _ => None,
                };
                let chunk = CompletionChunk {
                    id: self.id.clone(),
                    object: "text_completion".into(),
                    created: self.created,
                    model: self.model.clone(),
                    choices: vec![CompletionChunkChoice {
                        index: i,
                        text: echo.unwrap_or_default(),
                        logprobs,
                        prompt_token_ids: self
                            .plan
                            .return_token_ids
                            .then(|| self.plan.prompts[p].clone()),
                        prompt_logprobs,
                        ..CompletionChunkChoice::default()
                    }],
                    usage: self.chunk_usage(),
                };
                self.push(&chunk);
            }
        }
        Ok(())
    }

    /// Sequence `seq` chose `token`: decode it, cut or hold back text, and
    /// send what is ready.
    fn token(
        &mut self,
        seq: usize,
        token: u32,
        logprob: f32,
        top: Vec<(u32, f32)>,
    ) -> Result<(), TokenizerError> {
        if seq >= self.choices.len() || self.choices[seq].finished {
            return Ok(());
        }
        self.open(seq)?;
        let delta = self.decode_next(seq, token)?;
        let c = &mut self.choices[seq];
        c.logprobs.push(logprob);
        c.text.push_str(&delta);
        // A stop string ends the choice here: the text before it goes out.
        let stop = earliest_stop(&c.text, c.sent, &self.plan.stop_strings);
        let end = match &stop {
            Some((at, _)) => *at,
            None => c.text.len() - held_back(&c.text, &self.plan.stop_strings),
        };
        let end = self.tool_limit(seq, end);
        let c = &mut self.choices[seq];
        let text = c
            .text
            .get(c.sent..end.max(c.sent))
            .unwrap_or("")
            .to_string();
        c.sent = end.max(c.sent);
        let rows = [TokenRow {
            token,
            logprob: Some(logprob),
            top: Some(top.clone()),
        }];
        let wants_step = self.plan.logprobs || self.plan.return_token_ids;
        if !text.is_empty() || wants_step {
            self.step_chunk(seq, text, &rows, &top, None)?;
        }
        if let Some((at, s)) = stop {
            let c = &mut self.choices[seq];
            c.text.truncate(at);
            c.finished = true;
            if let Some(flag) = self.stop_flags.get(seq) {
                flag.store(true, Ordering::Relaxed);
            }
            self.final_chunk(seq, Finish::StopString(s), String::new());
        }
        Ok(())
    }

    /// Decode `token` after sequence `seq`'s tokens: the text it adds (empty
    /// while it ends in an incomplete character).
    fn decode_next(&mut self, seq: usize, token: u32) -> Result<String, TokenizerError> {
        let tokenizer = &self.tokenizer;
        let c = &mut self.choices[seq];
        c.tokens.push(token);
        let before = tokenizer.decode(&c.tokens[c.prefix..c.read], true)?;
        let now = tokenizer.decode(&c.tokens[c.prefix..], true)?;
        if now.len() > before.len() && !now.ends_with('\u{FFFD}') && now.starts_with(&before) {
            c.prefix = c.read;
            c.read = c.tokens.len();
            return Ok(now[before.len()..].to_string());
        }
        Ok(String::new())
    }

    /// With tools, content stops where a `<tool_call>` starts (or could).
    fn tool_limit(&mut self, seq: usize, end: usize) -> usize {
        if self.plan.tools.is_none() || self.kind != Kind::Chat {
            return end;
        }
        let c = &mut self.choices[seq];
        if c.tool_call_at.is_none() {
            c.tool_call_at = c.text.find(TOOL_CALL_START);
        }
        match c.tool_call_at {
            Some(at) => end.min(at),
            None => end.min(c.text.len() - held_back(&c.text, &[TOOL_CALL_START.to_string()])),
        }
    }

    /// A chunk of one step of choice `i`: its new text and the step's token.
    fn step_chunk(
        &mut self,
        i: usize,
        text: String,
        rows: &[TokenRow],
        top: &[(u32, f32)],
        finish: Option<&Finish>,
    ) -> Result<(), TokenizerError> {
        let token_ids = self
            .plan
            .return_token_ids
            .then(|| rows.iter().map(|r| r.token).collect());
        match self.kind {
            Kind::Completion => {
                let logprobs = if self.plan.logprobs && !rows.is_empty() {
                    let (lp, next) = answer::completion_logprobs(
                        self.tokenizer(),
                        rows,
                        self.plan.top_logprobs > 0,
                        self.choices[i].offset,
                    )?;
                    self.choices[i].offset = next;
                    Some(lp)
                } else {
                    None
                };
                let chunk = CompletionChunk {
                    id: self.id.clone(),
                    object: "text_completion".into(),
                    created: self.created,
                    model: self.model.clone(),
                    choices: vec![CompletionChunkChoice {
                        index: i,
                        text,
                        logprobs,
                        finish_reason: finish.map(|f| f.reason().to_string()),
                        stop_reason: finish.and_then(Finish::stop_reason),
                        token_ids,
                        ..CompletionChunkChoice::default()
                    }],
                    usage: self.chunk_usage(),
                };
                self.push(&chunk);
            }
            Kind::Chat => {
                let logprobs = if self.plan.logprobs && !rows.is_empty() {
                    let tokens: Vec<u32> = rows.iter().map(|r| r.token).collect();
                    let lps: Vec<f32> = rows.iter().filter_map(|r| r.logprob).collect();
                    Some(answer::chat_logprobs(
                        self.tokenizer(),
                        &tokens,
                        &lps,
                        &[top.to_vec()],
                        self.plan.top_logprobs,
                    )?)
                } else {
                    None
                };
                let delta = ChatDelta {
                    content: (!text.is_empty()).then_some(text),
                    ..ChatDelta::default()
                };
                let chunk = self.chat_chunk(i, delta, logprobs, finish, token_ids);
                self.push(&chunk);
            }
        }
        Ok(())
    }

    fn chat_chunk(
        &self,
        i: usize,
        delta: ChatDelta,
        logprobs: Option<agentrl_policy_client::protocol::ChatLogprobs>,
        finish: Option<&Finish>,
        token_ids: Option<Vec<u32>>,
    ) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.created,
            model: self.model.clone(),
            choices: vec![ChatChunkChoice {
                index: i,
                delta,
                logprobs,
                finish_reason: finish.map(|f| f.reason().to_string()),
                stop_reason: finish.and_then(Finish::stop_reason),
                token_ids,
            }],
            usage: self.chunk_usage(),
        }
    }

    /// Choice `i`'s last chunk, with its finish reason and the `text` held
    /// back until the end (as vLLM sends it: in the chunk that finishes, so
    /// every earlier chunk is one step with its token's log-probs).
    fn final_chunk(&mut self, i: usize, finish: Finish, text: String) {
        match self.kind {
            Kind::Chat => {
                let delta = ChatDelta {
                    content: (!text.is_empty()).then_some(text),
                    ..ChatDelta::default()
                };
                let chunk = self.chat_chunk(i, delta, None, Some(&finish), None);
                self.push(&chunk);
            }
            Kind::Completion => {
                // No tokens: the step's text only.
                if let Err(e) = self.step_chunk(i, text, &[], &[], Some(&finish)) {
                    self.fail(ApiError::internal(format!("decoding: {e}")));
                }
            }
        }
    }

    /// The model thread is done: each open choice sends the rest of its text
    /// (and its tool calls), then its finish; then the usage and `[DONE]`.
    fn finish_all(&mut self, sequences: &[crate::batcher::SequenceOutput]) {
        for i in 0..self.choices.len() {
            if self.choices[i].finished {
                continue;
            }
            if let Err(e) = self
                .open(i)
                .and_then(|()| self.finish_choice(i, sequences.get(i)))
            {
                self.fail(ApiError::internal(format!("decoding: {e}")));
                return;
            }
        }
        if self.plan.stream.is_some_and(|s| s.include_usage) {
            let generated = self.choices.iter().map(|c| c.tokens.len()).sum();
            let usage = Some(Some(answer::usage(&self.plan, generated)));
            match self.kind {
                Kind::Completion => {
                    let chunk = CompletionChunk {
                        id: self.id.clone(),
                        object: "text_completion".into(),
                        created: self.created,
                        model: self.model.clone(),
                        choices: Vec::new(),
                        usage,
                    };
                    self.push(&chunk);
                }
                Kind::Chat => {
                    let chunk = ChatCompletionChunk {
                        id: self.id.clone(),
                        object: "chat.completion.chunk".into(),
                        created: self.created,
                        model: self.model.clone(),
                        choices: Vec::new(),
                        usage,
                    };
                    self.push(&chunk);
                }
            }
        }
        self.end();
    }

    fn finish_choice(
        &mut self,
        i: usize,
        output: Option<&crate::batcher::SequenceOutput>,
    ) -> Result<(), TokenizerError> {
        let full = self.tokenizer().decode(&self.choices[i].tokens, true)?;
        let c = &mut self.choices[i];
        // What incremental decoding held back (an incomplete character).
        if full.len() > c.text.len() && full.starts_with(&c.text) {
            c.text = full;
        }
        let stop = earliest_stop(&c.text, c.sent, &self.plan.stop_strings);
        let mut finish = match output {
            Some(o) => Finish::of(
                o.generation.stopped,
                o.generation.tokens.last().copied(),
                &self.plan,
            ),
            None => Finish::Length,
        };
        let mut end = c.text.len();
        if let Some((at, s)) = stop {
            end = at;
            finish = Finish::StopString(s);
        }
        c.finished = true;
        let parsed = match (&self.plan.tools, self.kind) {
            (Some(_), Kind::Chat) => {
                let (message, called) =
                    answer::reply_message(c.text[..end].to_string(), &self.plan);
                called.then_some(message)
            }
            _ => None,
        };
        let c = &mut self.choices[i];
        match parsed {
            Some(message) => {
                // The content before the first call, then the calls whole.
                let content_end = c.tool_call_at.unwrap_or(end).min(end);
                let rest = c
                    .text
                    .get(c.sent..content_end.max(c.sent))
                    .unwrap_or("")
                    .to_string();
                c.sent = content_end.max(c.sent);
                let calls = message
                    .tool_calls
                    .unwrap_or_default()
                    .into_iter()
                    .enumerate()
                    .map(|(index, call)| ToolCallDelta {
                        index,
                        id: call.id,
                        kind: call.kind,
                        function: call.function,
                    })
                    .collect();
                let delta = ChatDelta {
                    content: (!rest.is_empty()).then_some(rest),
                    tool_calls: Some(calls),
                    role: None,
                };
                let chunk = self.chat_chunk(i, delta, None, None, None);
                self.push(&chunk);
                let chunk = self.chat_chunk(i, ChatDelta::default(), None, None, None);
                let mut chunk = chunk;
                if let Some(choice) = chunk.choices.first_mut() {
                    choice.finish_reason = Some(if matches!(finish, Finish::Length) {
                        "length".into()
                    } else {
                        "tool_calls".into()
                    });
                    choice.stop_reason = finish.stop_reason();
                }
                self.push(&chunk);
                Ok(())
            }
            None => {
                let rest = c
                    .text
                    .get(c.sent..end.max(c.sent))
                    .unwrap_or("")
                    .to_string();
                c.sent = end.max(c.sent);
                self.final_chunk(i, finish, rest);
                Ok(())
            }
        }
    }
}

/// The earliest stop string in `text` that ends past `sent` (one found
/// wholly inside the text already sent would have ended the choice then):
/// where it starts, and which.
fn earliest_stop(text: &str, sent: usize, stops: &[String]) -> Option<(usize, String)> {
    stops
        .iter()
        .filter_map(|s| {
            // Search from where a match could still end past `sent`.
            let mut from = sent.saturating_sub(s.len().saturating_sub(1));
            while !text.is_char_boundary(from) {
                from -= 1;
            }
            loop {
                let at = from + text[from..].find(s.as_str())?;
                if at + s.len() > sent {
                    return Some((at, s));
                }
                from = at + text[at..].chars().next().map_or(1, char::len_utf8);
            }
        })
        .min_by_key(|&(at, s)| (at, std::cmp::Reverse(s.len())))
        .map(|(at, s)| (at, s.clone()))
}

/// Bytes at the end of `text` held back because they begin some stop string
/// (the longest such suffix shorter than the string), on a char boundary.
fn held_back(text: &str, stops: &[String]) -> usize {
    let mut held = 0;
    for s in stops {
        for (k, _) in s.char_indices().skip(1) {
            // `s[..k]` is a proper prefix of `s`.
            if k > held && text.ends_with(&s[..k]) {
                held = k;
            }
        }
    }
    held
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer::tests::{self as answer_tests, fixture_tokenizer};
    use crate::batcher::{GenerateOutput, SequenceOutput};
    use crate::options::{StreamPlan, ToolPlan};
    use agentrl_model::Generation;
    use serde_json::{json, Value};

    /// A streamed chat plan with `tools` (or none), ending at `<|im_end|>`.
    fn chat_plan(tools: Option<ToolPlan>, im_end: u32) -> Plan {
        Plan {
            stream: Some(StreamPlan::default()),
            ..answer_tests::plan(tools, im_end)
        }
    }

    /// The chunks streamed for `plan` when the model thread sends `reply`'s
    /// tokens one by one, then the end of turn, then the whole result.
    async fn streamed_chat(tok: &Arc<ChatTokenizer>, plan: Plan, reply: &str) -> Vec<Value> {
        let im_end = tok.token_id("<|im_end|>").expect("<|im_end|>");
        let mut tokens = tok.encode(reply).expect("encode");
        tokens.push(im_end);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        for &token in &tokens {
            let event = StreamEvent::Token {
                seq: 0,
                token,
                logprob: -0.5,
                top: Vec::new(),
            };
            tx.send(event).expect("the stream's receiver");
        }
        let output = GenerateOutput {
            sequences: vec![SequenceOutput {
                generation: Generation {
                    logprobs: vec![-0.5; tokens.len()],
                    tokens,
                    stopped: true,
                },
                top: Vec::new(),
            }],
            prompt_scores: Vec::new(),
        };
        tx.send(StreamEvent::Done(Ok(output)))
            .expect("the stream's receiver");
        let flags: Arc<[AtomicBool]> = Arc::from(vec![AtomicBool::new(false)]);
        let s = Streamer::new(Arc::clone(tok), plan, Kind::Chat, "tiny".into(), rx, flags);
        let body = axum::body::to_bytes(s.into_sse().into_body(), usize::MAX)
            .await
            .expect("the streamed body");
        let text = String::from_utf8(body.to_vec()).expect("UTF-8");
        let events: Vec<&str> = text
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| e.strip_prefix("data: ").expect("a data event"))
            .collect();
        assert_eq!(events.last(), Some(&"[DONE]"), "{text}");
        events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).expect("a JSON chunk"))
            .collect()
    }

    /// The content of a stream's deltas, joined.
    fn content(chunks: &[Value]) -> String {
        chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect()
    }

    #[tokio::test]
    async fn a_streamed_tool_call_reply_ends_in_tool_calls_deltas() {
        let tok = Arc::new(fixture_tokenizer());
        let im_end = tok.token_id("<|im_end|>").expect("<|im_end|>");
        let reply = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let tools = ToolPlan {
            tools: vec![json!({"type": "function", "function": {"name": "get_weather"}})],
            parallel: true,
        };
        let chunks = streamed_chat(&tok, chat_plan(Some(tools), im_end), reply).await;
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        // The content before the call streams as content; the call's text never does.
        assert_eq!(content(&chunks), "Let me look.\n");
        let calls: Vec<&Value> = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"].get("tool_calls"))
            .collect();
        assert_eq!(calls.len(), 1, "{chunks:?}");
        let call = &calls[0][0];
        assert_eq!(calls[0].as_array().map(Vec::len), Some(1));
        assert_eq!(
            (&call["index"], &call["type"]),
            (&json!(0), &json!("function"))
        );
        assert!(
            call["id"]
                .as_str()
                .is_some_and(|id| id.starts_with("call_")),
            "{call}"
        );
        assert_eq!(call["function"]["name"], "get_weather");
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().expect("a string"))
                .expect("JSON arguments");
        assert_eq!(args, json!({"city": "Paris"}));
        // The last chunk ends the turn in the calls, at the model's own end of sequence.
        let last = &chunks[chunks.len() - 1]["choices"][0];
        assert_eq!(last["finish_reason"], "tool_calls");
        assert_eq!(last["stop_reason"], Value::Null);
        assert!(chunks[..chunks.len() - 1]
            .iter()
            .all(|c| c["choices"][0]["finish_reason"].is_null()));
        // Without tools the same reply streams as plain content.
        let chunks = streamed_chat(&tok, chat_plan(None, im_end), reply).await;
        assert_eq!(content(&chunks), reply);
        assert!(chunks
            .iter()
            .all(|c| c["choices"][0]["delta"].get("tool_calls").is_none()));
        assert_eq!(
            chunks[chunks.len() - 1]["choices"][0]["finish_reason"],
            "stop"
        );
    }

    #[test]
    fn text_that_could_begin_a_stop_string_is_held_back() {
        let stops = vec!["</answer>".to_string(), "STOP".to_string()];
        assert_eq!(held_back("hello </ans", &stops), 5);
        assert_eq!(held_back("hello ST", &stops), 2);
        assert_eq!(held_back("hello", &stops), 0);
        // A whole stop string is found, not held.
        assert_eq!(held_back("x</answer>", &stops), 0);
    }

    #[test]
    fn the_earliest_stop_string_past_what_was_sent_is_found() {
        let stops = vec!["ab".to_string(), "b".to_string()];
        // "ab" at 2 and "b" at 3: the earliest start wins.
        assert_eq!(
            earliest_stop("xxab", 0, &stops),
            Some((2, "ab".to_string()))
        );
        // A match ending inside the text already sent is not looked for again,
        // but one straddling the sent boundary is found.
        assert_eq!(
            earliest_stop("aXab", 3, &stops),
            Some((2, "ab".to_string()))
        );
        assert_eq!(
            earliest_stop("éé", 2, &["é".to_string()]),
            Some((2, "é".to_string()))
        );
        assert_eq!(earliest_stop("xyz", 0, &stops), None);
    }
}
