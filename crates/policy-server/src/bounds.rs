//! A prompt's text measured before it is tokenized: a tokenizer allocates
//! in proportion to its input (about 190 bytes per byte of text for a
//! byte-level BPE, offsets and alignments included), so a 7 MB prompt that
//! cannot fit any context would otherwise cost more than a gigabyte to refuse.
//!
//! Two bounds, both before the whole text is encoded:
//! 1. bytes: a token covers at most [`ModelLimits::max_token_bytes`] bytes of
//!    text, so a text longer than `max_model_len × max_token_bytes` bytes
//!    has more tokens than the context holds — refused unread;
//! 2. tokens, counted piece by piece: a longer text is encoded in pieces of
//!    [`PIECE_BYTES`] (memory in proportion to a piece), cut before a space
//!    that follows a non-space, where byte-level BPE pre-tokenizers (GPT-2's,
//!    Qwen2's) split anyway; once the count passes the context, it is refused.
//!
//! Only a text that fits both is encoded whole.

use agentrl_tokenizer::ChatTokenizer;

use crate::error::ApiError;
use crate::plan::ModelLimits;

/// Bytes of text encoded at once when a long text is counted.
pub const PIECE_BYTES: usize = 64 << 10;

/// The longest text, in bytes, any of the tokenizer's tokens stands for
/// (special tokens spelled out); at least 1.
pub fn max_token_bytes(tokenizer: &ChatTokenizer) -> usize {
    let vocab = tokenizer.vocab_size() as u32;
    (0..vocab)
        .filter_map(|id| tokenizer.decode(&[id], false).ok())
        .map(|t| t.len())
        .max()
        .unwrap_or(1)
        .max(1)
}

/// `text` (the request field `field`) as token ids, refused without being
/// encoded whole when it cannot fit the context (see the module doc).
pub fn encode_bounded(
    tokenizer: &ChatTokenizer,
    text: &str,
    field: &str,
    limits: &ModelLimits,
) -> Result<Vec<u32>, ApiError> {
    let context = limits.max_model_len;
    let most_bytes = context.saturating_mul(limits.max_token_bytes.max(1));
    if text.len() > most_bytes {
        return Err(ApiError::invalid(
            field,
            format!(
                "the prompt has {} bytes: more than the {context} tokens of the model's context \
                 can hold ({most_bytes} bytes at most, {} bytes per token at most)",
                text.len(),
                limits.max_token_bytes
            ),
        ));
    }
    if text.len() > PIECE_BYTES {
        let mut counted = 0usize;
        let mut rest = text;
        let mut pieces = 0usize;
        while !rest.is_empty() {
            let cut = piece_end(rest, PIECE_BYTES);
            counted += tokenizer
                .encode(&rest[..cut])
                .map_err(|e| ApiError::invalid(field, format!("cannot tokenize: {e}")))?
                .len();
            pieces += 1;
            rest = &rest[cut..];
            // A cut elsewhere than before a space may move a token or two
            // across it: allow one per piece before refusing.
            if counted > context + pieces {
                return Err(ApiError::invalid(
                    field,
                    format!(
                        "the prompt has more than {} tokens (counted in its first {} bytes): \
                         it leaves no room in the model's context of {context} tokens",
                        counted - pieces,
                        text.len() - rest.len()
                    ),
                ));
            }
        }
    }
    tokenizer
        .encode(text)
        .map_err(|e| ApiError::invalid(field, format!("cannot tokenize: {e}")))
}

/// Where the piece of `text` starting at 0 ends: at most `max` bytes (the
/// whole text if shorter), before a space that follows a non-space in its
/// last quarter when there is one, else at the last char boundary.
fn piece_end(text: &str, max: usize) -> usize {
    if text.len() <= max {
        return text.len();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    if end == 0 {
        // `max` is shorter than the first character: take the character.
        return text.chars().next().map_or(text.len(), char::len_utf8);
    }
    let bytes = text.as_bytes();
    let floor = end - end / 4;
    (floor.max(1)..end)
        .rev()
        .find(|&i| bytes[i] == b' ' && !bytes[i - 1].is_ascii_whitespace())
        .unwrap_or(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_end_before_a_space_or_at_a_char_boundary() {
        let text = "ab cd ef";
        assert_eq!(piece_end(text, 100), text.len());
        // "ab cd" then " ef": the cut is before the space.
        assert_eq!(piece_end(text, 6), 5);
        // No space in reach: the last char boundary.
        let text = "ééééé";
        assert_eq!(piece_end(text, 5), 4);
        assert!(text.is_char_boundary(piece_end(text, 5)));
    }
}
