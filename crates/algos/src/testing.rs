//! Helpers shared by this crate's unit tests.

/// Every entry of `a` is within `tol` of the same entry of `b`.
pub(crate) fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= tol, "{a:?} vs {b:?}");
    }
}

/// [`close`], row by row.
pub(crate) fn close_rows(a: &[Vec<f32>], b: &[Vec<f32>], tol: f32) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (ra, rb) in a.iter().zip(b) {
        close(ra, rb, tol);
    }
}
