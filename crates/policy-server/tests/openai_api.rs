//! The policy server on loopback, over the qwen2-tiny fixture made by
//! transformers: answers match the model (and transformers' greedy
//! continuation), seeded requests repeat whatever they are batched with,
//! stop strings and stop tokens cut as vLLM cuts, the chat route renders the
//! checkpoint's template, and every bad request is a 400 naming its field.

use agentrl_model::{Generation, SamplingParams};
use agentrl_policy_client::{OpenAiOptions, OpenAiPolicy};
use agentrl_policy_server::{BackgroundPolicyServer, PolicyServerConfig};
use agentrl_rollout::Policy;
use agentrl_tokenizer::ChatTokenizer;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

mod tiny_server;
use tiny_server::qwen2_tiny::{fixture_dir, reference, u32s as ids};
use tiny_server::{fixture_model as model, post_text};

fn start_with(config: PolicyServerConfig) -> BackgroundPolicyServer {
    tiny_server::serve(model(), config)
}

fn start() -> BackgroundPolicyServer {
    start_with(PolicyServerConfig::default())
}

/// POST `body` to `route`; the status and the JSON answer.
fn post(server: &BackgroundPolicyServer, route: &str, body: &Value) -> (u16, Value) {
    let (status, text) = post_text(server, route, body);
    (status, serde_json::from_str(&text).unwrap())
}

fn complete(server: &BackgroundPolicyServer, body: Value) -> Value {
    let (status, answer) = post(server, "/v1/completions", &body);
    assert_eq!(status, 200, "{answer}");
    answer
}

#[test]
fn greedy_completion_is_the_models_with_token_ids_and_logprobs() {
    let server = start();
    let r = reference();
    let prompt = ids(&r["input_ids"]);
    let greedy = ids(&r["greedy_new_ids"]);
    let answer = complete(
        &server,
        json!({"model": "tiny", "prompt": prompt, "max_tokens": greedy.len(), "temperature": 0,
               "logprobs": 0, "return_token_ids": true}),
    );
    let choice = &answer["choices"][0];
    assert_eq!(
        ids(&choice["token_ids"]),
        greedy,
        "transformers' greedy ids"
    );
    assert_eq!(ids(&choice["prompt_token_ids"]), prompt);
    assert_eq!(choice["finish_reason"], "length");
    let local = model()
        .generate(
            std::slice::from_ref(&prompt),
            &SamplingParams::greedy(greedy.len()),
            &mut ChaCha8Rng::seed_from_u64(0),
        )
        .unwrap()
        .remove(0);
    let served: Vec<f32> = choice["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(
        served, local.logprobs,
        "the model's own log-probs, bit for bit"
    );
    assert_eq!(
        choice["logprobs"]["tokens"].as_array().unwrap().len(),
        greedy.len()
    );
    let tokenizer = ChatTokenizer::load(fixture_dir()).unwrap();
    assert_eq!(choice["text"], tokenizer.decode(&greedy, true).unwrap());
    assert_eq!(
        answer["usage"],
        json!({"prompt_tokens": prompt.len(), "completion_tokens": greedy.len(),
               "total_tokens": prompt.len() + greedy.len()})
    );
    assert_eq!(answer["object"], "text_completion");
    assert_eq!(answer["model"], "tiny");
}

#[test]
fn seeded_choices_repeat_whatever_they_are_batched_with() {
    let server = start();
    let body = json!({"prompt": ["#_P_O_#", [1, 5, 9, 40]], "n": 2, "seed": 5,
                      "max_tokens": 8, "temperature": 1.0, "return_token_ids": true});
    let alone = complete(&server, body.clone());
    let choices = alone["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
    }
    assert_eq!(ids(&choices[2]["prompt_token_ids"]), vec![1, 5, 9, 40]);
    assert_ne!(
        choices[0]["token_ids"], choices[1]["token_ids"],
        "two choices of one prompt sample from their own streams"
    );
    // The same request while others crowd the model's batches.
    let crowded = std::thread::scope(|s| {
        let others: Vec<_> = (0..4)
            .map(|k| {
                let server = &server;
                s.spawn(move || {
                    complete(
                        server,
                        json!({"prompt": [3, 4, 5], "n": 3, "seed": k, "max_tokens": 8}),
                    )
                })
            })
            .collect();
        let again = complete(&server, body.clone());
        for o in others {
            o.join().unwrap();
        }
        again
    });
    let tokens = |a: &Value| -> Vec<Value> {
        a["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["token_ids"].clone())
            .collect()
    };
    assert_eq!(tokens(&crowded), tokens(&alone));
}

#[test]
fn stop_strings_and_stop_tokens_cut_as_vllm_does() {
    let server = start();
    let prompt = ids(&reference()["input_ids"]);
    let full = complete(
        &server,
        json!({"prompt": prompt, "max_tokens": 24, "temperature": 0, "return_token_ids": true,
               "ignore_eos": true}),
    );
    let text = full["choices"][0]["text"].as_str().unwrap().to_string();
    let tokens = ids(&full["choices"][0]["token_ids"]);
    // A stop string taken from the middle of the text.
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    assert!(chars.len() >= 6, "{text:?}");
    let (at, _) = chars[chars.len() / 2];
    let stop: String = text[at..].chars().take(2).collect();
    let first = text.find(&stop).unwrap();
    let cut = complete(
        &server,
        json!({"prompt": prompt, "max_tokens": 24, "temperature": 0, "return_token_ids": true,
               "ignore_eos": true, "stop": [stop.clone()], "logprobs": 0}),
    );
    let c = &cut["choices"][0];
    assert_eq!(c["text"], text[..first]);
    assert_eq!(
        (c["finish_reason"].clone(), c["stop_reason"].clone()),
        (json!("stop"), json!(stop))
    );
    let kept = ids(&c["token_ids"]);
    assert!(
        kept.len() < tokens.len() && tokens.starts_with(&kept),
        "{kept:?}"
    );
    assert_eq!(
        c["logprobs"]["token_logprobs"].as_array().unwrap().len(),
        kept.len()
    );
    // A stop token id ends the choice with the token.
    let stop_id = tokens[3];
    let end = tokens.iter().position(|&t| t == stop_id).unwrap();
    let by_id = complete(
        &server,
        json!({"prompt": prompt, "max_tokens": 24, "temperature": 0, "return_token_ids": true,
               "ignore_eos": true, "stop_token_ids": [stop_id]}),
    );
    let c = &by_id["choices"][0];
    assert_eq!(ids(&c["token_ids"]), tokens[..=end].to_vec());
    assert_eq!(c["finish_reason"], "stop");
    assert_eq!(c["stop_reason"], json!(stop_id));
}

#[test]
fn chat_completions_render_the_checkpoints_template() {
    let server = start();
    let r = reference();
    let greedy = ids(&r["greedy_new_ids"]);
    let (status, answer) = post(
        &server,
        "/v1/chat/completions",
        &json!({"messages": r["chat_messages"], "max_tokens": greedy.len(), "temperature": 0,
                "return_token_ids": true, "logprobs": true}),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(ids(&answer["prompt_token_ids"]), ids(&r["input_ids"]));
    let choice = &answer["choices"][0];
    assert_eq!(ids(&choice["token_ids"]), greedy);
    assert_eq!(choice["message"]["role"], "assistant");
    let tokenizer = ChatTokenizer::load(fixture_dir()).unwrap();
    assert_eq!(
        choice["message"]["content"],
        tokenizer.decode(&greedy, true).unwrap()
    );
    assert_eq!(
        choice["logprobs"]["content"].as_array().unwrap().len(),
        greedy.len()
    );
    assert_eq!(answer["object"], "chat.completion");
}

#[test]
fn bad_requests_answer_400_naming_the_field() {
    let server = start_with(PolicyServerConfig {
        body_limit: 4096,
        ..PolicyServerConfig::default()
    });
    let cases: Vec<(&str, Value, u16, Option<&str>)> = vec![
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 0}),
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 100000}),
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": "ten"}),
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1, 384]}),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"prompt": ["ok", []]}),
            400,
            Some("prompt[1]"),
        ),
        (
            "/v1/completions",
            json!({"max_tokens": 3}),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "temperature": -1}),
            400,
            Some("temperature"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "top_p": 2}),
            400,
            Some("top_p"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "top_k": -5}),
            400,
            Some("top_k"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "n": 0}),
            400,
            Some("n"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "logprobs": 21}),
            400,
            Some("logprobs"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "stream_options": {"include_usage": true}}),
            400,
            Some("stream_options"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "suffix": "and so on"}),
            400,
            Some("suffix"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "n": 2, "best_of": 1}),
            400,
            Some("best_of"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "stop": ["a", ""]}),
            400,
            Some("stop[1]"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "stop_token_ids": [7, 384]}),
            400,
            Some("stop_token_ids[1]"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "seed": -1}),
            400,
            Some("seed"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "model": "other"}),
            404,
            Some("model"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": []}),
            400,
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user"}]}),
            400,
            Some("messages[0].content"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            400,
            Some("messages[0].content[0].type"),
        ),
        // A role no template knows, and a key a message does not have.
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "hacker", "content": "hi"}]}),
            400,
            Some("messages[0].role"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi", "priority": "root"}]}),
            400,
            Some("messages[0].priority"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}),
            400,
            Some("top_logprobs"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "max_completion_tokens": 3}),
            400,
            Some("max_completion_tokens"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x".repeat(5000)}),
            413,
            None,
        ),
    ];
    for (route, body, status, param) in cases {
        let (got, answer) = post(&server, route, &body);
        assert_eq!(got, status, "{route} {body}: {answer}");
        let err = &answer["error"];
        assert_eq!(err["param"].as_str(), param, "{route} {body}: {answer}");
        assert!(!err["message"].as_str().unwrap().is_empty(), "{answer}");
        assert_eq!(err["type"], "invalid_request_error", "{answer}");
    }
    // Not JSON, and the wrong method: the same error shape.
    let client = reqwest::blocking::Client::new();
    let resp = client
        .post(format!("{}/v1/completions", server.base_url()))
        .header("content-type", "application/json")
        .body("not json")
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let v: Value = resp.json().unwrap();
    assert_eq!(v["error"]["param"], Value::Null);
    let resp = client
        .get(format!("{}/v1/completions", server.base_url()))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 405);
    let v: Value = resp.json().unwrap();
    assert!(v["error"]["message"].is_string(), "{v}");
}

#[test]
fn the_api_key_guards_every_v1_route() {
    let server = start_with(PolicyServerConfig {
        api_key: Some("sesame".into()),
        ..PolicyServerConfig::default()
    });
    let client = reqwest::blocking::Client::new();
    let models = format!("{}/v1/models", server.base_url());
    let resp = client.get(&models).send().unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let v: Value = resp.json().unwrap();
    assert_eq!(v["error"]["code"], "invalid_api_key");
    let v: Value = client
        .get(&models)
        .bearer_auth("sesame")
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(v["data"][0]["id"], "tiny");
    assert_eq!(v["data"][0]["max_model_len"], 512);
    let health = client
        .get(format!("{}/health", server.base_url()))
        .send()
        .unwrap();
    assert_eq!(health.status().as_u16(), 200);
}

#[test]
fn openai_policy_generates_what_the_local_model_generates() {
    let server = start();
    let r = reference();
    let chat = ids(&r["input_ids"]);
    let prompts = vec![chat[..20].to_vec(), chat.clone(), chat[5..50].to_vec()];
    let mut remote = OpenAiPolicy::connect(OpenAiOptions::new(server.base_url())).unwrap();
    assert_eq!(remote.model(), "tiny");
    let greedy = SamplingParams {
        max_new_tokens: 12,
        temperature: 0.0,
        top_p: 1.0,
        top_k: 0,
        stop_tokens: vec![2],
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let served = remote.generate(&prompts, &greedy, &mut rng).unwrap();
    let local = model()
        .generate(&prompts, &greedy, &mut ChaCha8Rng::seed_from_u64(0))
        .unwrap();
    for (s, l) in served.iter().zip(&local) {
        assert_eq!((&s.tokens, s.stopped), (&l.tokens, l.stopped));
        for (a, b) in s.logprobs.iter().zip(&l.logprobs) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
    }
    // Sampled: the rollout's seed decides the tokens, through the wire.
    let sampled = SamplingParams {
        temperature: 1.0,
        ..greedy
    };
    let run = |seed: u64| {
        let mut p = OpenAiPolicy::connect(OpenAiOptions::new(server.base_url())).unwrap();
        p.generate(&prompts, &sampled, &mut ChaCha8Rng::seed_from_u64(seed))
            .unwrap()
    };
    // Batches may be shaped differently from run to run: the draws are
    // the same, the log-probs equal up to the GEMMs' float rounding.
    let tokens =
        |g: &[Generation]| -> Vec<Vec<u32>> { g.iter().map(|x| x.tokens.clone()).collect() };
    let (a, b, c) = (run(1), run(1), run(2));
    assert_eq!(tokens(&a), tokens(&b));
    for (x, y) in a
        .iter()
        .flat_map(|g| &g.logprobs)
        .zip(b.iter().flat_map(|g| &g.logprobs))
    {
        assert!((x - y).abs() < 1e-4, "{x} vs {y}");
    }
    assert_ne!(tokens(&a), tokens(&c));
}

#[test]
fn prompts_too_long_for_the_context_and_unknown_roles_or_keys_are_refused_unread() {
    let server = start_with(PolicyServerConfig {
        body_limit: 8 << 20,
        ..PolicyServerConfig::default()
    });
    // 2 MB of text: more bytes than 512 positions of the fixture's longest
    // token can hold, refused before the tokenizer sees it.
    let long = "ab".repeat(1 << 20);
    for (route, body, param) in [
        (
            "/v1/completions",
            json!({"prompt": long, "max_tokens": 4}),
            "prompt",
        ),
        (
            "/v1/completions",
            json!({"prompt": ["ok", long], "max_tokens": 4}),
            "prompt[1]",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": long}], "max_tokens": 4}),
            "messages",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "hacker", "content": "hi"}]}),
            "messages[0].role",
        ),
    ] {
        let (status, answer) = post(&server, route, &body);
        assert_eq!(status, 400, "{route}: {answer}");
        assert_eq!(answer["error"]["param"], param, "{answer}");
    }
    let (status, answer) = post(
        &server,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi", "secret": 1}]}),
    );
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("secret"),
        "{answer}"
    );
    // A prompt that fits is still served.
    let (status, answer) = post(
        &server,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], "max_tokens": 2}),
    );
    assert_eq!(status, 200, "{answer}");
}
