//! The bound on observations that go through `calc_heading_quat_inv`,
//! shared by the crate's unit tests and the parity tests.
//!
//! The heading quaternion is `(0, 0, sin(t), cos(t))`, `t = -atan2(y, x) / 2`,
//! normalized. This crate takes `atan2`, `sin` and `cos` from the platform's
//! libm (correctly rounded or nearly); torch takes them from its vectorized
//! kernels (SLEEF `*_u10`: within 1 ulp), so for some anchors the two
//! headings differ by an ulp of the angle or of a component: a rotation
//! about z by at most a few 1e-7 rad. Every observation component that is
//! rotated by the heading then differs from torch's by at most that angle
//! times the length of the vector it belongs to (plus the rounding of the
//! rotation itself). The observations are laid out in 3-vectors (positions,
//! velocities, the two axes of a tangent/normal pair) after `offset` leading
//! scalars (the max-coords height), so the bound is checked per 3-vector:
//! `|ours - torch| <= HEADING_TOL * (1 + |torch's vector|)`.
//! Measured on the recordings: at most 3.3e-7 (random anchors; the exported
//! pipeline's special anchors agree to the bit).

/// The tolerance per unit of vector length.
pub const HEADING_TOL: f64 = 1e-6;

/// The largest `|ours - theirs| / (1 + |theirs' vector|)` over the rows of
/// `width` floats, vectors of 3 after `offset` scalars (compared as
/// `|a - b| / (1 + |b|)`).
pub fn heading_error(ours: &[f32], theirs: &[f32], width: usize, offset: usize) -> f64 {
    assert_eq!(ours.len(), theirs.len());
    let mut most = 0f64;
    for (a, b) in ours.chunks(width).zip(theirs.chunks(width)) {
        let (a_head, a_rest) = a.split_at(offset);
        let (b_head, b_rest) = b.split_at(offset);
        for (x, y) in a_head.iter().zip(b_head) {
            most = most.max((f64::from(*x) - f64::from(*y)).abs() / (1.0 + f64::from(y.abs())));
        }
        for (u, v) in a_rest.chunks(3).zip(b_rest.chunks(3)) {
            let len = v.iter().map(|y| f64::from(*y).powi(2)).sum::<f64>().sqrt();
            for (x, y) in u.iter().zip(v) {
                most = most.max((f64::from(*x) - f64::from(*y)).abs() / (1.0 + len));
            }
        }
    }
    most
}
