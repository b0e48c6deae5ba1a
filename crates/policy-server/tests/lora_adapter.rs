//! vLLM's `/v1/load_lora_adapter` and `/v1/unload_lora_adapter` on the
//! policy server: an adapter saved by agentrl loads under a name,
//! completions naming it generate with the adapted model (the base model's
//! name still gets the base), a name taken twice, a bad directory or an
//! unknown model are refused, and an unloaded adapter is gone.

use agentrl_model::candle_core::{Device, Tensor};
use agentrl_model::{LoraConfig, LoraTarget, PolicyModel, SamplingParams};
use agentrl_policy_server::{BackgroundPolicyServer, PolicyServerConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

mod tiny_server;
use tiny_server::{fixture_model as base, post_text as post};

/// The fixture with a seeded adapter whose B is not zero, so it changes the outputs.
fn adapted() -> PolicyModel {
    let mut model = base();
    let config = LoraConfig {
        r: 4,
        alpha: 8.0,
        dropout: 0.0,
        target_modules: LoraTarget::ALL.to_vec(),
        use_rslora: false,
    };
    model.attach_lora(config, 1).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    for (name, var) in model.lora().unwrap().named_vars() {
        if name.ends_with("lora_B.weight") {
            let v: Vec<f32> = (0..var.elem_count())
                .map(|_| rng.random_range(-0.2..0.2))
                .collect();
            var.set(&Tensor::from_vec(v, var.dims(), &Device::Cpu).unwrap())
                .unwrap();
        }
    }
    model
}

/// The ids `GET /v1/models` lists.
fn served_ids(server: &BackgroundPolicyServer) -> Vec<String> {
    let models: Value = reqwest::blocking::get(format!("{}/v1/models", server.base_url()))
        .unwrap()
        .json()
        .unwrap();
    models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect()
}

/// Greedy tokens and log-probs of `model` (served under that name) after `prompt`.
fn served_greedy(
    server: &BackgroundPolicyServer,
    model: &str,
    prompt: &[u32],
) -> (Vec<u32>, Vec<f32>) {
    let (status, text) = post(
        server,
        "/v1/completions",
        &json!({"model": model, "prompt": prompt, "max_tokens": 6, "temperature": 0,
                "logprobs": 0, "return_token_ids": true, "ignore_eos": true}),
    );
    assert_eq!(status, 200, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        answer["model"], model,
        "the answer names the model that answered"
    );
    let choice = &answer["choices"][0];
    (
        serde_json::from_value(choice["token_ids"].clone()).unwrap(),
        serde_json::from_value(choice["logprobs"]["token_logprobs"].clone()).unwrap(),
    )
}

fn local_greedy(model: &PolicyModel, prompt: &[u32]) -> (Vec<u32>, Vec<f32>) {
    let g = model
        .generate(
            &[prompt.to_vec()],
            &SamplingParams::greedy(6),
            &mut ChaCha8Rng::seed_from_u64(0),
        )
        .unwrap()
        .remove(0);
    (g.tokens, g.logprobs)
}

#[test]
fn a_loaded_adapter_serves_under_its_name_beside_the_base() {
    let dir = tempfile::tempdir().unwrap();
    let adapted = adapted();
    adapted.lora().unwrap().save(dir.path(), None).unwrap();
    let server = tiny_server::serve(base(), PolicyServerConfig::default());
    let prompt = [3u32, 17, 42, 8, 99];

    let unknown = post(
        &server,
        "/v1/completions",
        &json!({"model": "sql", "prompt": prompt}),
    );
    assert_eq!(unknown.0, 404, "{}", unknown.1);

    let load = json!({"lora_name": "sql", "lora_path": dir.path()});
    let (status, text) = post(&server, "/v1/load_lora_adapter", &load);
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("'sql' added successfully"), "{text}");
    assert_eq!(served_ids(&server), ["tiny", "sql"]);

    let with_adapter = served_greedy(&server, "sql", &prompt);
    let without = served_greedy(&server, "tiny", &prompt);
    let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5);
    let local = local_greedy(&adapted, &prompt);
    assert_eq!(with_adapter.0, local.0);
    assert!(
        close(&with_adapter.1, &local.1),
        "{with_adapter:?} vs {local:?}"
    );
    let local_base = local_greedy(&base(), &prompt);
    assert_eq!(without.0, local_base.0);
    assert!(close(&without.1, &local_base.1));
    assert!(
        !close(&with_adapter.1, &without.1),
        "the adapter changes nothing: the test cannot tell which model answered"
    );

    let (status, text) = post(&server, "/v1/load_lora_adapter", &load);
    assert_eq!(status, 400);
    assert!(text.contains("already been loaded"), "{text}");
    let missing = json!({"lora_name": "other", "lora_path": dir.path().join("nowhere")});
    let (status, text) = post(&server, "/v1/load_lora_adapter", &missing);
    assert_eq!(status, 400);
    assert!(text.contains("adapter_config.json"), "{text}");
    let (status, text) = post(
        &server,
        "/v1/load_lora_adapter",
        &json!({"lora_name": "tiny", "lora_path": dir.path()}),
    );
    assert_eq!(status, 400);
    assert!(text.contains("lora_name"), "{text}");

    // Unloaded (vLLM's route and answer): gone from the list, requests
    // naming it are 404s, the base still answers, a second unload is a 404
    // naming the field, and the name can be loaded again.
    let unload = json!({"lora_name": "sql"});
    let (status, text) = post(&server, "/v1/unload_lora_adapter", &unload);
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("'sql' removed successfully"), "{text}");
    assert_eq!(served_ids(&server), ["tiny"]);
    let gone = post(
        &server,
        "/v1/completions",
        &json!({"model": "sql", "prompt": prompt}),
    );
    assert_eq!(gone.0, 404, "{}", gone.1);
    assert_eq!(served_greedy(&server, "tiny", &prompt), without);
    let (status, text) = post(&server, "/v1/unload_lora_adapter", &unload);
    assert_eq!(status, 404, "{text}");
    assert!(
        text.contains("lora_name") && text.contains("'sql'"),
        "{text}"
    );
    let (status, text) = post(&server, "/v1/load_lora_adapter", &load);
    assert_eq!(status, 200, "{text}");
    assert_eq!(served_greedy(&server, "sql", &prompt), with_adapter);
}
