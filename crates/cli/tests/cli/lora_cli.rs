//! LoRA end to end on `configs/smoke.toml`: a seeded run trains only the
//! adapter (the base weights of every checkpoint are the same bytes), its
//! checkpoints carry the adapter in PEFT's layout, a resumed run ends bit
//! for bit where the whole one did, `eval --policy` plays it, and
//! `merge-lora` writes a plain checkpoint giving the adapted model's logits.

use std::path::Path;

use crate::common::{agentrl, failure_stderr, json_stdout, ok_stdout, BIN, SMOKE};

const OVERRIDES: &[&str] = &[
    "name=lora-test",
    "lora.enabled=true",
    "lora.r=4",
    "lora.target_modules=[\"q_proj\", \"v_proj\", \"down_proj\"]",
    // GAE: the value head's errors give the policy a gradient even when every
    // sample of the smoke run gets the same reward; the value head trains beside the adapter.
    "algorithm.adv_estimator=gae",
    "actor.lr=1e-2",
    "trainer.total_training_steps=3",
];

fn train(out: &Path, extra: &[&str]) -> std::process::Output {
    std::process::Command::new(BIN)
        .arg("train")
        .arg(SMOKE)
        .args(OVERRIDES)
        .args(extra)
        .arg("--out")
        .arg(out)
        .arg("--quiet")
        .output()
        .unwrap()
}

fn read(path: impl AsRef<Path>) -> Vec<u8> {
    std::fs::read(path.as_ref()).unwrap_or_else(|e| panic!("{}: {e}", path.as_ref().display()))
}

/// The train lines of metrics.jsonl, as text.
fn train_lines(run: &Path) -> Vec<String> {
    String::from_utf8(read(run.join("metrics.jsonl")))
        .unwrap()
        .lines()
        .filter(|l| l.contains("\"kind\":\"train\""))
        .map(|l| {
            // Wall-clock figures differ between runs; everything else must not.
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            for key in ["rollout_seconds", "update_seconds", "scoring_seconds"] {
                v.as_object_mut().unwrap().remove(key);
            }
            v.to_string()
        })
        .collect()
}

/// Writes `{"ids", "logits"}` of one prompt under `model` to `out` and reads the logits.
fn prompt_logits(model: &Path, out: &Path) -> Vec<Vec<f64>> {
    let text = ok_stdout(&agentrl(&[
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        "pull an arm",
        "--max-new-tokens",
        "1",
        "--temperature",
        "0",
        "--logits",
        out.to_str().unwrap(),
    ]));
    assert!(!text.is_empty());
    let v: serde_json::Value = serde_json::from_slice(&read(out)).unwrap();
    serde_json::from_value(v["logits"].clone()).unwrap()
}

fn max_abs_diff(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    a.concat()
        .iter()
        .zip(b.concat())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

#[test]
fn a_lora_run_trains_only_the_adapter_resumes_exactly_evaluates_and_merges() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    ok_stdout(&train(&run, &[]));
    let ckpt = |step: usize| run.join(format!("checkpoints/step-{step}"));

    // Step 0 (after the warm start) and step 3 hold the same base weights;
    // the adapter moved.
    // The base is frozen; the value head (in the same file) trains.
    let base = |step: usize| {
        let path = ckpt(step).join("model.safetensors");
        let mut tensors: Vec<(String, Vec<f32>)> =
            candle_core::safetensors::load(&path, &candle_core::Device::Cpu)
                .unwrap()
                .into_iter()
                .filter(|(name, _)| !name.starts_with("value_head"))
                .map(|(name, t)| (name, t.flatten_all().unwrap().to_vec1().unwrap()))
                .collect();
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        tensors
    };
    assert!(base(0) == base(3), "the base weights changed");
    let adapter = |step: usize| read(ckpt(step).join("adapter/adapter_model.safetensors"));
    assert!(adapter(0) != adapter(3), "RL did not change the adapter");
    let config: serde_json::Value =
        serde_json::from_slice(&read(ckpt(3).join("adapter/adapter_config.json"))).unwrap();
    assert_eq!(config["peft_type"], "LORA");
    assert_eq!(config["r"], 4);
    assert_eq!(
        config["target_modules"],
        serde_json::json!(["q_proj", "v_proj", "down_proj"])
    );
    let toml = String::from_utf8(read(run.join("config.toml"))).unwrap();
    assert!(
        toml.contains("[lora]") && toml.contains("enabled = true"),
        "{toml}"
    );

    // Resume from step 1 of a copy: the same steps, the same adapter bytes.
    let resumed = dir.path().join("resumed");
    copy_dir(&run, &resumed);
    for step in [2, 3] {
        std::fs::remove_dir_all(resumed.join(format!("checkpoints/step-{step}"))).unwrap();
    }
    std::fs::remove_dir_all(resumed.join("checkpoints/best")).ok();
    std::fs::write(resumed.join("checkpoints/latest"), "step-1").unwrap();
    ok_stdout(&agentrl(&[
        "train",
        "--resume",
        resumed.to_str().unwrap(),
        "--quiet",
    ]));
    assert_eq!(train_lines(&resumed), train_lines(&run));
    assert!(
        read(resumed.join("checkpoints/step-3/adapter/adapter_model.safetensors")) == adapter(3),
        "the resumed run's adapter differs"
    );

    // `eval --policy RUN` plays the adapted model.
    let eval = json_stdout(&agentrl(&[
        "eval",
        "--env",
        "bandit",
        "--policy",
        run.to_str().unwrap(),
        "--n",
        "4",
        "--json",
    ]));
    assert!(eval.to_string().contains("success"), "{eval}");

    // merge-lora: a plain checkpoint with the adapted model's logits.
    let merged = dir.path().join("merged");
    let merge = |policy: &Path, out: &Path| {
        agentrl(&[
            "merge-lora",
            "--policy",
            policy.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
    };
    let said = ok_stdout(&merge(&run, &merged));
    assert!(said.contains("merged the LoRA adapter"), "{said}");
    assert!(!merged.join("adapter").exists() && merged.join("tokenizer.json").is_file());
    let adapted = prompt_logits(&ckpt(3), &dir.path().join("adapted.json"));
    let plain = prompt_logits(&merged, &dir.path().join("merged.json"));
    let base = {
        let bare = dir.path().join("base");
        copy_dir(&ckpt(3), &bare);
        std::fs::remove_dir_all(bare.join("adapter")).unwrap();
        prompt_logits(&bare, &dir.path().join("base.json"))
    };
    assert!(max_abs_diff(&adapted, &plain) < 1e-4);
    assert!(
        max_abs_diff(&adapted, &base) > 1e-3,
        "the adapter does not change the logits: the merge is not tested"
    );
    // A second merge into the same directory is refused, as is a policy without adapter.
    let e = failure_stderr(&merge(&run, &merged));
    assert!(e.contains("not an empty directory"), "{e}");
    let e = failure_stderr(&merge(&merged, &dir.path().join("again")));
    assert!(e.contains("has no LoRA adapter"), "{e}");
}

#[test]
fn lora_dropout_is_refused_for_training_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let out = train(&dir.path().join("run"), &["lora.lora_dropout=0.05"]);
    let e = failure_stderr(&out);
    assert!(
        e.contains("lora.lora_dropout") && e.contains("cannot be trained"),
        "{e}"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}
