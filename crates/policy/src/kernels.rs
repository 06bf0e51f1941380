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
//! - the weights are packed at load into panels of `W` output columns,
//!   each `K x W` contiguous (zero-padded past the last column), every k
//!   row on whole 64-byte cache lines: `W` = [`NR`] = 32 with AVX-512
//!   (a step reads two zmm), 16 elsewhere (two ymm);
//! - the input is packed per call into micro-panels of `MR` rows
//!   interleaved by k (zero-padded rows);
//! - the micro-kernel keeps an `MR x W` block of outputs in registers and
//!   does one fused multiply-add per weight and row; `multiversion`
//!   compiles it per instruction set and picks one at run time. AVX-512:
//!   12 x 32, 24 of the 32 zmm accumulate (12 rows reached 119 GFLOP/s on
//!   one Sapphire Rapids core where 6 rows reached 104 and 14 spilled).
//!   AVX2: 6 x 16, 12 of the 16 ymm accumulate, 2 hold weights, 1 a
//!   broadcast row value (BLIS's Haswell block): 12 independent chains
//!   cover the FMA latency of two pipes, 8 loads per 12 FMAs; a 1024 x
//!   1024 x 1024 product reached 69-76 GFLOP/s on one Zen 3 core where
//!   AVX2's former 2 x 32 block reached 52-62 (`benches/kernels.rs`);
//! - tasks are blocks of rows on the current rayon pool; each packs its
//!   rows, then goes panel by panel (K in blocks) and sweeps its
//!   micro-panels over the panel, which stays in cache; every output
//!   element is one sequential sum over k, so the result does not depend
//!   on the thread count;
//! - bias is the accumulators' start value, ReLU is applied when storing.
//!
//! At batch 1 this is a matrix-vector product that streams each weight
//! once: memory-bound, as it should be.
//!
//! # Row independence
//!
//! Every output element, on either path (matrix-vector for fewer than 4
//! rows, packed blocks otherwise) and with either packing, is computed as
//! `acc = bias; for k in 0..K { acc = fma(x[k], w[k], acc) }`, then the
//! epilogue: one sequential chain whose order depends neither on the
//! number of rows, nor on a row's position (its block, its slot in a
//! micro-panel, zero-padded neighbours), nor on the thread count, nor on
//! the instruction set (a fused multiply-add rounds once wherever it
//! runs); K blocking stores and reloads the float32 accumulator exactly.
//! So a row gives the same bits alone or in any batch, which
//! `pmstate-serve`'s dynamic batching relies on (`tests/row_independence.rs`
//! checks it on every recorded policy).

use rayon::prelude::*;

/// Output columns per packed panel with AVX-512 (the widest panel).
pub const NR: usize = 32;
/// Output columns per packed panel elsewhere (AVX2, the portable fallback).
const NR_AVX2: usize = 16;
/// Rows per micro-panel with AVX-512.
const MR_AVX512: usize = 12;
/// Rows per micro-panel elsewhere.
const MR_AVX2: usize = 6;

/// `W` consecutive floats on whole 64-byte cache lines (`W` = 16 or 32):
/// a k row of a packed panel, a panel's bias, or a row of a block of
/// outputs. A `Vec<f32>` is only 4-byte aligned (glibc's large blocks
/// start 16 bytes past a page), so rows of `f32` would make a quarter to
/// a half of the weight loads straddle two lines.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C, align(64))]
struct Cols<const W: usize>([f32; W]);

impl<const W: usize> Cols<W> {
    const ZERO: Self = Cols([0.0; W]);
}

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
    packing: Packing,
}

/// The weights in the panels of the instruction set found at packing.
#[derive(Debug, Clone)]
enum Packing {
    Avx512(Panels<NR>),
    Avx2(Panels<NR_AVX2>),
}

/// `ceil(n / W)` panels of `k` rows, and the bias padded likewise.
#[derive(Debug, Clone)]
struct Panels<const W: usize> {
    k: usize,
    n: usize,
    rows: Vec<Cols<W>>,
    bias: Vec<Cols<W>>,
}

impl PackedLinear {
    /// Packs `weight` (`[n, k]` row-major, as `nn.Linear` stores it) and
    /// `bias` (`[n]`) for this CPU's micro-kernel.
    pub fn new(weight: &[f32], bias: &[f32], n: usize, k: usize) -> Self {
        Self::for_isa(weight, bias, n, k, if avx512() { Isa::Avx512 } else { Isa::Avx2 })
    }

    /// [`PackedLinear::new`] for the micro-kernel of `isa` (tests run the
    /// AVX2 one on AVX-512 machines too).
    fn for_isa(weight: &[f32], bias: &[f32], n: usize, k: usize, isa: Isa) -> Self {
        debug_assert_eq!(weight.len(), n * k);
        let packing = match isa {
            Isa::Avx512 => Packing::Avx512(Panels::new(weight, bias, n, k)),
            Isa::Avx2 => Packing::Avx2(Panels::new(weight, bias, n, k)),
        };
        PackedLinear { k, n, packing }
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
        // every element is written below: no need to zero what is kept
        y.resize(m * self.n, 0.0);
        if m == 0 {
            return;
        }
        match &self.packing {
            Packing::Avx512(p) if m < 4 => p.gemv(x, m, epilogue, gemv_avx512, y),
            Packing::Avx512(p) => p.run::<MR_AVX512>(x, m, epilogue, Isa::Avx512, block_avx512::<MR_AVX512>, y),
            Packing::Avx2(p) if m < 4 => p.gemv(x, m, epilogue, gemv_avx2, y),
            Packing::Avx2(p) => p.run::<MR_AVX2>(x, m, epilogue, Isa::Avx2, block_avx2::<MR_AVX2>, y),
        }
    }
}

/// A micro-kernel: [`micro`] compiled for one instruction set.
type Block<const W: usize> = fn(&[f32], &[Cols<W>], &Cols<W>, &mut [Cols<W>], bool, Epilogue);
/// A matrix-vector kernel: [`gemv_panels`] compiled for one instruction
/// set, over the rows of a group of consecutive panels, their biases and
/// their tiles of outputs.
type Gemv<const W: usize> = fn(&[f32], &[Cols<W>], &[Cols<W>], &mut [Cols<W>], Epilogue);

impl<const W: usize> Panels<W> {
    fn new(weight: &[f32], bias: &[f32], n: usize, k: usize) -> Self {
        let p = n.div_ceil(W);
        let mut rows = vec![Cols::ZERO; p * k];
        for (pi, panel) in rows.chunks_exact_mut(k.max(1)).enumerate() {
            for (kk, row) in panel.iter_mut().enumerate() {
                for (j, v) in row.0.iter_mut().enumerate() {
                    let col = pi * W + j;
                    if col < n {
                        *v = weight[col * k + kk];
                    }
                }
            }
        }
        let mut b = vec![Cols::ZERO; p];
        for (i, v) in bias[..n].iter().enumerate() {
            b[i / W].0[i % W] = *v;
        }
        Panels { k, n, rows, bias: b }
    }

    /// The `k` rows of panel `pi`.
    fn panel(&self, pi: usize) -> &[Cols<W>] {
        &self.rows[pi * self.k..(pi + 1) * self.k]
    }

    /// A few rows: one matrix-vector product per row, groups of `g`
    /// panels (`g * W` = [`NR`] columns) in parallel. Memory-bound: each
    /// weight is read once per row from the packed panels.
    fn gemv(&self, x: &[f32], m: usize, epilogue: Epilogue, kernel: Gemv<W>, y: &mut [f32]) {
        let (k, n) = (self.k, self.n);
        let p = n.div_ceil(W);
        let g = (NR / W).max(1);
        // each row's tiles padded to whole groups: no task spans two rows
        let pg = p.div_ceil(g) * g;
        let mut tiles = vec![Cols::ZERO; m * pg];
        tiles.par_chunks_mut(g).enumerate().for_each(|(t, out)| {
            let (row, pi) = (t * g / pg, t * g % pg);
            let pe = (pi + g).min(p);
            let (b, bias) = (&self.rows[pi * k..pe * k], &self.bias[pi..pe]);
            kernel(&x[row * k..(row + 1) * k], b, bias, &mut out[..pe - pi], epilogue)
        });
        for (row, dst) in y.chunks_mut(n).enumerate() {
            for (pi, cols) in dst.chunks_mut(W).enumerate() {
                cols.copy_from_slice(&tiles[row * pg + pi].0[..cols.len()]);
            }
        }
    }

    /// Row blocks in parallel; each task packs its rows, then goes panel by
    /// panel (K in blocks) and writes its rows of `y` directly.
    fn run<const MR: usize>(&self, x: &[f32], m: usize, epilogue: Epilogue, isa: Isa, block: Block<W>, y: &mut [f32]) {
        let (k, n) = (self.k, self.n);
        let p = n.div_ceil(W);
        let mc = isa.rows_per_task(m, rayon::current_num_threads().max(1), MR);
        let kc = isa.kc();
        y.par_chunks_mut(mc * n).enumerate().for_each(|(blk, ys)| {
            let rows = ys.len() / n;
            let a = pack_rows::<MR>(x, m, k, blk * mc, rows);
            let mut tile = vec![Cols::ZERO; rows.div_ceil(MR) * MR];
            for pi in 0..p {
                let b = self.panel(pi);
                let bias = &self.bias[pi];
                let (c0, w) = (pi * W, W.min(n - pi * W));
                let mut k0 = 0;
                while k0 < k {
                    let k1 = (k0 + kc).min(k);
                    let (first, last) = (k0 == 0, k1 == k);
                    let ep = if last { epilogue } else { Epilogue::Identity };
                    let bk = &b[k0..k1];
                    for (i, o) in tile.chunks_exact_mut(MR).enumerate() {
                        block(&a[i * MR * k + k0 * MR..i * MR * k + k1 * MR], bk, bias, o, first, ep);
                        if last {
                            // stored now, the stores drain while the next
                            // micro-panel computes (one pass over the whole
                            // tile after the sweep stalled on them: 3 % of a
                            // forward)
                            store(o, &mut ys[i * MR * n..((i + 1) * MR).min(rows) * n], n, c0, w);
                        }
                    }
                    k0 = k1;
                }
            }
        });
    }
}

/// Columns `c0..c0 + w` of the rows of `y` (`n` wide) from a block's rows.
#[inline(always)]
fn store<const W: usize>(block: &[Cols<W>], y: &mut [f32], n: usize, c0: usize, w: usize) {
    let rows = y.chunks_exact_mut(n).zip(block);
    if w == W {
        // a fixed-size copy: vector moves, no call to memmove
        rows.for_each(|(yrow, t)| yrow[c0..c0 + W].copy_from_slice(&t.0));
    } else {
        rows.for_each(|(yrow, t)| yrow[c0..c0 + w].copy_from_slice(&t.0[..w]));
    }
}

/// Rows `first..first + rows` of `x` (`[m, k]`) packed into micro-panels
/// `[rows / MR][k][MR]`, the last one zero-padded.
fn pack_rows<const MR: usize>(x: &[f32], m: usize, k: usize, first: usize, rows: usize) -> Vec<f32> {
    let mut a = vec![0f32; rows.div_ceil(MR) * MR * k];
    for (i, dst) in a.chunks_exact_mut(MR * k).enumerate() {
        let f = first + i * MR;
        if f + MR <= m {
            // MR sequential streams in, one contiguous stream out; every
            // index in range by construction (no bounds checks left)
            let src: [&[f32]; MR] = std::array::from_fn(|r| &x[(f + r) * k..][..k]);
            for (kk, d) in (0..k).zip(dst.chunks_exact_mut(MR)) {
                for r in 0..MR {
                    d[r] = src[r][kk];
                }
            }
        } else {
            for r in 0..m.saturating_sub(f) {
                for (kk, &v) in x[(f + r) * k..][..k].iter().enumerate() {
                    dst[kk * MR + r] = v;
                }
            }
        }
    }
    a
}

/// Which micro-kernel, panel width and blocking.
#[derive(Clone, Copy, Debug)]
enum Isa {
    /// [`MR_AVX512`] x [`NR`] blocks.
    Avx512,
    /// [`MR_AVX2`] x [`NR_AVX2`] blocks, compiled for AVX2 + FMA and
    /// portably (x86 CPUs without AVX2, other architectures).
    Avx2,
}

impl Isa {
    /// Rows per task (a multiple of `mr`).
    fn rows_per_task(self, m: usize, threads: usize, mr: usize) -> usize {
        match self {
            // One task per thread where the batch is small (each task
            // streams every weight once), at most 168 rows each: their
            // packed rows (672 KiB for K = 1024) stay in a Sapphire Rapids
            // core's 2 MiB L2 while every panel goes by.
            Isa::Avx512 => (m.div_ceil(threads).div_ceil(mr) * mr).clamp(mr, 168),
            // Equal tasks, a multiple of the thread count, of at most
            // about 504 rows: each task streams every weight once (from
            // L3 or memory), and fewer, longer sweeps over a panel (64
            // KiB for K = 1024, in L2) amortize that better than packed
            // rows fitting L2 would (measured on Zen 3, 512 KiB of L2:
            // 168-row tasks were 10 % slower, 84-row ones 20 %).
            Isa::Avx2 => {
                let tasks = m.div_ceil(504).div_ceil(threads) * threads;
                m.div_ceil(tasks.min(m.div_ceil(mr))).div_ceil(mr) * mr
            }
        }
    }

    /// Depth of one pass over a panel.
    fn kc(self) -> usize {
        match self {
            // 256 x 32 weights (32 KiB) stay in L1 while every
            // micro-panel of the task's rows goes by
            Isa::Avx512 => 256,
            // a whole panel at K = 1024 (64 KiB, in L2): blocking it to
            // fit L1 measured no faster, and every pass costs a store and
            // reload of the outputs
            Isa::Avx2 => 1024,
        }
    }
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

/// One `MR x W` output block over a range of k: `out = epilogue(start +
/// a b)` where `start` is the bias on the first range and `out` itself
/// after.
#[inline(always)]
fn micro<const MR: usize, const W: usize>(
    a: &[f32],
    b: &[Cols<W>],
    bias: &Cols<W>,
    out: &mut [Cols<W>],
    first: bool,
    epilogue: Epilogue,
) {
    let mut acc = [[0f32; W]; MR];
    for (row, o) in acc.iter_mut().zip(out.iter()) {
        *row = if first { bias.0 } else { o.0 };
    }
    for (av, bv) in a.chunks_exact(MR).zip(b) {
        for (acc, &x) in acc.iter_mut().zip(av) {
            for (a, &w) in acc.iter_mut().zip(&bv.0) {
                *a = x.mul_add(w, *a);
            }
        }
    }
    for (row, o) in acc.iter().zip(out.iter_mut()) {
        match epilogue {
            Epilogue::Identity => o.0 = *row,
            Epilogue::Relu => {
                for (d, &v) in o.0.iter_mut().zip(row) {
                    *d = relu(v);
                }
            }
        }
    }
}

/// `out = epilogue(bias + x b)` for one row and `G` consecutive panels
/// (`b`: their rows, `k = x.len()` each; fewer panels at the end of a
/// layer): one fused multiply-add per k, in k order, starting from the
/// bias: the same operations in the same order as [`micro`] performs for
/// every row of a block, so a row's result does not depend on which path,
/// batch size or position in the batch computed it (see "Row independence"
/// in the module docs). Interleaved partial sums would overlap the FMA
/// latency but change the order; `G` panels side by side give `G * W / 8`
/// independent ymm chains instead (4 with AVX2: 16-column panels one at a
/// time left a 1 x 1024 x 1024 product 20 % slower than 32-column ones).
#[inline(always)]
fn gemv_panels<const W: usize, const G: usize>(
    x: &[f32],
    b: &[Cols<W>],
    bias: &[Cols<W>],
    out: &mut [Cols<W>],
    epilogue: Epilogue,
) {
    let k = x.len();
    if bias.len() != G {
        // the last, partial group: its panels one at a time
        for (i, (bias, out)) in bias.chunks(1).zip(out.chunks_mut(1)).enumerate() {
            gemv_panels::<W, 1>(x, &b[i * k..(i + 1) * k], bias, out, epilogue);
        }
        return;
    }
    let panels: [&[Cols<W>]; G] = std::array::from_fn(|g| &b[g * k..][..k]);
    let mut acc: [[f32; W]; G] = std::array::from_fn(|g| bias[g].0);
    for (kk, &xv) in x.iter().enumerate() {
        for (acc, panel) in acc.iter_mut().zip(&panels) {
            for (a, &w) in acc.iter_mut().zip(&panel[kk].0) {
                *a = xv.mul_add(w, *a);
            }
        }
    }
    for (acc, out) in acc.iter().zip(out) {
        for (o, &a) in out.0.iter_mut().zip(acc) {
            *o = match epilogue {
                Epilogue::Identity => a,
                Epilogue::Relu => relu(a),
            };
        }
    }
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma"))]
fn gemv_avx512(x: &[f32], b: &[Cols<NR>], bias: &[Cols<NR>], out: &mut [Cols<NR>], epilogue: Epilogue) {
    gemv_panels::<NR, 1>(x, b, bias, out, epilogue)
}

#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
fn gemv_avx2(x: &[f32], b: &[Cols<NR_AVX2>], bias: &[Cols<NR_AVX2>], out: &mut [Cols<NR_AVX2>], epilogue: Epilogue) {
    gemv_panels::<NR_AVX2, { NR / NR_AVX2 }>(x, b, bias, out, epilogue)
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma"))]
fn block_avx512<const MR: usize>(
    a: &[f32],
    b: &[Cols<NR>],
    bias: &Cols<NR>,
    out: &mut [Cols<NR>],
    first: bool,
    epilogue: Epilogue,
) {
    micro::<MR, NR>(a, b, bias, out, first, epilogue)
}

#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
fn block_avx2<const MR: usize>(
    a: &[f32],
    b: &[Cols<NR_AVX2>],
    bias: &Cols<NR_AVX2>,
    out: &mut [Cols<NR_AVX2>],
    first: bool,
    epilogue: Epilogue,
) {
    micro::<MR, NR_AVX2>(a, b, bias, out, first, epilogue)
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
        let y = PackedLinear::new(&w, &b, n, k).forward(&x, m, Epilogue::Relu);
        let avx2 = PackedLinear::for_isa(&w, &b, n, k, Isa::Avx2);
        assert!(matches!(avx2.packing, Packing::Avx2(_)));
        assert_eq!(y, avx2.forward(&x, m, Epilogue::Relu), "dyadic inputs: every order sums exactly");
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
        // this CPU's packing, and the AVX2 one (the same here on an AVX2
        // machine, a second micro-kernel and panel width on AVX-512)
        let auto = PackedLinear::new(&w, &b, n, k);
        let avx2 = PackedLinear::for_isa(&w, &b, n, k, Isa::Avx2);
        let alone: Vec<Vec<f32>> = rows.iter().map(|r| auto.forward(r, 1, Epilogue::Relu)).collect();
        for (r, want) in rows.iter().zip(&alone) {
            let got = avx2.forward(r, 1, Epilogue::Relu);
            assert_eq!(bits(&got), bits(want), "avx2 matrix-vector product");
        }
        // three threads: three row blocks (with either micro-kernel)
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().expect("a rayon pool");
        for m in [2usize, 3, 4, 5, 6, 7, 12, 13, 25, 169, 200] {
            let idx: Vec<usize> = (0..m).map(|j| (j * 37 + m) % rows.len()).collect();
            let x: Vec<f32> = idx.iter().flat_map(|&i| rows[i].iter().copied()).collect();
            for (isa, p, threads) in [("auto", &auto, None), ("avx2", &avx2, None), ("avx2", &avx2, Some(&pool))] {
                let y = match threads {
                    None => p.forward(&x, m, Epilogue::Relu),
                    Some(pool) => pool.install(|| p.forward(&x, m, Epilogue::Relu)),
                };
                for (j, &i) in idx.iter().enumerate() {
                    assert_eq!(bits(&y[j * n..(j + 1) * n]), bits(&alone[i]), "{isa}: row {i} at position {j} of {m}");
                }
            }
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|v| v.to_bits()).collect()
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
