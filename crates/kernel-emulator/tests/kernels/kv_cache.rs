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

#[test]
fn kv_copy_rows_moves_each_run_of_every_head_and_nothing_else() {
    let (kv, hd) = (2usize, 64usize);
    let (src_rows, src_cap, dst_rows, dst_cap) = (3usize, 50usize, 4usize, 70usize);
    let mut src = random(src_rows * kv * src_cap * hd, 1.0, 63);
    let before = random(dst_rows * kv * dst_cap * hd, 1.0, 64);
    // (dst_row, dst_slot, src_row, src_slot, len): runs of different
    // lengths (one past the grid's 3 × 256 threads: grid-strided), one of a
    // single position, one ending at the destination's last slot.
    let copies: [[u32; 5]; 4] = [
        [0, 3, 2, 0, 41],
        [2, 60, 0, 7, 10],
        [3, 0, 1, 49, 1],
        [1, 10, 0, 0, 5],
    ];
    let mut table: Vec<u32> = copies.iter().flatten().copied().collect();
    let mut dst = before.clone();
    let (dp, sp, tp) = (
        Shared::of(&mut dst),
        Shared::of(&mut src),
        Shared::of(&mut table),
    );
    let grid = Grid {
        grid: [3, copies.len() as u32, 1],
        block: [256, 1, 1],
    };
    // SAFETY: dst and src hold rows × kv × cap × hd values each, the table
    // 5 per copy, and every run lies inside both caches.
    unsafe {
        launch(grid, || {
            kv_copy_rows_f32(
                dp.ptr(),
                sp.ptr(),
                tp.ptr(),
                kv as u32,
                dst_cap as u32,
                src_cap as u32,
                hd as u32,
            )
        })
    }
    .unwrap();
    let at = |row: usize, h: usize, slot: usize, cap: usize| ((row * kv + h) * cap + slot) * hd;
    for r in 0..dst_rows {
        for h in 0..kv {
            for p in 0..dst_cap {
                let from = copies.iter().find_map(|&[dr, ds, sr, ss, len]| {
                    let (dr, ds, sr, ss, len) = (
                        dr as usize,
                        ds as usize,
                        sr as usize,
                        ss as usize,
                        len as usize,
                    );
                    (dr == r && (ds..ds + len).contains(&p))
                        .then(|| at(sr, h, ss + p - ds, src_cap))
                });
                let want = match from {
                    Some(i) => &src[i..][..hd],
                    None => &before[at(r, h, p, dst_cap)..][..hd],
                };
                assert_eq!(
                    &dst[at(r, h, p, dst_cap)..][..hd],
                    want,
                    "row {r}, head {h}, slot {p}"
                );
            }
        }
    }
}
