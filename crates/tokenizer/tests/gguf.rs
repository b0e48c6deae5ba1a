//! Tokenizers from GGUF metadata: the qwen2-tiny fixture's tokenizer written
//! as llama.cpp's `tokenizer.ggml.*` keys encodes like its tokenizer.json;
//! SmolLM2's GGUF (when AGENTRL_SMOLLM2_GGUF names it) gives transformers'
//! prompt ids.

use std::path::{Path, PathBuf};

use agentrl_tokenizer::{ChatMessage, ChatTokenizer};
use candle_core::quantized::gguf_file::Value;
use tokenizers::PreTokenizer;

#[path = "../../model/tests/model/qwen2_tiny/mod.rs"]
mod qwen2_tiny;
use qwen2_tiny::{fixture_dir, reference, u32s};

#[path = "../../model/tests/model/gguf_writer/mod.rs"]
mod gguf_writer;

/// A GGUF holding only the fixture tokenizer's metadata (no tensors: the
/// tokenizer reads none), with `tokenizer.ggml.pre` = `pre`.
fn fixture_tokenizer_gguf(dir: &Path, pre: &str) -> PathBuf {
    let path = dir.join(format!("tokenizer-{pre}.gguf"));
    let mut meta = vec![(
        "general.architecture".to_string(),
        Value::String("qwen2".into()),
    )];
    meta.extend(gguf_writer::tokenizer_metadata(&fixture_dir(), pre));
    gguf_writer::write_file(&path, &meta, &[]);
    path
}

/// Texts with what byte-level BPE must get right: spaces and newlines,
/// contractions, digits, punctuation runs, non-ASCII, special tokens inside
/// the text.
const TEXTS: &[&str] = &[
    "Hello world",
    " leading space and  two  spaces",
    "line one\nline two\n\n  indented\ttab",
    "I'm sure they'll say it's 1234 or 56.7%!",
    "<think>step</think><answer>Left</answer>",
    "__#__\n_P_O_\n#####",
    "naïve café, 東京 — √2 ≈ 1.414 🙂",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "trailing spaces   ",
    "",
];

#[test]
fn gguf_tokenizer_encodes_and_decodes_like_the_fixture_tokenizer_json() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = ChatTokenizer::load(fixture_tokenizer_gguf(dir.path(), "gpt2")).unwrap();
    let json = ChatTokenizer::load(fixture_dir()).unwrap();
    assert_eq!(gguf.vocab_size(), json.vocab_size());
    for text in TEXTS {
        let ids = json.encode(text).unwrap();
        assert_eq!(gguf.encode(text).unwrap(), ids, "{text:?}");
        for skip in [false, true] {
            assert_eq!(
                gguf.decode(&ids, skip).unwrap(),
                json.decode(&ids, skip).unwrap(),
                "{text:?}"
            );
        }
    }
    // Every token of the vocabulary decodes alike, one by one.
    for id in 0..json.vocab_size() as u32 {
        assert_eq!(gguf.token(id), json.token(id), "token {id}");
    }
}

#[test]
fn gguf_chat_template_and_special_tokens_come_from_the_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = ChatTokenizer::load(fixture_tokenizer_gguf(dir.path(), "gpt2")).unwrap();
    let json = ChatTokenizer::load(fixture_dir()).unwrap();
    assert_eq!(gguf.chat_template(), json.chat_template());
    assert_eq!(gguf.im_start_id(), json.im_start_id());
    assert_eq!(gguf.im_end_id(), json.im_end_id());
    assert_eq!(gguf.eos_id(), json.eos_id());
    assert_eq!(gguf.pad_id(), json.pad_id());
    assert_eq!(gguf.stop_ids(), json.stop_ids());
    let r = reference();
    let messages: Vec<ChatMessage> = serde_json::from_value(r["chat_messages"].clone()).unwrap();
    assert_eq!(
        gguf.encode_chat(&messages, true).unwrap(),
        u32s(&r["input_ids"])
    );
}

#[test]
fn a_gguf_tokenizer_saves_as_a_directory_that_loads_back_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = ChatTokenizer::load(fixture_tokenizer_gguf(dir.path(), "qwen2")).unwrap();
    let saved = dir.path().join("saved");
    gguf.save(&saved).unwrap();
    let back = ChatTokenizer::load(&saved).unwrap();
    assert_eq!(back.chat_template(), gguf.chat_template());
    assert_eq!(back.stop_ids(), gguf.stop_ids());
    for text in TEXTS {
        assert_eq!(
            back.encode(text).unwrap(),
            gguf.encode(text).unwrap(),
            "{text:?}"
        );
    }
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(saved.join("tokenizer_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(config["eos_token"], "<|im_end|>");
    assert_eq!(config["add_bos_token"], false);
    assert!(config["chat_template"].is_string());
}

/// The pre-tokenizer's pieces of `text`.
fn pieces(tok: &ChatTokenizer, text: &str) -> Vec<String> {
    let mut pre = tokenizers::PreTokenizedString::from(text);
    tok.inner()
        .get_pre_tokenizer()
        .unwrap()
        .pre_tokenize(&mut pre)
        .unwrap();
    pre.get_splits(
        tokenizers::OffsetReferential::Original,
        tokenizers::OffsetType::Byte,
    )
    .into_iter()
    .map(|(s, _, _)| s.to_string())
    .collect()
}

#[test]
fn tokenizer_ggml_pre_picks_the_split_regex_as_transformers_does() {
    let dir = tempfile::tempdir().unwrap();
    let load = |pre| ChatTokenizer::load(fixture_tokenizer_gguf(dir.path(), pre)).unwrap();
    let text = "I'm 12345 ok";
    // GPT-2's regex (also SmolLM2's `smollm`, not in transformers' table):
    // a run of digits is one piece.
    for pre in ["gpt2", "smollm"] {
        assert_eq!(
            pieces(&load(pre), text),
            ["I", "'m", "Ġ12345", "Ġok"],
            "{pre}"
        );
    }
    // Qwen2: digits one by one, the space on its own.
    assert_eq!(
        pieces(&load("qwen2"), text),
        ["I", "'m", "Ġ", "1", "2", "3", "4", "5", "Ġok"]
    );
    // Llama 3: digits in threes.
    assert_eq!(
        pieces(&load("llama-bpe"), text),
        ["I", "'m", "Ġ", "123", "45", "Ġok"]
    );
}

#[test]
fn unsupported_tokenizer_models_are_errors_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spm.gguf");
    let mut meta = gguf_writer::tokenizer_metadata(&fixture_dir(), "gpt2");
    for (k, v) in meta.iter_mut() {
        if k == "tokenizer.ggml.model" {
            *v = Value::String("llama".into());
        }
    }
    gguf_writer::write_file(&path, &meta, &[]);
    let err = ChatTokenizer::load(&path).unwrap_err().to_string();
    assert!(err.contains("tokenizer.ggml.model `llama`"), "{err}");
    let missing = ChatTokenizer::load(dir.path().join("absent.gguf"))
        .unwrap_err()
        .to_string();
    assert!(missing.contains("absent.gguf"), "{missing}");
}

/// SmolLM2-135M-Instruct's GGUF, when `AGENTRL_SMOLLM2_GGUF` names it
/// (`scripts/fetch-smollm2.sh`); `None` with a note otherwise.
fn smollm2_gguf() -> Option<PathBuf> {
    match std::env::var_os("AGENTRL_SMOLLM2_GGUF") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            eprintln!(
                "skipped: AGENTRL_SMOLLM2_GGUF is not set (scripts/fetch-smollm2.sh fetches SmolLM2's GGUF)"
            );
            None
        }
    }
}

#[test]
fn smollm2_gguf_chat_prompt_gives_transformers_ids() {
    let Some(path) = smollm2_gguf() else {
        return;
    };
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../model/tests/data/smollm2-reference.json"
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let tok = ChatTokenizer::load(&path).unwrap();
    let messages: Vec<ChatMessage> = serde_json::from_value(r["messages"].clone()).unwrap();
    assert_eq!(
        tok.render_chat(&messages, true).unwrap(),
        r["chat_text"].as_str().unwrap()
    );
    assert_eq!(
        tok.encode_chat(&messages, true).unwrap(),
        u32s(&r["prompt_ids"])
    );
    // The reply's end: <|im_end|>, then <|endoftext|>.
    assert_eq!(tok.stop_ids(), [2, 0]);
}
