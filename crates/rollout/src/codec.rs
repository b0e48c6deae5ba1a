//! Turning chat messages into token ids, one message at a time.
//!
//! The rollout builds each trajectory's token sequence incrementally in the
//! ChatML layout used by Qwen2 (`<|im_start|>role\ncontent<|im_end|>\n`), so
//! that the loss mask is exact: the policy's own tokens are known by
//! construction, never recovered by re-tokenising a rendered chat.

/// What the rollout needs from a tokenizer.
pub trait ChatCodec {
    /// Encode plain text (no special tokens added).
    fn encode(&self, text: &str) -> Vec<u32>;
    /// Decode ids to text, dropping special tokens.
    fn decode(&self, ids: &[u32]) -> String;
    /// `<|im_start|>`
    fn im_start(&self) -> u32;
    /// `<|im_end|>`: the policy's end-of-turn token.
    fn im_end(&self) -> u32;

    /// Tokens of a whole ChatML message, including the trailing newline.
    fn message(&self, role: &str, content: &str) -> Vec<u32> {
        let mut ids = self.assistant_header_for(role);
        ids.extend(self.encode(content));
        ids.push(self.im_end());
        ids.extend(self.encode("\n"));
        ids
    }

    /// `<|im_start|>role\n`: the header that opens a message.
    fn assistant_header_for(&self, role: &str) -> Vec<u32> {
        let mut ids = vec![self.im_start()];
        ids.extend(self.encode(&format!("{role}\n")));
        ids
    }
}

impl ChatCodec for agentrl_model::tokenizer::ChatTokenizer {
    fn encode(&self, text: &str) -> Vec<u32> {
        agentrl_model::tokenizer::ChatTokenizer::encode(self, text).unwrap_or_default()
    }
    fn decode(&self, ids: &[u32]) -> String {
        agentrl_model::tokenizer::ChatTokenizer::decode(self, ids, true).unwrap_or_default()
    }
    fn im_start(&self) -> u32 {
        self.im_start_id()
    }
    fn im_end(&self) -> u32 {
        self.im_end_id()
    }
}
