use agentrl_kernel_emulator::kernels::*;
use agentrl_kernel_emulator::{bf16, launch, Grid, Shared};

use crate::*;

/// `y + b` on every row and the column sums of `g`, `[rows, cols]`, in
/// f64.
fn reference(y: &[f64], b: &[f64], g: &[f64], cols: usize) -> (Vec<f64>, Vec<f64>) {
    let out = y.iter().enumerate().map(|(i, v)| v + b[i % cols]).collect();
    let mut sums = vec![0.0; cols];
    for (i, v) in g.iter().enumerate() {
        sums[i % cols] += v;
    }
    (out, sums)
}

#[test]
fn bias_add_and_column_sums_in_bf16_sum_in_f32() {
    // 150 rows in chunks of 64 (the last one short), 300 columns over two
    // blocks of 256 threads (the second mostly idle).
    let (rows, cols, per) = (150usize, 300usize, 64usize);
    let chunks = rows.div_ceil(per);
    let (mut y, mut b, mut g) = (
        to_bf16(&random(rows * cols, 2.0, 1)),
        to_bf16(&random(cols, 2.0, 2)),
        to_bf16(&random(rows * cols, 2.0, 3)),
    );
    let nan = bf16::from_f32(f32::NAN);
    let (mut out, mut sums) = (vec![nan; rows * cols], vec![nan; cols]);
    let mut partial = vec![f32::NAN; chunks * cols];
    let (yp, bp, gp, op) = (
        Shared::of(&mut y),
        Shared::of(&mut b),
        Shared::of(&mut g),
        Shared::of(&mut out),
    );
    let (pp, sp) = (Shared::of(&mut partial), Shared::of(&mut sums));
    let (r32, c32, per32, chunks32) = (rows as i32, cols as i32, per as i32, chunks as i32);
    // SAFETY: y, g and out hold rows·cols values, b and sums cols, partial
    // chunks·cols.
    unsafe {
        // Fewer threads than elements: the grid-stride loop covers the rest.
        launch(Grid::linear(7, 256), || {
            bias_add_bf16(
                yp.ptr(),
                bp.ptr(),
                op.ptr(),
                (rows * cols) as u64,
                cols as u32,
            )
        })
        .unwrap();
        let partial_grid = Grid {
            grid: [chunks as u32, cols.div_ceil(256) as u32, 1],
            block: [256, 1, 1],
        };
        launch(partial_grid, || {
            column_sums_partial_bf16(gp.ptr(), pp.ptr(), r32, c32, per32)
        })
        .unwrap();
        launch(Grid::linear(cols.div_ceil(256) as u32, 256), || {
            column_sums_finish_bf16(pp.ptr(), sp.ptr(), chunks32, c32)
        })
        .unwrap();
    }
    let (want_out, want_sums) = reference(&bf16_f64(&y), &bf16_f64(&b), &bf16_f64(&g), cols);
    // Each value rounded once to bf16 (2⁻⁹ relative): the sums of 150 terms
    // were never rounded on the way.
    assert_close("bias add", &bf16_f64(&out), &want_out, 4e-3);
    assert_close("column sums", &bf16_f64(&sums), &want_sums, 4e-3);
}
