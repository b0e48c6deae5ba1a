//! GGUF files (llama.cpp's format, in which most small pretrained models
//! reach people who run them locally) as a model source.
//!
//! The architecture and hyper-parameters come from the file's metadata
//! (`general.architecture` = `llama` or `qwen2`, then `{arch}.block_count`,
//! `{arch}.embedding_length`, ...), mapped to a [`ModelConfig`] as
//! transformers' GGUF loader maps them. The tensors are read with candle's
//! GGUF reader and dequantised to f32 with candle's dequantisation (every
//! type candle reads: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K …
//! Q6_K), one tensor at a time so that loading holds the f32 model plus one
//! tensor, never the whole file twice. llama.cpp's tensor names are mapped to
//! Hugging Face's, and the Q/K rows that llama.cpp's converter permutes for
//! its rotary layout in `llama` models are put back in Hugging Face's order.
//! A model loaded from a GGUF file saves as a Hugging Face directory, like
//! any other.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{Device, Tensor};

use crate::checkpoint::LoadedTensor;
use crate::config::RopeParameters;
use crate::{ModelConfig, ModelError};

/// The extension of a GGUF file.
pub const GGUF_EXTENSION: &str = "gguf";

/// The first four bytes of every GGUF file.
const GGUF_MAGIC: &[u8; 4] = b"GGUF";

/// Whether `path` names a GGUF file rather than a checkpoint directory: it
/// ends in `.gguf` (even if it does not exist yet, so that a missing file
/// is reported as one), or it is a file starting with GGUF's magic bytes.
pub fn is_gguf(path: &Path) -> bool {
    if path.is_dir() {
        return false;
    }
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case(GGUF_EXTENSION))
    {
        return true;
    }
    let mut magic = [0u8; 4];
    path.is_file()
        && File::open(path)
            .and_then(|mut f| f.read_exact(&mut magic))
            .is_ok()
        && &magic == GGUF_MAGIC
}

/// The architectures whose GGUF files this crate reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arch {
    Llama,
    Qwen2,
}

impl Arch {
    fn parse(name: &str) -> Option<Self> {
        match name {
            "llama" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            _ => None,
        }
    }

    /// The metadata prefix and `model_type`.
    fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
        }
    }

    /// transformers' class, for `config.json`'s `architectures`.
    fn class(self) -> &'static str {
        match self {
            Arch::Llama => "LlamaForCausalLM",
            Arch::Qwen2 => "Qwen2ForCausalLM",
        }
    }

    /// Whether llama.cpp's converter interleaved the halves of each Q/K head
    /// (its `LlamaModel.permute`): `llama` runs GPT-J-style rotary in
    /// llama.cpp, `qwen2` the NeoX style Hugging Face uses, unpermuted.
    fn permutes_qk(self) -> bool {
        self == Arch::Llama
    }
}

/// An open GGUF file: its metadata and tensor directory, read once.
pub struct GgufFile {
    path: PathBuf,
    content: Content,
    reader: BufReader<File>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("tensors", &self.content.tensor_infos.len())
            .finish()
    }
}

impl GgufFile {
    /// Reads the header, metadata and tensor directory of `path` (no tensor data).
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
        let mut reader = BufReader::new(file);
        let content = Content::read(&mut reader).map_err(|e| ModelError::CorruptFile {
            path: path.to_path_buf(),
            msg: format!("not a readable GGUF file: {e}"),
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            content,
            reader,
        })
    }

    /// The file's metadata (`general.*`, `{arch}.*`, `tokenizer.*`).
    pub fn metadata(&self) -> &std::collections::HashMap<String, Value> {
        &self.content.metadata
    }

    fn config_error(&self, msg: impl Into<String>) -> ModelError {
        ModelError::Config {
            path: self.path.clone(),
            msg: msg.into(),
        }
    }

    fn arch(&self) -> Result<Arch, ModelError> {
        let name = self.string("general.architecture")?;
        Arch::parse(name).ok_or_else(|| {
            self.config_error(format!(
                "general.architecture `{name}` is not supported (only llama and qwen2)"
            ))
        })
    }

    fn string(&self, key: &str) -> Result<&str, ModelError> {
        match self.metadata().get(key) {
            Some(Value::String(s)) => Ok(s),
            Some(other) => Err(self.config_error(format!("{key} is not a string: {other:?}"))),
            None => Err(self.config_error(format!("no {key} in the metadata"))),
        }
    }

    /// A non-negative integer of the metadata, whatever its stored width.
    fn uint(&self, key: &str) -> Result<Option<usize>, ModelError> {
        let Some(v) = self.metadata().get(key) else {
            return Ok(None);
        };
        let n: Option<u64> = match v {
            Value::U8(x) => Some(u64::from(*x)),
            Value::U16(x) => Some(u64::from(*x)),
            Value::U32(x) => Some(u64::from(*x)),
            Value::U64(x) => Some(*x),
            Value::I8(x) => u64::try_from(*x).ok(),
            Value::I16(x) => u64::try_from(*x).ok(),
            Value::I32(x) => u64::try_from(*x).ok(),
            Value::I64(x) => u64::try_from(*x).ok(),
            _ => None,
        };
        n.and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| self.config_error(format!("{key} is not a count: {v:?}")))
    }

    fn required_uint(&self, key: &str) -> Result<usize, ModelError> {
        self.uint(key)?
            .ok_or_else(|| self.config_error(format!("no {key} in the metadata")))
    }

    fn float(&self, key: &str) -> Result<Option<f64>, ModelError> {
        match self.metadata().get(key) {
            None => Ok(None),
            Some(Value::F32(x)) => Ok(Some(f64::from(*x))),
            Some(Value::F64(x)) => Ok(Some(*x)),
            Some(other) => Err(self.config_error(format!("{key} is not a number: {other:?}"))),
        }
    }

    /// The shape of a tensor (PyTorch's order: `[out, in]`), if the file has it.
    fn tensor_dims(&self, name: &str) -> Option<&[usize]> {
        self.content.tensor_infos.get(name).map(|t| t.shape.dims())
    }

    /// The model configuration the metadata describes, as transformers'
    /// GGUF loader builds it: `{arch}.context_length` →
    /// `max_position_embeddings`, `block_count`, `feed_forward_length`,
    /// `embedding_length`, `attention.head_count(_kv)`,
    /// `attention.layer_norm_rms_epsilon`, `rope.freq_base` (10000 when
    /// absent, as in llama.cpp); the vocabulary from the embedding matrix;
    /// tied embeddings when there is no `output.weight`.
    pub fn config(&self) -> Result<ModelConfig, ModelError> {
        let arch = self.arch()?;
        let key = |k: &str| format!("{}.{k}", arch.name());
        let hidden_size = self.required_uint(&key("embedding_length"))?;
        let heads = self.required_uint(&key("attention.head_count"))?;
        let kv_heads = self.uint(&key("attention.head_count_kv"))?.unwrap_or(heads);
        let head_dim = match self.uint(&key("attention.key_length"))? {
            Some(d) => d,
            None => hidden_size / heads.max(1),
        };
        // A rotary width other than the head's (partial rotary) or per-head
        // values of another width are models this crate does not implement.
        for k in ["rope.dimension_count", "attention.value_length"] {
            if let Some(d) = self.uint(&key(k))? {
                if d != head_dim {
                    return Err(self.config_error(format!(
                        "{} is {d}, not the head width {head_dim}: not supported",
                        key(k)
                    )));
                }
            }
        }
        if let Ok(kind) = self.string(&key("rope.scaling.type")) {
            if kind != "none" {
                return Err(self.config_error(format!(
                    "{} `{kind}`: rotary scaling is not supported",
                    key("rope.scaling.type")
                )));
            }
        }
        let vocab_size = match self.tensor_dims("token_embd.weight") {
            Some([v, _]) => *v,
            Some(other) => {
                return Err(self.config_error(format!(
                    "token_embd.weight has shape {other:?}, not [vocab, hidden]"
                )))
            }
            None => {
                return Err(ModelError::MissingTensor {
                    name: "token_embd.weight".into(),
                    path: self.path.clone(),
                })
            }
        };
        let rms_norm_eps = self
            .float(&key("attention.layer_norm_rms_epsilon"))?
            .ok_or_else(|| {
                self.config_error(format!(
                    "no {} in the metadata",
                    key("attention.layer_norm_rms_epsilon")
                ))
            })?;
        let rope_theta = self.float(&key("rope.freq_base"))?.unwrap_or(10_000.0);
        let attention_bias = match arch {
            // Qwen2 always has q/k/v biases (the config's default for it).
            Arch::Qwen2 => None,
            Arch::Llama => self
                .tensor_dims("blk.0.attn_q.bias")
                .is_some()
                .then_some(true),
        };
        let mut extra = BTreeMap::new();
        extra.insert("architectures".into(), serde_json::json!([arch.class()]));
        for (ours, theirs) in [
            ("bos_token_id", "tokenizer.ggml.bos_token_id"),
            ("eos_token_id", "tokenizer.ggml.eos_token_id"),
            ("pad_token_id", "tokenizer.ggml.padding_token_id"),
        ] {
            if let Some(id) = self.uint(theirs)? {
                extra.insert(ours.into(), serde_json::json!(id));
            }
        }
        let config = ModelConfig {
            model_type: arch.name().into(),
            vocab_size,
            hidden_size,
            intermediate_size: self.required_uint(&key("feed_forward_length"))?,
            num_hidden_layers: self.required_uint(&key("block_count"))?,
            num_attention_heads: heads,
            num_key_value_heads: Some(kv_heads),
            head_dim: Some(head_dim),
            rms_norm_eps,
            rope_theta: Some(rope_theta),
            rope_parameters: Some(RopeParameters {
                rope_theta: Some(rope_theta),
                rope_type: Some("default".into()),
                extra: BTreeMap::new(),
            }),
            max_position_embeddings: self.required_uint(&key("context_length"))?,
            tie_word_embeddings: self.tensor_dims("output.weight").is_none(),
            attention_bias,
            initializer_range: 0.02,
            hidden_act: "silu".into(),
            extra,
        };
        config.validate().map_err(|msg| self.config_error(msg))?;
        Ok(config)
    }

    /// Every tensor under its Hugging Face name, dequantised to f32 on the
    /// CPU one at a time (Q/K of `llama` models un-permuted). A tensor this
    /// crate has no name for (e.g. llama 3's `rope_freqs.weight`, a rotary
    /// scaling it does not implement) is an error, not silently dropped.
    pub(crate) fn tensors(
        &mut self,
        config: &ModelConfig,
    ) -> Result<BTreeMap<String, LoadedTensor>, ModelError> {
        let arch = self.arch()?;
        let mut names: Vec<String> = self.content.tensor_infos.keys().cloned().collect();
        names.sort();
        let mut out = BTreeMap::new();
        for gguf_name in names {
            let Some((hf_name, part)) = hf_name(&gguf_name, config.num_hidden_layers) else {
                return Err(ModelError::CorruptFile {
                    path: self.path.clone(),
                    msg: format!(
                        "tensor `{gguf_name}` is not part of a {} model this crate implements",
                        arch.name()
                    ),
                });
            };
            let tensor = self.dequantized(&gguf_name)?;
            let tensor = match part {
                Part::Query if arch.permutes_qk() => {
                    unpermute_rows(&tensor, config.num_attention_heads)?
                }
                Part::Key if arch.permutes_qk() => unpermute_rows(&tensor, config.num_kv_heads())?,
                _ => tensor,
            };
            out.insert(
                hf_name,
                LoadedTensor {
                    tensor,
                    file: self.path.clone(),
                },
            );
        }
        Ok(out)
    }

    /// One tensor read from the file and dequantised to f32 on the CPU.
    fn dequantized(&mut self, name: &str) -> Result<Tensor, ModelError> {
        let corrupt = |e: candle_core::Error| ModelError::CorruptFile {
            path: self.path.clone(),
            msg: format!("tensor `{name}`: {e}"),
        };
        let q = self
            .content
            .tensor(&mut self.reader, name, &Device::Cpu)
            .map_err(corrupt)?;
        q.dequantize(&Device::Cpu).map_err(corrupt)
    }
}

/// Which projection a tensor belongs to, for the Q/K un-permutation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Query,
    Key,
    Other,
}

/// The Hugging Face name of a llama.cpp tensor name, as transformers maps
/// them (`blk.N.attn_q.weight` → `model.layers.N.self_attn.q_proj.weight`,
/// ...), or `None` for a tensor outside the model (or past its layers).
fn hf_name(gguf: &str, layers: usize) -> Option<(String, Part)> {
    let top = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(name) = top {
        return Some((name.to_string(), Part::Other));
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    if layer >= layers {
        return None;
    }
    let (module, kind) = rest.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None;
    }
    let (hf, part) = match module {
        "attn_q" => ("self_attn.q_proj", Part::Query),
        "attn_k" => ("self_attn.k_proj", Part::Key),
        "attn_v" => ("self_attn.v_proj", Part::Other),
        "attn_output" => ("self_attn.o_proj", Part::Other),
        "ffn_gate" => ("mlp.gate_proj", Part::Other),
        "ffn_up" => ("mlp.up_proj", Part::Other),
        "ffn_down" => ("mlp.down_proj", Part::Other),
        "attn_norm" => ("input_layernorm", Part::Other),
        "ffn_norm" => ("post_attention_layernorm", Part::Other),
        _ => return None,
    };
    Some((format!("model.layers.{layer}.{hf}.{kind}"), part))
}

/// Undoes llama.cpp's `LlamaModel.permute` of a Q or K projection (weight
/// `[heads·d, in]` or bias `[heads·d]`): llama.cpp stores each head's rows
/// as `(d/2, 2)` — the two halves that rotate together interleaved — where
/// Hugging Face keeps `(2, d/2)`, first half then second. This is
/// transformers' `reverse_permute_weights`.
pub fn unpermute_rows(t: &Tensor, heads: usize) -> Result<Tensor, ModelError> {
    let dims = t.dims().to_vec();
    let rows = dims.first().copied().unwrap_or(0);
    if heads == 0 || !rows.is_multiple_of(2 * heads) {
        return Err(ModelError::InvalidInput(format!(
            "cannot un-permute {rows} rows into {heads} rotary heads"
        )));
    }
    let half = rows / heads / 2;
    let rest: usize = dims[1..].iter().product();
    Ok(t.reshape((heads, half, 2, rest))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape(dims)?)
}

/// The configuration and tensors (Hugging Face names, f32 on the CPU) of the
/// GGUF file `path`.
pub(crate) fn read_checkpoint(
    path: &Path,
) -> Result<(ModelConfig, BTreeMap<String, LoadedTensor>), ModelError> {
    let mut file = GgufFile::open(path)?;
    let config = file.config()?;
    let tensors = file.tensors(&config)?;
    Ok((config, tensors))
}

/// The configuration the metadata of the GGUF file `path` describes (reads
/// no tensor data).
pub fn read_config(path: &Path) -> Result<ModelConfig, ModelError> {
    GgufFile::open(path)?.config()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_names_map_to_hugging_face_names() {
        let cases = [
            ("token_embd.weight", "model.embed_tokens.weight"),
            ("output_norm.weight", "model.norm.weight"),
            ("output.weight", "lm_head.weight"),
            (
                "blk.0.attn_q.weight",
                "model.layers.0.self_attn.q_proj.weight",
            ),
            ("blk.1.attn_k.bias", "model.layers.1.self_attn.k_proj.bias"),
            (
                "blk.1.attn_v.weight",
                "model.layers.1.self_attn.v_proj.weight",
            ),
            (
                "blk.0.attn_output.weight",
                "model.layers.0.self_attn.o_proj.weight",
            ),
            (
                "blk.0.ffn_gate.weight",
                "model.layers.0.mlp.gate_proj.weight",
            ),
            ("blk.0.ffn_up.weight", "model.layers.0.mlp.up_proj.weight"),
            (
                "blk.0.ffn_down.weight",
                "model.layers.0.mlp.down_proj.weight",
            ),
            (
                "blk.1.attn_norm.weight",
                "model.layers.1.input_layernorm.weight",
            ),
            (
                "blk.1.ffn_norm.weight",
                "model.layers.1.post_attention_layernorm.weight",
            ),
        ];
        for (gguf, hf) in cases {
            assert_eq!(hf_name(gguf, 2).map(|(n, _)| n).as_deref(), Some(hf));
        }
        for outside in [
            "rope_freqs.weight",
            "blk.2.attn_q.weight",
            "blk.0.attn_q.scale",
            "blk.x.attn_q.weight",
        ] {
            assert!(hf_name(outside, 2).is_none(), "{outside}");
        }
    }

    /// llama.cpp's `LlamaModel.permute`, written as in its converter.
    fn permute(t: &Tensor, heads: usize) -> Tensor {
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

    #[test]
    fn unpermute_undoes_llama_cpp_permutation_and_is_not_the_identity() {
        // 2 heads of width 6 (3 rotary pairs), 4 input columns.
        let w = Tensor::arange(0f32, 48., &Device::Cpu)
            .unwrap()
            .reshape((12, 4))
            .unwrap();
        let permuted = permute(&w, 2);
        let rows = |t: &Tensor| t.to_vec2::<f32>().unwrap();
        assert_ne!(rows(&permuted), rows(&w));
        // Head 0's rows 0..6 are stored as 0, 3, 1, 4, 2, 5.
        let first: Vec<f32> = rows(&permuted).iter().map(|r| r[0]).collect();
        assert_eq!(
            first,
            [0., 12., 4., 16., 8., 20., 24., 36., 28., 40., 32., 44.]
        );
        assert_eq!(rows(&unpermute_rows(&permuted, 2).unwrap()), rows(&w));
        let bias = Tensor::arange(0f32, 12., &Device::Cpu).unwrap();
        let back = unpermute_rows(&permute(&bias, 2), 2).unwrap();
        assert_eq!(
            back.to_vec1::<f32>().unwrap(),
            bias.to_vec1::<f32>().unwrap()
        );
        assert!(unpermute_rows(&w, 5).is_err());
    }
}
