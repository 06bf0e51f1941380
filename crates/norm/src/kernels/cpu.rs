//! CPU kernels: one fused pass for normalize, one pass over memory for moments.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::Direction;

/// Rows per task: small enough to spread work over threads, large enough
/// that a task's overhead is noise. Fixed, so that results never depend on
/// the number of threads.
const ROWS_PER_TASK_TARGET_ELEMS: usize = 1 << 16;
/// Rows per block inside a task: a block is summed twice while it sits in L1/L2.
const BLOCK_TARGET_ELEMS: usize = 1 << 13;

/// An input element type: f32 or f64.
pub(crate) trait Elem: Copy + Send + Sync + 'static {
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

/// Moments of one block of rows by two passes while it is hot in cache.
fn block_moments<T: Elem>(block: &[T], cols: usize, sum: &mut [f64], out: &mut Partial) {
    let rows = block.len() / cols;
    sum.iter_mut().for_each(|s| *s = 0.0);
    for row in block.chunks_exact(cols) {
        for (s, &v) in sum.iter_mut().zip(row) {
            *s += v.to_f64();
        }
    }
    let inv = 1.0 / rows as f64;
    for (m, s) in out.mean.iter_mut().zip(sum.iter()) {
        *m = s * inv;
    }
    out.m2.iter_mut().for_each(|q| *q = 0.0);
    for row in block.chunks_exact(cols) {
        for ((q, &m), &v) in out.m2.iter_mut().zip(&out.mean).zip(row) {
            let d = v.to_f64() - m;
            *q += d * d;
        }
    }
    out.n = rows as f64;
}

fn task_moments<T: Elem>(rows: &[T], cols: usize) -> Partial {
    let block_rows = (BLOCK_TARGET_ELEMS / cols).max(1);
    let mut acc = Partial::empty(cols);
    let mut blk = Partial::empty(cols);
    let mut sum = vec![0.0; cols];
    for block in rows.chunks(block_rows * cols) {
        block_moments(block, cols, &mut sum, &mut blk);
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

/// `out = f(x)` row by row, where a row has `p.std.len()` elements. One
/// read of x, one write of out, nothing else allocated.
pub(crate) fn normalize<T: Elem>(x: &[T], p: &Affine<'_, T>) -> Vec<T> {
    let cols = p.std.len();
    debug_assert!(cols > 0 && x.len() % cols == 0);
    let mut out: Vec<T> = Vec::with_capacity(x.len());
    let task = rows_per_task(cols) * cols;
    out.spare_capacity_mut()[..x.len()]
        .par_chunks_mut(task)
        .zip(x.par_chunks(task))
        .for_each(|(o, xs)| {
            for (orow, xrow) in o.chunks_exact_mut(cols).zip(xs.chunks_exact(cols)) {
                row_kernel(xrow, orow, p);
            }
        });
    // SAFETY: the chunks above cover spare_capacity_mut()[..x.len()] exactly
    // (same length as x, same chunking, chunks_exact with cols dividing both),
    // and row_kernel writes every element of each output row.
    unsafe { out.set_len(x.len()) };
    out
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
    fn clamp_propagates_nan_and_keeps_signed_zero() {
        let c = Some((-5.0f32, 5.0f32));
        assert!(clamp(f32::NAN, c).is_nan());
        assert_eq!(clamp(-7.0f32, c), -5.0);
        assert_eq!(clamp(7.0f32, c), 5.0);
        assert!(clamp(-0.0f32, c).is_sign_negative());
    }
}
