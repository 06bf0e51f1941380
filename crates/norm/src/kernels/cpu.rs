//! CPU kernels: one fused pass for normalize, one pass over memory for moments.
// Unsafe code is allowed here (denied elsewhere): one uninitialized-output write, argued where it is made.
#![allow(unsafe_code)]

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::isa::{self, Isa};
use super::Direction;

/// Elements per task: small enough to spread work over threads, large
/// enough that a task's overhead is noise. Fixed, so that results never
/// depend on the number of threads.
const ROWS_PER_TASK_TARGET_ELEMS: usize = 1 << 18;
/// Rows per shifted block in `moments`: the one-pass formula inside a block
/// loses at most a factor of this many f64 ulps (see `block_moments`), and
/// each block costs one Chan merge of all columns.
const BLOCK_ROWS: usize = 256;

/// An input element type: f32 or f64.
pub trait Elem: Copy + Send + Sync + 'static {
    fn to_f64(self) -> f64;
    fn sub(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn add(self, o: Self) -> Self;
    fn lt(self, o: Self) -> bool;
    fn gt(self, o: Self) -> bool;
}

macro_rules! elem {
    ($t:ty) => {
        impl Elem for $t {
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                self - o
            }
            #[inline(always)]
            fn div(self, o: Self) -> Self {
                self / o
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn lt(self, o: Self) -> bool {
                self < o
            }
            #[inline(always)]
            fn gt(self, o: Self) -> bool {
                self > o
            }
        }
    };
}
elem!(f32);
elem!(f64);

fn rows_per_task(cols: usize) -> usize {
    (ROWS_PER_TASK_TARGET_ELEMS / cols.max(1)).max(1)
}

/// Per-column moments of a block of rows, in f64: count, mean, sum of
/// squared deviations (M2).
#[derive(Clone)]
struct Partial {
    n: f64,
    mean: Vec<f64>,
    m2: Vec<f64>,
}

impl Partial {
    fn empty(cols: usize) -> Self {
        Self { n: 0.0, mean: vec![0.0; cols], m2: vec![0.0; cols] }
    }

    /// Chan's merge in f64.
    fn merge(&mut self, o: &Partial) {
        if o.n == 0.0 {
            return;
        }
        if self.n == 0.0 {
            self.clone_from(o);
            return;
        }
        let n = self.n + o.n;
        let wb = o.n / n;
        let wab = self.n * o.n / n;
        for ((m, q), (om, oq)) in self.mean.iter_mut().zip(&mut self.m2).zip(o.mean.iter().zip(&o.m2)) {
            let d = om - *m;
            *m += d * wb;
            *q += oq + d * d * wab;
        }
        self.n = n;
    }
}

/// Rows summed into a register tile before it goes back to memory: enough
/// to amortize loading and storing the tile's sums, few enough that the
/// rows stream through the prefetcher side by side.
const GROUP: usize = 16;

/// Runs `$body` (an expression over the enclosing function's arguments)
/// compiled for the instruction set `$isa`: inside, `const W: usize` is the
/// register tile width of f64 lanes that fits that instruction set's
/// register file (see [`shifted_sums`]). Each variant is a
/// `#[target_feature]` function, called only after `Isa::is_supported`
/// (`is_x86_feature_detected!`) said this CPU has its features.
macro_rules! with_isa {
    ($isa:expr, <$T:ident>, ($($arg:ident: $ty:ty),*), |$w:ident| $body:expr) => {{
        #[inline(always)]
        fn body<$T: Elem, const $w: usize>($($arg: $ty),*) {
            $body
        }
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
        unsafe fn avx512<$T: Elem>($($arg: $ty),*) {
            // 32 zmm registers of 8 f64: tiles of 4 (sums, squares, shifts).
            body::<$T, 32>($($arg),*)
        }
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2<$T: Elem>($($arg: $ty),*) {
            // 16 ymm registers of 4 f64: tiles of 4 leave room for temporaries.
            body::<$T, 16>($($arg),*)
        }
        let isa: Isa = $isa;
        debug_assert!(isa.is_supported(), "{isa} kernel requested on a CPU without it");
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `avx512` only needs the CPU to have the features it is
            // compiled with (avx512f, avx512vl, avx2, fma), and the guard has
            // just checked each of them with `is_x86_feature_detected!`.
            Isa::Avx512 if Isa::Avx512.is_supported() => unsafe { avx512::<$T>($($arg),*) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above, for avx2 and fma.
            Isa::Avx2 if Isa::Avx2.is_supported() => unsafe { avx2::<$T>($($arg),*) },
            // SSE2 registers of 2 f64 (16 of them): tiles of 4 again.
            _ => body::<$T, 8>($($arg),*),
        }
    }};
}

/// Sums of `x - shift` and `(x - shift)^2` per column over a block of rows,
/// in f64, in row order, with `mul_add` (fused on every instruction set, so
/// every one gives the same bits; the baseline calls libm's `fma`).
///
/// A register tile of `W` columns holds `W` sums, `W` sums of squares and
/// `W` shifts: 3W/L registers of L f64 lanes, plus temporaries. The tile
/// width is per instruction set so that this fits: 32 columns take 12 of
/// AVX-512's 32 registers, but would take 24 of AVX2's 16, and LLVM then
/// keeps the sums on the stack (a load, add and store per row and vector,
/// plus register shuffling): record_moments ran at 2-3x a copy on AVX2.
fn shifted_sums<T: Elem>(isa: Isa, block: &[T], cols: usize, shift: &[f64], s1: &mut [f64], s2: &mut [f64]) {
    with_isa!(isa, <T>, (block: &[T], cols: usize, shift: &[f64], s1: &mut [f64], s2: &mut [f64]), |W| {
        for group in block.chunks(GROUP * cols) {
            group_sums::<T, W>(group, cols, shift, s1, s2);
        }
    })
}

/// [`shifted_sums`] over one group of rows, in register tiles of `W`
/// columns: for each tile, `W` sums and `W` sums of squares are loaded into
/// registers, summed down the group's rows, and stored once. Columns past
/// the last whole tile are summed in one more tile that ends at the last
/// column (overlapping the one before) and stores only the new columns:
/// each column is still summed once per row, in row order.
#[inline(always)]
fn group_sums<T: Elem, const W: usize>(group: &[T], cols: usize, shift: &[f64], s1: &mut [f64], s2: &mut [f64]) {
    if cols < W {
        return narrow_group_sums(group, cols, shift, s1, s2);
    }
    tiled_sums::<T, W>(group, cols, shift, s1, s2);
}

/// The tiles of [`group_sums`] for `cols >= W`: whole tiles from the left,
/// then one that ends at the last column and stores only the new columns.
#[inline(always)]
fn tiled_sums<T: Elem, const W: usize>(group: &[T], cols: usize, shift: &[f64], s1: &mut [f64], s2: &mut [f64]) {
    let mut j = 0;
    while j + W <= cols {
        tile_sums::<T, W>(group, cols, j, 0, shift, s1, s2);
        j += W;
    }
    if j < cols {
        tile_sums::<T, W>(group, cols, cols - W, j - (cols - W), shift, s1, s2);
    }
}

/// [`group_sums`] for fewer columns than a tile: tiles of 4, then column by column.
#[inline(always)]
fn narrow_group_sums<T: Elem>(group: &[T], cols: usize, shift: &[f64], s1: &mut [f64], s2: &mut [f64]) {
    const N: usize = 4;
    if cols >= N {
        return tiled_sums::<T, N>(group, cols, shift, s1, s2);
    }
    for row in group.chunks_exact(cols) {
        for (((a, q), &k), &v) in s1.iter_mut().zip(s2.iter_mut()).zip(shift).zip(row) {
            let d = v.to_f64() - k;
            *a += d;
            *q = d.mul_add(d, *q);
        }
    }
}

/// Columns `j..j + W` of [`group_sums`] in registers; stores columns
/// `j + keep..j + W` only.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tile_sums<T: Elem, const W: usize>(
    group: &[T],
    cols: usize,
    j: usize,
    keep: usize,
    shift: &[f64],
    s1: &mut [f64],
    s2: &mut [f64],
) {
    let mut a = [0f64; W];
    let mut q = [0f64; W];
    let mut k = [0f64; W];
    a.copy_from_slice(&s1[j..j + W]);
    q.copy_from_slice(&s2[j..j + W]);
    k.copy_from_slice(&shift[j..j + W]);
    for row in group.chunks_exact(cols) {
        let xs: &[T; W] = row[j..j + W].try_into().expect("a tile lies within its row");
        for i in 0..W {
            let d = xs[i].to_f64() - k[i];
            a[i] += d;
            q[i] = d.mul_add(d, q[i]);
        }
    }
    s1[j + keep..j + W].copy_from_slice(&a[keep..]);
    s2[j + keep..j + W].copy_from_slice(&q[keep..]);
}

/// Moments of one block of rows in one pass, shifted by the block's first
/// row. The shift keeps the one-pass formula stable: a sample lies within
/// sqrt(n) population std devs of its block's mean, so
/// M2 = s2 - s1^2/n cancels at most a factor n (<= the block's rows) of f64
/// precision.
fn block_moments<T: Elem>(isa: Isa, block: &[T], cols: usize, scratch: &mut [f64], out: &mut Partial) {
    let rows = block.len() / cols;
    for (k, &v) in scratch.iter_mut().zip(&block[..cols]) {
        *k = v.to_f64();
    }
    out.mean.iter_mut().for_each(|s| *s = 0.0);
    out.m2.iter_mut().for_each(|s| *s = 0.0);
    shifted_sums(isa, block, cols, scratch, &mut out.mean, &mut out.m2);
    let n = rows as f64;
    for ((m, q), &k) in out.mean.iter_mut().zip(out.m2.iter_mut()).zip(scratch.iter()) {
        let s1 = *m;
        *m = k + s1 / n;
        *q = (*q - s1 * s1 / n).max(0.0);
    }
    out.n = n;
}

fn task_moments<T: Elem>(isa: Isa, rows: &[T], cols: usize) -> Partial {
    let mut acc = Partial::empty(cols);
    let mut blk = Partial::empty(cols);
    let mut scratch = vec![0.0; cols];
    for block in rows.chunks(BLOCK_ROWS * cols) {
        block_moments(isa, block, cols, &mut scratch, &mut blk);
        acc.merge(&blk);
    }
    acc
}

/// Per-column mean and population variance of a row-major `rows × cols`
/// matrix, accumulated in f64. Reads the data from memory once (each block
/// twice from cache). Deterministic for any number of threads, the same
/// bits on every instruction set.
pub(crate) fn moments<T: Elem>(data: &[T], cols: usize) -> (Vec<f64>, Vec<f64>) {
    moments_with(isa::current(), data, cols)
}

/// [`moments`] with the kernels of `isa` (which this CPU must support).
pub(crate) fn moments_with<T: Elem>(isa: Isa, data: &[T], cols: usize) -> (Vec<f64>, Vec<f64>) {
    debug_assert!(cols > 0 && data.len().is_multiple_of(cols));
    let task = rows_per_task(cols) * cols;
    let partials: Vec<Partial> = data.par_chunks(task).map(|c| task_moments(isa, c, cols)).collect();
    let mut total = Partial::empty(cols);
    for p in &partials {
        total.merge(p);
    }
    let n = total.n;
    let var = total.m2.iter().map(|q| q / n).collect();
    (total.mean, var)
}

/// Whether every element is finite.
pub(crate) fn all_finite<T: Elem>(data: &[T]) -> bool {
    data.par_chunks(1 << 16).all(|c| c.iter().all(|v| v.to_f64().is_finite()))
}

/// Per-element parameters of normalize, converted once to the output type.
pub(crate) struct Affine<'a, T> {
    pub mean: Option<&'a [T]>,
    pub std: &'a [T],
    /// `(lo, hi)` = `(-c, c)` rounded to T.
    pub clamp: Option<(T, T)>,
    pub direction: Direction,
}

#[inline(always)]
fn clamp<T: Elem>(v: T, c: Option<(T, T)>) -> T {
    match c {
        // Comparisons with NaN are false, so NaN passes through as in torch.
        Some((lo, hi)) => {
            if v.lt(lo) {
                lo
            } else if v.gt(hi) {
                hi
            } else {
                v
            }
        }
        None => v,
    }
}

#[inline(always)]
fn row_kernel<T: Elem>(x: &[T], out: &mut [MaybeUninit<T>], p: &Affine<'_, T>) {
    match (p.direction, p.mean) {
        (Direction::Normalize, Some(m)) => {
            for (((o, &v), &m), &s) in out.iter_mut().zip(x).zip(m).zip(p.std) {
                o.write(clamp(v.sub(m).div(s), p.clamp));
            }
        }
        (Direction::Normalize, None) => {
            for ((o, &v), &s) in out.iter_mut().zip(x).zip(p.std) {
                o.write(clamp(v.div(s), p.clamp));
            }
        }
        (Direction::UnNormalize, Some(m)) => {
            for (((o, &v), &m), &s) in out.iter_mut().zip(x).zip(m).zip(p.std) {
                o.write(clamp(v, p.clamp).mul(s).add(m));
            }
        }
        (Direction::UnNormalize, None) => {
            for ((o, &v), &s) in out.iter_mut().zip(x).zip(p.std) {
                o.write(clamp(v, p.clamp).mul(s));
            }
        }
    }
}

/// A new vector of x's length, filled task by task in parallel by `task`
/// (which must write every element of its output chunk). One read of x,
/// one write of the output, nothing else allocated.
fn map_tasks<T: Elem>(x: &[T], cols: usize, task: impl Fn(&[T], &mut [MaybeUninit<T>]) + Sync) -> Vec<T> {
    debug_assert!(cols > 0 && x.len().is_multiple_of(cols));
    let mut out: Vec<T> = Vec::with_capacity(x.len());
    let chunk = rows_per_task(cols) * cols;
    out.spare_capacity_mut()[..x.len()].par_chunks_mut(chunk).zip(x.par_chunks(chunk)).for_each(|(o, xs)| task(xs, o));
    // SAFETY: the zipped chunks cover spare_capacity_mut()[..x.len()]
    // exactly (same length and chunking as x), and every `task` passed here
    // writes each element of its output chunk (normalize_task and copy_task
    // zip output with input rows of equal length; the tests
    // `map_tasks_initializes_every_element` and
    // `normalize_writes_every_element` check it).
    unsafe { out.set_len(x.len()) };
    out
}

fn normalize_task<T: Elem>(isa: Isa, xs: &[T], out: &mut [MaybeUninit<T>], p: &Affine<'_, T>) {
    with_isa!(isa, <T>, (xs: &[T], out: &mut [MaybeUninit<T>], p: &Affine<'_, T>), |W| {
        let cols = p.std.len();
        for (orow, xrow) in out.chunks_exact_mut(cols).zip(xs.chunks_exact(cols)) {
            row_kernel(xrow, orow, p);
        }
    })
}

fn copy_task<T: Elem>(isa: Isa, xs: &[T], out: &mut [MaybeUninit<T>]) {
    with_isa!(isa, <T>, (xs: &[T], out: &mut [MaybeUninit<T>]), |W| {
        for (o, &v) in out.iter_mut().zip(xs) {
            o.write(v);
        }
    })
}

/// normalize / un_norm of a row-major matrix whose rows have `p.std.len()`
/// elements, in one fused pass.
pub(crate) fn normalize<T: Elem>(x: &[T], p: &Affine<'_, T>) -> Vec<T> {
    normalize_with(isa::current(), x, p)
}

/// [`normalize`] with the kernels of `isa` (which this CPU must support).
pub(crate) fn normalize_with<T: Elem>(isa: Isa, x: &[T], p: &Affine<'_, T>) -> Vec<T> {
    map_tasks(x, p.std.len(), |xs, o| normalize_task(isa, xs, o, p))
}

/// A plain parallel copy through the same allocation, threading and
/// instruction set as `normalize`: the bandwidth limit that normalize is
/// measured against.
pub fn copy<T: Elem>(x: &[T], cols: usize) -> Vec<T> {
    let isa = isa::current();
    map_tasks(x, cols, |xs, o| copy_task(isa, xs, o))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_match_two_pass_f64_over_many_blocks() {
        let cols = 3;
        let rows = 50_000;
        let data: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919) % 1000) as f32 * 0.01 + 1000.0).collect();
        let (m, v) = moments(&data, cols);
        for c in 0..cols {
            let col: Vec<f64> = data.iter().skip(c).step_by(cols).map(|&x| x as f64).collect();
            let mean = col.iter().sum::<f64>() / rows as f64;
            let var = col.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / rows as f64;
            assert!((m[c] - mean).abs() <= 1e-12 * mean.abs(), "{} {}", m[c], mean);
            assert!((v[c] - var).abs() <= 1e-9 * var, "{} {}", v[c], var);
        }
    }

    #[test]
    fn moments_do_not_depend_on_thread_count() {
        let cols = 5;
        let data: Vec<f32> = (0..200_003 * cols).map(|i| (i as f32).sin()).collect();
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let a = one.install(|| moments(&data, cols));
        let b = moments(&data, cols);
        assert_eq!(a.0, b.0);
        assert_eq!(a.1, b.1);
    }

    #[test]
    fn normalize_writes_every_element() {
        let cols = 7;
        let x: Vec<f32> = (0..cols * 100_001).map(|i| i as f32).collect();
        let std = vec![2.0f32; cols];
        let mean = vec![1.0f32; cols];
        let p = Affine { mean: Some(&mean), std: &std, clamp: None, direction: Direction::Normalize };
        let y = normalize(&x, &p);
        assert_eq!(y.len(), x.len());
        for (a, b) in x.iter().zip(&y) {
            assert_eq!(*b, (a - 1.0) / 2.0);
        }
    }

    #[test]
    fn map_tasks_initializes_every_element() {
        for (rows, cols) in [(1, 1), (3, 1), (1, 5), (100_003, 3), (7, 70_000)] {
            let x: Vec<f64> = (0..rows * cols).map(|i| i as f64 + 0.5).collect();
            assert_eq!(copy(&x, cols), x);
        }
    }

    /// Every instruction set this CPU has (so the `unsafe` calls of the
    /// `#[target_feature]` variants run) gives the scalar kernels' bits, and
    /// the tiles (whole, overlapping tail, narrow) sum each column once.
    #[test]
    fn every_supported_isa_gives_the_same_bits() {
        let isas: Vec<Isa> = Isa::ALL.into_iter().filter(|i| i.is_supported()).collect();
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for cols in [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 64, 70, 358] {
            for rows in [1, 7, 9, 300, 513] {
                let x64: Vec<f64> =
                    (0..rows * cols).map(|i| ((i * 7919) % 1013) as f64 * 0.37 - 100.0 + (i % cols) as f64).collect();
                let x32: Vec<f32> = x64.iter().map(|&v| v as f32).collect();
                let (m, v) = moments_with(Isa::Scalar, &x32, cols);
                let (m64, v64) = moments_with(Isa::Scalar, &x64, cols);
                for c in 0..cols {
                    let col: Vec<f64> = x32.iter().skip(c).step_by(cols).map(|&x| x as f64).collect();
                    let mean = col.iter().sum::<f64>() / rows as f64;
                    let var = col.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / rows as f64;
                    assert!((m[c] - mean).abs() <= 1e-12 * mean.abs().max(1.0), "{cols}x{rows} col {c}");
                    assert!((v[c] - var).abs() <= 1e-9 * var.max(1.0), "{cols}x{rows} col {c}: {} {}", v[c], var);
                }
                let std = vec![1.5f32; cols];
                let mean = vec![0.25f32; cols];
                let p =
                    Affine { mean: Some(&mean), std: &std, clamp: Some((-5.0, 5.0)), direction: Direction::Normalize };
                let z = normalize_with(Isa::Scalar, &x32, &p);
                for &isa in &isas {
                    let (mi, vi) = moments_with(isa, &x32, cols);
                    assert_eq!((bits(&mi), bits(&vi)), (bits(&m), bits(&v)), "{isa} f32 {rows}x{cols}");
                    let (mi, vi) = moments_with(isa, &x64, cols);
                    assert_eq!((bits(&mi), bits(&vi)), (bits(&m64), bits(&v64)), "{isa} f64 {rows}x{cols}");
                    let zi = normalize_with(isa, &x32, &p);
                    assert!(
                        zi.iter().zip(&z).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{isa} normalize {rows}x{cols}"
                    );
                    let ci: Vec<f32> = map_tasks(&x32, cols, |xs, o| copy_task(isa, xs, o));
                    assert_eq!(ci, x32);
                }
            }
        }
    }

    #[test]
    fn clamp_propagates_nan_and_keeps_signed_zero() {
        let c = Some((-5.0f32, 5.0f32));
        assert!(clamp(f32::NAN, c).is_nan());
        assert_eq!(clamp(-7.0f32, c), -5.0);
        assert_eq!(clamp(7.0f32, c), 5.0);
        assert!(clamp(-0.0f32, c).is_sign_negative());
    }
}
