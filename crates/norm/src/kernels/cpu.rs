//! CPU kernels: one fused pass for normalize, one pass over memory for moments.
// Unsafe code is allowed here (denied elsewhere): one uninitialized-output write, argued where it is made.
#![allow(unsafe_code)]

use std::mem::MaybeUninit;

use rayon::prelude::*;

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

/// Columns per register tile of [`shifted_sums`]: four AVX-512 registers of f64.
const TILE: usize = 32;
/// Rows summed into a register tile before it goes back to memory: few
/// enough that the rows stream through the prefetcher side by side.
const GROUP: usize = 8;

/// Sums of `x - shift` and `(x - shift)^2` per column over a block of rows,
/// in f64, in row order, with `mul_add` (fused on every variant, so every
/// ISA variant gives the same bits; the baseline variant calls libm). For
/// each group of GROUP rows, tiles of TILE columns are summed down the group
/// in registers and stored once.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn shifted_sums<T: Elem>(block: &[T], cols: usize, shift: &[f64], s1: &mut [f64], s2: &mut [f64]) {
    let tiled = cols / TILE * TILE;
    for group in block.chunks(GROUP * cols) {
        for j in (0..tiled).step_by(TILE) {
            let mut a = [0f64; TILE];
            let mut q = [0f64; TILE];
            let mut k = [0f64; TILE];
            a.copy_from_slice(&s1[j..j + TILE]);
            q.copy_from_slice(&s2[j..j + TILE]);
            k.copy_from_slice(&shift[j..j + TILE]);
            for row in group.chunks_exact(cols) {
                let xs = &row[j..j + TILE];
                for i in 0..TILE {
                    let d = xs[i].to_f64() - k[i];
                    a[i] += d;
                    q[i] = d.mul_add(d, q[i]);
                }
            }
            s1[j..j + TILE].copy_from_slice(&a);
            s2[j..j + TILE].copy_from_slice(&q);
        }
        if tiled < cols {
            let (s1, s2, shift) = (&mut s1[tiled..], &mut s2[tiled..], &shift[tiled..]);
            for row in group.chunks_exact(cols) {
                for (((a, q), &k), &v) in s1.iter_mut().zip(s2.iter_mut()).zip(shift).zip(&row[tiled..]) {
                    let d = v.to_f64() - k;
                    *a += d;
                    *q = d.mul_add(d, *q);
                }
            }
        }
    }
}

/// Moments of one block of rows in one pass, shifted by the block's first
/// row. The shift keeps the one-pass formula stable: a sample lies within
/// sqrt(n) population std devs of its block's mean, so
/// M2 = s2 - s1^2/n cancels at most a factor n (<= the block's rows) of f64
/// precision.
fn block_moments<T: Elem>(block: &[T], cols: usize, scratch: &mut [f64], out: &mut Partial) {
    let rows = block.len() / cols;
    for (k, &v) in scratch.iter_mut().zip(&block[..cols]) {
        *k = v.to_f64();
    }
    out.mean.iter_mut().for_each(|s| *s = 0.0);
    out.m2.iter_mut().for_each(|s| *s = 0.0);
    shifted_sums(block, cols, scratch, &mut out.mean, &mut out.m2);
    let n = rows as f64;
    for ((m, q), &k) in out.mean.iter_mut().zip(out.m2.iter_mut()).zip(scratch.iter()) {
        let s1 = *m;
        *m = k + s1 / n;
        *q = (*q - s1 * s1 / n).max(0.0);
    }
    out.n = n;
}

fn task_moments<T: Elem>(rows: &[T], cols: usize) -> Partial {
    let mut acc = Partial::empty(cols);
    let mut blk = Partial::empty(cols);
    let mut scratch = vec![0.0; cols];
    for block in rows.chunks(BLOCK_ROWS * cols) {
        block_moments(block, cols, &mut scratch, &mut blk);
        acc.merge(&blk);
    }
    acc
}

/// Per-column mean and population variance of a row-major `rows × cols`
/// matrix, accumulated in f64. Reads the data from memory once (each block
/// twice from cache). Deterministic for any number of threads.
pub(crate) fn moments<T: Elem>(data: &[T], cols: usize) -> (Vec<f64>, Vec<f64>) {
    debug_assert!(cols > 0 && data.len() % cols == 0);
    let task = rows_per_task(cols) * cols;
    let partials: Vec<Partial> = data.par_chunks(task).map(|c| task_moments(c, cols)).collect();
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
    debug_assert!(cols > 0 && x.len() % cols == 0);
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

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn normalize_task<T: Elem>(xs: &[T], out: &mut [MaybeUninit<T>], p: &Affine<'_, T>) {
    let cols = p.std.len();
    for (orow, xrow) in out.chunks_exact_mut(cols).zip(xs.chunks_exact(cols)) {
        row_kernel(xrow, orow, p);
    }
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn copy_task<T: Elem>(xs: &[T], out: &mut [MaybeUninit<T>]) {
    for (o, &v) in out.iter_mut().zip(xs) {
        o.write(v);
    }
}

/// normalize / un_norm of a row-major matrix whose rows have `p.std.len()`
/// elements, in one fused pass.
pub(crate) fn normalize<T: Elem>(x: &[T], p: &Affine<'_, T>) -> Vec<T> {
    map_tasks(x, p.std.len(), |xs, o| normalize_task(xs, o, p))
}

/// A plain parallel copy through the same allocation and threading as
/// `normalize`: the bandwidth limit that normalize is measured against.
pub fn copy<T: Elem>(x: &[T], cols: usize) -> Vec<T> {
    map_tasks(x, cols, |xs, o| copy_task(xs, o))
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

    #[test]
    fn clamp_propagates_nan_and_keeps_signed_zero() {
        let c = Some((-5.0f32, 5.0f32));
        assert!(clamp(f32::NAN, c).is_nan());
        assert_eq!(clamp(-7.0f32, c), -5.0);
        assert_eq!(clamp(7.0f32, c), 5.0);
        assert!(clamp(-0.0f32, c).is_sign_negative());
    }
}
