//! The CPU forward's matrix product: `y = act(x W^T + b)` for float32,
//! with the weights packed once at load.
//!
//! Why not candle's matmul (the gemm crate): measured on the full-size
//! smpl tracker (docs/policy-speed.md) it reached about half of torch's
//! MKL throughput at batch >= 1024, and 4x torch's latency at batch 1.
//! candle's `mkl` feature needs Intel's library downloaded at build time
//! (not available offline, and not in CI). So this module is a small
//! GotoBLAS-style kernel:
//!
//! - the weights are packed at load into panels of `W` output columns,
//!   each `K x W` contiguous (zero-padded past the last column), every k
//!   row on whole 64-byte cache lines: `W` = [`NR`] = 32 with AVX-512
//!   (a step reads two zmm), 16 elsewhere (two ymm);
//! - the input is packed per call into micro-panels of `MR` rows
//!   interleaved by k;
//! - the micro-kernel (`micro`) keeps an `MR x G W` block of outputs
//!   (`G` panels side by side) in registers and does one fused
//!   multiply-add per weight and row. `dispatch` compiles it per
//!   instruction set inside `#[target_feature]` functions and picks the
//!   one this CPU supports, or the one `PMSTATE_CPU_ISA` forces (the
//!   normalizer kernels' selection, `pmstate_norm`). AVX-512: 12 x 32
//!   blocks, 24 of the 32 zmm accumulate. AVX2: 6 x 16, 12 of the 16 ymm
//!   accumulate, 2 hold weights, 1 a broadcast row value (BLIS's Haswell
//!   block);
//! - fewer rows than a full block (batch 1 to 11 with AVX-512, 1 to 5
//!   elsewhere) take the narrow path: one block of exactly those rows,
//!   `G` panels wide so that at least 8 accumulators hide the FMA latency,
//!   every weight read once for all rows, panel groups in parallel. At
//!   batch 1 this is a matrix-vector product that streams each weight
//!   once: memory-bound, as it should be;
//! - the blocked path: tasks are blocks of rows on the current rayon
//!   pool, equal in rows, and where rows are too few to give every thread
//!   a block of several micro-panels, groups of panels of one block; each
//!   task packs its rows, then goes panel by panel (K in blocks) and
//!   sweeps its micro-panels over the panel, which stays in cache. Rows
//!   that do not fill a block stretch the blocks (AVX-512: up to 14 rows,
//!   28 accumulators) or form a tail that goes over groups of panels at
//!   once, so no block is left with too few accumulators (a one-row tail
//!   had made 13 rows 29 % slower than 12);
//! - bias is the accumulators' start value, ReLU is applied when storing.
//!
//! # Row independence
//!
//! Every output element, on either path, with any block shape and with
//! any instruction set, is computed as `acc = bias; for k in 0..K { acc =
//! fma(x[k], w[k], acc) }`, then the epilogue: one sequential chain whose
//! order depends neither on the number of rows, nor on a row's position
//! (its block, its slot in a micro-panel, zero-padded neighbours), nor on
//! the thread count, nor on the instruction set (a fused multiply-add
//! rounds once wherever it runs, libm's `fmaf` included); K blocking
//! stores and reloads the float32 accumulator exactly. So a row gives the
//! same bits alone or in any batch, which `pmstate-serve`'s dynamic
//! batching relies on (`pmstate-policy`'s `tests/row_independence.rs`
//! checks it on every recorded policy, the tests below on every
//! instruction set this CPU has).
//!
//! A crate of its own: it changes with CPUs and instruction sets, never
//! with ProtoMotions, and knows nothing of models (`pmstate-policy` packs
//! its Linear layers with it and re-exports it as `pmstate_policy::kernels`).

#![warn(missing_docs)]
// unsafe only in `dispatch` (calls of #[target_feature] functions)
#![deny(unsafe_code)]

mod dispatch;
mod micro;

use std::cell::RefCell;
use std::ops::Range;

pub use pmstate_norm::{Isa, IsaError};
use rayon::prelude::*;

use dispatch::Kernel;
pub use dispatch::Supported;
use micro::Start;

/// Output columns per packed panel with AVX-512 (the widest panel).
pub const NR: usize = 32;
/// Output columns per packed panel elsewhere (AVX2, the portable path).
const NR_NARROW: usize = 16;
/// Rows per full block with AVX-512.
const MR_WIDE: usize = 12;
/// Rows per full block elsewhere.
const MR_NARROW: usize = 6;

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
    isa: Supported,
    packing: Packing,
    next_slice: NextSlice,
    residency: Residency,
}

/// Where a forward finds a layer's weights, which decides how its blocks
/// read them: chosen at packing from the layer's size
/// ([`Residency::of_weights`]); benchmarks and tests set it. A matter of
/// speed only: the bits are the same either way.
///
/// Measured on one thread, Zen 5 (the `sweep` example): with ten
/// 1024 x 1024 layers (4 MiB each, 40 MiB in all) the `Memory` reads made
/// 2 to 64 rows 1.1-1.7x faster; with three 256 x 256 or 512 x 512 layers
/// (in L2 between calls) they made 2 rows 1.4x slower (a 2-row block one
/// panel wide has 4 accumulators: latency-bound once the weights are
/// near) and 64 rows 5-15 % slower (stretched micro-panels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residency {
    /// Streamed from L3 or memory on every call: each block that reads
    /// weights first asks 16 KiB ahead, narrow-path blocks of 2 rows and
    /// more are one panel wide (one stream to ask ahead on), and blocked
    /// tasks stretch their micro-panels (13 rows in one block of 13)
    /// rather than read the weights once more for a tail.
    Memory,
    /// In L1 or L2 between calls: blocks wide enough for 8 accumulators,
    /// nothing asked ahead, no stretch.
    Cache,
}

impl std::fmt::Display for Residency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Residency::Memory => "weights streamed from memory",
            Residency::Cache => "weights in cache",
        })
    }
}

impl Residency {
    /// The largest layer taken to stay in cache: 1 MiB of weights (Zen 5's
    /// L2; a layer that size measured level either way).
    pub const CACHED_BYTES: usize = 1 << 20;

    /// [`Residency::Memory`] for a layer of more than
    /// [`Residency::CACHED_BYTES`] of weights, else [`Residency::Cache`].
    /// The layer alone decides: a model of many small layers that together
    /// overflow the caches reads them as if cached (unmeasured; level at
    /// worst with the kernels before the distinction).
    pub fn of_weights(bytes: usize) -> Residency {
        if bytes > Self::CACHED_BYTES {
            Residency::Memory
        } else {
            Residency::Cache
        }
    }
}

/// Whether the blocked path asks for the next slice of a panel while it
/// sweeps the current one (`prefetcht1`, a share before each
/// micro-panel). A hint: it changes no value, only speed, and which way
/// depends on the CPU:
///
/// - on an Intel Xeon (Emerald Rapids, one thread) it made the fastest
///   calls 3-7 % faster at 64 and 1024 rows, never slower
///   (docs/policy-speed.md);
/// - on an AMD EPYC (Zen 4, AVX-512) it made every batch slower: the smpl
///   tracker's forward on one thread 3.77 -> 2.63 ms at 12 rows, 13.5 ->
///   12.7 ms at 64, 204 -> 201 ms at 1024 without it; on two threads 1.84
///   -> 1.46 ms at 12 rows, 7.26 -> 6.83 ms at 64, 13.4 -> 12.9 ms at 128.
///   A task of few micro-panels asks for a whole 32 KiB slice at once
///   before a sweep that uses it once, and the hardware's own prefetchers
///   follow the panel's sequential reads. (Zen 5: 2x slower at 12 rows,
///   1.25x at 64.)
///
/// A task of fewer than 4 micro-panels never asks:
/// the Xeon measured its gain at 64 rows and more, and the cost above
/// (one sweep to spread a slice's requests over) is a property of the
/// task, not of the vendor. On that Xeon batches 12 to 24 (one or two
/// micro-panels) trailed onnxruntime by 1.3-1.7x where batch 8 was level,
/// which is this cost's shape; unmeasured there since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextSlice {
    /// Ask for the next slice ahead.
    Prefetch,
    /// Leave it to the hardware.
    Leave,
}

impl NextSlice {
    /// What measured faster on this CPU's vendor: [`NextSlice::Prefetch`] on
    /// Intel, [`NextSlice::Leave`] elsewhere (AMD measured; other vendors
    /// unmeasured: no hint is the default that cannot make things worse
    /// than the hardware alone).
    pub fn for_this_cpu() -> NextSlice {
        #[cfg(target_arch = "x86_64")]
        {
            let id = std::arch::x86_64::__cpuid(0);
            // the vendor string "GenuineIntel" in ebx, edx, ecx
            let vendor = [id.ebx, id.edx, id.ecx].map(u32::to_le_bytes);
            if vendor.concat() == b"GenuineIntel" {
                return NextSlice::Prefetch;
            }
        }
        NextSlice::Leave
    }
}

/// The weights in the panels of the instruction set chosen at packing.
#[derive(Debug, Clone)]
enum Packing {
    /// AVX-512.
    Wide(Panels<NR>),
    /// AVX2 and the portable path.
    Narrow(Panels<NR_NARROW>),
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
    /// `bias` (`[n]`) for the instruction set the CPU kernels run with:
    /// the best this CPU has, or the one `PMSTATE_CPU_ISA` (or
    /// `pmstate_norm`'s `select_isa`) fixed; an error if that variable
    /// names one this CPU lacks.
    pub fn new(weight: &[f32], bias: &[f32], n: usize, k: usize) -> Result<Self, IsaError> {
        Self::with_isa(weight, bias, n, k, pmstate_norm::bench_support::try_isa()?)
    }

    /// [`PackedLinear::new`] for the kernels of `isa` (benchmarks and tests
    /// run every instruction set the CPU has); an error if it lacks `isa`.
    pub fn with_isa(weight: &[f32], bias: &[f32], n: usize, k: usize, isa: Isa) -> Result<Self, IsaError> {
        debug_assert_eq!(weight.len(), n * k);
        let isa = Supported::check(isa)?;
        let packing = match isa.isa() {
            Isa::Avx512 => Packing::Wide(Panels::new(weight, bias, n, k)),
            Isa::Avx2 | Isa::Scalar => Packing::Narrow(Panels::new(weight, bias, n, k)),
        };
        let residency = Residency::of_weights(n.saturating_mul(k).saturating_mul(std::mem::size_of::<f32>()));
        Ok(PackedLinear { k, n, isa, packing, next_slice: NextSlice::for_this_cpu(), residency })
    }

    /// The same packed weights with the next-slice hint set (benchmarks
    /// compare both ways on one machine; the bits do not change).
    pub fn with_next_slice(mut self, next_slice: NextSlice) -> Self {
        self.next_slice = next_slice;
        self
    }

    /// The same packed weights read as `residency` says (benchmarks
    /// compare both ways, tests check both give the same bits).
    pub fn with_residency(mut self, residency: Residency) -> Self {
        self.residency = residency;
        self
    }

    /// How the forward reads the weights.
    pub fn residency(&self) -> Residency {
        self.residency
    }

    /// Panels per narrow-path block of `m` rows, and the k rows a block
    /// asks ahead (0: none), for panels of `W` columns; `groups` is the
    /// instruction set's [`dispatch::wide_groups`] or
    /// [`dispatch::narrow_groups`].
    fn narrow_reads<const W: usize>(&self, m: usize, groups: fn(usize) -> usize) -> (usize, usize) {
        match self.residency {
            Residency::Memory => {
                let g = dispatch::streaming_groups(m);
                (g, if g == PREFETCH_PANELS { ahead_rows::<W>() } else { 0 })
            }
            Residency::Cache => (groups(m), 0),
        }
    }

    /// Input width.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Output width.
    pub fn n(&self) -> usize {
        self.n
    }

    /// The bias, `[n]`.
    fn bias(&self) -> Vec<f32> {
        fn flat<const W: usize>(p: &Panels<W>) -> Vec<f32> {
            p.bias.iter().flat_map(|c| c.0).take(p.n).collect()
        }
        match &self.packing {
            Packing::Wide(p) => flat(p),
            Packing::Narrow(p) => flat(p),
        }
    }

    /// The instruction set the kernels run with.
    pub fn isa(&self) -> Isa {
        self.isa.isa()
    }

    /// The same, as the token [`per_isa`] functions take.
    pub fn supported(&self) -> Supported {
        self.isa
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
        assert_eq!(x.len(), m * self.k, "{m} rows of {} inputs", self.k);
        // every element is written below: no need to zero what is kept
        y.resize(m * self.n, 0.0);
        if m == 0 {
            return;
        }
        if self.k == 0 {
            // no inputs: every row is the bias, through the epilogue
            let bias = self.bias();
            for row in y.chunks_mut(self.n) {
                for (d, &b) in row.iter_mut().zip(&bias) {
                    *d = if epilogue == Epilogue::Relu { relu(b) } else { b };
                }
            }
            return;
        }
        let isa = self.isa;
        match &self.packing {
            Packing::Wide(p) => {
                let pick = |mr, g| dispatch::wide(isa, mr, g);
                if m < MR_WIDE {
                    let (g, ahead) = self.narrow_reads::<NR>(m, dispatch::wide_groups);
                    p.narrow(x, m, epilogue, g, ahead, pick, y)
                } else {
                    p.blocked::<MR_WIDE>(
                        x,
                        m,
                        epilogue,
                        Blocking::WIDE.for_layer(self.next_slice, self.residency),
                        pick,
                        y,
                    )
                }
            }
            Packing::Narrow(p) => {
                let pick = |mr, g| dispatch::narrow(isa, mr, g);
                if m < MR_NARROW {
                    let (g, ahead) = self.narrow_reads::<NR_NARROW>(m, dispatch::narrow_groups);
                    p.narrow(x, m, epilogue, g, ahead, pick, y)
                } else {
                    p.blocked::<MR_NARROW>(
                        x,
                        m,
                        epilogue,
                        Blocking::NARROW.for_layer(self.next_slice, self.residency),
                        pick,
                        y,
                    )
                }
            }
        }
    }
}

/// Buffers of [`PackedLinear::forward_into_scratch`], kept by the caller
/// across calls so that a small batch allocates nothing after the first.
#[derive(Debug, Default, Clone)]
pub struct KernelScratch {
    /// The rows interleaved by k.
    a: Vec<f32>,
    /// Tiles of the AVX-512 panels.
    wide: Vec<Cols<NR>>,
    /// Tiles of the AVX2 and portable panels.
    narrow: Vec<Cols<NR_NARROW>>,
}

/// The block function of a shape, `None` if none is compiled for it.
trait Pick<const W: usize>: Fn(usize, usize) -> Option<Kernel<W>> + Sync {}
impl<const W: usize, F: Fn(usize, usize) -> Option<Kernel<W>> + Sync> Pick<W> for F {}

impl PackedLinear {
    /// [`PackedLinear::forward_into`] on the calling thread with the
    /// caller's buffers: for fewer rows than a block (12 on AVX-512, 6
    /// otherwise: a control loop's batch) nothing is allocated once `y` and
    /// `scratch` have grown to the layer's size, and no thread pool is
    /// entered; the same bits as `forward_into`. Larger batches run
    /// `forward_into`.
    pub fn forward_into_scratch(
        &self,
        x: &[f32],
        m: usize,
        epilogue: Epilogue,
        y: &mut Vec<f32>,
        scratch: &mut KernelScratch,
    ) {
        let small = match &self.packing {
            Packing::Wide(_) => m < MR_WIDE,
            Packing::Narrow(_) => m < MR_NARROW,
        };
        if !small || m == 0 || self.k == 0 {
            return self.forward_into(x, m, epilogue, y);
        }
        assert_eq!(x.len(), m * self.k, "{m} rows of {} inputs", self.k);
        y.resize(m * self.n, 0.0);
        let isa = self.isa;
        match &self.packing {
            Packing::Wide(p) => {
                let pick = |mr, g| dispatch::wide(isa, mr, g);
                let reads = self.narrow_reads::<NR>(m, dispatch::wide_groups);
                p.narrow_seq(x, m, epilogue, reads, pick, y, &mut scratch.a, &mut scratch.wide)
            }
            Packing::Narrow(p) => {
                let pick = |mr, g| dispatch::narrow(isa, mr, g);
                let reads = self.narrow_reads::<NR_NARROW>(m, dispatch::narrow_groups);
                p.narrow_seq(x, m, epilogue, reads, pick, y, &mut scratch.a, &mut scratch.narrow)
            }
        }
    }
}

/// The block function of `mr` rows by `g` panels: every shape a path asks
/// for is compiled ([`dispatch`] lists them), so a miss is this module's bug.
fn kernel<const W: usize>(pick: &impl Pick<W>, mr: usize, g: usize) -> Kernel<W> {
    pick(mr, g).unwrap_or_else(|| unreachable!("no {mr} x {g} block compiled for {W}-column panels"))
}

/// How the blocked path splits rows and k.
#[derive(Clone, Copy, Debug)]
struct Blocking {
    /// At most this many rows per task.
    max_rows: usize,
    /// Depth of one pass over a panel.
    kc: usize,
    /// Whether to ask for the next slice ahead.
    next_slice: NextSlice,
    /// Rows a micro-panel may take beyond a full block ([`RowSplit`]) where
    /// the weights come from memory: 2 with AVX-512 (a 14-row block holds
    /// 28 accumulators, 2 weight vectors and a broadcast row value in the
    /// 32 zmm), none with AVX2's 16 ymm.
    stretch: usize,
    /// The k rows the first micro-panel of a slice asks ahead (0: none).
    ahead: usize,
    /// Panels per block for a tail of so many rows
    /// ([`dispatch::wide_groups`] or [`dispatch::narrow_groups`]).
    tail_groups: fn(usize) -> usize,
}

impl Blocking {
    /// AVX-512: tasks of at most 168 rows: their packed rows (672 KiB for
    /// K = 1024) stay in a 2 MiB L2 while every panel goes by; 256 x 32
    /// weights (32 KiB) stay in L1 while every micro-panel of the task's
    /// rows goes by.
    const WIDE: Blocking = Blocking {
        max_rows: 168,
        kc: 256,
        next_slice: NextSlice::Leave,
        stretch: 2,
        ahead: ahead_rows::<NR>(),
        tail_groups: dispatch::wide_groups,
    };
    /// AVX2: tasks of at most about 504 rows: each task streams every
    /// weight once (from L3 or memory), and fewer, longer sweeps over a
    /// panel (64 KiB for K = 1024, in L2) amortize that better than packed
    /// rows fitting L2 would (measured on Zen 3, 512 KiB of L2: 168-row
    /// tasks were 10 % slower, 84-row ones 20 %); a whole panel at K = 1024
    /// per pass: blocking it to fit L1 measured no faster, and every pass
    /// costs a store and reload of the outputs.
    const NARROW: Blocking = Blocking {
        max_rows: 504,
        kc: 1024,
        next_slice: NextSlice::Leave,
        stretch: 0,
        ahead: ahead_rows::<NR_NARROW>(),
        tail_groups: dispatch::narrow_groups,
    };

    /// This blocking with the next-slice hint `next_slice`, for weights
    /// found where `residency` says (no stretch and nothing asked ahead
    /// for cached ones).
    fn for_layer(self, next_slice: NextSlice, residency: Residency) -> Blocking {
        match residency {
            Residency::Memory => Blocking { next_slice, ..self },
            Residency::Cache => Blocking { next_slice, stretch: 0, ahead: 0, ..self },
        }
    }

    /// How `m` rows and `panels` panels split into tasks on `threads`
    /// threads.
    ///
    /// - As few row blocks as `max_rows` allows. Where that is at least the
    ///   thread count, or where one block per thread still gives every task
    ///   [`MIN_PANELS_PER_TASK`] micro-panels: blocks rounded up to a
    ///   multiple of the thread count, whole width each.
    /// - Otherwise (few rows, many threads) the blocks' panels are split
    ///   into groups, a task per block and group: row tasks that short
    ///   would each stream every weight for few rows, and below one
    ///   micro-panel per thread some threads would have nothing to do (12
    ///   rows on two threads ran on one: 3.8 ms for the smpl tracker's
    ///   forward; 2.0 ms in two panel groups, Zen 4).
    /// - The rows are shared equally between blocks (the last one at most
    ///   `blocks - 1` rows short), never more blocks than micro-panels.
    ///   Equal shares, not whole micro-panels: rounding each block up to a
    ///   multiple of `mr` split 128 rows on two threads 72/56, and the
    ///   forward waited for the longer task (14.4 ms against 13.3 for
    ///   64/64, Zen 4); a last micro-panel of fewer rows (its own block
    ///   shape) costs far less than that. One thread, with nothing to
    ///   balance, gets blocks of whole micro-panels.
    fn grid(self, m: usize, panels: usize, threads: usize, mr: usize) -> Grid {
        let threads = threads.max(1);
        let blocks = m.div_ceil(self.max_rows).max(1);
        let long_enough = m / threads >= MIN_PANELS_PER_TASK * mr;
        let (blocks, groups) = if blocks >= threads || long_enough {
            (blocks.div_ceil(threads) * threads, 1)
        } else {
            (blocks, (threads / blocks).clamp(1, panels.max(1)))
        };
        let rows = m.div_ceil(blocks.min(m.div_ceil(mr)).max(1));
        // one thread has nothing to balance: whole micro-panels (as many
        // blocks), as the one-thread measurements on the Xeon ran them,
        // rather than a partial one in every block (a micro-panel of 1 to
        // 3 rows has too few accumulators to hide the FMA latency of a
        // core with two 512-bit FMA pipes; level either way on Zen 4)
        let rows = if threads == 1 { (rows.div_ceil(mr) * mr).min(self.max_rows.max(rows)) } else { rows };
        Grid { rows, groups }
    }
}

/// Micro-panels a row task needs before rows are split between threads
/// rather than panels: row tasks of 32 rows (under three 12-row micro-panels)
/// made the smpl tracker's forward at 64 rows on two threads 8 % slower
/// than two panel groups of all 64 rows; at 112 rows and more two row
/// blocks were up to 4 % faster (two panel groups each pack every row and
/// copy half their outputs into place). Zen 4, AVX-512.
const MIN_PANELS_PER_TASK: usize = 4;

/// How far ahead of its reads a block asks for the weights it will read
/// (`prefetcht0`, in the micro-kernel's loop): 16 KiB.
///
/// The hardware's prefetchers stop at every 4 KiB page, so a block that
/// reads a weight slice straight from memory waited for each page's first
/// lines: at 8 to 64 rows the forward was bound by that latency, neither
/// by memory bandwidth nor by the fused multiply-adds. Asked 16 KiB ahead
/// (Zen 5, one thread, ten 1024 x 1024 layers: the `sweep` example), 12
/// rows went from 1.75 to 1.10 ms, 8 from 1.37 to 0.84, 64 from 7.1 to
/// 6.0; 8 KiB ahead gained half that, 32 and 64 KiB the same as 16.
pub(crate) const PREFETCH_AHEAD_BYTES: usize = 16 * 1024;

/// [`PREFETCH_AHEAD_BYTES`] in k rows of a `W`-column panel.
const fn ahead_rows<const W: usize>() -> usize {
    PREFETCH_AHEAD_BYTES / (W * std::mem::size_of::<f32>())
}

/// Narrow-path blocks one panel wide ask ahead; a row's block of 4
/// panels does not: its 4 streams' loads already fill the load ports, and
/// asking ahead on each made 1 row 10-35 % slower (Zen 5), where the
/// hardware keeps up with 4 streams.
const PREFETCH_PANELS: usize = 1;

/// Micro-panels a task needs before [`NextSlice::Prefetch`] asks for the
/// next slice: its requests spread over that many sweeps.
const MIN_PANELS_TO_HINT: usize = 4;

/// The tasks of one [`Panels::blocked`] call: blocks of `rows` rows (the
/// last may be shorter), each split into `groups` groups of panels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Grid {
    rows: usize,
    groups: usize,
}

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

    /// The rows of panels `p0..` (a block reads `g` of them, `k` apart).
    fn panels_from(&self, p0: usize) -> &[Cols<W>] {
        &self.rows[p0 * self.k..]
    }

    /// [`Panels::narrow`] on this thread, in the caller's buffers: the same
    /// tiles ([`Panels::tile`]), so the same bits; nothing allocated once the
    /// buffers have grown to the layer's size.
    #[allow(clippy::too_many_arguments)]
    fn narrow_seq(
        &self,
        x: &[f32],
        m: usize,
        epilogue: Epilogue,
        (g, ahead): (usize, usize),
        pick: impl Pick<W>,
        y: &mut [f32],
        a: &mut Vec<f32>,
        tiles: &mut Vec<Cols<W>>,
    ) {
        let (full, single) = (kernel(&pick, m, g), kernel(&pick, m, 1));
        interleave_rows_into(x, m, self.k, a);
        tiles.clear();
        tiles.resize(self.n.div_ceil(W).div_ceil(g) * g * m, Cols::ZERO);
        for (gi, tile) in tiles.chunks_mut(m * g).enumerate() {
            self.tile(a, m, (g, ahead), gi, full, single, tile, epilogue);
        }
        self.scatter(tiles, m, g, y);
    }

    /// Group `gi` of `g` panels for the `m` interleaved rows `a`: one block
    /// of `full`, or for the last, partial group its panels one at a time,
    /// each asking `ahead` k rows ahead.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn tile(
        &self,
        a: &[f32],
        m: usize,
        (g, ahead): (usize, usize),
        gi: usize,
        full: Kernel<W>,
        single: Kernel<W>,
        tile: &mut [Cols<W>],
        epilogue: Epilogue,
    ) {
        let (k, p) = (self.k, self.n.div_ceil(W));
        let p0 = gi * g;
        if p0 + g <= p {
            full.run(a, self.panels_from(p0), k, &self.bias[p0..p0 + g], tile, Start::Bias, epilogue, ahead);
        } else {
            let mut spare = [Cols::<W>::ZERO; MR_WIDE];
            let one = &mut spare[..m];
            for (j, pi) in (p0..p).enumerate() {
                single.run(a, self.panels_from(pi), k, &self.bias[pi..pi + 1], one, Start::Bias, epilogue, ahead);
                for (r, c) in one.iter().enumerate() {
                    tile[r * g + j] = *c;
                }
            }
        }
    }

    /// The tiles' columns into the rows of `y`.
    fn scatter(&self, tiles: &[Cols<W>], m: usize, g: usize, y: &mut [f32]) {
        for (r, dst) in y.chunks_mut(self.n).enumerate() {
            for (pi, cols) in dst.chunks_mut(W).enumerate() {
                let t = &tiles[(pi / g) * g * m + r * g + pi % g];
                cols.copy_from_slice(&t.0[..cols.len()]);
            }
        }
    }

    /// Fewer rows than a full block: one block of exactly `m` rows, `g`
    /// panels at a time (asking `ahead` k rows ahead), groups of panels in
    /// parallel; every weight is read once for all rows.
    #[allow(clippy::too_many_arguments)]
    fn narrow(
        &self,
        x: &[f32],
        m: usize,
        epilogue: Epilogue,
        g: usize,
        ahead: usize,
        pick: impl Pick<W>,
        y: &mut [f32],
    ) {
        let (full, single) = (kernel(&pick, m, g), kernel(&pick, m, 1));
        // the rows interleaved by k (a copy of x itself for one row)
        let a = interleave_rows(x, m, self.k);
        // each group's tile: [m][g]
        let mut tiles = vec![Cols::ZERO; self.n.div_ceil(W).div_ceil(g) * g * m];
        tiles
            .par_chunks_mut(m * g)
            .enumerate()
            .for_each(|(gi, tile)| self.tile(&a, m, (g, ahead), gi, full, single, tile, epilogue));
        self.scatter(&tiles, m, g, y);
    }

    /// Tasks in parallel ([`Blocking::grid`]: blocks of rows, for few rows
    /// also groups of panels); each task packs its rows, then goes panel by
    /// panel of its group (K in blocks) and writes its outputs.
    fn blocked<const MR: usize>(
        &self,
        x: &[f32],
        m: usize,
        epilogue: Epilogue,
        blocking: Blocking,
        pick: impl Pick<W>,
        y: &mut [f32],
    ) where
        KernelScratch: Tiles<W>,
    {
        let n = self.n;
        let p = n.div_ceil(W);
        let Grid { rows: mc, groups } = blocking.grid(m, p, rayon::current_num_threads(), MR);
        let run = |first: usize, panels: Range<usize>, out: Out<'_>| {
            let task = BlockTask { x, first, epilogue, blocking, pick: &pick };
            TASK_BUFFERS.with(|cell| match cell.try_borrow_mut() {
                Ok(mut buffers) => self.block_task::<MR>(&task, panels, out, &mut buffers),
                // a forward inside a task on this thread: buffers of its own
                Err(_) => self.block_task::<MR>(&task, panels, out, &mut KernelScratch::default()),
            })
        };
        if groups == 1 {
            y.par_chunks_mut(mc * n)
                .enumerate()
                .for_each(|(blk, ys)| run(blk * mc, 0..p, Out { y: ys, stride: n, first_col: 0 }));
            return;
        }
        // group 0 writes its columns of `y` in place, the others their own
        // buffers, copied into place once all are done
        let bound = |g: usize| g * p / groups;
        y.par_chunks_mut(mc * n).enumerate().for_each(|(blk, ys)| {
            let rows = ys.len() / n;
            let (_, side) = rayon::join(
                || run(blk * mc, 0..bound(1), Out { y: &mut *ys, stride: n, first_col: 0 }),
                || {
                    (1..groups)
                        .into_par_iter()
                        .map(|g| {
                            let (lo, hi) = (bound(g), bound(g + 1));
                            let cols = (hi * W).min(n) - lo * W;
                            let mut side = vec![0.0; rows * cols];
                            run(blk * mc, lo..hi, Out { y: &mut side, stride: cols, first_col: lo * W });
                            (lo * W, cols, side)
                        })
                        .collect::<Vec<_>>()
                },
            );
            for (c0, cols, s) in side {
                for (dst, src) in ys.chunks_exact_mut(n).zip(s.chunks_exact(cols)) {
                    dst[c0..c0 + cols].copy_from_slice(src);
                }
            }
        });
    }

    /// One task of [`Panels::blocked`]: the rows of `out` (from row
    /// `task.first` of `x`), packed into `buffers.a`, their outputs in
    /// `panels` built in `buffers`' tile and stored into `out`.
    ///
    /// The rows go as [`RowSplit`] says: whole micro-panels of `MR` rows
    /// (up to `MR + stretch`: 13 rows in one block of 13), and where rows
    /// are left a tail of fewer. The whole micro-panels go panel by panel
    /// (a block one panel wide keeps enough accumulators), reading the
    /// weights in the order they lie in memory; then the tail goes over
    /// each group of `blocking.tail_groups(tail)` panels at once, the group's
    /// slices still in L2 from those sweeps, so that a tail of one to six
    /// rows keeps at least 8 accumulators too. Measured on one thread,
    /// Zen 5, ten 1024 x 1024 layers (the `sweep` example), fastest calls:
    ///
    /// - a tail one panel at a time (as before) was latency-bound: 13
    ///   rows took 29 % longer than 12 (a row of 2 accumulators, each
    ///   fused multiply-add waiting on the one before); over groups 10 %,
    ///   and 13 rows in one stretched block 8 %;
    /// - the group's panels a K block at a time (the tail fused into the
    ///   same pass) read four streams 128 KiB apart: 13 rows 35 % slower
    ///   than 12 even with the tail left out;
    /// - micro-panels of balanced sizes under `MR` (13 as 7 + 6) were 10 %
    ///   slower at 13 rows and 7 % at 64 (six of 10 or 11 rows: more
    ///   weight loads per fused multiply-add than five of 12 and a tail).
    fn block_task<const MR: usize>(
        &self,
        task: &BlockTask<'_, W, impl Pick<W>>,
        panels: Range<usize>,
        out: Out<'_>,
        buffers: &mut KernelScratch,
    ) where
        KernelScratch: Tiles<W>,
    {
        let (k, n) = (self.k, self.n);
        let BlockTask { x, first, epilogue, blocking, pick } = *task;
        let Out { y: ys, stride, first_col } = out;
        let rows = ys.len() / stride;
        let (a, tile) = buffers.split();
        let split = RowSplit::new(rows, MR, blocking.stretch);
        pack_rows::<MR>(x, k, first, split, a);
        let a = &a[..];
        let RowSplit { whole, tail, .. } = split;
        // the block functions of the whole micro-panels' sizes
        let (size, larger) = split.sizes();
        let full = (kernel(pick, size, 1), larger.map(|r| kernel(pick, r, 1)));
        // panels per group: 1 without a tail (the sweep of whole
        // micro-panels alone, panel by panel)
        let g = if tail > 0 { (blocking.tail_groups)(tail) } else { 1 };
        // the tail's rows and its block functions: `tail x g` for a whole
        // group, `tail x 1` for each panel of a last, partial one
        let tail_rows = &a[whole * k..];
        let tail_kernels = (tail > 0).then(|| (kernel(pick, tail, g), kernel(pick, tail, 1)));
        // every element of the tile is written (`Start::Bias`) before it
        // is read: the whole micro-panels' rows of one panel, then the
        // tail's `[tail][g]`
        tile.resize(whole + g * tail, Cols::ZERO);
        let (tile, tail_tile) = tile[..whole + g * tail].split_at_mut(whole);
        let end = panels.end;
        for p0 in panels.step_by(g) {
            let gp = g.min(end - p0);
            // the whole micro-panels panel by panel, K in blocks: the
            // weights read in the order they lie in memory (a group's
            // panels a K block at a time, four streams 128 KiB apart, made
            // 13 rows 35 % slower than 12 on Zen 5, the tail's work or not)
            for pi in p0..p0 + gp {
                self.sweep_panel(a, split, pi, end, blocking, full, epilogue, tile, ys, stride, first_col);
            }
            // then the tail over the group, its slices in L2 from the sweeps
            let Some((group, single)) = tail_kernels else { continue };
            let ys = &mut ys[whole * stride..];
            for KBlock { k0, k1, start, last, epilogue: ep } in k_blocks(k, blocking.kc, epilogue) {
                let xs = &tail_rows[k0 * tail..k1 * tail];
                if gp == g {
                    // one block over the group: `[tail][g]`
                    let b = &self.panels_from(p0)[k0..];
                    group.run(xs, b, k, &self.bias[p0..p0 + g], tail_tile, start, ep, 0);
                    if last {
                        for (yrow, t) in ys.chunks_exact_mut(stride).zip(tail_tile.chunks_exact(g)) {
                            for (j, t) in t.iter().enumerate() {
                                let (c0, w) = ((p0 + j) * W, W.min(n - (p0 + j) * W));
                                store(std::slice::from_ref(t), yrow, stride, c0 - first_col, w);
                            }
                        }
                    }
                } else {
                    // a last, partial group: its panels one at a time, `[j][tail]`
                    for (j, o) in tail_tile.chunks_exact_mut(tail).take(gp).enumerate() {
                        let pi = p0 + j;
                        single.run(xs, &self.panels_from(pi)[k0..k1], k, &self.bias[pi..pi + 1], o, start, ep, 0);
                        if last {
                            store(o, ys, stride, pi * W - first_col, W.min(n - pi * W));
                        }
                    }
                }
            }
        }
    }

    /// The whole micro-panels of a task (`split`, in `a`) over panel `pi`,
    /// K in blocks of `blocking.kc`, their outputs stored into `ys`
    /// (`stride` wide, from output column `first_col`); `end` is the task's
    /// last panel (exclusive), for the next-slice hint; `full` the block
    /// functions of the micro-panels' two sizes.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn sweep_panel(
        &self,
        a: &[f32],
        split: RowSplit,
        pi: usize,
        end: usize,
        blocking: Blocking,
        full: (Kernel<W>, Option<Kernel<W>>),
        epilogue: Epilogue,
        tile: &mut [Cols<W>],
        ys: &mut [f32],
        stride: usize,
        first_col: usize,
    ) {
        let (k, n) = (self.k, self.n);
        let (size, _) = split.sizes();
        let hint = blocking.next_slice == NextSlice::Prefetch && split.count >= MIN_PANELS_TO_HINT;
        let b = self.panels_from(pi);
        let bias = &self.bias[pi..pi + 1];
        let (c0, w) = (pi * W, W.min(n - pi * W));
        for KBlock { k0, k1, start, last, epilogue: ep } in k_blocks(k, blocking.kc, epilogue) {
            let bk = &b[k0..k1];
            // the slice swept next, asked for a share at a time before
            // each micro-panel where the hint pays ([`NextSlice`]): the
            // first sweep of a slice would otherwise wait for it to come
            // from L3 or memory
            let next = if k1 < k {
                &b[k1..(k1 + blocking.kc).min(k)]
            } else if pi + 1 < end {
                &self.panels_from(pi + 1)[..blocking.kc.min(k)]
            } else {
                &[]
            };
            let share = next.len().div_ceil(split.count.max(1));
            for (i, (r0, r)) in split.panels().enumerate() {
                if hint {
                    dispatch::prefetch(next.chunks(share.max(1)).nth(i).unwrap_or(&[]));
                }
                let kernel = match full {
                    (_, Some(larger)) if r != size => larger,
                    (kernel, _) => kernel,
                };
                let o = &mut tile[r0..r0 + r];
                let panel = &a[r0 * k..][..r * k];
                // the first micro-panel reads the slice from memory, asking
                // ahead; the others find it in L1
                let ahead = if i == 0 { blocking.ahead } else { 0 };
                kernel.run(&panel[k0 * r..k1 * r], bk, k, bias, o, start, ep, ahead);
                if last {
                    // stored now, the stores drain while the next
                    // micro-panel computes (one pass over the whole tile
                    // after the sweep stalled on them: 3 % of a forward)
                    store(o, &mut ys[r0 * stride..][..r * stride], stride, c0 - first_col, w);
                }
            }
        }
    }
}

/// One pass of a block over the k range `k0..k1`.
#[derive(Clone, Copy, Debug)]
struct KBlock {
    k0: usize,
    k1: usize,
    /// From the bias (the first pass) or the partial sums stored before.
    start: Start,
    /// The last pass: the outputs are final and stored.
    last: bool,
    /// The forward's epilogue on the last pass, none before.
    epilogue: Epilogue,
}

/// The passes over `0..k` in blocks of `kc` (the last may be shorter).
fn k_blocks(k: usize, kc: usize, epilogue: Epilogue) -> impl Iterator<Item = KBlock> {
    (0..k).step_by(kc.max(1)).map(move |k0| {
        let k1 = (k0 + kc).min(k);
        KBlock {
            k0,
            k1,
            start: if k0 == 0 { Start::Bias } else { Start::Partial },
            last: k1 == k,
            epilogue: if k1 == k { epilogue } else { Epilogue::Identity },
        }
    })
}

/// Where a task of [`Panels::blocked`] writes: rows `stride` wide whose
/// first element is output column `first_col`.
struct Out<'a> {
    y: &'a mut [f32],
    stride: usize,
    first_col: usize,
}

/// What every task of one [`Panels::blocked`] call shares.
struct BlockTask<'a, const W: usize, P> {
    x: &'a [f32],
    /// The task's first row of `x`.
    first: usize,
    epilogue: Epilogue,
    blocking: Blocking,
    pick: &'a P,
}

impl<const W: usize, P> Clone for BlockTask<'_, W, P> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<const W: usize, P> Copy for BlockTask<'_, W, P> {}

thread_local! {
    /// Each thread's packed rows and output tile for the blocked path,
    /// kept across calls. Fresh per task, they were 0.3-2.7 MB blocks
    /// that the allocator hands back to the kernel between calls: every
    /// forward then paid page faults and page zeroing for them (7 % of
    /// MaskedMimic's batch-256 forward on an AVX-512 EPYC). They grow to
    /// the largest task seen (at most `Blocking::max_rows` rows of the
    /// widest input) and stay that size.
    static TASK_BUFFERS: RefCell<KernelScratch> = RefCell::new(KernelScratch::default());
}

/// The packed rows and the tile buffer of a [`KernelScratch`] for
/// `W`-column panels.
trait Tiles<const W: usize> {
    fn split(&mut self) -> (&mut Vec<f32>, &mut Vec<Cols<W>>);
}

impl Tiles<NR> for KernelScratch {
    fn split(&mut self) -> (&mut Vec<f32>, &mut Vec<Cols<NR>>) {
        (&mut self.a, &mut self.wide)
    }
}

impl Tiles<NR_NARROW> for KernelScratch {
    fn split(&mut self) -> (&mut Vec<f32>, &mut Vec<Cols<NR_NARROW>>) {
        (&mut self.a, &mut self.narrow)
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

/// How a task's rows go through the micro-kernel: `count` whole
/// micro-panels sharing the first `whole` rows as equally as they can
/// (each `MR` to `MR + stretch` rows), then a tail of fewer than `MR` rows
/// (computed over groups of panels).
///
/// Rows left over from whole micro-panels go into them where they fit
/// (with AVX-512, 13 rows as one micro-panel of 13, 26 as two of 13):
/// a stretched micro-panel costs its rows' share, where a tail pays for
/// reading the weights once more from L2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RowSplit {
    count: usize,
    whole: usize,
    tail: usize,
}

impl RowSplit {
    /// `rows` rows in micro-panels of `mr` rows stretched by up to `stretch`.
    fn new(rows: usize, mr: usize, stretch: usize) -> RowSplit {
        let (count, tail) = (rows / mr, rows % mr);
        if tail <= count * stretch {
            RowSplit { count, whole: rows, tail: 0 }
        } else {
            RowSplit { count, whole: rows - tail, tail }
        }
    }

    /// The whole micro-panels' size, and the larger one of the first
    /// `whole % count` (if any).
    fn sizes(self) -> (usize, Option<usize>) {
        let size = self.whole / self.count.max(1);
        (size, (!self.whole.is_multiple_of(self.count.max(1))).then_some(size + 1))
    }

    /// `(first row, rows)` of each whole micro-panel, in order.
    fn panels(self) -> impl Iterator<Item = (usize, usize)> {
        let (size, _) = self.sizes();
        let larger = self.whole % self.count.max(1);
        (0..self.count).map(move |i| (i * size + i.min(larger), size + usize::from(i < larger)))
    }
}

/// Rows `first..` of `x` (`[m, k]`) packed as `split` says: each whole
/// micro-panel `[k][r]` (`r` its rows), then the tail `[k][tail]`, one
/// after the other, into `a` (resized; every element is written).
fn pack_rows<const MR: usize>(x: &[f32], k: usize, first: usize, split: RowSplit, a: &mut Vec<f32>) {
    let rows = split.whole + split.tail;
    a.resize(rows * k, 0.0);
    let tail = (split.tail > 0).then_some((split.whole, split.tail));
    for (r0, r) in split.panels().chain(tail) {
        let f = first + r0;
        let dst = &mut a[r0 * k..][..r * k];
        if r == MR {
            // MR sequential streams in, one contiguous stream out; every
            // index in range by construction (no bounds checks left)
            let src: [&[f32]; MR] = std::array::from_fn(|r| &x[(f + r) * k..][..k]);
            for (kk, d) in (0..k).zip(dst.chunks_exact_mut(MR)) {
                for r in 0..MR {
                    d[r] = src[r][kk];
                }
            }
        } else {
            for (row, src) in x[f * k..(f + r) * k].chunks_exact(k.max(1)).enumerate() {
                for (d, &v) in dst[row..].iter_mut().step_by(r).zip(src) {
                    *d = v;
                }
            }
        }
    }
}

/// All `m` rows of `x` (`[m, k]`) interleaved by k: `[k][m]` (one row is
/// copied as it is).
/// [`interleave_rows`] into `a` (its capacity reused).
fn interleave_rows_into(x: &[f32], m: usize, k: usize, a: &mut Vec<f32>) {
    a.clear();
    if m == 1 {
        a.extend_from_slice(x);
        return;
    }
    a.resize(m * k, 0.0);
    for (r, row) in x.chunks_exact(k).enumerate() {
        for (d, &v) in a[r..].iter_mut().step_by(m).zip(row) {
            *d = v;
        }
    }
}

fn interleave_rows(x: &[f32], m: usize, k: usize) -> Vec<f32> {
    let mut a = Vec::new();
    interleave_rows_into(x, m, k, &mut a);
    a
}

/// Test inputs shared with the crates whose tests check their kernels'
/// bits (the policy crate's MLP and transformer).
#[doc(hidden)]
pub mod testing {
    /// Uniform in [-1, 1): values that round in every sum, so any change
    /// of order shows in the bits.
    pub fn values(len: usize, seed: u32, scale: f32) -> Vec<f32> {
        let mut s = seed | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                ((s as f32 / u32::MAX as f32) * 2.0 - 1.0) * scale
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::values;
    use super::*;

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|v| v.to_bits()).collect()
    }

    /// Every instruction set this CPU has, the others named on stderr.
    fn supported() -> Vec<Isa> {
        Isa::ALL
            .into_iter()
            .filter(|isa| {
                let ok = isa.is_supported();
                if !ok {
                    eprintln!("skipped: this CPU lacks {isa} (its kernels are checked on machines that have it)");
                }
                ok
            })
            .collect()
    }

    #[test]
    fn every_instruction_set_gives_the_portable_paths_bits() {
        // every row count of the narrow path (1 to 11 on AVX-512, 1 to 5
        // elsewhere), full and partial panel groups, and the blocked path
        // with a partial micro-panel and K blocked in several passes
        for (m, n, k) in [(1, 300, 257), (2, 70, 1030), (3, 33, 5), (4, 129, 64), (5, 16, 300), (7, 200, 40)]
            .into_iter()
            .chain([(11, 65, 513), (12, 45, 300), (13, 70, 1030), (29, 33, 600), (200, 40, 100)])
            // a tail of every length after whole micro-panels, over whole
            // groups of panels and a last, partial one (10 wide panels, 19
            // narrow), K in one and several passes
            .chain((13..=23).map(|m| (m, 300, if m % 2 == 0 { 70 } else { 700 })))
        {
            let w = values(n * k, 0x9e37_79b9 ^ (m * n) as u32, 0.37);
            let b = values(n, 0x85eb_ca6b, 1.0);
            let x = values(m * k, 0xc2b2_ae35 ^ k as u32, 3.1);
            let portable = PackedLinear::with_isa(&w, &b, n, k, Isa::Scalar).expect("the portable path runs anywhere");
            for ep in [Epilogue::Identity, Epilogue::Relu] {
                let want = bits(&portable.forward(&x, m, ep));
                for isa in supported() {
                    let p = PackedLinear::with_isa(&w, &b, n, k, isa).expect("a supported instruction set");
                    assert_eq!(p.isa(), isa);
                    for hint in [NextSlice::Prefetch, NextSlice::Leave] {
                        for residency in [Residency::Memory, Residency::Cache] {
                            let p = p.clone().with_next_slice(hint).with_residency(residency);
                            let got = bits(&p.forward(&x, m, ep));
                            assert_eq!(got, want, "{isa}, {hint:?}, {residency:?}: {m} x {n} x {k}, {ep:?}");
                        }
                    }
                }
            }
        }
    }

    /// An `mr`-row, 2-panel block given a weight slice one row short.
    fn short_weights<const W: usize>(kernel: Kernel<W>, mr: usize) -> std::thread::Result<()> {
        std::panic::catch_unwind(|| {
            let kc = 8;
            let a = vec![1f32; mr * kc];
            let b = vec![Cols::<W>::ZERO; 2 * kc - 1];
            let bias = vec![Cols::<W>::ZERO; 2];
            let mut out = vec![Cols::<W>::ZERO; mr * 2];
            kernel.run(&a, &b, kc, &bias, &mut out, Start::Bias, Epilogue::Identity, 0);
        })
    }

    #[test]
    fn a_block_given_short_slices_panics_instead_of_reading_past_them() {
        for isa in supported() {
            let s = Supported::check(isa).expect("supported");
            let result = match isa {
                Isa::Avx512 => short_weights(dispatch::wide(s, 4, 2).expect("a 4 x 2 block"), 4),
                _ => short_weights(dispatch::narrow(s, 2, 2).expect("a 2 x 2 block"), 2),
            };
            assert!(result.is_err(), "{isa}: a short weight slice must panic");
        }
    }

    #[test]
    fn an_instruction_set_the_cpu_lacks_is_refused() {
        for isa in Isa::ALL.into_iter().filter(|i| !i.is_supported()) {
            let e = PackedLinear::with_isa(&[1.0], &[0.0], 1, 1, isa).expect_err("refused");
            assert!(matches!(e, IsaError::Unsupported { isa: got, .. } if got == isa), "{e}");
        }
        // the portable path is always there
        assert!(PackedLinear::with_isa(&[1.0], &[0.0], 1, 1, Isa::Scalar).is_ok());
    }

    #[test]
    fn a_nan_input_gives_nan_through_the_relu_epilogue_as_in_torch() {
        // One NaN feature poisons every output of its row (as torch's
        // Linear + ReLU does); the other rows stay finite, on both paths
        // (one and 5 rows: narrow; 13 rows: blocked) and every instruction set.
        let (n, k) = (20, 33);
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 7 % 23) as f32 - 11.0) / 32.0).collect();
        let b = vec![-0.25f32; n];
        for isa in supported() {
            let p = PackedLinear::with_isa(&w, &b, n, k, isa).expect("a supported instruction set");
            for m in [1usize, 5, 13] {
                let mut x: Vec<f32> = (0..m * k).map(|i| ((i * 5 % 17) as f32 - 8.0) / 8.0).collect();
                x[3] = f32::NAN;
                let y = p.forward(&x, m, Epilogue::Relu);
                assert!(y[..n].iter().all(|v| v.is_nan()), "{isa} batch {m}: {:?}", &y[..n]);
                assert!(y[n..].iter().all(|v| v.is_finite() && *v >= 0.0), "{isa} batch {m}");
            }
        }
    }

    #[test]
    fn a_row_is_bitwise_the_same_in_any_batch_on_every_path() {
        // 5 wide panels (a tail's group of 4 and a partial one), 9 narrow
        let (n, k) = (140, 1030);
        let w = values(n * k, 0x9e37_79b9, 0.37);
        let b = values(n, 0x1234_5678, 1.0);
        let rows: Vec<Vec<f32>> = (0..200).map(|i| values(k, 0xabcd + i, 3.1)).collect();
        let portable = PackedLinear::with_isa(&w, &b, n, k, Isa::Scalar).expect("the portable path");
        let alone: Vec<Vec<f32>> = rows.iter().map(|r| portable.forward(r, 1, Epilogue::Relu)).collect();
        // three threads: three row blocks, or three tasks over panel groups
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().expect("a rayon pool");
        for isa in supported() {
            for residency in [Residency::Memory, Residency::Cache] {
                let p = PackedLinear::with_isa(&w, &b, n, k, isa).expect("a supported instruction set");
                let p = p.with_residency(residency);
                for m in [1usize, 2, 3, 4, 5, 6, 7, 11, 12, 13, 14, 15, 16, 17, 18, 22, 25, 169, 200] {
                    let idx: Vec<usize> = (0..m).map(|j| (j * 37 + m) % rows.len()).collect();
                    let x: Vec<f32> = idx.iter().flat_map(|&i| rows[i].iter().copied()).collect();
                    for threads in [None, Some(&pool)] {
                        let y = match threads {
                            None => p.forward(&x, m, Epilogue::Relu),
                            Some(pool) => pool.install(|| p.forward(&x, m, Epilogue::Relu)),
                        };
                        for (j, &i) in idx.iter().enumerate() {
                            assert_eq!(
                                bits(&y[j * n..(j + 1) * n]),
                                bits(&alone[i]),
                                "{isa}, {residency:?}: row {i} at position {j} of {m}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn layers_over_a_mebibyte_of_weights_are_read_as_streamed_from_memory() {
        let layer = |n: usize, k: usize| {
            PackedLinear::with_isa(&vec![0.5; n * k], &vec![0.0; n], n, k, Isa::Scalar).expect("the portable path")
        };
        // 512 x 512 float32 is 1 MiB: cached; one column more streams
        assert_eq!(layer(512, 512).residency(), Residency::Cache);
        assert_eq!(layer(513, 512).residency(), Residency::Memory);
        assert_eq!(layer(1024, 1024).residency(), Residency::Memory);
        assert_eq!(layer(3, 0).residency(), Residency::Cache);
    }

    #[test]
    fn a_tasks_rows_split_into_micro_panels_that_cover_them_once() {
        for (mr, stretch) in [(MR_WIDE, Blocking::WIDE.stretch), (MR_NARROW, Blocking::NARROW.stretch)] {
            for rows in 1..=400 {
                let split = RowSplit::new(rows, mr, stretch);
                let mut next = 0;
                for (r0, r) in split.panels() {
                    assert_eq!(r0, next, "{rows} rows by {mr}: {split:?}");
                    assert!((mr..=mr + stretch).contains(&r), "{rows} rows by {mr}: a micro-panel of {r}");
                    next += r;
                }
                assert_eq!(next, split.whole, "{rows} rows by {mr}: {split:?}");
                assert_eq!(split.whole + split.tail, rows);
                assert!(split.tail < mr, "{rows} rows by {mr}: {split:?}");
                // a tail only where the whole micro-panels cannot take it
                assert!(split.tail == 0 || split.tail > split.count * stretch, "{rows} rows by {mr}: {split:?}");
            }
        }
        // AVX-512: 13 rows in one stretched micro-panel, 27 as 14 + 13,
        // 15 as 12 and a tail of 3
        assert_eq!(RowSplit::new(13, 12, 2).panels().collect::<Vec<_>>(), [(0, 13)]);
        assert_eq!(RowSplit::new(27, 12, 2).panels().collect::<Vec<_>>(), [(0, 14), (14, 13)]);
        assert_eq!(RowSplit::new(15, 12, 2), RowSplit { count: 1, whole: 12, tail: 3 });
    }

    #[test]
    fn tasks_share_rows_equally_and_split_panels_only_for_few_rows() {
        let wide = Blocking::WIDE;
        // a row split of whole width where every thread gets 4 micro-panels
        assert_eq!(wide.grid(128, 32, 2, 12), Grid { rows: 64, groups: 1 });
        assert_eq!(wide.grid(256, 32, 2, 12), Grid { rows: 128, groups: 1 });
        // more blocks than threads: rounded up to a multiple of them
        assert_eq!(wide.grid(400, 32, 2, 12), Grid { rows: 100, groups: 1 });
        // few rows: every row in one block, the panels in one group per thread
        assert_eq!(wide.grid(12, 32, 2, 12), Grid { rows: 12, groups: 2 });
        assert_eq!(wide.grid(64, 32, 2, 12), Grid { rows: 64, groups: 2 });
        // never more groups than panels
        assert_eq!(wide.grid(13, 7, 8, 12), Grid { rows: 13, groups: 7 });
        // one thread: one task, or blocks of whole micro-panels
        assert_eq!(wide.grid(100, 32, 1, 12), Grid { rows: 108, groups: 1 });
        assert_eq!(wide.grid(1024, 32, 1, 12), Grid { rows: 156, groups: 1 });
        for blocking in [Blocking::WIDE, Blocking::NARROW] {
            for threads in 1..=9 {
                for m in 1..=1200 {
                    let Grid { rows, groups } = blocking.grid(m, 40, threads, 6);
                    let blocks = m.div_ceil(rows);
                    assert!(rows <= blocking.max_rows, "{m} rows on {threads}: blocks of {rows}");
                    // several threads: the last block at most `blocks - 1` rows short
                    assert!(threads == 1 || blocks * rows - m < blocks, "{m} rows on {threads}: blocks of {rows}");
                    // panel groups only to give idle threads work
                    assert!(groups == 1 || blocks * groups <= threads, "{m} rows on {threads}: {blocks} x {groups}");
                    // and no thread idle where the thread count divides evenly
                    // (12 rows on two threads once made one task)
                    if [2, 4, 8].contains(&threads) {
                        assert!(blocks * groups >= threads, "{m} rows on {threads}: {blocks} x {groups}");
                    }
                    // one thread: as few blocks as the rows allow, whole micro-panels
                    if threads == 1 {
                        assert_eq!(blocks, m.div_ceil(blocking.max_rows), "{m} rows: blocks of {rows}");
                        assert!(rows % 6 == 0, "{m} rows: blocks of {rows}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_blocked_path_gives_the_same_bits_on_any_number_of_threads() {
        // 13 panels (the last one partial), rows split into as many blocks
        // as the pool has threads, at most (partial micro-panels among
        // them): every split gives the bits of one thread
        let (n, k) = (200, 300);
        let w = values(n * k, 0x2545_f491, 0.37);
        let b = values(n, 0x9e37_79b9, 1.0);
        for isa in supported() {
            let p = PackedLinear::with_isa(&w, &b, n, k, isa).expect("a supported instruction set");
            for m in [13usize, 40, 97] {
                let x = values(m * k, 0x0bad_cafe ^ m as u32, 3.1);
                let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a rayon pool");
                let want = bits(&one.install(|| p.forward(&x, m, Epilogue::Relu)));
                for threads in [2, 3, 5, 8] {
                    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a rayon pool");
                    let got = bits(&pool.install(|| p.forward(&x, m, Epilogue::Relu)));
                    assert_eq!(got, want, "{isa}: {m} rows on {threads} threads");
                }
            }
        }
    }

    #[test]
    fn a_threads_kept_buffers_give_the_same_bits_after_larger_and_smaller_layers() {
        // one pool thread runs every task, so each call reuses the packed
        // rows and tile the call before left behind: larger ones (stale
        // values past what this call writes) and smaller ones (grown)
        let layer = |n: usize, k: usize, seed: u32, isa: Isa| {
            let w = values(n * k, seed, 0.37);
            let b = values(n, seed ^ 0x85eb_ca6b, 1.0);
            PackedLinear::with_isa(&w, &b, n, k, isa).expect("a supported instruction set")
        };
        for isa in supported() {
            let (small, large) = (layer(45, 70, 11, isa), layer(130, 600, 13, isa));
            let xs = values(29 * 70, 17, 3.1);
            let xl = values(200 * 600, 19, 3.1);
            let fresh = |p: &PackedLinear, x: &[f32], m: usize| {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a rayon pool");
                bits(&pool.install(|| p.forward(x, m, Epilogue::Relu)))
            };
            let (want_small, want_large) = (fresh(&small, &xs, 29), fresh(&large, &xl, 200));
            let kept = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a rayon pool");
            kept.install(|| {
                for round in 0..2 {
                    assert_eq!(
                        bits(&small.forward(&xs, 29, Epilogue::Relu)),
                        want_small,
                        "{isa}: small, round {round}"
                    );
                    assert_eq!(
                        bits(&large.forward(&xl, 200, Epilogue::Relu)),
                        want_large,
                        "{isa}: large, round {round}"
                    );
                }
            });
        }
    }

    #[test]
    fn matches_a_plain_product_for_ragged_sizes() {
        for (m, n, k) in [
            (1, 1, 1),
            (4, 3, 0),
            (13, 5, 0),
            (1, 70, 9),
            (3, 33, 1030),
            (7, 33, 5),
            (97, 69, 130),
            (2, 64, 3),
            (100, 40, 600),
        ] {
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0).collect();
            let b: Vec<f32> = (0..n).map(|i| i as f32 / 8.0 - 1.0).collect();
            let x: Vec<f32> = (0..m * k).map(|i| ((i * 13 % 29) as f32 - 14.0) / 16.0).collect();
            let p = PackedLinear::new(&w, &b, n, k).expect("the default instruction set");
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
