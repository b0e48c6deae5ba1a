//! `kv_cache.cu`: a step's rows land at the device-held position only.

use agentrl_kernel_emulator::kernels::*;
use agentrl_kernel_emulator::{launch, Grid, Shared};

use crate::*;

#[test]
fn kv_write_puts_each_row_at_the_slot_and_nothing_else() {
    let (rows, cap, hd) = (6usize, 40usize, 64usize);
    let before = random(rows * cap * hd, 1.0, 61);
    let mut fresh = random(rows * hd, 1.0, 62);
    for slot in [0u32, 17, 39, 40] {
        let mut cache = before.clone();
        let mut at = vec![slot];
        let (cp, fp, sp) = (
            Shared::of(&mut cache),
            Shared::of(&mut fresh),
            Shared::of(&mut at),
        );
        // SAFETY: cache holds rows × cap × hd values, fresh rows × hd, slot one.
        unsafe {
            launch(Grid::linear(2, 128), || {
                kv_write_f32(
                    cp.ptr(),
                    fp.ptr(),
                    sp.ptr(),
                    rows as u64,
                    cap as u32,
                    hd as u32,
                )
            })
        }
        .unwrap();
        for r in 0..rows {
            for p in 0..cap {
                let got = &cache[(r * cap + p) * hd..][..hd];
                let want = if p == slot as usize {
                    &fresh[r * hd..][..hd]
                } else {
                    &before[(r * cap + p) * hd..][..hd]
                };
                assert_eq!(got, want, "slot {slot}, row {r}, position {p}");
            }
        }
    }
}
