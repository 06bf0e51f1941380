//! Quaternion functions of ProtoMotions' `protomotions/utils/rotations.py`,
//! for xyzw quaternions (`w_last=True`, what every published config uses),
//! in float32 with the reference's formulas and order of operations, so
//! that results match torch to the last bit wherever torch's kernels do
//! plain IEEE arithmetic (see `docs/deploy.md` for where they do not:
//! `atan2`, `sin`, `cos` and the norm).
//!
//! Written on `[f32; 4]` / `[f32; 3]` rather than candle tensors: one
//! control step touches a few dozen quaternions, where a tensor op's
//! dispatch and allocation would cost more than the arithmetic, and the
//! step must not allocate.

/// A quaternion, `[x, y, z, w]`.
pub type Quat = [f32; 4];
/// A 3-vector.
pub type Vec3 = [f32; 3];

/// `torch.cross(a, b)` for 3-vectors.
#[inline]
pub fn cross(a: Vec3, b: Vec3) -> Vec3 {
    [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]]
}

/// The dot product as `torch.bmm` of a `[1, 3]` by a `[3, 1]` computes it:
/// left to right.
#[inline]
pub fn dot3(a: Vec3, b: Vec3) -> f32 {
    a[0] * b[0] + a[1] * b[1] + a[2] * b[2]
}

/// `quat_mul(a, b)`: the reference's 8-multiply Hamilton product, as written.
pub fn quat_mul(a: Quat, b: Quat) -> Quat {
    let [x1, y1, z1, w1] = a;
    let [x2, y2, z2, w2] = b;
    let ww = (z1 + x1) * (x2 + y2);
    let yy = (w1 - y1) * (w2 + z2);
    let zz = (w1 + y1) * (w2 - z2);
    let xx = ww + yy + zz;
    let qq = 0.5 * (xx + (z1 - x1) * (x2 - y2));
    let w = qq - ww + (z1 - y1) * (y2 - z2);
    let x = qq - xx + (x1 + w1) * (x2 + w2);
    let y = qq - yy + (w1 - x1) * (y2 + z2);
    let z = qq - zz + (z1 + y1) * (w2 - x2);
    [x, y, z, w]
}

/// `quat_conjugate(q)`: the vector part negated.
#[inline]
pub fn quat_conjugate(q: Quat) -> Quat {
    [-q[0], -q[1], -q[2], q[3]]
}

/// The three terms `quat_rotate` and `quat_rotate_inverse` share:
/// `v * (2 w^2 - 1)`, `cross(u, v) * w * 2`, `u * dot(u, v) * 2`.
#[inline]
fn rotate_terms(q: Quat, v: Vec3) -> (Vec3, Vec3, Vec3) {
    let u = [q[0], q[1], q[2]];
    let w = q[3];
    let s = 2.0 * (w * w) - 1.0;
    let a = [v[0] * s, v[1] * s, v[2] * s];
    let c = cross(u, v);
    let b = [c[0] * w * 2.0, c[1] * w * 2.0, c[2] * w * 2.0];
    let d = dot3(u, v);
    let e = [u[0] * d * 2.0, u[1] * d * 2.0, u[2] * d * 2.0];
    (a, b, e)
}

/// `quat_rotate(q, v)`: `a + b + c`.
pub fn quat_rotate(q: Quat, v: Vec3) -> Vec3 {
    let (a, b, c) = rotate_terms(q, v);
    [a[0] + b[0] + c[0], a[1] + b[1] + c[1], a[2] + b[2] + c[2]]
}

/// `quat_rotate_inverse(q, v)`: `a - b + c`.
pub fn quat_rotate_inverse(q: Quat, v: Vec3) -> Vec3 {
    let (a, b, c) = rotate_terms(q, v);
    [a[0] - b[0] + c[0], a[1] - b[1] + c[1], a[2] - b[2] + c[2]]
}

/// `quat_to_tan_norm(q)`: the rotated x axis, then the rotated z axis.
pub fn quat_to_tan_norm(q: Quat) -> [f32; 6] {
    let t = quat_rotate(q, [1.0, 0.0, 0.0]);
    let n = quat_rotate(q, [0.0, 0.0, 1.0]);
    [t[0], t[1], t[2], n[0], n[1], n[2]]
}

/// `calc_heading(q)`: the angle of the rotated x axis in the xy plane.
pub fn calc_heading(q: Quat) -> f32 {
    let d = quat_rotate(q, [1.0, 0.0, 0.0]);
    d[1].atan2(d[0])
}

/// `normalize(x)` of a quaternion: `x / max(|x|, 1e-9)`.
pub fn quat_unit(q: Quat) -> Quat {
    let n = (q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3]).sqrt().max(1e-9);
    [q[0] / n, q[1] / n, q[2] / n, q[3] / n]
}

/// `quat_from_angle_axis(angle, [0, 0, 1])`: the axis is already unit, so
/// `normalize(axis)` is exact; the products with its zeros are kept
/// (they give torch's signed zeros).
fn quat_from_angle_about_z(angle: f32) -> Quat {
    let theta = angle / 2.0;
    let s = theta.sin();
    quat_unit([0.0 * s, 0.0 * s, 1.0 * s, theta.cos()])
}

/// `calc_heading_quat_inv(q)`: the rotation about z by minus the heading.
pub fn calc_heading_quat_inv(q: Quat) -> Quat {
    quat_from_angle_about_z(-calc_heading(q))
}

/// `root_projected_gravity(q)`: `[0, 0, -1]` in the frame of `q`.
pub fn projected_gravity(q: Quat) -> Vec3 {
    quat_rotate_inverse(q, [0.0, 0.0, -1.0])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The f64 Hamilton product, written the textbook way.
    fn mul64(a: [f64; 4], b: [f64; 4]) -> [f64; 4] {
        let [x1, y1, z1, w1] = a;
        let [x2, y2, z2, w2] = b;
        [
            w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
            w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2,
            w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2,
            w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2,
        ]
    }

    /// `v` rotated by unit `q` as `q v q*`, in f64.
    fn rot64(q: [f64; 4], v: [f64; 3]) -> [f64; 3] {
        let p = mul64(mul64(q, [v[0], v[1], v[2], 0.0]), [-q[0], -q[1], -q[2], q[3]]);
        [p[0], p[1], p[2]]
    }

    fn unit() -> impl Strategy<Value = [f32; 4]> {
        prop::array::uniform4(-1.0f32..1.0)
            .prop_filter("not near zero", |q| q.iter().map(|x| x * x).sum::<f32>() > 0.01)
            .prop_map(|q| {
                let n = q.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
                q.map(|x| (x as f64 / n) as f32)
            })
    }

    fn up(q: [f32; 4]) -> [f64; 4] {
        q.map(f64::from)
    }

    proptest! {
        #[test]
        fn quat_mul_is_the_hamilton_product(a in unit(), b in unit()) {
            let got = quat_mul(a, b);
            let want = mul64(up(a), up(b));
            for i in 0..4 {
                prop_assert!((got[i] as f64 - want[i]).abs() < 4e-7, "{i}: {} vs {}", got[i], want[i]);
            }
        }

        #[test]
        fn rotate_and_inverse_match_q_v_qconj(q in unit(), v in prop::array::uniform3(-10.0f32..10.0)) {
            let got = quat_rotate(q, v);
            let want = rot64(up(q), v.map(f64::from));
            let inv = quat_rotate_inverse(q, v);
            let want_inv = rot64(up(quat_conjugate(q)), v.map(f64::from));
            for i in 0..3 {
                prop_assert!((got[i] as f64 - want[i]).abs() < 1e-5, "rotate {i}: {} vs {}", got[i], want[i]);
                prop_assert!((inv[i] as f64 - want_inv[i]).abs() < 1e-5, "inverse {i}: {} vs {}", inv[i], want_inv[i]);
            }
        }

        #[test]
        fn heading_inverse_undoes_the_heading(q in unit()) {
            let d = rot64(up(q), [1.0, 0.0, 0.0]);
            // away from the vertical, where the heading is defined
            prop_assume!(d[0].hypot(d[1]) > 1e-2);
            let h = calc_heading_quat_inv(q);
            let back = rot64(up(quat_mul(h, q)), [1.0, 0.0, 0.0]);
            prop_assert!(back[1].abs() < 1e-5 && back[0] > 0.0, "{back:?}");
            // a rotation about z alone
            prop_assert!(h[0] == 0.0 && h[1] == 0.0);
            let n: f64 = up(h).iter().map(|x| x * x).sum();
            prop_assert!((n - 1.0).abs() < 1e-6);
        }

        #[test]
        fn tan_norm_is_the_rotated_x_and_z_axes(q in unit()) {
            let t = quat_to_tan_norm(q);
            let x = rot64(up(q), [1.0, 0.0, 0.0]);
            let z = rot64(up(q), [0.0, 0.0, 1.0]);
            for i in 0..3 {
                prop_assert!((t[i] as f64 - x[i]).abs() < 1e-6);
                prop_assert!((t[3 + i] as f64 - z[i]).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn gravity_of_identity_and_upside_down() {
        assert_eq!(projected_gravity([0.0, 0.0, 0.0, 1.0]), [0.0, 0.0, -1.0]);
        assert_eq!(projected_gravity([0.0, 0.0, 0.0, -1.0]), [0.0, 0.0, -1.0]);
        assert_eq!(projected_gravity([1.0, 0.0, 0.0, 0.0]), [0.0, 0.0, 1.0]);
    }
}
