//! Writes a Hugging Face checkpoint directory as a GGUF file the way
//! llama.cpp's `convert_hf_to_gguf.py` lays one out (its metadata keys,
//! tensor names, the Q/K row permutation of `llama` models, a byte-level
//! BPE tokenizer as `tokenizer.ggml.*`), with candle's GGUF writer, for the
//! tests of every crate that reads GGUF files. Include it as
//! `#[path = "../../model/tests/model/gguf_writer/mod.rs"] mod gguf_writer;`.
//!
//! Written apart from the loader (`agentrl_model::gguf`) on purpose: the
//! tests hold the loader to this independent description of the format.
#![allow(dead_code)] // each test binary uses its own subset

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use serde_json::Value as Json;

/// The storage type of a tensor, given its GGUF name and shape.
pub type DtypeRule = Box<dyn Fn(&str, &[usize]) -> GgmlDType>;

/// What to write.
pub struct GgufOptions {
    /// `general.architecture`: `qwen2` or `llama` (whose Q/K rows get
    /// llama.cpp's permutation).
    pub arch: &'static str,
    /// The storage type of each tensor, by its GGUF name and shape
    /// (`[out, in]`); a type whose block does not divide a row falls back
    /// to F32, as llama.cpp does for such tensors.
    pub dtype: DtypeRule,
    /// Write `tokenizer.ggml.*` and `tokenizer.chat_template` from the
    /// directory's `tokenizer.json` and `tokenizer_config.json`.
    pub tokenizer: bool,
    /// `tokenizer.ggml.pre`.
    pub pre: &'static str,
    /// Whether a `llama` file gets llama.cpp's Q/K permutation (always, in
    /// a real one: off only to show what the loader's un-permutation does).
    pub llama_permute: bool,
}

impl GgufOptions {
    /// Every tensor in F32, with the tokenizer.
    pub fn f32(arch: &'static str) -> Self {
        Self {
            arch,
            dtype: Box::new(|_, _| GgmlDType::F32),
            tokenizer: true,
            pre: "gpt2",
            llama_permute: true,
        }
    }
}

/// Every 2-D weight in `dtype` where its rows allow, the rest F32.
pub fn matrices_in(dtype: GgmlDType) -> DtypeRule {
    Box::new(move |_, dims| {
        if dims.len() == 2 {
            dtype
        } else {
            GgmlDType::F32
        }
    })
}

/// llama.cpp's `LlamaModel.permute` of a Q or K projection: each head's
/// rows `(2, d/2)` stored as `(d/2, 2)`.
pub fn llama_cpp_permute(t: &Tensor, heads: usize) -> Tensor {
    let dims = t.dims().to_vec();
    let half = dims[0] / heads / 2;
    let rest: usize = dims[1..].iter().product();
    t.reshape((heads, 2, half, rest))
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .contiguous()
        .unwrap()
        .reshape(dims)
        .unwrap()
}

/// llama.cpp's name of a Hugging Face tensor (`None`: not written).
fn gguf_name(hf: &str) -> Option<String> {
    match hf {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (module, kind) = rest.rsplit_once('.')?;
    let short = match module {
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        _ => return None,
    };
    Some(format!("blk.{layer}.{short}.{kind}"))
}

fn read_json(path: &Path) -> Json {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn count(cfg: &Json, key: &str) -> u32 {
    cfg[key]
        .as_u64()
        .unwrap_or_else(|| panic!("config.json has no {key}")) as u32
}

/// Writes the checkpoint in `hf_dir` (config.json, model.safetensors,
/// tokenizer files) as the GGUF file `out`.
pub fn write_gguf(hf_dir: &Path, out: &Path, opts: &GgufOptions) {
    let cfg = read_json(&hf_dir.join("config.json"));
    let arch = opts.arch;
    let heads = count(&cfg, "num_attention_heads");
    let kv_heads = cfg["num_key_value_heads"]
        .as_u64()
        .map_or(heads, |n| n as u32);
    let hidden = count(&cfg, "hidden_size");
    let head_dim = cfg["head_dim"]
        .as_u64()
        .map_or(hidden / heads, |n| n as u32);
    let theta = cfg["rope_parameters"]["rope_theta"]
        .as_f64()
        .or(cfg["rope_theta"].as_f64())
        .unwrap_or(10_000.0);
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        ("general.name".into(), Value::String("test model".into())),
        (
            format!("{arch}.context_length"),
            Value::U32(count(&cfg, "max_position_embeddings")),
        ),
        (format!("{arch}.embedding_length"), Value::U32(hidden)),
        (
            format!("{arch}.block_count"),
            Value::U32(count(&cfg, "num_hidden_layers")),
        ),
        (
            format!("{arch}.feed_forward_length"),
            Value::U32(count(&cfg, "intermediate_size")),
        ),
        (format!("{arch}.attention.head_count"), Value::U32(heads)),
        (
            format!("{arch}.attention.head_count_kv"),
            Value::U32(kv_heads),
        ),
        (format!("{arch}.rope.dimension_count"), Value::U32(head_dim)),
        (format!("{arch}.rope.freq_base"), Value::F32(theta as f32)),
        (
            format!("{arch}.attention.layer_norm_rms_epsilon"),
            Value::F32(cfg["rms_norm_eps"].as_f64().unwrap() as f32),
        ),
    ];
    if opts.tokenizer {
        meta.extend(tokenizer_metadata(hf_dir, opts.pre));
    }

    let stored =
        candle_core::safetensors::load(hf_dir.join("model.safetensors"), &Device::Cpu).unwrap();
    let mut names: Vec<&String> = stored.keys().collect();
    names.sort();
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    for hf in names {
        let Some(name) = gguf_name(hf) else {
            continue;
        };
        let mut t = stored[hf].to_dtype(candle_core::DType::F32).unwrap();
        let permute = arch == "llama" && opts.llama_permute;
        if permute && name.contains(".attn_q.") {
            t = llama_cpp_permute(&t, heads as usize);
        }
        if permute && name.contains(".attn_k.") {
            t = llama_cpp_permute(&t, kv_heads as usize);
        }
        let mut dtype = (opts.dtype)(&name, t.dims());
        if t.dims().last().is_none_or(|&n| n % dtype.block_size() != 0) {
            dtype = GgmlDType::F32;
        }
        tensors.push((name, QTensor::quantize(&t, dtype).unwrap()));
    }
    write_file(out, &meta, &tensors);
}

/// Writes `meta` and `tensors` with candle's GGUF writer.
pub fn write_file(out: &Path, meta: &[(String, Value)], tensors: &[(String, QTensor)]) {
    let meta: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(out).unwrap();
    gguf_file::write(&mut file, &meta, &tensors).unwrap();
}

/// The `tokenizer.*` metadata llama.cpp writes for the byte-level BPE
/// tokenizer in `dir`: every token in id order, its type (3 for a special
/// added token), the merges as `"a b"`, the special token ids, the chat
/// template.
pub fn tokenizer_metadata(dir: &Path, pre: &str) -> Vec<(String, Value)> {
    let tok = read_json(&dir.join("tokenizer.json"));
    let conf = read_json(&dir.join("tokenizer_config.json"));
    let mut by_id: HashMap<u64, (String, i32)> = HashMap::new();
    for (token, id) in tok["model"]["vocab"].as_object().unwrap() {
        by_id.insert(id.as_u64().unwrap(), (token.clone(), 1));
    }
    for added in tok["added_tokens"].as_array().unwrap() {
        let kind = if added["special"].as_bool() == Some(true) {
            3
        } else {
            4
        };
        by_id.insert(
            added["id"].as_u64().unwrap(),
            (added["content"].as_str().unwrap().to_string(), kind),
        );
    }
    let n = by_id.len() as u64;
    let (tokens, types): (Vec<Value>, Vec<Value>) = (0..n)
        .map(|id| {
            let (t, kind) = by_id.remove(&id).expect("token ids are 0..n");
            (Value::String(t), Value::I32(kind))
        })
        .unzip();
    let merges: Vec<Value> = tok["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Json::String(s) => Value::String(s.clone()),
            Json::Array(pair) => Value::String(format!(
                "{} {}",
                pair[0].as_str().unwrap(),
                pair[1].as_str().unwrap()
            )),
            other => panic!("merge {other}"),
        })
        .collect();
    let id_of = |key: &str| -> Option<u32> {
        let token = conf[key].as_str()?;
        tokens
            .iter()
            .position(|t| matches!(t, Value::String(s) if s == token))
            .map(|i| i as u32)
    };
    let mut meta = vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String(pre.into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens.clone())),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
        ("tokenizer.ggml.merges".into(), Value::Array(merges)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
    ];
    for (key, gguf_key) in [
        ("bos_token", "tokenizer.ggml.bos_token_id"),
        ("eos_token", "tokenizer.ggml.eos_token_id"),
        ("pad_token", "tokenizer.ggml.padding_token_id"),
        ("unk_token", "tokenizer.ggml.unknown_token_id"),
    ] {
        if let Some(id) = id_of(key) {
            meta.push((gguf_key.into(), Value::U32(id)));
        }
    }
    if let Some(t) = conf["chat_template"].as_str() {
        meta.push(("tokenizer.chat_template".into(), Value::String(t.into())));
    }
    meta
}
