//! A hand-written OpenAPI 3.0 description of the routes (`GET /openapi.json`).
//!
//! Hand-written rather than derived (utoipa): the routes are few and stable,
//! and a derive crate would add a proc-macro dependency tree for one document.

use serde_json::{json, Value};

fn id_query() -> Value {
    json!([{ "name": "id", "in": "query", "required": true, "schema": { "type": "integer", "format": "uint64" } }])
}

fn body(schema: &str) -> Value {
    json!({ "required": false, "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{schema}") } } } })
}

fn ok(schema: Value) -> Value {
    json!({
        "200": { "description": "OK", "content": { "application/json": { "schema": schema } } },
        "4XX": { "description": "Bad input; the body is an Error", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } }
    })
}

fn reference(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

/// Session routes, relative to a prefix ("" or "/{env}").
fn session_paths(prefix: &str, paths: &mut serde_json::Map<String, Value>, env_param: bool) {
    let env = if env_param {
        json!([{ "name": "env", "in": "path", "required": true, "schema": { "type": "string" } }])
    } else {
        json!([])
    };
    let with_env = |extra: Value| -> Value {
        let mut v = env.as_array().cloned().unwrap_or_default();
        v.extend(extra.as_array().cloned().unwrap_or_default());
        Value::Array(v)
    };
    let post = |summary: &str, req: &str, resp: Value| json!({ "post": { "summary": summary, "parameters": with_env(json!([])), "requestBody": body(req), "responses": ok(resp) } });
    let get = |summary: &str, resp: Value| json!({ "get": { "summary": summary, "parameters": with_env(id_query()), "responses": ok(resp) } });
    paths.insert(
        format!("{prefix}/create"),
        post(
            "Create a session (an empty body is allowed); data_idx = seed index in the split (default train)",
            "CreateRequest",
            reference("SessionResponse"),
        ),
    );
    paths.insert(
        format!("{prefix}/reset"),
        post(
            "Reset a session, optionally to another seed/data_idx, difficulty or split",
            "ResetRequest",
            reference("SessionResponse"),
        ),
    );
    paths.insert(
        format!("{prefix}/step"),
        post(
            "Apply one action. Invalid action: 400 kind=invalid_action, the session stays usable and counted it. After done: 409 kind=episode_over",
            "StepRequest",
            reference("StepResponse"),
        ),
    );
    paths.insert(
        format!("{prefix}/step_batch"),
        json!({ "post": { "summary": "Apply many steps in order; one result per entry", "parameters": with_env(json!([])),
            "requestBody": { "content": { "application/json": { "schema": { "type": "array", "items": reference("StepRequest") } } } },
            "responses": ok(json!({ "type": "array", "items": reference("BatchStepResult") })) } }),
    );
    paths.insert(
        format!("{prefix}/close"),
        post(
            "Close a session",
            "CloseRequest",
            json!({ "type": "object" }),
        ),
    );
    paths.insert(
        format!("{prefix}/observation"),
        get(
            "Current observation (a JSON string)",
            json!({ "type": "string" }),
        ),
    );
    paths.insert(
        format!("{prefix}/available_actions"),
        get(
            "Currently valid actions",
            json!({ "type": "array", "items": { "type": "string" } }),
        ),
    );
    paths.insert(
        format!("{prefix}/instructions"),
        get(
            "The environment's instructions (a JSON string)",
            json!({ "type": "string" }),
        ),
    );
    paths.insert(
        format!("{prefix}/expert_action"),
        get("The expert solver's next action, or null", json!({ "type": "object", "properties": { "action": { "type": "string", "nullable": true } } })),
    );
}

/// The document, listing the served environments in the description.
pub(crate) fn document(envs: &[&str]) -> Value {
    let mut paths = serde_json::Map::new();
    paths.insert("/health".into(), json!({ "get": { "summary": "Liveness and live session count (no token needed)", "responses": ok(reference("Health")) } }));
    paths.insert("/envs".into(), json!({ "get": { "summary": "Served environments", "responses": ok(json!({ "type": "array", "items": reference("EnvEntry") })) } }));
    session_paths("", &mut paths, false);
    session_paths("/{env}", &mut paths, true);
    let status_props = json!({
        "done": { "type": "boolean" }, "success": { "type": "boolean" },
        "score": { "type": "number", "description": "sum of rewards since reset" },
        "steps": { "type": "integer" }, "invalid_actions": { "type": "integer" }, "max_steps": { "type": "integer" },
        "state_key": { "type": "integer", "format": "uint64" }
    });
    let mut session_props = json!({
        "id": { "type": "integer" }, "env": { "type": "string" }, "spec": reference("TaskSpec"),
        "observation": { "type": "string" }, "instructions": { "type": "string" }, "reward": { "type": "number" }
    });
    let mut step_props = json!({
        "id": { "type": "integer" }, "observation": { "type": "string" }, "reward": { "type": "number" },
        "info": { "type": "object", "properties": { "effective": { "type": "boolean" }, "extra": { "type": "object" } } }
    });
    for props in [&mut session_props, &mut step_props] {
        if let (Some(p), Some(s)) = (props.as_object_mut(), status_props.as_object()) {
            p.extend(s.clone());
        }
    }
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "agentrl environment server",
            "version": env!("CARGO_PKG_VERSION"),
            "description": format!(
                "AgentGym-compatible env-server routes, at the top level (env in the body) and under /{{env}}/. \
                 Every error is a JSON body {{\"error\", \"kind\"}}. With --token, every route but /health needs \
                 'Authorization: Bearer <token>'. Served: {}.", envs.join(", "))
        },
        "paths": paths,
        "components": { "schemas": {
            "CreateRequest": { "type": "object", "properties": {
                "env": { "type": "string" }, "seed": { "type": "integer" }, "data_idx": { "type": "integer", "description": "same as seed" },
                "difficulty": { "type": "string" }, "split": { "type": "string", "enum": ["train", "val", "test"] },
                "params": { "type": "object", "description": "env params; only the env's request_params (see GET /envs), others answer 403 kind=forbidden_param" } } },
            "ResetRequest": { "type": "object", "required": ["id"], "properties": {
                "env": { "type": "string" }, "id": { "type": "integer" }, "seed": { "type": "integer" }, "data_idx": { "type": "integer" },
                "difficulty": { "type": "string" }, "split": { "type": "string" } } },
            "StepRequest": { "type": "object", "required": ["id", "action"], "properties": {
                "env": { "type": "string" }, "id": { "type": "integer" }, "action": { "type": "string" } } },
            "CloseRequest": { "type": "object", "required": ["id"], "properties": { "env": { "type": "string" }, "id": { "type": "integer" } } },
            "TaskSpec": { "type": "object", "properties": {
                "env": { "type": "string" }, "split": { "type": "string" }, "difficulty": { "type": "string" }, "seed": { "type": "integer" } } },
            "SessionResponse": { "type": "object", "properties": session_props },
            "StepResponse": { "type": "object", "properties": step_props },
            "BatchStepResult": { "type": "object", "properties": {
                "code": { "type": "integer" }, "ok": reference("StepResponse"), "err": reference("Error") } },
            "Health": { "type": "object", "properties": {
                "status": { "type": "string" }, "sessions": { "type": "integer" }, "max_sessions": { "type": "integer" },
                "builds_running": { "type": "integer" }, "builds_waiting": { "type": "integer" } } },
            "EnvEntry": { "type": "object", "properties": {
                "name": { "type": "string" }, "summary": { "type": "string" },
                "difficulties": { "type": "array", "items": { "type": "string" } }, "default_max_turns": { "type": "integer" },
                "request_params": { "type": "array", "items": { "type": "string" } } } },
            "Error": { "type": "object", "required": ["error", "kind"], "properties": {
                "error": { "type": "string" },
                "kind": { "type": "string", "enum": ["bad_request", "unauthorized", "not_found", "method_not_allowed",
                    "payload_too_large", "full", "busy", "invalid_action", "episode_over", "invalid_spec", "forbidden_param",
                    "timeout", "internal"] },
                "action_error": { "type": "object" }, "status": { "type": "object" } } }
        } }
    })
}
