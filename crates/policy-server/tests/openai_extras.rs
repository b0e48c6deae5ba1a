//! What OpenAI clients ask of the policy server beyond token ids, on
//! loopback over the qwen2-tiny fixture: streamed answers as OpenAI and
//! vLLM frame them, top log-probs (against transformers' log-softmax of the
//! same logits), `text_offset`, `echo` and vLLM's `prompt_logprobs`,
//! penalties and `logit_bias` in sampling, `best_of`, the parameters SDKs
//! send with neutral values, tools in the prompt and calls read back,
//! `GET /v1/models/{id}`, and a client that leaves mid-stream.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use agentrl_model::{LogitAdjustment, SamplingParams, Steering};
use agentrl_policy_server::{BackgroundPolicyServer, PolicyServerConfig};
use agentrl_tokenizer::ChatTokenizer;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

mod tiny_server;
use tiny_server::qwen2_tiny::{fixture_dir, reference, u32s as ids};
use tiny_server::{fixture_model as model, post_text};

fn start() -> BackgroundPolicyServer {
    tiny_server::serve(model(), PolicyServerConfig::default())
}

fn post(server: &BackgroundPolicyServer, route: &str, body: &Value) -> (u16, Value) {
    let (status, text) = post_text(server, route, body);
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")),
    )
}

fn ok(server: &BackgroundPolicyServer, route: &str, body: Value) -> Value {
    let (status, answer) = post(server, route, &body);
    assert_eq!(status, 200, "{answer}");
    answer
}

/// A streamed answer's events: each `data:` payload, in order.
fn sse(server: &BackgroundPolicyServer, route: &str, body: &Value) -> Vec<String> {
    let resp = reqwest::blocking::Client::new()
        .post(format!("{}{route}", server.base_url()))
        .json(body)
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let text = resp.text().unwrap();
    assert!(text.ends_with("\n\n"), "{text:?}");
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data event: {e:?}"))
                .to_string()
        })
        .collect()
}

/// The JSON chunks of a stream, checked to end with `[DONE]`.
fn chunks(events: &[String]) -> Vec<Value> {
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect()
}

fn tokenizer() -> ChatTokenizer {
    ChatTokenizer::load(fixture_dir()).unwrap()
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

#[test]
fn a_streamed_completion_is_the_answer_in_openais_frames() {
    let server = start();
    let prompt = ids(&reference()["input_ids"]);
    let body = json!({"prompt": prompt, "max_tokens": 20, "temperature": 1.0, "seed": 11,
                      "n": 2, "logprobs": 2, "ignore_eos": true});
    let whole = ok(&server, "/v1/completions", body.clone());
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let chunks = chunks(&sse(&server, "/v1/completions", &streamed));
    let id = chunks[0]["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("cmpl-"), "{id}");
    for (i, c) in whole["choices"].as_array().unwrap().iter().enumerate() {
        let mine: Vec<&Value> = chunks
            .iter()
            .filter(|k| k["choices"].as_array().is_some_and(|a| !a.is_empty()))
            .filter(|k| k["choices"][0]["index"] == i)
            .collect();
        let text: String = mine
            .iter()
            .map(|k| k["choices"][0]["text"].as_str().unwrap())
            .collect();
        assert_eq!(text, c["text"].as_str().unwrap(), "choice {i}");
        // Every step's log-probs, offsets continuing: the whole answer's.
        let mut lps = Vec::new();
        let mut offsets = Vec::new();
        for k in &mine[..mine.len() - 1] {
            let l = &k["choices"][0]["logprobs"];
            lps.extend(f32s(&l["token_logprobs"]));
            offsets.extend(l["text_offset"].as_array().unwrap().iter().cloned());
            assert_eq!(k["choices"][0]["finish_reason"], Value::Null);
        }
        assert_eq!(lps, f32s(&c["logprobs"]["token_logprobs"]));
        assert_eq!(&offsets, c["logprobs"]["text_offset"].as_array().unwrap());
        let last = &mine[mine.len() - 1]["choices"][0];
        assert_eq!(last["finish_reason"], c["finish_reason"]);
        assert_eq!(last["finish_reason"], "length");
    }
    // `usage: null` in every chunk, then one with the usage and no choices.
    let (usage, rest) = chunks.split_last().unwrap();
    assert!(rest
        .iter()
        .all(|k| k["usage"].is_null() && k.get("usage").is_some()));
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"], whole["usage"]);
    assert!(chunks.iter().all(|k| k["id"] == id.as_str()
        && k["object"] == "text_completion"
        && k["model"] == "tiny"));
}

#[test]
fn a_streamed_chat_opens_with_the_role_cuts_stop_strings_and_ends_with_the_reason() {
    let server = start();
    let r = reference();
    let body = json!({"messages": r["chat_messages"], "max_tokens": 24, "temperature": 0,
                      "ignore_eos": true});
    let whole = ok(&server, "/v1/chat/completions", body.clone());
    let text = whole["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    // A stop string from the middle of the reply.
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let (at, _) = chars[chars.len() / 2];
    let stop: String = text[at..].chars().take(2).collect();
    let cut = &text[..text.find(&stop).unwrap()];
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stop"] = json!([stop]);
    let chunks = chunks(&sse(&server, "/v1/chat/completions", &streamed));
    assert!(chunks
        .iter()
        .all(|k| k["object"] == "chat.completion.chunk" && k.get("usage").is_none()));
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    let content: String = chunks
        .iter()
        .filter_map(|k| k["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(
        content, cut,
        "the text before the stop string, nothing after"
    );
    let last = &chunks[chunks.len() - 1]["choices"][0];
    assert_eq!(last["finish_reason"], "stop");
    assert_eq!(last["stop_reason"], json!(stop));
    assert_eq!(last["delta"], json!({}));
    // The same request not streamed cuts at the same place.
    let mut plain = body;
    plain["stop"] = json!([stop]);
    let answer = ok(&server, "/v1/chat/completions", plain);
    assert_eq!(answer["choices"][0]["message"]["content"], cut);
}

/// `log_softmax` of transformers' logits, best first.
fn reference_top(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max
        + logits
            .iter()
            .map(|&x| (x as f64 - max).exp())
            .sum::<f64>()
            .ln();
    let mut all: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &x)| (i as u32, (x as f64 - lse) as f32))
        .collect();
    all.sort_by(|a, b| b.1.total_cmp(&a.1));
    all.truncate(k);
    all
}

#[test]
fn top_logprobs_are_the_models_own_log_softmax_with_offsets() {
    let server = start();
    let r = reference();
    let prompt = ids(&r["input_ids"]);
    let want = reference_top(&f32s(&r["logits_last"]), 5);
    let tok = tokenizer();
    // Completions: `logprobs: 5` → `{text: log-prob}` per token.
    let answer = ok(
        &server,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 5}),
    );
    let lp = &answer["choices"][0]["logprobs"];
    let first = lp["top_logprobs"][0].as_object().unwrap();
    // Keyed by text: tokens that decode alike (byte pieces shown as U+FFFD)
    // share one key, holding the likeliest of them.
    let mut texts: Vec<String> = Vec::new();
    for (id, l) in &want {
        let text = tok.decode(&[*id], false).unwrap();
        let served = first[&text].as_f64().unwrap() as f32;
        if texts.contains(&text) {
            assert!(served >= *l, "token {id}: {served} below {l}");
        } else {
            assert!((served - l).abs() < 1e-4, "token {id}: {served} vs {l}");
            texts.push(text);
        }
    }
    assert_eq!(first.len(), texts.len(), "{first:?}");
    // Greedy: each token is its step's best, with the same log-prob.
    let tokens = lp["tokens"].as_array().unwrap();
    for (i, t) in tokens.iter().enumerate() {
        let best = lp["top_logprobs"][i]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::NEG_INFINITY, f64::max);
        assert_eq!(
            best as f32,
            lp["token_logprobs"][i].as_f64().unwrap() as f32,
            "{t}"
        );
    }
    // Offsets: characters, each after the previous token's text.
    let offsets: Vec<usize> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(offsets[0], 0);
    for i in 1..offsets.len() {
        let prev = tokens[i - 1].as_str().unwrap().chars().count();
        assert_eq!(offsets[i], offsets[i - 1] + prev);
    }
    // Chat: `top_logprobs: 5` of the same first step (the chat renders to
    // the same prompt ids), most likely first.
    let answer = ok(
        &server,
        "/v1/chat/completions",
        json!({"messages": r["chat_messages"], "max_tokens": 2, "temperature": 0,
               "logprobs": true, "top_logprobs": 5}),
    );
    let top = &answer["choices"][0]["logprobs"]["content"][0]["top_logprobs"];
    let got: Vec<(String, f32)> = top
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["token"].as_str().unwrap().to_string(),
                t["logprob"].as_f64().unwrap() as f32,
            )
        })
        .collect();
    assert_eq!(got.len(), 5);
    for ((text, l), (id, w)) in got.iter().zip(&want) {
        assert_eq!(text, &tok.decode(&[*id], false).unwrap());
        assert!((l - w).abs() < 1e-4, "{l} vs {w}");
    }
    assert_eq!(top[0]["bytes"], json!(got[0].0.as_bytes()));
    // vLLM's bound.
    let (s, v) = post(
        &server,
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 1, "logprobs": 21}),
    );
    assert_eq!((s, v["error"]["param"].clone()), (400, json!("logprobs")));
    let (s, v) = post(
        &server,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}),
    );
    assert_eq!(
        (s, v["error"]["param"].clone()),
        (400, json!("top_logprobs"))
    );
}

#[test]
fn echo_answers_the_prompt_with_the_models_log_probs() {
    let server = start();
    let prompt = ids(&reference()["input_ids"])[..30].to_vec();
    let tok = tokenizer();
    // lm-eval's scoring request: the prompt only, with its log-probs.
    let answer = ok(
        &server,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 0, "echo": true, "logprobs": 1,
               "prompt_logprobs": 2}),
    );
    let c = &answer["choices"][0];
    assert_eq!(c["text"], tok.decode(&prompt, false).unwrap());
    let lp = &c["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), prompt.len());
    assert_eq!(lp["token_logprobs"][0], Value::Null);
    assert_eq!(lp["top_logprobs"][0], Value::Null);
    // The training forward's log-probs of the same tokens.
    let reference = model()
        .sequence_logprobs(std::slice::from_ref(&prompt))
        .unwrap();
    let want: Vec<f32> = reference.logprobs.flatten_all().unwrap().to_vec1().unwrap();
    for (i, w) in want.iter().enumerate() {
        let served = lp["token_logprobs"][i + 1].as_f64().unwrap() as f32;
        assert!((served - w).abs() < 1e-4, "{i}: {served} vs {w}");
    }
    assert_eq!(answer["usage"]["completion_tokens"], 0);
    // vLLM's prompt_logprobs: null, then the token itself (with its rank)
    // and the position's 2 most likely.
    let pl = c["prompt_logprobs"].as_array().unwrap();
    assert_eq!(pl.len(), prompt.len());
    assert_eq!(pl[0], Value::Null);
    for (i, entry) in pl.iter().enumerate().skip(1) {
        let entry = entry.as_object().unwrap();
        let own = &entry[&prompt[i].to_string()];
        assert!((own["logprob"].as_f64().unwrap() as f32 - want[i - 1]).abs() < 1e-4);
        assert!(own["rank"].as_u64().unwrap() >= 1);
        assert!(entry.len() == 2 || entry.len() == 3, "{entry:?}");
        assert!(entry.values().any(|e| e["rank"] == 1));
    }
    // With a completion: the prompt's text, then the choice's.
    let answer = ok(
        &server,
        "/v1/completions",
        json!({"prompt": "#_P_O_#", "max_tokens": 4, "temperature": 0, "echo": true,
               "return_token_ids": true}),
    );
    let c = &answer["choices"][0];
    let gen = tok.decode(&ids(&c["token_ids"]), true).unwrap();
    assert_eq!(c["text"], format!("#_P_O_#{gen}"));
}

/// Replays the server's adjustment on the local model.
struct Adjust(LogitAdjustment);

impl Steering for Adjust {
    fn adjusts(&self, _: usize) -> bool {
        true
    }
    fn adjust(&self, _: usize, generated: &[u32], logits: &mut [f32]) {
        self.0.apply(logits, generated);
    }
    fn chosen(&mut self, _: usize, _: u32, _: f32, _: &[f32]) -> bool {
        true
    }
}

#[test]
fn penalties_and_logit_bias_steer_sampling_and_log_probs_stay_raw() {
    let server = start();
    let r = reference();
    let prompt = ids(&r["input_ids"]);
    let greedy = ids(&r["greedy_new_ids"]);
    let ask = |extra: Value| -> (Vec<u32>, Vec<f32>) {
        let mut body = json!({"prompt": prompt, "max_tokens": greedy.len(), "temperature": 0,
                              "ignore_eos": true, "return_token_ids": true, "logprobs": 0});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let a = ok(&server, "/v1/completions", body);
        (
            ids(&a["choices"][0]["token_ids"]),
            f32s(&a["choices"][0]["logprobs"]["token_logprobs"]),
        )
    };
    // Neutral values, as SDKs send them: transformers' greedy path.
    let (plain, plain_lps) = ask(json!({"frequency_penalty": 0, "presence_penalty": 0.0,
                                        "logit_bias": {}, "best_of": 1}));
    assert_eq!(plain, greedy);
    // The greedy path repeats tokens (306 four times): penalties break that,
    // as the local model steered by the same adjustment does.
    for (adjust, extra) in [
        (
            LogitAdjustment {
                frequency_penalty: 1.5,
                ..LogitAdjustment::default()
            },
            json!({"frequency_penalty": 1.5}),
        ),
        (
            LogitAdjustment {
                presence_penalty: 2.0,
                ..LogitAdjustment::default()
            },
            json!({"presence_penalty": 2.0}),
        ),
        (
            LogitAdjustment {
                logit_bias: vec![(306, -100.0), (43, 8.0)],
                ..LogitAdjustment::default()
            },
            json!({"logit_bias": {"306": -100, "43": 8}}),
        ),
    ] {
        let (served, lps) = ask(extra.clone());
        assert_ne!(served, greedy, "{extra}");
        let local = model()
            .generate_steered(
                std::slice::from_ref(&prompt),
                &SamplingParams::greedy(greedy.len()),
                &mut [ChaCha8Rng::seed_from_u64(0)],
                &mut Adjust(adjust),
            )
            .unwrap()
            .remove(0);
        assert_eq!(served, local.tokens, "{extra}");
        for (a, b) in lps.iter().zip(&local.logprobs) {
            assert!((a - b).abs() < 1e-5, "{extra}: {a} vs {b}");
        }
    }
    let (biased, _) = ask(json!({"logit_bias": {"306": -100}}));
    assert!(!biased.contains(&306), "{biased:?}");
    // Until the path diverges, a bias leaves the raw log-probs as they were.
    let (forced, forced_lps) = ask(json!({"logit_bias": {"7": 100}}));
    assert_eq!(forced, vec![7; greedy.len()]);
    assert!(
        forced_lps[0] < plain_lps[0],
        "7 is not the raw model's best"
    );
    for (field, body) in [
        (
            "frequency_penalty",
            json!({"prompt": "x", "frequency_penalty": 2.5}),
        ),
        (
            "logit_bias.400",
            json!({"prompt": "x", "logit_bias": {"400": 1}}),
        ),
        (
            "logit_bias.3",
            json!({"prompt": "x", "logit_bias": {"3": 101}}),
        ),
    ] {
        let (s, v) = post(&server, "/v1/completions", &body);
        assert_eq!((s, v["error"]["param"].clone()), (400, json!(field)), "{v}");
    }
}

#[test]
fn best_of_answers_the_n_choices_with_the_highest_total_log_prob() {
    let server = start();
    let body = json!({"prompt": "#_P_O_#", "max_tokens": 6, "seed": 3, "n": 4,
                      "logprobs": 0, "return_token_ids": true});
    let four = ok(&server, "/v1/completions", body);
    let total = |c: &Value| {
        f32s(&c["logprobs"]["token_logprobs"])
            .iter()
            .map(|&x| x as f64)
            .sum::<f64>()
    };
    let best = four["choices"]
        .as_array()
        .unwrap()
        .iter()
        .max_by(|a, b| total(a).total_cmp(&total(b)))
        .unwrap()
        .clone();
    let one = ok(
        &server,
        "/v1/completions",
        json!({"prompt": "#_P_O_#", "max_tokens": 6, "seed": 3, "n": 1, "best_of": 4,
               "logprobs": 0, "return_token_ids": true}),
    );
    assert_eq!(one["choices"].as_array().unwrap().len(), 1);
    assert_eq!(one["choices"][0]["token_ids"], best["token_ids"]);
    let (s, v) = post(
        &server,
        "/v1/completions",
        &json!({"prompt": "x", "n": 2, "best_of": 1}),
    );
    assert_eq!((s, v["error"]["param"].clone()), (400, json!("best_of")));
}

#[test]
fn sdk_defaults_are_accepted_and_json_modes_refused_with_the_reason() {
    let server = start();
    // What the OpenAI SDK and LangChain send with their defaults.
    let a = ok(
        &server,
        "/v1/chat/completions",
        json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
               "frequency_penalty": 0, "presence_penalty": 0, "logit_bias": {}, "n": 1,
               "response_format": {"type": "text"}, "stream": false, "temperature": 0.7,
               "top_p": 1, "user": "u", "parallel_tool_calls": true}),
    );
    assert_eq!(a["choices"][0]["message"]["role"], "assistant");
    for mode in ["json_object", "json_schema"] {
        let (s, v) = post(
            &server,
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}],
                    "response_format": {"type": mode}}),
        );
        assert_eq!(s, 400);
        assert_eq!(v["error"]["param"], "response_format");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("does not constrain decoding"),
            "{v}"
        );
    }
    // GET /v1/models/{id}.
    let client = reqwest::blocking::Client::new();
    let card: Value = client
        .get(format!("{}/v1/models/tiny", server.base_url()))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(
        (card["id"].clone(), card["object"].clone()),
        (json!("tiny"), json!("model"))
    );
    let resp = client
        .get(format!("{}/v1/models/gpt-4o", server.base_url()))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 404);
    let v: Value = resp.json().unwrap();
    assert_eq!(v["error"]["code"], "model_not_found");
}

#[test]
fn stop_reason_is_null_at_the_models_end_of_sequence() {
    let server = start();
    let r = reference();
    let greedy = ids(&r["greedy_new_ids"]);
    // The fixture's greedy path, ended by declaring its 4th token the end
    // of sequence: a request's own stop id is named, eos is not.
    let stop_id = greedy[3];
    let a = ok(
        &server,
        "/v1/chat/completions",
        json!({"messages": r["chat_messages"], "max_tokens": 24, "temperature": 0,
               "stop_token_ids": [stop_id], "ignore_eos": true}),
    );
    assert_eq!(a["choices"][0]["stop_reason"], json!(stop_id));
    // The model's own end of sequence (<|im_end|>, forced by a bias): null.
    let im_end = tokenizer().im_end_id();
    let a = ok(
        &server,
        "/v1/chat/completions",
        json!({"messages": r["chat_messages"], "max_tokens": 5, "temperature": 0,
               "logit_bias": {im_end.to_string(): 100}, "return_token_ids": true}),
    );
    let c = &a["choices"][0];
    assert_eq!(ids(&c["token_ids"]), vec![im_end]);
    assert_eq!(c["finish_reason"], "stop");
    assert_eq!(c["stop_reason"], Value::Null);
    assert!(c.get("stop_reason").is_some(), "{c}");
}

#[test]
fn tools_are_rendered_into_the_prompt_and_the_history() {
    let server = start();
    let tok = tokenizer();
    // The fixture's context is 512 tokens and its small vocabulary spends
    // about 314 of them on the tools preamble alone: the tools and the
    // history of a call go in two requests.
    let tools = json!([{"type": "function", "function": {"name": "get_weather"}}]);
    let a = ok(
        &server,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Weather in Paris?"}],
               "tools": tools, "max_tokens": 3, "temperature": 0, "return_token_ids": true}),
    );
    let prompt = tok.decode(&ids(&a["prompt_token_ids"]), false).unwrap();
    // The fixture's template has no tools section: the tools are written
    // as Qwen2.5's template writes them.
    assert!(
        prompt.starts_with("<|im_start|>system\n# Tools\n"),
        "{prompt}"
    );
    assert!(prompt.contains("\"name\": \"get_weather\""), "{prompt}");
    // The tiny model does not call: its reply is content.
    let m = &a["choices"][0]["message"];
    assert!(
        m["content"].is_string() && m.get("tool_calls").is_none(),
        "{m}"
    );
    // A call and its result in the history, written as Qwen2.5 writes them.
    let a = ok(
        &server,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Weather in Paris?"},
                            {"role": "assistant", "content": null, "tool_calls": [
                                {"id": "call_1", "type": "function", "function":
                                    {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
               "max_tokens": 3, "temperature": 0, "return_token_ids": true}),
    );
    let prompt = tok.decode(&ids(&a["prompt_token_ids"]), false).unwrap();
    assert!(
        prompt.contains(
            "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>"
        ),
        "{prompt}"
    );
    assert!(
        prompt.contains("<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>"),
        "{prompt}"
    );
    // tool_choice "none" leaves the tools out; forcing a call is refused.
    let a = ok(
        &server,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "tools": tools,
               "tool_choice": "none", "max_tokens": 1, "return_token_ids": true}),
    );
    let prompt = tok.decode(&ids(&a["prompt_token_ids"]), false).unwrap();
    assert!(!prompt.contains("# Tools"), "{prompt}");
    // Streamed with tools: the same reply as content, in chunks (the calls a
    // model writes come back as `tool_calls` deltas: stream.rs's unit test).
    let body = json!({"messages": [{"role": "user", "content": "Weather in Paris?"}],
                      "tools": tools, "max_tokens": 12, "temperature": 0, "ignore_eos": true});
    let whole = ok(&server, "/v1/chat/completions", body.clone());
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let chunks = chunks(&sse(&server, "/v1/chat/completions", &streamed));
    let content: String = chunks
        .iter()
        .filter_map(|k| k["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(json!(content), whole["choices"][0]["message"]["content"]);
    assert!(chunks
        .iter()
        .all(|k| k["choices"][0]["delta"].get("tool_calls").is_none()));
    assert_eq!(
        chunks[chunks.len() - 1]["choices"][0]["finish_reason"],
        whole["choices"][0]["finish_reason"]
    );
    let (s, v) = post(
        &server,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "tools": tools,
                "tool_choice": "required"}),
    );
    assert_eq!(
        (s, v["error"]["param"].clone()),
        (400, json!("tool_choice"))
    );
}

#[test]
fn a_client_that_leaves_mid_stream_does_not_stop_the_server() {
    let server = start();
    let addr = server.local_addr().unwrap();
    let body = json!({"prompt": [5, 6, 7], "max_tokens": 400, "ignore_eos": true,
                      "stream": true})
    .to_string();
    for _ in 0..3 {
        let mut conn = TcpStream::connect(addr).unwrap();
        write!(
            conn,
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut reader = BufReader::new(conn);
        let mut line = String::new();
        // Read up to the first event, then hang up.
        loop {
            line.clear();
            assert!(
                reader.read_line(&mut line).unwrap() > 0,
                "the stream ended early"
            );
            if line.starts_with("data: ") {
                break;
            }
        }
        assert!(line.contains("text_completion"), "{line}");
    }
    // The server goes on serving (streamed and not).
    let events = sse(
        &server,
        "/v1/completions",
        &json!({"prompt": [5, 6, 7], "max_tokens": 3, "stream": true}),
    );
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    ok(
        &server,
        "/v1/completions",
        json!({"prompt": [5], "max_tokens": 2}),
    );
}

#[test]
fn a_client_that_leaves_mid_stream_frees_its_sequences_at_their_next_token() {
    let server = start();
    let stats = server.stats().unwrap();
    let addr = server.local_addr().unwrap();
    // Many sequences of many tokens: a run to the end would take far longer
    // than the server needs to see the client gone.
    let (n, max_tokens) = (16u64, 500u64);
    let body = json!({"prompt": [5, 6, 7], "max_tokens": max_tokens, "n": n,
                      "ignore_eos": true, "stream": true})
    .to_string();
    let mut conn = TcpStream::connect(addr).unwrap();
    write!(
        conn,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "the stream ended early"
        );
    }
    // The first chunk is out: its sequences are in the model's batch.
    assert!(stats.running_sequences() > 0);
    drop(reader);
    let deadline = Instant::now() + Duration::from_secs(120);
    while stats.running_sequences() > 0 {
        assert!(Instant::now() < deadline, "the sequences never ended");
        std::thread::sleep(Duration::from_millis(2));
    }
    let made = stats.generated_tokens();
    assert!(
        made < n * max_tokens / 2,
        "{made} of {} tokens made for a client that had left",
        n * max_tokens
    );
    // The next request is served, and counted alone.
    ok(
        &server,
        "/v1/completions",
        json!({"prompt": [5], "max_tokens": 3, "ignore_eos": true}),
    );
    assert_eq!(stats.generated_tokens(), made + 3);
    assert_eq!(stats.running_sequences(), 0);
}
