//! The ChatML tokenizer and its chat template, apart from the model: a Hugging
//! Face `tokenizers` tokenizer loaded from a checkpoint directory or trained
//! as a small byte-level BPE on environment text ([`ChatTokenizer`]), and the
//! Jinja chat template rendered as transformers renders it ([`ChatTemplate`]).

mod chat_template;
mod chat_tokenizer;

pub use chat_template::{
    ChatMessage, ChatTemplate, TemplateError, TemplateTokens, CHATML_TEMPLATE,
};
pub use chat_tokenizer::{
    ChatTokenizer, TokenizerError, ENDOFTEXT, GENERATION_CONFIG_FILE, IM_END, IM_START,
    MAX_TRAINED_VOCAB, MIN_TRAINED_VOCAB, TRAINED_PRE_TOKENIZER,
};
