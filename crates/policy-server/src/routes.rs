//! The routes (`/v1/models`, `/v1/models/{id}`, `/v1/completions`,
//! `/v1/chat/completions`, vLLM's `/v1/load_lora_adapter` and
//! `/v1/unload_lora_adapter`, `/health`), their JSON extractor and the
//! layers around them.
//!
//! A handler checks the request into a [`Plan`] (tokenizing on a blocking
//! thread), queues its sequences for the model thread, and writes the answer
//! (decoding on a blocking thread): the async runtime only moves bytes. A
//! streamed request ([`crate::stream`]) answers server-sent events as the
//! tokens come.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use agentrl_connections::Hardening;
use agentrl_policy_client::protocol::{
    ChatCompletionRequest, CompletionRequest, ModelCard, ModelList,
};
use agentrl_tokenizer::{ChatTokenizer, TokenizerError};
use axum::body::Bytes;
use axum::extract::{FromRequest, Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::answer;
use crate::batcher::{
    GenerateError, GenerateOutput, GenerateRequest, Generator, SequenceOptions, StreamEvent,
};
use crate::error::ApiError;
use crate::plan::{self, ModelLimits, Plan};
use crate::stream::{self, Kind};

/// Shared state of every route.
pub(crate) struct AppState {
    /// The name the model is served under.
    pub name: String,
    /// Shared with the streams that decode as tokens come.
    pub tokenizer: Arc<ChatTokenizer>,
    pub limits: ModelLimits,
    pub generator: Generator,
    /// When the server started (the model card's `created`).
    pub created: u64,
    /// The names of the LoRA adapters loaded on the model thread.
    pub adapters: Mutex<BTreeSet<String>>,
}

/// vLLM's `/v1/load_lora_adapter` body.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LoadLoraAdapterRequest {
    /// The name requests then give as `model`.
    lora_name: String,
    /// A PEFT adapter directory on the server's machine.
    lora_path: PathBuf,
}

/// vLLM's `/v1/unload_lora_adapter` body (its `lora_int_id` is accepted and
/// not needed: names are unique here).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct UnloadLoraAdapterRequest {
    lora_name: String,
    #[serde(default, rename = "lora_int_id")]
    _lora_int_id: Option<i64>,
}

pub(crate) type Shared = Arc<AppState>;

/// The application: routes inside the shared auth, request timeout, body
/// limit, panic and JSON-error layers ([`agentrl_connections::harden`]).
/// A timed-out request drops its answer's receiver: its sequences are
/// skipped if they have not started and leave the batch at their next token
/// if they have ([`crate::batcher`]).
pub(crate) fn router(state: Shared, hardening: Hardening) -> Router {
    let routes = Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        // A served name may hold slashes (`--model runs/fl3` by default).
        .route("/v1/models/{*id}", get(model_card))
        .route(
            "/v1/completions",
            generation_route(
                plan::completion,
                answer::completion_response,
                Kind::Completion,
            ),
        )
        .route(
            "/v1/chat/completions",
            generation_route(plan::chat, answer::chat_response, Kind::Chat),
        )
        .route("/v1/load_lora_adapter", post(load_lora_adapter))
        .route("/v1/unload_lora_adapter", post(unload_lora_adapter))
        .fallback(not_found)
        .with_state(state);
    agentrl_connections::harden::<ApiError>(routes, hardening)
}

/// A JSON body whose deserialisation errors are 400s naming the field
/// (`max_tokens`, `messages[0].content`, an unknown field).
pub(crate) struct OpenAiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for OpenAiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            ApiError::new(
                e.status(),
                "invalid_request_error",
                e.body_text(),
                None,
                None,
            )
        })?;
        let de = &mut serde_json::Deserializer::from_slice(&bytes);
        serde_path_to_error::deserialize(de)
            .map(OpenAiJson)
            .map_err(|e| body_error(&e))
    }
}

/// A deserialisation error as a 400: the field it is about is the path, or
/// the unknown field's name under the object that holds it
/// (`messages[0].priority`), so a client sees which message was refused.
fn body_error(e: &serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let message = e.inner().to_string();
    let path = e.path().to_string();
    let unknown = message
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split('`').next());
    match (path.as_str(), unknown) {
        ("." | "?", Some(field)) => ApiError::invalid(field, message.clone()),
        (at, Some(field)) if at == field || at.ends_with(&format!(".{field}")) => {
            ApiError::invalid(at, message.clone())
        }
        (at, Some(field)) => ApiError::invalid(&format!("{at}.{field}"), message.clone()),
        (".", None) => ApiError::bad_request(format!("the body is not a valid request: {message}")),
        (field, None) => ApiError::invalid(field, format!("{field}: {message}")),
    }
}

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn models(State(st): State<Shared>) -> Result<Json<ModelList>, ApiError> {
    let mut data = vec![st.card(&st.name)];
    data.extend(st.adapter_names()?.iter().map(|n| st.card(n)));
    Ok(Json(ModelList {
        object: "list".into(),
        data,
    }))
}

/// `GET /v1/models/{id}`: the served model's or a loaded adapter's card; 404
/// (OpenAI's `model_not_found`) for any other name.
async fn model_card(
    State(st): State<Shared>,
    Path(id): Path<String>,
) -> Result<Json<ModelCard>, ApiError> {
    if id == st.name || st.adapter_names()?.contains(&id) {
        Ok(Json(st.card(&id)))
    } else {
        Err(ApiError::unknown_model(&id, &st.name))
    }
}

/// Loads a PEFT adapter (vLLM's route and answer): requests naming
/// `lora_name` as their `model` then generate with it.
async fn load_lora_adapter(
    State(st): State<Shared>,
    OpenAiJson(req): OpenAiJson<LoadLoraAdapterRequest>,
) -> Result<String, ApiError> {
    let name = req.lora_name;
    if name.trim().is_empty() || name == st.name {
        return Err(ApiError::invalid(
            "lora_name",
            format!("lora_name {name:?} must be non-empty and not the base model's name"),
        ));
    }
    st.generator
        .load_adapter(name.clone(), req.lora_path)
        .await
        .map_err(generate_error)?;
    st.adapters
        .lock()
        .map_err(|_| ApiError::internal("the adapter list lock is poisoned"))?
        .insert(name.clone());
    Ok(format!(
        "Success: LoRA adapter '{name}' added successfully."
    ))
}

/// Unloads an adapter (vLLM's route and answer): requests naming it are
/// refused (404) from now on; those already queued are generated first.
async fn unload_lora_adapter(
    State(st): State<Shared>,
    OpenAiJson(req): OpenAiJson<UnloadLoraAdapterRequest>,
) -> Result<String, ApiError> {
    let name = req.lora_name;
    let removed = st
        .adapters
        .lock()
        .map_err(|_| ApiError::internal("the adapter list lock is poisoned"))?
        .remove(&name);
    if !removed {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("the LoRA adapter '{name}' cannot be found"),
            Some("lora_name"),
            Some("adapter_not_found"),
        ));
    }
    st.generator
        .unload_adapter(name.clone())
        .await
        .map_err(generate_error)?;
    Ok(format!(
        "Success: LoRA adapter '{name}' removed successfully."
    ))
}

/// A generation request's `model`: the served model, a loaded LoRA
/// adapter, or none (the served model).
trait NamesModel {
    fn model(&self) -> Option<String>;
}

impl NamesModel for CompletionRequest {
    fn model(&self) -> Option<String> {
        self.model.clone()
    }
}

impl NamesModel for ChatCompletionRequest {
    fn model(&self) -> Option<String> {
        self.model.clone()
    }
}

/// A generation route (`/v1/completions`, `/v1/chat/completions`): the body
/// read as `Req` ([`OpenAiJson`]) and answered by [`answer_request`] with
/// `plan_of` and `answer_of`.
fn generation_route<Req, Resp>(
    plan_of: Planner<Req>,
    answer_of: Answerer<Resp>,
    kind: Kind,
) -> MethodRouter<Shared>
where
    Req: DeserializeOwned + NamesModel + Send + 'static,
    Resp: Serialize + Send + 'static,
{
    post(
        move |State(st): State<Shared>, OpenAiJson(req): OpenAiJson<Req>| async move {
            let model = req.model();
            answer_request(st, model, req, plan_of, answer_of, kind).await
        },
    )
}

/// Checks a request's body into a [`Plan`] (tokenizing).
type Planner<Req> = fn(&Req, &ChatTokenizer, &ModelLimits) -> Result<Plan, ApiError>;
/// Writes a request's answer from its generated choices (decoding).
type Answerer<Resp> =
    fn(&ChatTokenizer, &str, &Plan, GenerateOutput) -> Result<Resp, TokenizerError>;

/// One generation request from body to answer: check the model it names,
/// plan it on a blocking thread, then stream it, or generate and write the
/// answer (named after the adapter used, if any) on a blocking thread.
async fn answer_request<Req, Resp>(
    st: Shared,
    model: Option<String>,
    req: Req,
    plan_of: Planner<Req>,
    answer_of: Answerer<Resp>,
    kind: Kind,
) -> Result<Response, ApiError>
where
    Req: Send + 'static,
    Resp: Serialize + Send + 'static,
{
    let adapter = st.check_model(model.as_deref())?;
    let plan = {
        let st = Arc::clone(&st);
        blocking(move || plan_of(&req, &st.tokenizer, &st.limits)).await??
    };
    if plan.stream.is_some() {
        return stream::respond(st, plan, adapter, kind);
    }
    let output = st.generate(&plan, adapter.clone()).await?;
    let answer = blocking(move || {
        let name = adapter.as_deref().unwrap_or(&st.name);
        answer_of(&st.tokenizer, name, &plan, output)
            .map_err(|e| ApiError::internal(format!("decoding: {e}")))
    })
    .await??;
    Ok(Json(answer).into_response())
}

impl AppState {
    /// A request may name the served model, a loaded LoRA adapter (its
    /// name is returned) or none.
    fn check_model(&self, asked: Option<&str>) -> Result<Option<String>, ApiError> {
        match asked {
            Some(m) if m != self.name => {
                if self.adapter_names()?.contains(m) {
                    Ok(Some(m.to_string()))
                } else {
                    Err(ApiError::unknown_model(m, &self.name))
                }
            }
            _ => Ok(None),
        }
    }

    /// The model card of `id` (the served model or an adapter).
    fn card(&self, id: &str) -> ModelCard {
        ModelCard {
            id: id.to_string(),
            object: "model".into(),
            created: self.created,
            owned_by: "agentrl".into(),
            max_model_len: Some(self.limits.max_model_len),
        }
    }

    fn adapter_names(&self) -> Result<BTreeSet<String>, ApiError> {
        Ok(self
            .adapters
            .lock()
            .map_err(|_| ApiError::internal("the adapter list lock is poisoned"))?
            .clone())
    }

    /// Every sequence of `plan`, from the model thread, with `adapter` or the base.
    async fn generate(
        &self,
        plan: &Plan,
        adapter: Option<String>,
    ) -> Result<GenerateOutput, ApiError> {
        self.generator
            .generate_with(request_of(plan, adapter, None))
            .await
            .map_err(generate_error)
    }

    /// Queue `plan`'s sequences and receive their tokens as they come;
    /// setting `stop_flags[i]` ends sequence `i`.
    pub(crate) fn start_stream(
        &self,
        plan: &Plan,
        adapter: Option<String>,
        stop_flags: Arc<[AtomicBool]>,
    ) -> Result<UnboundedReceiver<StreamEvent>, ApiError> {
        self.generator
            .stream(request_of(plan, adapter, Some(stop_flags)))
            .map_err(generate_error)
    }
}

/// The model thread's request for `plan`.
fn request_of(
    plan: &Plan,
    adapter: Option<String>,
    stop_flags: Option<Arc<[AtomicBool]>>,
) -> GenerateRequest {
    let (prompts, rngs) = plan.sequences();
    GenerateRequest {
        prompts,
        rngs,
        params: plan.params.clone(),
        adapter,
        options: SequenceOptions {
            adjust: plan.adjust.clone(),
            top_logprobs: plan.top_logprobs,
            score_prompts: plan.prompt_scoring().map(|k| (plan.prompts.clone(), k)),
            stop_flags,
        },
    }
}

/// The answer to a model thread's failure.
pub(crate) fn generate_error(e: GenerateError) -> ApiError {
    match e {
        GenerateError::Busy(queued) => ApiError::busy(queued),
        GenerateError::Stopped => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the server is shutting down",
            None,
            None,
        ),
        GenerateError::Failed(msg) => ApiError::internal(msg),
        GenerateError::Adapter(msg) => ApiError::bad_request(msg),
    }
}

/// Run `f` on tokio's blocking pool (tokenizing and decoding stay off the
/// async workers).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("a request task failed: {e}")))
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!(
            "no route {} {} (served: GET /v1/models, GET /v1/models/{{id}}, POST /v1/completions, POST /v1/chat/completions, POST /v1/load_lora_adapter, POST /v1/unload_lora_adapter, GET /health)",
            req.method(),
            req.uri().path()
        ),
        None,
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentrl_policy_client::protocol::CompletionRequest;

    fn error_of(body: &str) -> ApiError {
        let de = &mut serde_json::Deserializer::from_str(body);
        let e = serde_path_to_error::deserialize::<_, CompletionRequest>(de).unwrap_err();
        body_error(&e)
    }

    #[test]
    fn body_errors_name_the_field() {
        let e = error_of(r#"{"prompt": "x", "max_tokens": "ten"}"#);
        assert_eq!(e.body.error.param.as_deref(), Some("max_tokens"));
        let e = error_of(r#"{"prompt": "x", "best_of": -2}"#);
        assert_eq!(e.body.error.param.as_deref(), Some("best_of"));
        let e = error_of(r#"{"prompt": "x", "functions": []}"#);
        assert_eq!(e.body.error.param.as_deref(), Some("functions"));
        let e = error_of(r#"{"prompt": "x", "stream_options": {"bogus": 1}}"#);
        assert_eq!(e.body.error.param.as_deref(), Some("stream_options.bogus"));
        let e = error_of(r#"{"prompt": {"a": 1}}"#);
        assert_eq!(e.body.error.param.as_deref(), Some("prompt"));
        let e = error_of("not json");
        assert_eq!(e.body.error.param, None);
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }
}
