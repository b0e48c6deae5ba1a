//! The tokenizer and chat template of a GGUF file (llama.cpp's format),
//! rebuilt from its `tokenizer.ggml.*` metadata as transformers' GGUF
//! loader rebuilds it (`transformers/integrations/gguf/gguf_tokenizer_mapping.py`):
//!
//! - `tokenizer.ggml.model` = `gpt2`: a byte-level BPE over
//!   `tokenizer.ggml.tokens` (ids in file order; a token not written in the
//!   byte alphabet is respelled through it, as GPT-2's vocabulary would
//!   spell it) and `tokenizer.ggml.merges`, GPT-2's byte-level
//!   pre-tokenizer and decoder;
//! - `tokenizer.ggml.pre` naming a known family (`qwen2`, `llama-bpe`, …):
//!   that family's split regex before a byte-level step without GPT-2's;
//! - tokens of `tokenizer.ggml.token_type` 3 (control) added as special
//!   tokens, 4 (user-defined) as plain added tokens;
//! - bos/eos/unk/pad from `tokenizer.ggml.*_token_id`, `add_bos_token` /
//!   `add_eos_token` from the file, and the chat template from
//!   `tokenizer.chat_template`.
//!
//! SentencePiece vocabularies (`tokenizer.ggml.model` = `llama`) are not
//! read: agentrl's chat layout needs `<|im_start|>`/`<|im_end|>`, which
//! those models do not have.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use serde_json::{json, Map};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use crate::chat_template::{ChatTemplate, TemplateTokens};
use crate::chat_tokenizer::{ChatTokenizer, TokenizerError};

/// `tokenizer.ggml.token_type` of a control token (`<|im_end|>`, …).
const CONTROL: i64 = 3;
/// `tokenizer.ggml.token_type` of a user-defined added token (`<think>`, …).
const USER_DEFINED: i64 = 4;

/// Llama 3's split (and the families llama.cpp gives it to).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split: digits one by one.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5's split: Qwen2's with combining marks inside words.
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Mistral's tekken split.
const TEKKEN_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-4o's split (and the families llama.cpp gives it to).
const GPT4O_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The split regex of a `tokenizer.ggml.pre` value, as transformers'
/// `GGUF_PRE_TOKENIZER_SPLITS` maps it; `None` (SmolLM2's `smollm`, GPT-2's
/// `gpt2`, anything unlisted) keeps GPT-2's byte-level regex.
fn pre_tokenizer_split(pre: &str) -> Option<&'static str> {
    Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" | "dbrx" | "smaug-bpe" => LLAMA3_SPLIT,
        "tekken" => TEKKEN_SPLIT,
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" => QWEN2_SPLIT,
        "qwen35" => QWEN35_SPLIT,
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => GPT4O_SPLIT,
        _ => return None,
    })
}

/// GPT-2's `bytes_to_unicode`: the printable character each byte is
/// written as in a byte-level vocabulary.
fn bytes_to_unicode() -> [char; 256] {
    let printable = |b: u32| {
        (u32::from(b'!')..=u32::from(b'~')).contains(&b)
            || (0xA1..=0xAC).contains(&b)
            || (0xAE..=0xFF).contains(&b)
    };
    let mut out = ['\0'; 256];
    let mut shifted = 0u32;
    for b in 0..256u32 {
        let c = if printable(b) {
            b
        } else {
            shifted += 1;
            255 + shifted
        };
        out[b as usize] = char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER);
    }
    out
}

/// The metadata of a GGUF file, read with candle's reader (the tensor data
/// stays on disk).
struct Metadata<'a> {
    path: &'a Path,
    values: HashMap<String, Value>,
}

impl<'a> Metadata<'a> {
    fn read(path: &'a Path) -> Result<Self, TokenizerError> {
        let file = File::open(path).map_err(|source| TokenizerError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let content = Content::read(&mut BufReader::new(file))
            .map_err(|e| Self::error_at(path, format!("not a readable GGUF file: {e}")))?;
        Ok(Self {
            path,
            values: content.metadata,
        })
    }

    fn error_at(path: &Path, message: String) -> TokenizerError {
        TokenizerError::Parse {
            path: path.to_path_buf(),
            message,
        }
    }

    fn error(&self, message: String) -> TokenizerError {
        Self::error_at(self.path, message)
    }

    fn string(&self, key: &str) -> Result<Option<&str>, TokenizerError> {
        match self.values.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.error(format!("{key} is not a string: {other:?}"))),
        }
    }

    fn flag(&self, key: &str) -> Result<Option<bool>, TokenizerError> {
        match self.values.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.error(format!("{key} is not a boolean: {other:?}"))),
        }
    }

    fn integer(&self, key: &str, v: &Value) -> Result<i64, TokenizerError> {
        let n = match v {
            Value::U8(x) => Some(i64::from(*x)),
            Value::I8(x) => Some(i64::from(*x)),
            Value::U16(x) => Some(i64::from(*x)),
            Value::I16(x) => Some(i64::from(*x)),
            Value::U32(x) => Some(i64::from(*x)),
            Value::I32(x) => Some(i64::from(*x)),
            Value::U64(x) => i64::try_from(*x).ok(),
            Value::I64(x) => Some(*x),
            _ => None,
        };
        n.ok_or_else(|| self.error(format!("{key} holds {v:?}, not an integer")))
    }

    fn array(&self, key: &str) -> Result<Option<&[Value]>, TokenizerError> {
        match self.values.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => Ok(Some(items)),
            Some(other) => Err(self.error(format!("{key} is not an array: {other:?}"))),
        }
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<String>>, TokenizerError> {
        let Some(items) = self.array(key)? else {
            return Ok(None);
        };
        items
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(self.error(format!("{key} holds {other:?}, not a string"))),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// The token a `tokenizer.ggml.*_token_id` names, if the file sets one.
    fn token(&self, key: &str, tokens: &[String]) -> Result<Option<String>, TokenizerError> {
        let Some(v) = self.values.get(key) else {
            return Ok(None);
        };
        let id = self.integer(key, v)?;
        usize::try_from(id)
            .ok()
            .and_then(|i| tokens.get(i))
            .cloned()
            .map(Some)
            .ok_or_else(|| {
                self.error(format!(
                    "{key} is {id}, outside the {} tokens",
                    tokens.len()
                ))
            })
    }
}

/// Loads the tokenizer and chat template of the GGUF file `path`.
pub(crate) fn load(path: &Path) -> Result<ChatTokenizer, TokenizerError> {
    let meta = Metadata::read(path)?;
    match meta.string("tokenizer.ggml.model")? {
        Some("gpt2") => {}
        Some(other) => {
            return Err(meta.error(format!(
                "tokenizer.ggml.model `{other}` is not supported (only `gpt2`, a byte-level BPE)"
            )))
        }
        None => return Err(meta.error("no tokenizer.ggml.model in the metadata".into())),
    }
    let tokens = meta
        .strings("tokenizer.ggml.tokens")?
        .ok_or_else(|| meta.error("no tokenizer.ggml.tokens in the metadata".into()))?;
    let merges = meta
        .strings("tokenizer.ggml.merges")?
        .ok_or_else(|| meta.error("no tokenizer.ggml.merges in the metadata".into()))?;
    let token_types: Vec<i64> = match meta.array("tokenizer.ggml.token_type")? {
        Some(items) => items
            .iter()
            .map(|v| meta.integer("tokenizer.ggml.token_type", v))
            .collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    if !token_types.is_empty() && token_types.len() != tokens.len() {
        return Err(meta.error(format!(
            "tokenizer.ggml.token_type has {} entries for {} tokens",
            token_types.len(),
            tokens.len()
        )));
    }

    let spelling = bytes_to_unicode();
    let alphabet: HashSet<char> = spelling.iter().copied().collect();
    let spelled = |t: &str| t.chars().all(|c| alphabet.contains(&c));
    // As a Python dict built in file order: a repeated token keeps its last id.
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(id, t)| {
            let key = if spelled(t) {
                t.clone()
            } else {
                t.bytes().map(|b| spelling[b as usize]).collect()
            };
            (key, id as u32)
        })
        .collect();
    let in_vocab: HashSet<&String> = vocab.keys().collect();
    let user_defined: Vec<AddedToken> = tokens
        .iter()
        .zip(&token_types)
        .filter(|(t, &kind)| kind == USER_DEFINED && in_vocab.contains(t))
        .map(|(t, _)| AddedToken::from(t.clone(), false).normalized(false))
        .collect();
    let merges = merges
        .iter()
        .map(|m| {
            let parts: Vec<&str> = m.split(' ').collect();
            match parts.as_slice() {
                [a, b] => Ok((a.to_string(), b.to_string())),
                _ => Err(meta.error(format!(
                    "tokenizer.ggml.merges entry {m:?} is not two tokens separated by a space"
                ))),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .continuing_subword_prefix(String::new())
        .end_of_word_suffix(String::new())
        .fuse_unk(false)
        .build()
        .map_err(|e| meta.error(format!("byte-level BPE: {e}")))?;

    let mut tokenizer = Tokenizer::new(bpe);
    let pre = meta.string("tokenizer.ggml.pre")?;
    match pre.and_then(pre_tokenizer_split) {
        Some(regex) => {
            let split = Split::new(
                SplitPattern::Regex(regex.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| meta.error(format!("pre-tokenizer of `{pre:?}`: {e}")))?;
            tokenizer.with_pre_tokenizer(Some(Sequence::new(vec![
                PreTokenizerWrapper::Split(split),
                PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)),
            ])));
        }
        None => {
            tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
        }
    }
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));

    let tokens_of = TemplateTokens {
        bos: meta.token("tokenizer.ggml.bos_token_id", &tokens)?,
        eos: meta.token("tokenizer.ggml.eos_token_id", &tokens)?,
        pad: meta.token("tokenizer.ggml.padding_token_id", &tokens)?,
        unk: meta.token("tokenizer.ggml.unknown_token_id", &tokens)?,
    };
    let add_bos = meta.flag("tokenizer.ggml.add_bos_token")?;
    let add_eos = meta.flag("tokenizer.ggml.add_eos_token")?;
    let post = post_processor(
        &tokens_of,
        &tokens,
        add_bos.unwrap_or(false),
        add_eos.unwrap_or(false),
    )
    .map_err(|e| meta.error(format!("post-processor: {e}")))?;
    tokenizer.with_post_processor(Some(post));

    // A control token outside the byte alphabet is a llama.cpp mislabel
    // that transformers skips (adding it would grow the vocabulary).
    let control: Vec<AddedToken> = tokens
        .iter()
        .zip(&token_types)
        .filter(|(t, &kind)| kind == CONTROL && spelled(t))
        .map(|(t, _)| AddedToken::from(t.clone(), true))
        .collect();
    tokenizer.add_special_tokens(&control);
    tokenizer.add_tokens(&user_defined);

    let mut config = Map::new();
    if let Some(b) = add_bos {
        config.insert("add_bos_token".into(), json!(b));
    }
    if let Some(b) = add_eos {
        config.insert("add_eos_token".into(), json!(b));
    }
    let template = meta
        .string("tokenizer.chat_template")?
        .map(ChatTemplate::new)
        .transpose()?;
    ChatTokenizer::assemble(tokenizer, config, template, tokens_of, path)
}

/// transformers' `update_post_processor`: `bos $A eos` as the flags say,
/// for encodings that ask for special tokens (agentrl's never do: the chat
/// template writes them).
fn post_processor(
    specials: &TemplateTokens,
    tokens: &[String],
    add_bos: bool,
    add_eos: bool,
) -> Result<TemplateProcessing, String> {
    let id_of = |t: &str| tokens.iter().rposition(|x| x == t).map(|i| i as u32);
    let bos = specials.bos.as_deref().filter(|_| add_bos);
    let eos = specials.eos.as_deref().filter(|_| add_eos);
    let wrap = |seq: &str, type_id: u8| {
        let mut parts = Vec::new();
        if let Some(b) = bos {
            parts.push(format!("{b}:{type_id}"));
        }
        parts.push(format!("${seq}:{type_id}"));
        if let Some(e) = eos {
            parts.push(format!("{e}:{type_id}"));
        }
        parts.join(" ")
    };
    let single = wrap("A", 0);
    let pair = format!("{single} {}", wrap("B", 1));
    let mut special_tokens: Vec<(String, u32)> = Vec::new();
    for t in bos.into_iter().chain(eos) {
        let id = id_of(t).ok_or_else(|| format!("{t} is not in the vocabulary"))?;
        special_tokens.push((t.to_string(), id));
    }
    TemplateProcessing::builder()
        .try_single(single)
        .map_err(|e| e.to_string())?
        .try_pair(pair)
        .map_err(|e| e.to_string())?
        .special_tokens(special_tokens)
        .build()
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_alphabet_is_gpt2s() {
        let ours: HashSet<char> = bytes_to_unicode().into_iter().collect();
        let theirs: HashSet<char> = ByteLevel::alphabet().into_iter().collect();
        assert_eq!(ours.len(), 256);
        assert_eq!(ours, theirs);
        let map = bytes_to_unicode();
        assert_eq!(map[b' ' as usize], 'Ġ');
        assert_eq!(map[b'\n' as usize], 'Ċ');
        assert_eq!(map[b'a' as usize], 'a');
    }

    #[test]
    fn the_post_processor_adds_bos_and_eos_only_when_asked() {
        let tokens: Vec<String> = ["<s>", "</s>", "a"].map(String::from).to_vec();
        let specials = TemplateTokens {
            bos: Some("<s>".into()),
            eos: Some("</s>".into()),
            pad: None,
            unk: None,
        };
        let plain = post_processor(&specials, &tokens, false, false).unwrap();
        assert_eq!(plain.get_added_single(), 0);
        let both = post_processor(&specials, &tokens, true, true).unwrap();
        assert_eq!(both.get_added_single(), 2);
        assert_eq!(both.get_added_pair(), 4);
    }
}
