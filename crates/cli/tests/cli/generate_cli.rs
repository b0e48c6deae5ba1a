//! `agentrl generate` on the qwen2-tiny fixture made by transformers (its
//! directory, and the same checkpoint written as a GGUF file), and
//! `agentrl bench model`'s rounds.

use std::path::Path;

use serde_json::Value;

use crate::common::{agentrl, agentrl_line, failure_stderr, json_stdout, SMOKE};

#[path = "../../../model/tests/model/qwen2_tiny/mod.rs"]
mod qwen2_tiny;
use qwen2_tiny::{fixture_dir, reference};

#[path = "../../../model/tests/model/gguf_writer/mod.rs"]
mod gguf_writer;

/// `agentrl generate --model MODEL` with the words of `line` and then `more`.
fn generate(model: &Path, line: &str, more: &[&str]) -> std::process::Output {
    let model = model.to_str().unwrap();
    agentrl_line(
        &format!("generate {line}"),
        &[&["--model", model], more].concat(),
    )
}

#[test]
fn greedy_generate_matches_transformers_continuation() {
    let r = reference();
    let dir = tempfile::tempdir().unwrap();
    let chat = dir.path().join("chat.json");
    std::fs::write(&chat, r["chat_messages"].to_string()).unwrap();
    let greedy = r["greedy_new_ids"].as_array().unwrap();
    let line = format!("--temperature 0 --max-new-tokens {} --json", greedy.len());
    let out = generate(&fixture_dir(), &line, &["--chat", chat.to_str().unwrap()]);
    let v = json_stdout(&out);
    assert_eq!(v["prompt_ids"], r["input_ids"]);
    assert_eq!(v["new_ids"], r["greedy_new_ids"]);
    assert_eq!(v["stopped"], Value::Bool(false));
    assert!(!v["text"].as_str().unwrap().is_empty());
}

#[test]
fn greedy_generate_on_a_gguf_of_the_fixture_matches_transformers_continuation() {
    // The fixture as llama.cpp would write it: weights, tokenizer and chat
    // template all come from the one file.
    let r = reference();
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("qwen2-tiny.gguf");
    gguf_writer::write_gguf(
        &fixture_dir(),
        &gguf,
        &gguf_writer::GgufOptions::f32("qwen2"),
    );
    let chat = dir.path().join("chat.json");
    std::fs::write(&chat, r["chat_messages"].to_string()).unwrap();
    let greedy = r["greedy_new_ids"].as_array().unwrap();
    let line = format!("--temperature 0 --max-new-tokens {} --json", greedy.len());
    let v = json_stdout(&generate(&gguf, &line, &["--chat", chat.to_str().unwrap()]));
    assert_eq!(v["prompt_ids"], r["input_ids"]);
    assert_eq!(v["new_ids"], r["greedy_new_ids"]);
}

#[test]
fn prompt_is_rendered_as_one_user_message_and_seeded_sampling_repeats() {
    let run = |seed: &str| {
        let line = format!("--max-new-tokens 8 --temperature 1.0 --top-k 50 --seed {seed} --json");
        json_stdout(&generate(
            &fixture_dir(),
            &line,
            &["--prompt", "Your move?"],
        ))
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
    let out = generate(Path::new("/nonexistent/agentrl-model"), "--prompt hi", &[]);
    let err = failure_stderr(&out);
    assert!(err.contains("/nonexistent/agentrl-model"), "{err}");
}

#[test]
fn bad_chat_json_is_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let chat = dir.path().join("broken-chat.json");
    std::fs::write(&chat, "[{\"role\": \"user\"").unwrap();
    let out = generate(&fixture_dir(), "", &["--chat", chat.to_str().unwrap()]);
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
        let line = format!("--prompt hi --temperature {temperature}");
        let err = failure_stderr(&generate(dir.path(), &line, &[]));
        assert!(
            err.contains("not finite"),
            "temperature {temperature}: {err}"
        );
    }
}

#[test]
fn device_cuda_either_runs_or_names_the_missing_build_or_gpu() {
    let out = generate(
        &fixture_dir(),
        "--prompt hi --temperature 0 --max-new-tokens 3 --json --device cuda",
        &[],
    );
    if !out.status.success() {
        // CI: no cuda feature, no GPU.
        let err = failure_stderr(&out);
        assert!(err.contains("--device cuda"), "{err}");
    } else {
        // A cuda build on a GPU: the same greedy tokens as the CPU.
        let cpu = generate(
            &fixture_dir(),
            "--prompt hi --temperature 0 --max-new-tokens 3 --json",
            &[],
        );
        assert_eq!(json_stdout(&out)["new_ids"], json_stdout(&cpu)["new_ids"]);
    }
}

/// `--rounds N` measures N times and reports the median round; 0 rounds is
/// refused by name. (No PyTorch here: the ratios need one.)
#[test]
fn bench_model_rounds_report_the_median_round() {
    let tiny = [
        "bench",
        "model",
        "--no-torch",
        "--json",
        "--steps",
        "1",
        "--sample-runs",
        "1",
        "--batch",
        "2",
        "--seq-len",
        "16",
        "--prompt-len",
        "4",
        "--new-tokens",
        "2",
    ];
    let v = json_stdout(&agentrl(&[&tiny[..], &["--rounds", "3"]].concat()));
    assert_eq!(v["rounds"], 3);
    // This build (no `openblas` feature) runs every product on the gemm crate.
    assert_eq!(v["gemm_backend"], "gemm");
    let mut each: Vec<f64> = v["train_tokens_per_s_rounds"]
        .as_array()
        .expect("rounds' figures")
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(each.len(), 3);
    each.sort_by(f64::total_cmp);
    assert_eq!(v["train_tokens_per_s"].as_f64(), Some(each[1]), "{v}");
    let err = failure_stderr(&agentrl(&[&tiny[..], &["--rounds", "0"]].concat()));
    assert!(err.contains("--rounds"), "{err}");
}

/// `bench rollout --rl-steps N` times N whole RL steps of a config through
/// the trainer, each phase; 0 steps is refused by name.
#[test]
fn bench_rollout_times_whole_rl_steps_phase_by_phase() {
    let v = json_stdout(&agentrl(&[
        "bench",
        "rollout",
        SMOKE,
        "--rl-steps",
        "2",
        "--json",
    ]));
    let steps = v["steps"].as_array().expect("the steps' phases");
    assert_eq!(steps.len(), 2, "{v}");
    for s in steps {
        let (rollout, update) = (
            s["rollout"].as_f64().unwrap(),
            s["update"].as_f64().unwrap(),
        );
        assert!(rollout > 0.0 && update > 0.0, "{s}");
        let total = s["total"].as_f64().unwrap();
        let parts = rollout + update + s["scoring"].as_f64().unwrap();
        assert!((total - parts).abs() < 1e-9, "{s}");
    }
    assert_eq!(v["device"], "cpu");
    assert!(v["parameters"].as_u64().unwrap() > 0);
    let err = failure_stderr(&agentrl(&["bench", "rollout", SMOKE, "--rl-steps", "0"]));
    assert!(err.contains("--rl-steps"), "{err}");
}
