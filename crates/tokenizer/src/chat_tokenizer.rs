//! The ChatML tokenizer: a Hugging Face `tokenizers` tokenizer plus the chat
//! template and special tokens from `tokenizer_config.json`.
//!
//! Two ways in, as for the model: [`ChatTokenizer::load`] reads a Hugging
//! Face directory (Qwen2 / Qwen2.5 checkpoints), and
//! [`ChatTokenizer::train_bpe`] trains a small byte-level BPE on environment
//! text for a tiny model. [`ChatTokenizer::save`] writes the directory back so
//! that transformers' `AutoTokenizer.from_pretrained` loads it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use crate::chat_template::{
    ChatMessage, ChatTemplate, TemplateError, TemplateTokens, CHATML_TEMPLATE,
};

/// `<|endoftext|>`: end of document; Qwen2's padding token.
pub const ENDOFTEXT: &str = "<|endoftext|>";
/// `<|im_start|>`: opens a ChatML message.
pub const IM_START: &str = "<|im_start|>";
/// `<|im_end|>`: closes a ChatML message; the policy's end-of-turn token.
pub const IM_END: &str = "<|im_end|>";

/// Special tokens of a trained tokenizer, in id order (ids 0, 1, 2).
const CHATML_SPECIALS: [&str; 3] = [ENDOFTEXT, IM_START, IM_END];
/// Pre-tokenizer of a trained tokenizer: BPE merges only inside one match.
/// Whole XML-like tags and words may merge; every other character (grid
/// cells such as `_`, `#`, `O`, `P`, digits, punctuation) stays its own
/// token, so a grid row of n cells is n tokens and the cell below another
/// is always the same distance away — a tiny model can learn to look there.
/// (GPT-2's pattern would merge `___` or `####` into tokens whose width
/// depends on the row's contents.)
pub const TRAINED_PRE_TOKENIZER: &str = r"</?[a-z_]+>| ?\p{Lu}\p{Ll}+| ?\p{Ll}+|\s+(?!\S)|\s+|.";

/// transformers' generation defaults, beside the model's `config.json`.
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// Number of symbols in the byte-level alphabet: every byte is one symbol.
const BYTE_ALPHABET: usize = 256;

/// Smallest vocabulary a trained tokenizer can have: the 3 ChatML special
/// tokens and the 256 bytes.
pub const MIN_TRAINED_VOCAB: usize = CHATML_SPECIALS.len() + BYTE_ALPHABET;

/// Largest vocabulary [`ChatTokenizer::train_bpe`] is asked for: 2^20
/// (released vocabularies have at most ~262k tokens). The BPE trainer
/// reserves memory for the target up front, so a target of 10^12 would abort
/// the process instead of failing.
pub const MAX_TRAINED_VOCAB: usize = 1 << 20;

/// Why a tokenizer could not be loaded, trained, saved or used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file is not valid JSON or does not have the expected shape.
    #[error("{}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The tokenizer lacks a token the ChatML layout needs.
    #[error("{}: tokenizer has no {token} token; agentrl needs a ChatML tokenizer (<|im_start|>, <|im_end|>)", path.display())]
    MissingSpecialToken {
        /// The directory or file that was loaded.
        path: PathBuf,
        /// The missing token.
        token: String,
    },
    /// The tokenizer has no chat template.
    #[error("tokenizer has no chat template (tokenizer_config.json has no `chat_template`, and there is no chat_template.jinja)")]
    NoChatTemplate,
    /// The chat template is broken or rejected its input.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// Encoding or decoding failed inside `tokenizers`.
    #[error("tokenizer: {0}")]
    Tokenizers(String),
    /// BPE training was asked for something impossible.
    #[error("BPE training: {0}")]
    Train(String),
}

type Result<T> = std::result::Result<T, TokenizerError>;

/// A ChatML tokenizer with its chat template.
#[derive(Debug, Clone)]
pub struct ChatTokenizer {
    tokenizer: Tokenizer,
    /// `tokenizer_config.json` as read, kept so that `save` writes back the
    /// keys this type does not interpret.
    config: Map<String, Value>,
    /// `generation_config.json` of the directory loaded from (sampling
    /// defaults and all), kept so that `save` writes it back with the ChatML
    /// stop tokens; empty for a trained tokenizer.
    generation: Map<String, Value>,
    template: Option<ChatTemplate>,
    tokens: TemplateTokens,
    im_start: u32,
    im_end: u32,
    endoftext: Option<u32>,
    eos: u32,
}

impl ChatTokenizer {
    /// Load a Hugging Face tokenizer directory: `tokenizer.json` (required),
    /// `tokenizer_config.json` (special tokens, `added_tokens_decoder`,
    /// `chat_template`), else `chat_template.jinja` / `chat_template.json`.
    ///
    /// A GGUF file instead of a directory is read through its
    /// `tokenizer.ggml.*` metadata and `tokenizer.chat_template`, as
    /// transformers' GGUF loader rebuilds them; saving it writes the
    /// directory layout.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        if crate::is_gguf(dir) {
            return crate::gguf::load(dir);
        }
        let tokenizer_path = dir.join("tokenizer.json");
        let bytes = read(&tokenizer_path)?;
        let mut tokenizer = Tokenizer::from_bytes(&bytes).map_err(|e| TokenizerError::Parse {
            path: tokenizer_path.clone(),
            message: e.to_string(),
        })?;

        let config_path = dir.join("tokenizer_config.json");
        let config = if config_path.exists() {
            read_json_object(&config_path)?
        } else {
            Map::new()
        };

        // Tokens declared only in tokenizer_config.json, as transformers adds them.
        if let Some(Value::Object(decl)) = config.get("added_tokens_decoder") {
            let mut declared: BTreeMap<u32, AddedToken> = BTreeMap::new();
            for (id, spec) in decl {
                let id: u32 = id.parse().map_err(|_| TokenizerError::Parse {
                    path: config_path.clone(),
                    message: format!("added_tokens_decoder key {id:?} is not a token id"),
                })?;
                declared.insert(id, added_token_from_json(spec, &config_path)?);
            }
            for (id, token) in declared {
                if tokenizer.token_to_id(&token.content).is_some() {
                    continue;
                }
                let content = token.content.clone();
                if token.special {
                    tokenizer.add_special_tokens(&[token]);
                } else {
                    tokenizer.add_tokens(&[token]);
                }
                let got = tokenizer.token_to_id(&content);
                if got != Some(id) {
                    return Err(TokenizerError::Parse {
                        path: config_path,
                        message: format!(
                            "added token {content:?} is declared with id {id} but tokenizer.json gives it {got:?}"
                        ),
                    });
                }
            }
        }

        let template_source = chat_template_source(dir, &config, &config_path)?;
        let tokens = TemplateTokens {
            bos: special_token(&config, "bos_token", &config_path)?,
            eos: special_token(&config, "eos_token", &config_path)?,
            pad: special_token(&config, "pad_token", &config_path)?,
            unk: special_token(&config, "unk_token", &config_path)?,
        };
        let template = template_source.map(ChatTemplate::new).transpose()?;
        let generation_path = dir.join(GENERATION_CONFIG_FILE);
        let generation = if generation_path.exists() {
            read_json_object(&generation_path)?
        } else {
            Map::new()
        };
        let mut t = Self::assemble(tokenizer, config, template, tokens, dir)?;
        t.generation = generation;
        Ok(t)
    }

    /// Check the ChatML tokens and fix the ids every caller needs.
    pub(crate) fn assemble(
        mut tokenizer: Tokenizer,
        config: Map<String, Value>,
        template: Option<ChatTemplate>,
        tokens: TemplateTokens,
        origin: &Path,
    ) -> Result<Self> {
        // Truncation/padding in tokenizer.json would silently cut or pad
        // every encoding; sequence handling is the rollout's job.
        tokenizer
            .with_truncation(None)
            .map_err(|e| TokenizerError::Tokenizers(e.to_string()))?;
        tokenizer.with_padding(None);
        let need = |token: &str| {
            tokenizer
                .token_to_id(token)
                .ok_or_else(|| TokenizerError::MissingSpecialToken {
                    path: origin.to_path_buf(),
                    token: token.to_string(),
                })
        };
        let im_start = need(IM_START)?;
        let im_end = need(IM_END)?;
        let endoftext = tokenizer.token_to_id(ENDOFTEXT);
        let eos = match &tokens.eos {
            Some(eos) => need(eos)?,
            None => im_end,
        };
        Ok(Self {
            tokenizer,
            config,
            generation: Map::new(),
            template,
            tokens,
            im_start,
            im_end,
            endoftext,
            eos,
        })
    }

    /// Train a byte-level BPE (GPT-2 / Qwen2 style: ByteLevel pre-tokenizer
    /// and decoder, every byte in the alphabet) on `texts`, with the ChatML
    /// special tokens `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` as ids 0,
    /// 1, 2 and the ChatML chat template. The vocabulary holds at most
    /// `vocab_size` tokens (special tokens included; fewer when the text has
    /// no more pairs to merge). Special-token strings inside `texts` are not
    /// learnt from. The same texts give the same tokenizer, byte for byte.
    pub fn train_bpe(texts: &[String], vocab_size: usize) -> Result<Self> {
        if vocab_size < MIN_TRAINED_VOCAB {
            return Err(TokenizerError::Train(format!(
                "vocab_size {vocab_size} is below {MIN_TRAINED_VOCAB} (3 special tokens + 256 bytes)"
            )));
        }
        if vocab_size > MAX_TRAINED_VOCAB {
            return Err(TokenizerError::Train(format!(
                "vocab_size {vocab_size} is above the {MAX_TRAINED_VOCAB} tokens a trained tokenizer may have"
            )));
        }
        let specials: Vec<AddedToken> = CHATML_SPECIALS
            .iter()
            .map(|t| AddedToken::from(*t, true))
            .collect();
        let trainer = BpeTrainer::builder()
            .vocab_size(vocab_size)
            .min_frequency(0)
            .show_progress(false)
            .special_tokens(specials.clone())
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build();

        let mut tokenizer = Tokenizer::new(BPE::default());
        let split = Split::new(
            SplitPattern::Regex(TRAINED_PRE_TOKENIZER.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| TokenizerError::Train(e.to_string()))?;
        // Qwen2's layout: a regex split, then byte-level mapping without
        // GPT-2's own regex.
        tokenizer.with_pre_tokenizer(Some(Sequence::new(vec![
            PreTokenizerWrapper::Split(split),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)),
        ])));
        tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
        tokenizer.add_special_tokens(&specials);
        // `train` would count a special-token string in the text as a word
        // and learn merges such as `<|im`; cut the texts at them instead, so
        // no merge spans or imitates a special token.
        let mut pieces: Vec<&str> = texts
            .iter()
            .flat_map(|t| split_at_specials(t))
            .filter(|p| !p.is_empty())
            .collect();
        // The trainer's statistics are order-independent counts, and its
        // merge queue breaks count ties by pair ids, which follow the sorted
        // byte alphabet: the result does not depend on hash order or
        // threads. Sorting the input anyway keeps any future
        // order-sensitivity out.
        pieces.sort_unstable();
        let mut wrapped = tokenizers::models::TrainerWrapper::from(trainer);
        tokenizer
            .train(&mut wrapped, pieces.into_iter())
            .map_err(|e| TokenizerError::Train(e.to_string()))?;

        let mut config = Map::new();
        config.insert("add_bos_token".into(), json!(false));
        config.insert("add_prefix_space".into(), json!(false));
        config.insert("clean_up_tokenization_spaces".into(), json!(false));
        config.insert("errors".into(), json!("replace"));
        config.insert("model_max_length".into(), json!(32768));
        config.insert("split_special_tokens".into(), json!(false));
        config.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
        let tokens = TemplateTokens {
            bos: None,
            eos: Some(IM_END.to_string()),
            pad: Some(ENDOFTEXT.to_string()),
            unk: None,
        };
        let template = Some(ChatTemplate::new(CHATML_TEMPLATE)?);
        Self::assemble(tokenizer, config, template, tokens, Path::new("<trained>"))
    }

    /// Write `tokenizer.json`, `tokenizer_config.json` (special tokens,
    /// `added_tokens_decoder`, chat template) and `special_tokens_map.json`
    /// into `dir` (created if needed), the layout transformers' `AutoTokenizer`
    /// loads, and `generation_config.json` ([`ChatTokenizer::generation_config`])
    /// so that transformers' `generate` stops where agentrl's does. Each file
    /// is replaced atomically.
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|source| TokenizerError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let tokenizer_path = dir.join("tokenizer.json");
        let text = self
            .tokenizer
            .to_string(true)
            .map_err(|e| TokenizerError::Tokenizers(e.to_string()))?;
        write(&tokenizer_path, text)?;

        let mut config = self.config.clone();
        // Without a class, AutoTokenizer needs the model's config.json to
        // pick one; this class loads tokenizer.json as it is.
        config
            .entry("tokenizer_class")
            .or_insert_with(|| json!("PreTrainedTokenizerFast"));
        let mut decoder = Map::new();
        let mut added: Vec<(u32, AddedToken)> = self
            .tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .collect();
        added.sort_by_key(|(id, _)| *id);
        for (id, t) in &added {
            decoder.insert(
                id.to_string(),
                json!({
                    "content": t.content,
                    "lstrip": t.lstrip,
                    "normalized": t.normalized,
                    "rstrip": t.rstrip,
                    "single_word": t.single_word,
                    "special": t.special,
                }),
            );
        }
        config.insert("added_tokens_decoder".into(), Value::Object(decoder));
        let opt = |t: &Option<String>| t.as_ref().map_or(Value::Null, |s| json!(s));
        config.insert("bos_token".into(), opt(&self.tokens.bos));
        config.insert("eos_token".into(), opt(&self.tokens.eos));
        config.insert("pad_token".into(), opt(&self.tokens.pad));
        config.insert("unk_token".into(), opt(&self.tokens.unk));
        match &self.template {
            Some(t) => config.insert("chat_template".into(), json!(t.source())),
            None => config.remove("chat_template"),
        };
        write_json(&dir.join("tokenizer_config.json"), &Value::Object(config))?;

        let mut map = Map::new();
        for (key, value) in [
            ("bos_token", &self.tokens.bos),
            ("eos_token", &self.tokens.eos),
            ("pad_token", &self.tokens.pad),
            ("unk_token", &self.tokens.unk),
        ] {
            if let Some(v) = value {
                map.insert(key.into(), json!(v));
            }
        }
        let additional: Vec<&str> = added
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(_, t)| t.content.as_str())
            .collect();
        map.insert("additional_special_tokens".into(), json!(additional));
        write_json(&dir.join("special_tokens_map.json"), &Value::Object(map))?;
        write_json(
            &dir.join(GENERATION_CONFIG_FILE),
            &Value::Object(self.generation_config()),
        )
    }

    /// transformers' `GenerationConfig` for a model using this tokenizer, as
    /// Qwen2.5 writes it: `eos_token_id` lists the tokens that end a reply
    /// ([`ChatTokenizer::stop_ids`]: `<|im_end|>` first, then
    /// `<|endoftext|>`), `bos_token_id` is the configured bos token (else
    /// `<|endoftext|>`), `pad_token_id` the pad token. The loaded directory's
    /// own `generation_config.json` is kept (sampling defaults, other stop
    /// tokens after ours); without `<|im_end|>` in `eos_token_id`,
    /// transformers' `generate` runs past the end of the turn.
    pub fn generation_config(&self) -> Map<String, Value> {
        let mut g = self.generation.clone();
        // The file no longer mirrors config.json: transformers must not
        // rebuild it from there.
        g.remove("_from_model_config");
        let mut eos = self.stop_ids();
        let theirs = match g.get("eos_token_id") {
            Some(Value::Array(ids)) => ids.iter().filter_map(Value::as_u64).collect(),
            Some(v) => v.as_u64().into_iter().collect(),
            None => Vec::new(),
        };
        for id in theirs {
            if let Ok(id) = u32::try_from(id) {
                if !eos.contains(&id) {
                    eos.push(id);
                }
            }
        }
        g.insert("eos_token_id".into(), json!(eos));
        let bos = self
            .tokens
            .bos
            .as_deref()
            .and_then(|t| self.token_id(t))
            .or(self.endoftext);
        if let Some(bos) = bos {
            if g.get("bos_token_id").is_none_or(Value::is_null) {
                g.insert("bos_token_id".into(), json!(bos));
            }
        }
        if g.get("pad_token_id").is_none_or(Value::is_null) {
            g.insert("pad_token_id".into(), json!(self.pad_id()));
        }
        g
    }

    /// Token ids of `text`, adding no special tokens; special-token strings
    /// inside the text (`<|im_start|>`, …) map to their ids, as in
    /// transformers.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| TokenizerError::Tokenizers(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Text of `ids`; `skip_special` drops special tokens (`<|im_end|>`, …).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.tokenizer
            .decode(ids, skip_special)
            .map_err(|e| TokenizerError::Tokenizers(e.to_string()))
    }

    /// Render `messages` with the chat template (as transformers'
    /// `apply_chat_template(…, tokenize=False)`).
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let template = self
            .template
            .as_ref()
            .ok_or(TokenizerError::NoChatTemplate)?;
        Ok(template.render(messages, add_generation_prompt, &self.tokens)?)
    }

    /// Render JSON `messages` (OpenAI's shape: `tool_calls`, `tool_call_id`)
    /// with `tools` through the chat template, as transformers'
    /// `apply_chat_template(messages, tools=tools, tokenize=False)` does
    /// (an assistant call's `arguments` string parsed first, as vLLM does).
    /// A template that does not read `tools` gets them in the messages
    /// instead ([`crate::tools::hermes_messages`]).
    pub fn render_chat_with_tools(
        &self,
        messages: &[Value],
        tools: Option<&[Value]>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let template = self
            .template
            .as_ref()
            .ok_or(TokenizerError::NoChatTemplate)?;
        // Both ways write a call's arguments as the JSON value they hold,
        // not as a string of JSON (OpenAI's wire form).
        let messages = crate::tools::template_messages(messages);
        if template.reads_tools() {
            return Ok(template.render_with_tools(
                &messages,
                tools,
                add_generation_prompt,
                &self.tokens,
            )?);
        }
        // A template that knows nothing of tools gets them, the calls and
        // their results written into the messages as Qwen2.5 writes them.
        let messages = crate::tools::hermes_messages(&messages, tools.unwrap_or_default());
        Ok(template.render_with_tools(&messages, None, add_generation_prompt, &self.tokens)?)
    }

    /// Whether the chat template renders `tools` itself (else a caller
    /// that has tools must describe them in a message).
    pub fn template_reads_tools(&self) -> bool {
        self.template
            .as_ref()
            .is_some_and(ChatTemplate::reads_tools)
    }

    /// Render `messages` with the chat template and encode the text.
    pub fn encode_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>> {
        self.encode(&self.render_chat(messages, add_generation_prompt)?)
    }

    /// The id of a token string (vocabulary or added token).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// The token string of an id.
    pub fn token(&self, id: u32) -> Option<String> {
        self.tokenizer.id_to_token(id)
    }

    /// Number of tokens, added tokens included (the model's embedding table
    /// may be larger).
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// Id of `<|im_start|>`.
    pub fn im_start_id(&self) -> u32 {
        self.im_start
    }

    /// Id of `<|im_end|>`, the end-of-turn token.
    pub fn im_end_id(&self) -> u32 {
        self.im_end
    }

    /// Id of `<|endoftext|>`, if the vocabulary has it.
    pub fn endoftext_id(&self) -> Option<u32> {
        self.endoftext
    }

    /// Id of the configured `eos_token` (`<|im_end|>` when none is set).
    pub fn eos_id(&self) -> u32 {
        self.eos
    }

    /// Id of the configured `pad_token`, else `<|endoftext|>`, else eos.
    pub fn pad_id(&self) -> u32 {
        self.tokens
            .pad
            .as_deref()
            .and_then(|t| self.token_id(t))
            .or(self.endoftext)
            .unwrap_or(self.eos)
    }

    /// Tokens that end generation: `<|im_end|>`, `<|endoftext|>` and eos,
    /// without repeats.
    pub fn stop_ids(&self) -> Vec<u32> {
        let mut ids = vec![self.im_end];
        for id in self.endoftext.into_iter().chain([self.eos]) {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids
    }

    /// The chat template source, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.template.as_ref().map(ChatTemplate::source)
    }

    /// Replace the chat template (compiled now, so a broken one fails here).
    pub fn set_chat_template(&mut self, source: impl Into<String>) -> Result<()> {
        self.template = Some(ChatTemplate::new(source)?);
        Ok(())
    }

    /// The special-token strings the template sees.
    pub fn template_tokens(&self) -> &TemplateTokens {
        &self.tokens
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &Tokenizer {
        &self.tokenizer
    }
}

/// `text` cut at every ChatML special-token string (which are dropped).
fn split_at_specials(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    loop {
        let next = CHATML_SPECIALS
            .iter()
            .filter_map(|s| rest.find(s).map(|at| (at, s.len())))
            .min();
        match next {
            Some((at, len)) => {
                out.push(&rest[..at]);
                rest = &rest[at + len..];
            }
            None => {
                out.push(rest);
                return out;
            }
        }
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| TokenizerError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Atomically: a kill mid-save leaves the previous file whole.
fn write(path: &Path, text: String) -> Result<()> {
    agentrl_durable::write(path, text).map_err(|source| TokenizerError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn write_json(path: &Path, value: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|e| TokenizerError::Parse {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    write(path, text + "\n")
}

fn read_json_object(path: &Path) -> Result<Map<String, Value>> {
    let bytes = read(path)?;
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(TokenizerError::Parse {
            path: path.to_path_buf(),
            message: "expected a JSON object".into(),
        }),
        Err(e) => Err(TokenizerError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        }),
    }
}

/// A special token given as a string, as `{"content": …}` (transformers'
/// serialised AddedToken), or null.
fn special_token(config: &Map<String, Value>, key: &str, path: &Path) -> Result<Option<String>> {
    match config.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(o)) => match o.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(TokenizerError::Parse {
                path: path.to_path_buf(),
                message: format!("{key} has no string `content`"),
            }),
        },
        Some(other) => Err(TokenizerError::Parse {
            path: path.to_path_buf(),
            message: format!("{key} must be a string or null, found {other}"),
        }),
    }
}

fn added_token_from_json(spec: &Value, path: &Path) -> Result<AddedToken> {
    let content =
        spec.get("content")
            .and_then(Value::as_str)
            .ok_or_else(|| TokenizerError::Parse {
                path: path.to_path_buf(),
                message: format!("added_tokens_decoder entry without `content`: {spec}"),
            })?;
    let flag = |k: &str, default: bool| spec.get(k).and_then(Value::as_bool).unwrap_or(default);
    let special = flag("special", false);
    Ok(AddedToken::from(content, special)
        .single_word(flag("single_word", false))
        .lstrip(flag("lstrip", false))
        .rstrip(flag("rstrip", false))
        .normalized(flag("normalized", !special)))
}

/// The chat template: `tokenizer_config.json`'s `chat_template` (a string, or
/// a list of named templates of which `default` is taken), else
/// `chat_template.jinja`, else `chat_template.json`.
fn chat_template_source(
    dir: &Path,
    config: &Map<String, Value>,
    config_path: &Path,
) -> Result<Option<String>> {
    match config.get("chat_template") {
        Some(Value::String(s)) => return Ok(Some(s.clone())),
        Some(Value::Array(named)) => {
            let pick = named
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .or_else(|| named.first());
            return match pick.and_then(|t| t.get("template")).and_then(Value::as_str) {
                Some(s) => Ok(Some(s.to_string())),
                None => Err(TokenizerError::Parse {
                    path: config_path.to_path_buf(),
                    message: "chat_template list has no template".into(),
                }),
            };
        }
        Some(Value::Null) | None => {}
        Some(other) => {
            return Err(TokenizerError::Parse {
                path: config_path.to_path_buf(),
                message: format!("chat_template must be a string, found {other}"),
            })
        }
    }
    let jinja = dir.join("chat_template.jinja");
    if jinja.exists() {
        let bytes = read(&jinja)?;
        return String::from_utf8(bytes)
            .map(Some)
            .map_err(|e| TokenizerError::Parse {
                path: jinja,
                message: e.to_string(),
            });
    }
    let json_path = dir.join("chat_template.json");
    if json_path.exists() {
        let map = read_json_object(&json_path)?;
        return match map.get("chat_template") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(TokenizerError::Parse {
                path: json_path,
                message: "no string `chat_template`".into(),
            }),
        };
    }
    Ok(None)
}
