//! Per-token training targets for a batch of trajectories, aligned with the
//! model's next-token log-probs: position `t` of a row scores token `t + 1`.

use candle_core::{Device, Tensor};

/// Right-pad ragged rows into a `[rows, width]` f32 tensor.
pub fn padded(rows: &[Vec<f32>], width: usize, device: &Device) -> candle_core::Result<Tensor> {
    let mut flat = vec![0f32; rows.len() * width];
    for (r, row) in rows.iter().enumerate() {
        let n = row.len().min(width);
        flat[r * width..r * width + n].copy_from_slice(&row[..n]);
    }
    Tensor::from_vec(flat, (rows.len(), width), device)
}

/// Drop the first element of a per-token row so it lines up with next-token
/// log-probs (the first token is never predicted).
pub fn shift(row: &[f32]) -> Vec<f32> {
    row.iter().skip(1).copied().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_fills_with_zeros() {
        let t = padded(&[vec![1.0, 2.0], vec![3.0]], 3, &Device::Cpu).unwrap();
        assert_eq!(
            t.to_vec2::<f32>().unwrap(),
            vec![vec![1.0, 2.0, 0.0], vec![3.0, 0.0, 0.0]]
        );
    }

    #[test]
    fn shift_aligns_with_next_token() {
        assert_eq!(shift(&[0.0, 1.0, 1.0]), vec![1.0, 1.0]);
    }
}
