//! AgentGym's own clients, replayed: every request of each committed
//! transcript (`tests/data/agentgym/<env>.json`, recorded from AgentGym's
//! clients against AgentGym's servers, `scripts/agentgym/README.md`) goes to
//! the `/{env}/` routes of an in-process `agentrl serve`, in order, with the
//! recorded session ids replaced by ours. Each answer must have the recorded
//! status and the fields and JSON types the AgentGym client reads; values that
//! depend on the backend (observation texts, rewards, `done` of a scripted
//! action on another task) are compared by shape only, except the messages a
//! client or trainer matches on (invalid actions). Before a recorded
//! "step after done" the replay drives the episode to its end with our expert,
//! since the recorded actions solve AgentGym's task, not ours.

use std::collections::HashMap;

use crate::common::{serve, start, test_config, Api};
use serde_json::{json, Value};

/// The envs `agentrl serve` speaks AgentGym's dialect for (sciworld: no env).
const ENVS: [&str; 5] = ["textcraft", "babyai", "alfworld", "webshop", "searchqa"];

/// Where we answer otherwise than AgentGym, on purpose (docs/src/agentgym.md,
/// GAP.md §6): the status we answer and why.
fn deliberate(env: &str, phase: &str, recorded: u16) -> Option<(u16, &'static str)> {
    match (env, phase, recorded) {
        // AgentGym's ALFWorld and WebShop servers have no close route (404,
        // their own client asserts on it); we close and answer true/false.
        ("alfworld" | "webshop", p, 404) if p.ends_with("close") || p.ends_with("close.again") => {
            Some((200, "close answers a bool"))
        }
        // Our ALFWorld env has its task at create: an observation, not
        // AgentGym's `{"error": "'observation'"}`.
        ("alfworld", "probe.observation.before_reset", _) => {
            Some((200, "observation before reset"))
        }
        // `data_idx` names the game as every other AgentGym client names its
        // task, and `world_type` defaults to "Text".
        ("alfworld", "probe.reset.data_idx_instead_of_game", _) => {
            Some((200, "data_idx is game's alias"))
        }
        // Client errors AgentGym's SearchQA answers with an uncaught 500.
        ("searchqa", "probe.step.unknown_env_idx", 500) => Some((404, "unknown env_idx")),
        ("searchqa", "probe.create.item_out_of_range", 500) => Some((400, "item past the data")),
        ("searchqa", "probe.reset.no_item_id", 500) => Some((422, "reset needs the item id")),
        _ => None,
    }
}

fn id_key(env: &str) -> &'static str {
    match env {
        "webshop" | "searchqa" => "env_idx",
        _ => "id",
    }
}

/// The JSON type of a value, numbers as one type (AgentGym sends `0` where we send `0.0`).
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Same top-level type; objects: the same keys with values of the same
/// types (`detail` entries: the same `loc`s); arrays: the same element types.
fn same_shape(ours: &Value, recorded: &Value) -> Result<(), String> {
    if kind(ours) != kind(recorded) {
        return Err(format!("{} instead of {}", kind(ours), kind(recorded)));
    }
    match (ours, recorded) {
        (Value::Object(o), Value::Object(r)) => {
            let ok: Vec<&String> = o.keys().collect();
            let rk: Vec<&String> = r.keys().collect();
            let (mut ok, mut rk) = (ok, rk);
            ok.sort();
            rk.sort();
            if ok != rk {
                return Err(format!("keys {ok:?} instead of {rk:?}"));
            }
            for (k, rv) in r {
                if k == "detail" {
                    let locs = |v: &Value| -> Vec<Value> {
                        v.as_array()
                            .map(|a| a.iter().map(|d| d["loc"].clone()).collect())
                            .unwrap_or_default()
                    };
                    if locs(&o[k]) != locs(rv) {
                        return Err(format!("detail {} instead of {}", o[k], rv));
                    }
                } else if kind(&o[k]) != kind(rv) {
                    return Err(format!("'{k}' is {} instead of {}", kind(&o[k]), kind(rv)));
                }
            }
            Ok(())
        }
        (Value::Array(o), Value::Array(r)) => {
            let ok: Vec<_> = o.iter().map(kind).collect();
            let rk: Vec<_> = r.iter().map(kind).collect();
            if ok == rk || (r.len() > 1 && ok.iter().all(|k| rk.contains(k))) {
                Ok(())
            } else {
                Err(format!("elements {ok:?} instead of {rk:?}"))
            }
        }
        _ => Ok(()),
    }
}

/// The recorded id → ours, for bodies and queries.
struct Ids(HashMap<u64, u64>);

impl Ids {
    fn map(&self, id: u64) -> u64 {
        self.0.get(&id).copied().unwrap_or(id)
    }

    fn body(&self, env: &str, body: &Value) -> Value {
        let mut body = body.clone();
        let key = id_key(env);
        if let Some(id) = body.get(key).and_then(Value::as_u64) {
            body[key] = json!(self.map(id));
        }
        body
    }

    fn path(&self, env: &str, path: &str) -> String {
        let key = id_key(env);
        let Some((route, query)) = path.split_once('?') else {
            return path.to_string();
        };
        let query: Vec<String> = query
            .split('&')
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) if k == key => match v.parse::<u64>() {
                    Ok(id) => format!("{k}={}", self.map(id)),
                    Err(_) => kv.to_string(),
                },
                _ => kv.to_string(),
            })
            .collect();
        format!("{route}?{}", query.join("&"))
    }
}

/// The session id in a create answer: `{"id": …}`, or a bare int.
fn created_id(v: &Value) -> Option<u64> {
    v.get("id").and_then(Value::as_u64).or_else(|| v.as_u64())
}

/// Our expert's action written the way `env`'s AgentGym client sends it.
fn as_client_action(env: &str, action: &str) -> String {
    if env != "searchqa" {
        return action.to_string();
    }
    for tag in ["search", "answer"] {
        if let Some(arg) = action
            .strip_prefix(&format!("{tag}["))
            .and_then(|a| a.strip_suffix(']'))
        {
            return format!("<think>expert</think>\n<{tag}> {arg} </{tag}>");
        }
    }
    action.to_string()
}

/// Step session `id` with our expert until the episode is over.
async fn drive_to_done(api: &Api, env: &str, id: u64) {
    for _ in 0..200 {
        let path = format!("/{env}/expert_action?id={id}");
        let (s, v) = api.send("GET", &path, None).await;
        assert_eq!(s, 200, "{env} expert_action: {v}");
        let Some(action) = v["action"].as_str() else {
            return; // the expert has nothing to do: the episode is over
        };
        let body = json!({ id_key(env): id, "action": as_client_action(env, action) });
        let (s, v) = api.send("POST", &format!("/{env}/step"), Some(&body)).await;
        assert_eq!(s, 200, "{env} expert step {action}: {v}");
        if v["done"] == true {
            return;
        }
    }
    panic!("{env}: the expert did not finish session {id} in 200 steps");
}

/// The text a trainer matches an invalid action by: the first line.
fn first_line(v: &Value, field: &str) -> String {
    v[field]
        .as_str()
        .unwrap_or_default()
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

async fn replay(api: &Api, env: &str) {
    let path = format!(
        "{}/tests/data/agentgym/{env}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let transcript: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut ids = Ids(HashMap::new());
    let mut last_state: HashMap<u64, Value> = HashMap::new();
    let mut replayed = 0;
    for e in transcript["exchanges"].as_array().unwrap() {
        let Some(method) = e["method"].as_str() else {
            continue; // what the client returned or raised
        };
        let phase = e["phase"].as_str().unwrap();
        let recorded_status = e["status"].as_u64().unwrap() as u16;
        let recorded = e.get("response").cloned().unwrap_or(Value::Null);
        let request = e.get("request").filter(|r| !r.is_null());
        let route = e["path"].as_str().unwrap();
        let body = request.map(|b| ids.body(env, b));
        let session = body
            .as_ref()
            .and_then(|b| b.get(id_key(env)))
            .and_then(Value::as_u64);
        if phase == "client.step.after_done" {
            if let Some(id) = session {
                drive_to_done(api, env, id).await;
            }
        }
        let path = format!("/{env}{}", ids.path(env, route));
        let (status, ours) = api.send(method, &path, body.as_ref()).await;
        let what = format!("{env} {phase} {method} {route} {}", json!(request));
        replayed += 1;
        if let Some((expected, why)) = deliberate(env, phase, recorded_status) {
            assert_eq!(status.as_u16(), expected, "{what} ({why}): {ours}");
            continue;
        }
        assert_eq!(status.as_u16(), recorded_status, "{what}: {ours}");
        if recorded_status == 500 {
            continue; // AgentGym's body is the text "Internal Server Error"
        }
        if let Err(why) = same_shape(&ours, &recorded) {
            panic!("{what}: {why}\n ours: {ours}\n recorded: {recorded}");
        }
        if route == "/create" && status == 200 {
            if let (Some(r), Some(o)) = (created_id(&recorded), created_id(&ours)) {
                ids.0.insert(r, o);
            }
        }
        let field = if env == "webshop" {
            "state"
        } else {
            "observation"
        };
        if phase == "client.step.invalid" {
            if env == "webshop" {
                // "If action not valid, perform nothing": the page unchanged.
                let before = session.and_then(|id| last_state.get(&id)).cloned();
                assert_eq!(Some(ours[field].clone()), before, "{what}");
            } else {
                assert_eq!(
                    first_line(&ours, field),
                    first_line(&recorded, field),
                    "{what}"
                );
            }
        }
        if let (Some(id), true) = (session, ours.get(field).is_some()) {
            last_state.insert(id, ours[field].clone());
        }
    }
    assert!(replayed > 10, "{env}: only {replayed} requests replayed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agentgym_clients_requests_get_agentgyms_answers() {
    let (server, api) = serve().await;
    for env in ENVS {
        replay(&api, env).await;
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn babyai_data_idx_picks_agentgyms_level_and_the_operator_may_pick_a_difficulty() {
    let (server, api) = serve().await;
    let (_, v) = api.send("POST", "/babyai/create", None).await;
    let id = v["id"].as_u64().unwrap();
    let mut missions = Vec::new();
    for data_idx in [0u64, 18, 40] {
        let body = json!({"id": id, "data_idx": data_idx});
        let (s, v) = api.send("POST", "/babyai/reset", Some(&body)).await;
        assert_eq!(s, 200, "{v}");
        let obs = v["observation"].as_str().unwrap().to_string();
        assert!(
            obs.contains("\nAvailable actions: [\"turn left\", "),
            "{obs}"
        );
        missions.push(obs.lines().next().unwrap().to_string());
    }
    // Level 1 (GoToRedBallGrey) is a "go to the red ball" mission for every seed.
    assert!(
        missions[0].contains("red ball") && missions[2].contains("red ball"),
        "{missions:?}"
    );
    assert_ne!(missions[0], missions[1]);
    server.shutdown().await.unwrap();

    let config = agentrl_server::ServerConfig {
        env_params: vec!["babyai.difficulty=bosslevel".into()],
        ..test_config()
    };
    let server = start(config).await;
    let api = Api::new(&server);
    let (_, v) = api.send("POST", "/babyai/create", None).await;
    let id = v["id"].as_u64().unwrap();
    let body = json!({"id": id, "data_idx": 0});
    let (s, _) = api.send("POST", "/babyai/reset", Some(&body)).await;
    assert_eq!(s, 200);
    // The typed API shows which task the reset built.
    let (s, v) = api
        .send("POST", "/create", Some(&json!({"env": "babyai"})))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["spec"]["difficulty"], "bosslevel");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_sessions_under_env_keep_the_typed_api_and_agentgym_ones_count_invalid_actions() {
    let (server, api) = serve().await;
    // An agentrl client (it names the env) under /{env}/: 400 as at the top level.
    let (_, v) = api
        .send("POST", "/counter/create", Some(&json!({"env": "counter"})))
        .await;
    let typed = v["id"].as_u64().unwrap();
    let body = json!({"id": typed, "action": "jump"});
    let (s, v) = api.send("POST", "/counter/step", Some(&body)).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["kind"], "invalid_action");
    // An AgentGym client: 200 with the message; the counter still counts it.
    let (_, v) = api.send("POST", "/counter/create", None).await;
    let id = v["id"].as_u64().unwrap();
    let body = json!({"id": id, "action": "jump"});
    let (s, v) = api.send("POST", "/counter/step", Some(&body)).await;
    assert_eq!(s, 200, "{v}");
    assert!(
        v["observation"]
            .as_str()
            .unwrap()
            .starts_with("Invalid action: unknown action 'jump'"),
        "{v}"
    );
    assert_eq!(v["invalid_actions"], 1);
    assert_eq!(v["done"], false);
    // Unknown id, step after done, a second close: 200 as AgentGym answers.
    let body = json!({"id": 12_345, "action": "inc"});
    let (s, v) = api.send("POST", "/counter/step", Some(&body)).await;
    assert_eq!(
        (s.as_u16(), v),
        (200, json!({"error": "The id 12345 is not valid."}))
    );
    drive_to_done(&api, "counter", id).await;
    let body = json!({"id": id, "action": "inc"});
    let (s, v) = api.send("POST", "/counter/step", Some(&body)).await;
    assert_eq!(
        (s.as_u16(), v),
        (
            200,
            json!({"error": format!("The task with environment {id} has finished.")})
        )
    );
    for expected in [true, false] {
        let (s, v) = api
            .send("POST", "/counter/close", Some(&json!({"id": id})))
            .await;
        assert_eq!((s.as_u16(), v), (200, json!(expected)));
    }
    let (s, v) = api
        .send("POST", "/counter/close", Some(&json!({"id": typed})))
        .await;
    assert_eq!(s, 200);
    assert_eq!(v["closed"], true);
    // Typed sessions name themselves `id` under WebShop and SearchQA too
    // (whose AgentGym clients say `env_idx`).
    for (env, action) in [("webshop", "search[shoes]"), ("searchqa", "search[paris]")] {
        let url = format!("/{env}/create");
        let (s, v) = api.send("POST", &url, Some(&json!({"env": env}))).await;
        assert_eq!(s, 200, "{v}");
        let id = v["id"].as_u64().unwrap();
        let body = json!({"id": id, "action": action});
        let (s, v) = api.send("POST", &format!("/{env}/step"), Some(&body)).await;
        assert_eq!(s, 200, "{env}: {v}");
        assert_eq!(v["steps"], 1, "{env}: {v}");
        let url = format!("/{env}/observation?id={id}");
        let (s, v) = api.send("GET", &url, None).await;
        assert_eq!(s, 200, "{env}: {v}");
        assert!(v.is_string(), "{env}: {v}");
        let url = format!("/{env}/close");
        let (s, v) = api.send("POST", &url, Some(&json!({"id": id}))).await;
        assert_eq!(
            (s.as_u16(), &v["closed"]),
            (200, &json!(true)),
            "{env}: {v}"
        );
    }
    assert_eq!(server.live_sessions(), 0);
    server.shutdown().await.unwrap();
}

/// POST `body` as it is (malformed JSON included) to `path`: the status
/// and the JSON answer.
async fn post_raw(api: &Api, path: &str, body: &str) -> (u16, Value) {
    let r = api
        .client
        .post(api.url(path))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

/// The first entry of a FastAPI 422 answer, checked to be one.
fn first_detail(status: u16, v: &Value, what: &str) -> Value {
    assert_eq!(status, 422, "{what}: {v}");
    let detail = v["detail"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: {v}"));
    for d in detail {
        assert!(
            d["type"].is_string() && d["loc"].is_array() && d["msg"].is_string(),
            "{what}: {d}"
        );
    }
    detail[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_env_idx_is_a_404_naming_it_and_searchqa_item_mistakes_are_4xx() {
    let (server, api) = serve().await;
    for env in ["webshop", "searchqa"] {
        let requests = [
            (
                "POST",
                format!("/{env}/step"),
                Some(json!({"env_idx": 999, "action": "search[x]"})),
            ),
            (
                "POST",
                format!("/{env}/reset"),
                Some(json!({"env_idx": 999, "id": 0, "session_id": 0})),
            ),
            ("GET", format!("/{env}/observation?env_idx=999"), None),
            ("GET", format!("/{env}/available_actions?env_idx=999"), None),
        ];
        for (method, path, body) in requests {
            let (s, v) = api.send(method, &path, body.as_ref()).await;
            assert_eq!(s, 404, "{method} {path}: {v}");
            assert_eq!(v["kind"], "not_found", "{method} {path}: {v}");
            let msg = v["error"].as_str().unwrap_or_default();
            assert!(msg.contains("env_idx 999"), "{method} {path}: {v}");
        }
    }
    // An item past SearchQA's data is the request's mistake (400, naming
    // it), at create and at reset; a reset without the item is a missing field.
    let body = json!({"id": 221_328});
    let (s, v) = api.send("POST", "/searchqa/create", Some(&body)).await;
    assert_eq!(
        (s.as_u16(), &v["kind"]),
        (400, &json!("invalid_spec")),
        "{v}"
    );
    assert!(v["error"].as_str().unwrap().contains("221328"), "{v}");
    let body = json!({"id": 3});
    let (s, v) = api.send("POST", "/searchqa/create", Some(&body)).await;
    assert_eq!(s, 200, "{v}");
    let id = v.as_u64().unwrap();
    let body = json!({"env_idx": id, "id": 221_328});
    let (s, v) = api.send("POST", "/searchqa/reset", Some(&body)).await;
    assert_eq!(
        (s.as_u16(), &v["kind"]),
        (400, &json!("invalid_spec")),
        "{v}"
    );
    let body = json!({"env_idx": id});
    let (s, v) = api.send("POST", "/searchqa/reset", Some(&body)).await;
    let d = first_detail(s.as_u16(), &v, "reset without id");
    assert_eq!(
        (&d["type"], &d["loc"]),
        (&json!("missing"), &json!(["body", "id"]))
    );
    let (s, v) = api
        .send("POST", "/searchqa/close", Some(&json!({"env_idx": id})))
        .await;
    assert_eq!((s.as_u16(), v), (200, json!(true)));
    // A WebShop goal past the seeds an env can build: 400 with the reason.
    let (_, v) = api.send("POST", "/webshop/create", None).await;
    let id = v.as_u64().unwrap();
    let body = json!({"env_idx": id, "session_id": 1u64 << 40});
    let (s, v) = api.send("POST", "/webshop/reset", Some(&body)).await;
    assert_eq!(
        (s.as_u16(), &v["kind"]),
        (400, &json!("invalid_spec")),
        "{v}"
    );
    assert!(
        v["error"].as_str().unwrap().contains("1099511627776"),
        "{v}"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_or_invalid_bodies_on_agentgym_routes_are_fastapis_422() {
    let (server, api) = serve().await;
    for route in [
        "/babyai/create",
        "/babyai/reset",
        "/babyai/step",
        "/babyai/close",
        "/webshop/step",
        "/alfworld/reset",
    ] {
        let (s, v) = post_raw(&api, route, "{\"id\": ").await;
        let d = first_detail(s, &v, route);
        assert_eq!(d["type"], "json_invalid", "{route}: {v}");
        // Where the text ends, as Python's json module reports it.
        assert_eq!(d["loc"], json!(["body", 7]), "{route}: {v}");
        let msg = d["msg"].as_str().unwrap();
        assert!(
            msg.starts_with("JSON decode error") && msg.contains("EOF"),
            "{route}: {v}"
        );
    }
    // A bad character: its offset, on the line it is on.
    let (s, v) = post_raw(&api, "/babyai/step", "{\"id\": 1,\n \"action\": x}").await;
    let d = first_detail(s, &v, "bad character");
    assert_eq!(d["loc"], json!(["body", 21]), "{v}");
    // JSON that is not an object where the route reads fields.
    let (s, v) = post_raw(&api, "/babyai/step", "[1, 2]").await;
    let d = first_detail(s, &v, "a list");
    assert_eq!(
        (&d["type"], &d["loc"]),
        (&json!("model_attributes_type"), &json!(["body"])),
        "{v}"
    );
    // A missing field, a field of the wrong type.
    let (s, v) = post_raw(&api, "/babyai/step", "{\"id\": 1}").await;
    let d = first_detail(s, &v, "no action");
    assert_eq!(
        (&d["type"], &d["loc"]),
        (&json!("missing"), &json!(["body", "action"]))
    );
    let (s, v) = post_raw(&api, "/babyai/step", "{\"id\": true, \"action\": \"x\"}").await;
    let d = first_detail(s, &v, "a bool id");
    assert_eq!(
        (&d["type"], &d["loc"]),
        (&json!("int_type"), &json!(["body", "id"]))
    );
    // agentrl's own routes keep their answer: 400 for malformed JSON.
    let (s, v) = post_raw(&api, "/step", "{\"id\": ").await;
    assert_eq!((s, &v["kind"]), (400, &json!("bad_request")), "{v}");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_and_indices_given_as_decimal_strings_are_read_as_pydantic_reads_them() {
    let (server, api) = serve().await;
    let (_, v) = api.send("POST", "/babyai/create", None).await;
    let id = v["id"].as_u64().unwrap();
    let sid = id.to_string();
    let reset = |body: Value| {
        let api = api.clone();
        async move { api.send("POST", "/babyai/reset", Some(&body)).await }
    };
    let (s, by_int) = reset(json!({"id": id, "data_idx": 18})).await;
    assert_eq!(s, 200, "{by_int}");
    for data_idx in [json!("18"), json!(" 18 "), json!("+18"), json!(18.0)] {
        let (s, v) = reset(json!({"id": sid, "data_idx": data_idx})).await;
        assert_eq!((s.as_u16(), &v), (200, &by_int), "data_idx {data_idx}");
    }
    let body = json!({"id": sid, "action": "turn left"});
    let (s, v) = api.send("POST", "/babyai/step", Some(&body)).await;
    assert_eq!(s, 200, "{v}");
    assert!(v["observation"].is_string(), "{v}");
    // What pydantic refuses: 422 naming the field and the value.
    for (body, field, kind) in [
        (json!({"id": "abc", "data_idx": 0}), "id", "int_parsing"),
        (
            json!({"id": sid, "data_idx": "1x"}),
            "data_idx",
            "int_parsing",
        ),
        (
            json!({"id": sid, "data_idx": ""}),
            "data_idx",
            "int_parsing",
        ),
        (
            json!({"id": sid, "data_idx": 1.5}),
            "data_idx",
            "int_from_float",
        ),
        (
            json!({"id": sid, "data_idx": -1}),
            "data_idx",
            "greater_than_equal",
        ),
        (
            json!({"id": sid, "data_idx": "-1"}),
            "data_idx",
            "greater_than_equal",
        ),
        (json!({"id": sid, "data_idx": [1]}), "data_idx", "int_type"),
    ] {
        let (s, v) = reset(body.clone()).await;
        let d = first_detail(s.as_u16(), &v, &body.to_string());
        assert_eq!(
            (&d["type"], &d["loc"], &d["input"]),
            (&json!(kind), &json!(["body", field]), &body[field]),
            "{body}: {v}"
        );
    }
    let (s, v) = api.send("GET", "/babyai/observation?id=abc", None).await;
    let d = first_detail(s.as_u16(), &v, "?id=abc");
    assert_eq!(
        (&d["type"], &d["loc"]),
        (&json!("int_parsing"), &json!(["query", "id"]))
    );
    let (s, v) = api
        .send("GET", &format!("/babyai/observation?id=%2B{id}"), None)
        .await;
    assert_eq!(s, 200, "{v}");
    // WebShop's env_idx and session_id.
    let (_, v) = api.send("POST", "/webshop/create", None).await;
    let ws = v.as_u64().unwrap();
    let body = json!({"env_idx": ws, "session_id": 2});
    let (s, by_int) = api.send("POST", "/webshop/reset", Some(&body)).await;
    assert_eq!(s, 200, "{by_int}");
    let body = json!({"env_idx": ws.to_string(), "session_id": "2"});
    let (s, v) = api.send("POST", "/webshop/reset", Some(&body)).await;
    assert_eq!((s.as_u16(), &v), (200, &by_int));
    for (env, body) in [
        ("babyai", json!({"id": sid})),
        ("webshop", json!({"env_idx": ws.to_string()})),
    ] {
        let path = format!("/{env}/close");
        let (s, v) = api.send("POST", &path, Some(&body)).await;
        assert_eq!((s.as_u16(), v), (200, json!(true)), "{env}");
    }
    assert_eq!(server.live_sessions(), 0);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alfworld_reset_takes_data_idx_for_game() {
    let (server, api) = serve().await;
    let (_, v) = api.send("POST", "/alfworld/create", None).await;
    let id = v["id"].as_u64().unwrap();
    let reset = |body: Value| {
        let api = api.clone();
        async move { api.send("POST", "/alfworld/reset", Some(&body)).await }
    };
    for game in [7u64, 2420] {
        let (s, by_game) = reset(json!({"id": id, "game": game, "world_type": "Text"})).await;
        assert_eq!(s, 200, "{by_game}");
        assert!(by_game["observation"].is_string(), "{by_game}");
        // The alias; world_type defaults to "Text".
        let (s, v) = reset(json!({"id": id, "data_idx": game})).await;
        assert_eq!((s.as_u16(), &v), (200, &by_game), "data_idx {game}");
        let (s, v) = reset(json!({"id": id, "data_idx": game, "game": game})).await;
        assert_eq!((s.as_u16(), &v), (200, &by_game), "both {game}");
    }
    let (s, v) = reset(json!({"id": id, "game": 1, "data_idx": 2})).await;
    let d = first_detail(s.as_u16(), &v, "game and data_idx differ");
    assert_eq!(d["loc"], json!(["body", "data_idx"]), "{v}");
    assert!(d["msg"].as_str().unwrap().contains("differ"), "{v}");
    let (s, v) = reset(json!({"id": id})).await;
    let d = first_detail(s.as_u16(), &v, "neither");
    assert_eq!(
        (&d["type"], &d["loc"]),
        (&json!("missing"), &json!(["body", "game"]))
    );
    let (s, v) = reset(json!({"id": id, "data_idx": 2620})).await;
    assert_eq!(
        (s.as_u16(), v),
        (200, json!({"error": "list index out of range"}))
    );
    server.shutdown().await.unwrap();
}
