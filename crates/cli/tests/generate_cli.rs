//! `agentrl generate` on the qwen2-tiny fixture made by transformers.

use std::path::PathBuf;

use serde_json::Value;

mod common;
use common::{agentrl, failure_stderr, json_stdout};

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../model/tests/data/qwen2-tiny")
}

fn reference() -> Value {
    let text = std::fs::read_to_string(fixture_dir().join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn greedy_generate_matches_transformers_continuation() {
    let r = reference();
    let dir = tempfile::tempdir().unwrap();
    let chat = dir.path().join("chat.json");
    std::fs::write(&chat, r["chat_messages"].to_string()).unwrap();
    let greedy = r["greedy_new_ids"].as_array().unwrap();
    let out = agentrl(&[
        "generate",
        "--model",
        fixture_dir().to_str().unwrap(),
        "--chat",
        chat.to_str().unwrap(),
        "--temperature",
        "0",
        "--max-new-tokens",
        &greedy.len().to_string(),
        "--json",
    ]);
    let v = json_stdout(&out);
    assert_eq!(v["prompt_ids"], r["input_ids"]);
    assert_eq!(v["new_ids"], r["greedy_new_ids"]);
    assert_eq!(v["stopped"], Value::Bool(false));
    assert!(!v["text"].as_str().unwrap().is_empty());
}

#[test]
fn prompt_is_rendered_as_one_user_message_and_seeded_sampling_repeats() {
    let run = |seed: &str| {
        json_stdout(&agentrl(&[
            "generate",
            "--model",
            fixture_dir().to_str().unwrap(),
            "--prompt",
            "Your move?",
            "--max-new-tokens",
            "8",
            "--temperature",
            "1.0",
            "--top-k",
            "50",
            "--seed",
            seed,
            "--json",
        ]))
    };
    let a = run("3");
    let b = run("3");
    assert_eq!(a, b);
    // <|im_start|>user\n … <|im_end|>\n<|im_start|>assistant\n
    let prompt: Vec<u64> = a["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert_eq!(prompt[0], 1);
    assert_eq!(prompt.iter().filter(|&&t| t == 1).count(), 2);
    assert_eq!(prompt.iter().filter(|&&t| t == 2).count(), 1);
    assert!(a["new_ids"].as_array().unwrap().len() <= 8);
}

#[test]
fn missing_model_directory_is_named_in_the_error() {
    let out = agentrl(&[
        "generate",
        "--model",
        "/nonexistent/agentrl-model",
        "--prompt",
        "hi",
    ]);
    let err = failure_stderr(&out);
    assert!(err.contains("/nonexistent/agentrl-model"), "{err}");
}

#[test]
fn bad_chat_json_is_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let chat = dir.path().join("broken-chat.json");
    std::fs::write(&chat, "[{\"role\": \"user\"").unwrap();
    let out = agentrl(&[
        "generate",
        "--model",
        fixture_dir().to_str().unwrap(),
        "--chat",
        chat.to_str().unwrap(),
    ]);
    let err = failure_stderr(&out);
    assert!(err.contains("broken-chat.json"), "{err}");
}

#[test]
fn a_model_with_nan_weights_is_an_error_not_empty_text() {
    use agentrl_model::PolicyModel;
    use candle_core::{Device, Tensor};
    let dir = tempfile::tempdir().unwrap();
    let model = PolicyModel::load(&fixture_dir(), false, &Device::Cpu).unwrap();
    for (name, var) in model.named_vars().unwrap() {
        if name.contains("norm") {
            let nan = Tensor::full(f32::NAN, var.shape(), &Device::Cpu).unwrap();
            var.set(&nan).unwrap();
        }
    }
    model.save(dir.path()).unwrap();
    agentrl_tokenizer::ChatTokenizer::load(fixture_dir())
        .unwrap()
        .save(dir.path())
        .unwrap();
    for temperature in ["0", "1"] {
        let out = agentrl(&[
            "generate",
            "--model",
            dir.path().to_str().unwrap(),
            "--prompt",
            "hi",
            "--temperature",
            temperature,
        ]);
        assert!(!out.status.success(), "temperature {temperature}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("not finite"), "{err}");
    }
}
