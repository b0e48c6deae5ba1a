//! Turning chat messages into token ids, one message at a time.
//!
//! The rollout builds each trajectory's token sequence incrementally in the
//! ChatML layout used by Qwen2 (`<|im_start|>role\ncontent<|im_end|>\n`), so
//! that the loss mask is exact: the policy's own tokens are known by
//! construction, never recovered by re-tokenising a rendered chat.

use agentrl_tokenizer::ChatTokenizer;

/// A tokenizer failed to encode or decode. A rollout stops on it rather than
/// playing on with empty tokens.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// Encoding text failed.
    #[error("the tokenizer cannot encode {text:?}: {reason}")]
    Encode {
        /// The text (cut to its first 80 characters).
        text: String,
        /// The tokenizer's complaint.
        reason: String,
    },
    /// Decoding ids failed.
    #[error("the tokenizer cannot decode {count} ids: {reason}")]
    Decode {
        /// How many ids were given.
        count: usize,
        /// The tokenizer's complaint.
        reason: String,
    },
}

impl CodecError {
    /// An encode failure for `text`, keeping a short prefix of it for the message.
    pub fn encode(text: &str, reason: impl ToString) -> Self {
        Self::Encode {
            text: text.chars().take(80).collect(),
            reason: reason.to_string(),
        }
    }
}

/// What the rollout needs from a tokenizer.
pub trait ChatCodec {
    /// Encode plain text (no special tokens added).
    fn encode(&self, text: &str) -> Result<Vec<u32>, CodecError>;
    /// Decode ids to text, dropping special tokens.
    fn decode(&self, ids: &[u32]) -> Result<String, CodecError>;
    /// `<|im_start|>`
    fn im_start(&self) -> u32;
    /// `<|im_end|>`: the policy's end-of-turn token.
    fn im_end(&self) -> u32;

    /// Tokens of a whole ChatML message, including the trailing newline.
    fn message(&self, role: &str, content: &str) -> Result<Vec<u32>, CodecError> {
        let mut ids = self.assistant_header_for(role)?;
        ids.extend(self.encode(content)?);
        ids.push(self.im_end());
        ids.extend(self.encode("\n")?);
        Ok(ids)
    }

    /// `<|im_start|>role\n`: the header that opens a message.
    fn assistant_header_for(&self, role: &str) -> Result<Vec<u32>, CodecError> {
        let mut ids = vec![self.im_start()];
        ids.extend(self.encode(&format!("{role}\n"))?);
        Ok(ids)
    }
}

impl ChatCodec for ChatTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, CodecError> {
        ChatTokenizer::encode(self, text).map_err(|e| CodecError::encode(text, e))
    }
    fn decode(&self, ids: &[u32]) -> Result<String, CodecError> {
        ChatTokenizer::decode(self, ids, true).map_err(|e| CodecError::Decode {
            count: ids.len(),
            reason: e.to_string(),
        })
    }
    fn im_start(&self) -> u32 {
        self.im_start_id()
    }
    fn im_end(&self) -> u32 {
        self.im_end_id()
    }
}
