//! The CPU forward's matrix product: `y = act(x W^T + b)` for float32,
//! with the weights packed once at load.
//!
//! Why not candle's matmul (the gemm crate): measured on the full-size
//! smpl tracker (docs/policy-speed.md) it reached about half of torch's
//! MKL throughput at batch >= 1024, and 4x torch's latency at batch 1.
//! candle's `mkl` feature needs Intel's library downloaded at build time
//! (not available offline, and not in CI). So this module is a small
//! GotoBLAS-style kernel in safe Rust:
//!
//! - the weights are packed at load into panels of [`NR`] = 32 output
//!   columns, each `K x 32` contiguous (zero-padded past the last column),
//!   so a micro-kernel step reads one 128-byte row of the panel;
//! - the input is packed per call into micro-panels of `MR` rows
//!   interleaved by k (zero-padded rows);
//! - the micro-kernel keeps an `MR x 32` block of outputs in registers
//!   (12 x 2 of the 32 zmm with AVX-512: 24 accumulators, 2 weight rows, 1
//!   broadcast; 2 x 4 of the 16 ymm with AVX2) and does one fused
//!   multiply-add per weight and row; `multiversion` compiles it per
//!   instruction set and picks one at run time (12 rows reached 119
//!   GFLOP/s on one Sapphire Rapids core where 6 rows reached 104 and 14
//!   spilled);
//! - tasks are (block of rows, panel) pairs on the current rayon pool;
//!   every output element is one sequential sum over k, so the result does
//!   not depend on the thread count;
//! - bias is the accumulators' start value, ReLU is applied when storing.
//!
//! At batch 1 this is a matrix-vector product that streams each weight
//! once: memory-bound, as it should be.
//!
//! # Row independence
//!
//! Every output element, on either path (matrix-vector for fewer than 4
//! rows, packed blocks otherwise), is computed as `acc = bias; for k in
//! 0..K { acc = fma(x[k], w[k], acc) }`, then the epilogue: one sequential
//! chain whose order depends neither on the number of rows, nor on a row's
//! position (its block, its slot in a micro-panel, zero-padded neighbours),
//! nor on the thread count; K blocking stores and reloads the float32
//! accumulator exactly. So a row gives the same bits alone or in any batch,
//! which `pmstate-serve`'s dynamic batching relies on
//! (`tests/row_independence.rs` checks it on every recorded policy).

use rayon::prelude::*;

/// Output columns per packed panel.
pub const NR: usize = 32;
/// Most rows per task (a multiple of every MR): its packed rows (MC x K,
/// 672 KiB for K = 1024) stay in L2 while every panel goes by.
const MC: usize = 168;
/// Depth of one pass over a panel: `KC x NR` weights (32 KiB) stay in L1
/// while every micro-panel of the task's rows goes by.
const KC: usize = 256;

/// An elementwise function fused into the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Epilogue {
    /// Store as is.
    Identity,
    /// `torch.relu(y)`: 0 for negatives; NaN and -0.0 kept.
    Relu,
}

/// `torch.relu` exactly: negatives become 0; NaN and -0.0 pass through
/// (`f32::max` would turn a NaN into 0, hiding a NaN input).
#[inline(always)]
fn relu(v: f32) -> f32 {
    if v < 0.0 {
        0.0
    } else {
        v
    }
}

/// A Linear's weights packed for [`PackedLinear::forward`].
#[derive(Debug, Clone)]
pub struct PackedLinear {
    k: usize,
    n: usize,
    /// `ceil(n / NR)` panels of `k x NR`.
    panels: Vec<f32>,
    /// Bias padded to `ceil(n / NR) * NR`.
    bias: Vec<f32>,
}

impl PackedLinear {
    /// Packs `weight` (`[n, k]` row-major, as `nn.Linear` stores it) and `bias` (`[n]`).
    pub fn new(weight: &[f32], bias: &[f32], n: usize, k: usize) -> Self {
        debug_assert_eq!(weight.len(), n * k);
        let p = n.div_ceil(NR);
        let mut panels = vec![0f32; p * k * NR];
        for (pi, panel) in panels.chunks_exact_mut(k * NR).enumerate() {
            for (kk, row) in panel.chunks_exact_mut(NR).enumerate() {
                for (j, v) in row.iter_mut().enumerate() {
                    let col = pi * NR + j;
                    if col < n {
                        *v = weight[col * k + kk];
                    }
                }
            }
        }
        let mut b = vec![0f32; p * NR];
        b[..n].copy_from_slice(&bias[..n]);
        PackedLinear { k, n, panels, bias: b }
    }

    /// Input width.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Output width.
    pub fn n(&self) -> usize {
        self.n
    }

    /// `epilogue(x W^T + b)` for `m` rows of `x` (`[m, k]` row-major); `[m, n]` row-major.
    pub fn forward(&self, x: &[f32], m: usize, epilogue: Epilogue) -> Vec<f32> {
        let mut y = Vec::new();
        self.forward_into(x, m, epilogue, &mut y);
        y
    }

    /// [`PackedLinear::forward`] into `y` (resized; its capacity is reused,
    /// so a caller that keeps `y` across calls pays no page faults for it).
    pub fn forward_into(&self, x: &[f32], m: usize, epilogue: Epilogue, y: &mut Vec<f32>) {
        debug_assert_eq!(x.len(), m * self.k);
        y.clear();
        y.resize(m * self.n, 0.0);
        if m == 0 {
            return;
        }
        if m < 4 {
            return self.gemv(x, m, epilogue, y);
        }
        if avx512() {
            self.run::<12>(x, m, epilogue, Isa::Avx512, y)
        } else {
            self.run::<2>(x, m, epilogue, Isa::Other, y)
        }
    }

    /// A few rows: one matrix-vector product per row, panels in parallel.
    /// Memory-bound: each weight is read once per row from the packed panels.
    fn gemv(&self, x: &[f32], m: usize, epilogue: Epilogue, y: &mut [f32]) {
        let (k, n) = (self.k, self.n);
        let p = n.div_ceil(NR);
        let mut tiles = vec![0f32; m * p * NR];
        tiles.par_chunks_mut(NR).enumerate().for_each(|(t, out)| {
            let (row, pi) = (t / p, t % p);
            let b = &self.panels[pi * k * NR..(pi + 1) * k * NR];
            let xr = &x[row * k..(row + 1) * k];
            let bias = &self.bias[pi * NR..(pi + 1) * NR];
            if avx512() {
                gemv_avx512(xr, b, bias, out, epilogue)
            } else {
                gemv_avx2(xr, b, bias, out, epilogue)
            }
        });
        for (row, dst) in y.chunks_mut(n).enumerate() {
            for (pi, cols) in dst.chunks_mut(NR).enumerate() {
                cols.copy_from_slice(&tiles[(row * p + pi) * NR..][..cols.len()]);
            }
        }
    }

    /// Row blocks in parallel; each task packs its rows, then goes panel by
    /// panel (K in L1-sized chunks) and writes its rows of `y` directly.
    fn run<const MR: usize>(&self, x: &[f32], m: usize, epilogue: Epilogue, isa: Isa, y: &mut [f32]) {
        let (k, n) = (self.k, self.n);
        let p = n.div_ceil(NR);
        // one task per thread where the batch is small (each task streams
        // every weight once), at most MC rows each
        let threads = rayon::current_num_threads().max(1);
        let mc = (m.div_ceil(threads).div_ceil(MR) * MR).clamp(MR, MC);
        y.par_chunks_mut(mc * n).enumerate().for_each(|(blk, ys)| {
            let rows = ys.len() / n;
            let panels = rows.div_ceil(MR);
            // this block's rows packed: [panels][k][MR], zero-padded
            let mut a = vec![0f32; panels * MR * k];
            for (i, dst) in a.chunks_exact_mut(MR * k).enumerate() {
                let first = blk * mc + i * MR;
                let rows: Vec<&[f32]> = (first..(first + MR).min(m)).map(|row| &x[row * k..(row + 1) * k]).collect();
                if rows.len() == MR {
                    // MR sequential streams in, one contiguous stream out
                    for (kk, d) in dst.chunks_exact_mut(MR).enumerate() {
                        for (dv, row) in d.iter_mut().zip(&rows) {
                            *dv = row[kk];
                        }
                    }
                } else {
                    for (r, row) in rows.iter().enumerate() {
                        for (kk, &v) in row.iter().enumerate() {
                            dst[kk * MR + r] = v;
                        }
                    }
                }
            }
            let mut tile = vec![0f32; panels * MR * NR];
            for pi in 0..p {
                let b = &self.panels[pi * k * NR..(pi + 1) * k * NR];
                let bias: &[f32] = &self.bias[pi * NR..(pi + 1) * NR];
                let mut k0 = 0;
                while k0 < k {
                    let k1 = (k0 + KC).min(k);
                    let first = k0 == 0;
                    let ep = if k1 == k { epilogue } else { Epilogue::Identity };
                    let bk = &b[k0 * NR..k1 * NR];
                    for (i, o) in tile.chunks_exact_mut(MR * NR).enumerate() {
                        let ak = &a[i * MR * k + k0 * MR..i * MR * k + k1 * MR];
                        match isa {
                            Isa::Avx512 => block_avx512::<MR>(ak, bk, bias, o, first, ep),
                            Isa::Other => block_avx2::<MR>(ak, bk, bias, o, first, ep),
                        }
                    }
                    k0 = k1;
                }
                let c0 = pi * NR;
                let w = NR.min(n - c0);
                for (r, yrow) in ys.chunks_exact_mut(n).enumerate() {
                    yrow[c0..c0 + w].copy_from_slice(&tile[r * NR..r * NR + w]);
                }
            }
        });
    }
}

#[derive(Clone, Copy)]
enum Isa {
    Avx512,
    Other,
}

fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// One `MR x NR` output block over a range of k: `out = epilogue(start + a b)`
/// where `start` is the bias on the first range and `out` itself after.
#[inline(always)]
fn micro<const MR: usize>(a: &[f32], b: &[f32], bias: &[f32], out: &mut [f32], first: bool, epilogue: Epilogue) {
    let mut acc = [[0f32; NR]; MR];
    for (r, row) in acc.iter_mut().enumerate() {
        row.copy_from_slice(if first { &bias[..NR] } else { &out[r * NR..(r + 1) * NR] });
    }
    for (av, bv) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
        let Ok(bv) = <&[f32; NR]>::try_from(bv) else { continue };
        for r in 0..MR {
            let x = av[r];
            for j in 0..NR {
                acc[r][j] = x.mul_add(bv[j], acc[r][j]);
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        let dst = &mut out[r * NR..(r + 1) * NR];
        match epilogue {
            Epilogue::Identity => dst.copy_from_slice(row),
            Epilogue::Relu => {
                for (d, &v) in dst.iter_mut().zip(row) {
                    *d = relu(v);
                }
            }
        }
    }
}

/// `out = epilogue(bias + x b)` for one row and one panel: one fused
/// multiply-add per k, in k order, starting from the bias: the same
/// operations in the same order as [`micro`] performs for every row of a
/// block, so a row's result does not depend on which path, batch size or
/// position in the batch computed it (see "Row independence" in the module
/// docs). Four interleaved partial sums would overlap the FMA latency, but
/// one row streams each weight once and is bound by memory, not latency.
#[inline(always)]
fn gemv_panel(x: &[f32], b: &[f32], bias: &[f32], out: &mut [f32], epilogue: Epilogue) {
    let mut acc = [0f32; NR];
    acc.copy_from_slice(&bias[..NR]);
    for (&xv, row) in x.iter().zip(b.chunks_exact(NR)) {
        let Ok(row) = <&[f32; NR]>::try_from(row) else { continue };
        for j in 0..NR {
            acc[j] = xv.mul_add(row[j], acc[j]);
        }
    }
    for j in 0..NR {
        out[j] = match epilogue {
            Epilogue::Identity => acc[j],
            Epilogue::Relu => relu(acc[j]),
        };
    }
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma"))]
fn gemv_avx512(x: &[f32], b: &[f32], bias: &[f32], out: &mut [f32], epilogue: Epilogue) {
    gemv_panel(x, b, bias, out, epilogue)
}

#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
fn gemv_avx2(x: &[f32], b: &[f32], bias: &[f32], out: &mut [f32], epilogue: Epilogue) {
    gemv_panel(x, b, bias, out, epilogue)
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma"))]
fn block_avx512<const MR: usize>(a: &[f32], b: &[f32], bias: &[f32], out: &mut [f32], first: bool, epilogue: Epilogue) {
    micro::<MR>(a, b, bias, out, first, epilogue)
}

#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
fn block_avx2<const MR: usize>(a: &[f32], b: &[f32], bias: &[f32], out: &mut [f32], first: bool, epilogue: Epilogue) {
    micro::<MR>(a, b, bias, out, first, epilogue)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_avx2_path_matches_too() {
        let (m, n, k) = (29, 45, 300);
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0).collect();
        let b: Vec<f32> = (0..n).map(|i| i as f32 / 8.0 - 1.0).collect();
        let x: Vec<f32> = (0..m * k).map(|i| ((i * 13 % 29) as f32 - 14.0) / 16.0).collect();
        let p = PackedLinear::new(&w, &b, n, k);
        let mut y2 = vec![0f32; m * n];
        p.run::<2>(&x, m, Epilogue::Relu, Isa::Other, &mut y2);
        let y = p.forward(&x, m, Epilogue::Relu);
        assert_eq!(y, y2, "dyadic inputs: every order sums exactly");
    }

    #[test]
    fn a_nan_input_gives_nan_through_the_relu_epilogue_as_in_torch() {
        // One NaN feature poisons every output of its row (as torch's
        // Linear + ReLU does); the other rows stay finite, on both paths
        // (one row: matrix-vector; 5 rows: blocked).
        let (n, k) = (20, 33);
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 7 % 23) as f32 - 11.0) / 32.0).collect();
        let b = vec![-0.25f32; n];
        let p = PackedLinear::new(&w, &b, n, k);
        for m in [1usize, 5] {
            let mut x: Vec<f32> = (0..m * k).map(|i| ((i * 5 % 17) as f32 - 8.0) / 8.0).collect();
            x[3] = f32::NAN;
            let y = p.forward(&x, m, Epilogue::Relu);
            assert!(y[..n].iter().all(|v| v.is_nan()), "batch {m}: {:?}", &y[..n]);
            assert!(y[n..].iter().all(|v| v.is_finite() && *v >= 0.0), "batch {m}");
        }
    }

    #[test]
    fn a_row_is_bitwise_the_same_in_any_batch_on_either_path() {
        // values that round in every sum: any change of order shows
        let (n, k) = (70, 1030);
        let mut s = 0x9e37_79b9_u32;
        let mut rnd = move || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32) * 2.0 - 1.0
        };
        let w: Vec<f32> = (0..n * k).map(|_| rnd() * 0.37).collect();
        let b: Vec<f32> = (0..n).map(|_| rnd()).collect();
        let rows: Vec<Vec<f32>> = (0..200).map(|_| (0..k).map(|_| rnd() * 3.1).collect()).collect();
        let p = PackedLinear::new(&w, &b, n, k);
        let alone: Vec<Vec<f32>> = rows.iter().map(|r| p.forward(r, 1, Epilogue::Relu)).collect();
        for m in [2usize, 3, 4, 5, 12, 13, 25, 169, 200] {
            let idx: Vec<usize> = (0..m).map(|j| (j * 37 + m) % rows.len()).collect();
            let x: Vec<f32> = idx.iter().flat_map(|&i| rows[i].iter().copied()).collect();
            for (isa, y) in [
                ("auto", p.forward(&x, m, Epilogue::Relu)),
                ("avx2 blocks", {
                    let mut y = vec![0f32; m * n];
                    if m >= 4 {
                        p.run::<2>(&x, m, Epilogue::Relu, Isa::Other, &mut y);
                    } else {
                        y = p.forward(&x, m, Epilogue::Relu);
                    }
                    y
                }),
            ] {
                for (j, &i) in idx.iter().enumerate() {
                    let got: Vec<u32> = y[j * n..(j + 1) * n].iter().map(|v| v.to_bits()).collect();
                    let want: Vec<u32> = alone[i].iter().map(|v| v.to_bits()).collect();
                    assert_eq!(got, want, "{isa}: row {i} at position {j} of {m}");
                }
            }
        }
    }

    #[test]
    fn matches_a_plain_product_for_ragged_sizes() {
        for (m, n, k) in [(1, 1, 1), (1, 70, 9), (3, 33, 1030), (7, 33, 5), (97, 69, 130), (2, 64, 3), (100, 40, 600)] {
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0).collect();
            let b: Vec<f32> = (0..n).map(|i| i as f32 / 8.0 - 1.0).collect();
            let x: Vec<f32> = (0..m * k).map(|i| ((i * 13 % 29) as f32 - 14.0) / 16.0).collect();
            let p = PackedLinear::new(&w, &b, n, k);
            for ep in [Epilogue::Identity, Epilogue::Relu] {
                let y = p.forward(&x, m, ep);
                for r in 0..m {
                    for c in 0..n {
                        let mut s = b[c] as f64;
                        for j in 0..k {
                            s += w[c * k + j] as f64 * x[r * k + j] as f64;
                        }
                        let s = if ep == Epilogue::Relu { s.max(0.0) } else { s };
                        // exact in f64 here: small dyadic values
                        assert!(
                            (y[r * n + c] as f64 - s).abs() <= 1e-4,
                            "{m}x{n}x{k} [{r},{c}] {} vs {s}",
                            y[r * n + c]
                        );
                    }
                }
            }
        }
    }
}
