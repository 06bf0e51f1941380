//! v3.0's joint encoding (`envs/utils/humanoid.py: dof_to_obs`): each
//! body's hinge angles to a rotation (`quat_from_angle_axis` per hinge,
//! `quaternion_to_matrix`, their product in order), back to a quaternion
//! (`matrix_to_quaternion`: the best-conditioned of four candidates) and to
//! its tangent and normal (`quat_to_tan_norm`), six numbers per body.
//! Float32, term by term in torch's order; `sin`, `cos` and `sqrt` are
//! libm's (torch's vectorized ones may differ by an ulp).

use crate::rotations::{quat_to_tan_norm, Quat};

type Mat3 = [[f32; 3]; 3];

/// v3.0's `normalize(x)`: `x / max(|x|, 1e-9)` over the last axis.
fn normalize<const N: usize>(x: [f32; N]) -> [f32; N] {
    let n = x.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-9);
    x.map(|v| v / n)
}

/// `quat_from_angle_axis(angle, axis, w_last=False)`: `[w, x, y, z]`.
fn quat_from_angle_axis_wxyz(angle: f32, axis: [f32; 3]) -> [f32; 4] {
    let theta = angle / 2.0;
    let (s, c) = (theta.sin(), theta.cos());
    let a = normalize(axis);
    normalize([c, a[0] * s, a[1] * s, a[2] * s])
}

/// `quaternion_to_matrix(q, w_last=False)`.
fn quaternion_to_matrix(q: [f32; 4]) -> Mat3 {
    let [r, i, j, k] = q;
    let two_s = 2.0 / (r * r + i * i + j * j + k * k);
    [
        [1.0 - two_s * (j * j + k * k), two_s * (i * j - k * r), two_s * (i * k + j * r)],
        [two_s * (i * j + k * r), 1.0 - two_s * (i * i + k * k), two_s * (j * k - i * r)],
        [two_s * (i * k - j * r), two_s * (j * k + i * r), 1.0 - two_s * (i * i + j * j)],
    ]
}

fn matmul(a: &Mat3, b: &Mat3) -> Mat3 {
    std::array::from_fn(|r| std::array::from_fn(|c| a[r][0] * b[0][c] + a[r][1] * b[1][c] + a[r][2] * b[2][c]))
}

/// `matrix_to_quaternion(m, w_last=True)`: `[x, y, z, w]`.
fn matrix_to_quaternion(m: &Mat3) -> Quat {
    let [[m00, m01, m02], [m10, m11, m12], [m20, m21, m22]] = *m;
    let pos = |x: f32| if x > 0.0 { x.sqrt() } else { 0.0 };
    let q_abs = [
        pos(1.0 + m00 + m11 + m22),
        pos(1.0 + m00 - m11 - m22),
        pos(1.0 - m00 + m11 - m22),
        pos(1.0 - m00 - m11 + m22),
    ];
    let rows = [
        [q_abs[0] * q_abs[0], m21 - m12, m02 - m20, m10 - m01],
        [m21 - m12, q_abs[1] * q_abs[1], m10 + m01, m02 + m20],
        [m02 - m20, m10 + m01, q_abs[2] * q_abs[2], m12 + m21],
        [m10 - m01, m20 + m02, m21 + m12, q_abs[3] * q_abs[3]],
    ];
    // argmax: the first of equal maxima
    let mut best = 0;
    for (i, v) in q_abs.iter().enumerate().skip(1) {
        if *v > q_abs[best] {
            best = i;
        }
    }
    let den = 2.0 * q_abs[best].max(0.1);
    let [w, x, y, z] = rows[best].map(|v| v / den);
    [x, y, z, w]
}

/// The bodies' hinge axes, in `hinge_axes_map`'s order: the joints are
/// consumed in that order, `axes.len()` per body.
#[derive(Debug, Clone, PartialEq)]
pub struct Hinges {
    /// Per body, its hinge axes.
    pub bodies: Vec<Vec<[f32; 3]>>,
}

impl Hinges {
    /// Joints the map covers.
    pub fn num_dofs(&self) -> usize {
        self.bodies.iter().map(Vec::len).sum()
    }

    /// Output width: six per body.
    pub fn width(&self) -> usize {
        6 * self.bodies.len()
    }

    /// `dof_to_obs` of one row of joint angles into `out` ([`Hinges::width`]).
    pub fn dof_to_obs(&self, dof_pos: &[f32], out: &mut [f32]) {
        let mut at = 0;
        for (b, axes) in self.bodies.iter().enumerate() {
            let mut m: Mat3 = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]];
            for axis in axes {
                m = matmul(&m, &quaternion_to_matrix(quat_from_angle_axis_wxyz(dof_pos[at], *axis)));
                at += 1;
            }
            out[6 * b..6 * b + 6].copy_from_slice(&quat_to_tan_norm(matrix_to_quaternion(&m)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hinge of angle a about z: the tangent is (cos a, sin a, 0), the
    /// normal z, within float32 rounding.
    #[test]
    fn a_hinge_about_z_turns_the_tangent() {
        let h = Hinges { bodies: vec![vec![[0.0, 0.0, 1.0]]] };
        for a in [-3.0f32, -1.0, 0.0, 0.4, 2.5] {
            let mut out = [0f32; 6];
            h.dof_to_obs(&[a], &mut out);
            let want = [a.cos(), a.sin(), 0.0, 0.0, 0.0, 1.0];
            for (g, w) in out.iter().zip(want) {
                assert!((g - w).abs() < 1e-6, "{a}: {out:?}");
            }
        }
    }
}
