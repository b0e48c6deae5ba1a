//! The ChatML tokenizer and its chat template, apart from the model: a Hugging
//! Face `tokenizers` tokenizer loaded from a checkpoint directory or trained
//! as a small byte-level BPE on environment text ([`ChatTokenizer`]), and the
//! Jinja chat template rendered as transformers renders it ([`ChatTemplate`]).

mod chat_template;
mod chat_tokenizer;
mod gguf;
pub mod tools;

pub use chat_template::{
    ChatMessage, ChatTemplate, TemplateError, TemplateTokens, CHATML_TEMPLATE,
};
pub use chat_tokenizer::{
    ChatTokenizer, TokenizerError, ENDOFTEXT, GENERATION_CONFIG_FILE, IM_END, IM_START,
    MAX_TRAINED_VOCAB, MIN_TRAINED_VOCAB, TRAINED_PRE_TOKENIZER,
};

/// Whether `path` names a GGUF file rather than a tokenizer directory: it
/// ends in `.gguf` (even if it does not exist yet, so that a missing file is
/// reported as one), or it is a file starting with GGUF's magic bytes
/// (the same test as `agentrl_model::gguf::is_gguf`).
pub fn is_gguf(path: &std::path::Path) -> bool {
    use std::io::Read;
    if path.is_dir() {
        return false;
    }
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        return true;
    }
    let mut magic = [0u8; 4];
    path.is_file()
        && std::fs::File::open(path)
            .and_then(|mut f| f.read_exact(&mut magic))
            .is_ok()
        && &magic == b"GGUF"
}
