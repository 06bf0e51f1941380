//! The micro-kernel compiled once per instruction set, and the block
//! shapes each one runs.
//!
//! Each instruction set has one function per block shape (`MR` rows by
//! `G` panels) carrying `#[target_feature]`, whose whole body is the
//! inlined [`block`]: the loop, its loads and its fused multiply-adds are
//! compiled for that instruction set. A function compiled with features the
//! CPU lacks must not run, which is what makes calling it `unsafe`: the
//! only way to get a [`Kernel`] is through a [`Supported`] token, made only
//! after `is_supported` said yes, so every call is sound. This module is
//! the kernels crate's only `unsafe` (the calls through those pointers, and
//! the calls [`per_isa`](crate::per_isa) writes for row-wise loops in the
//! crates that use it: the policy crate's transformer).
#![allow(unsafe_code)]

use pmstate_norm::{Isa, IsaError};

use super::micro::{block, Start};
use super::{Cols, Epilogue, NR, NR_NARROW};

/// An instruction set this CPU was checked to support.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Supported(Isa);

impl Supported {
    /// `isa` if this CPU supports it, else the error naming it.
    pub fn check(isa: Isa) -> Result<Supported, IsaError> {
        isa.require().map(Supported)
    }

    /// The instruction set.
    pub fn isa(self) -> Isa {
        self.0
    }
}

/// Defines `fn $name(isa: Supported, args...)` that runs `$body(args...)`
/// compiled for `isa`: one `#[target_feature]` copy per x86_64 instruction
/// set, the baseline's otherwise.
///
/// For row-wise loops outside the matrix product (the transformer's
/// attention and LayerNorms): the crate is compiled for the target's
/// baseline (SSE2 on x86_64), where such a loop runs 4 floats at a time.
/// `$body` must be `#[inline(always)]` and call only `#[inline(always)]`
/// code for its loops (a call that is not inlined runs with the baseline's
/// instructions, as `gemv_panels` once did). With the same source on
/// every instruction set and no `mul_add` in it (Rust never fuses a
/// multiply and an add by itself), the bits do not depend on `isa`.
#[macro_export]
macro_rules! per_isa {
    ($(#[$doc:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) => $body:path) => {
        $(#[$doc])*
        #[allow(unsafe_code, clippy::too_many_arguments)]
        $vis fn $name(isa: $crate::Supported, $($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
            unsafe fn avx512($($arg: $ty),*) {
                $body($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2($($arg: $ty),*) {
                $body($($arg),*)
            }
            match isa.isa() {
                // SAFETY: a `Supported` is only made by `Supported::check`,
                // after `Isa::require` confirmed this CPU has every feature
                // of the instruction set; `$body` is safe code (its bounds
                // checks stay).
                #[cfg(target_arch = "x86_64")]
                $crate::Isa::Avx512 => unsafe { avx512($($arg),*) },
                // SAFETY: as above.
                #[cfg(target_arch = "x86_64")]
                $crate::Isa::Avx2 => unsafe { avx2($($arg),*) },
                _ => $body($($arg),*),
            }
        }
    };
}

/// A block function: [`block`] for one shape and instruction set.
type BlockFn<const W: usize> = unsafe fn(&[f32], &[Cols<W>], usize, &[Cols<W>], &mut [Cols<W>], Start, Epilogue, usize);

/// A block function of one shape, callable safely.
#[derive(Clone, Copy)]
pub(super) struct Kernel<const W: usize> {
    f: BlockFn<W>,
}

impl<const W: usize> Kernel<W> {
    /// [`block`] with this kernel's shape (see there for the arguments).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run(
        &self,
        a: &[f32],
        b: &[Cols<W>],
        stride: usize,
        bias: &[Cols<W>],
        out: &mut [Cols<W>],
        start: Start,
        epilogue: Epilogue,
        ahead: usize,
    ) {
        // SAFETY: a `Kernel` is only made by `wide` and `narrow` below, from
        // a `Supported` token, so the CPU has every feature `f` was
        // compiled with. The arguments are plain slices: the portable
        // `block` indexes them with bounds checks, and the SIMD blocks
        // assert every length they read through pointers before the loop,
        // so a wrong length panics, it does not read out of bounds.
        unsafe { (self.f)(a, b, stride, bias, out, start, epilogue, ahead) }
    }
}

/// Asks for `rows` (a slice of a packed panel swept soon) to be brought
/// into L2 (`prefetcht1`, one per 64-byte line; a hint that never faults,
/// changes no value, and costs a load slot per line); nothing elsewhere
/// than x86_64.
#[inline(always)]
pub(super) fn prefetch<const W: usize>(rows: &[Cols<W>]) {
    #[cfg(target_arch = "x86_64")]
    for row in rows {
        for line in row.0.chunks(16) {
            // SAFETY: a prefetch reads nothing and cannot fault; the
            // address is inside `rows`. SSE is part of x86_64's baseline.
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(line.as_ptr().cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = rows;
}

/// Panels per block for `mr` rows with 32-column panels (AVX-512) where
/// the weights come from L2 (a blocked task's tail): at least 8 zmm
/// accumulators (two per row and panel) for the fused multiply-add
/// latency of two pipes, and accumulators plus the weights a k step
/// reuses (two per panel) plus the broadcast row value within the 32
/// registers: `3 x 4` needed 33 and kept two accumulators on the stack,
/// a store and a load in every chain.
pub(super) fn wide_groups(mr: usize) -> usize {
    match mr {
        0..=2 => 4,
        3..=6 => 2,
        _ => 1,
    }
}

/// Panels per block for `mr` rows with 16-column panels (AVX2 and the
/// portable path) where the weights come from L2: as [`wide_groups`] for
/// 16 ymm (`3 x 2` spilled two accumulators: 3 rows took 1.8x 4 rows'
/// time).
pub(super) fn narrow_groups(mr: usize) -> usize {
    match mr {
        0..=1 => 4,
        2 => 2,
        _ => 1,
    }
}

/// Panels per block for `mr` rows where the weights stream from memory
/// (the narrow path, batches under a full block), on either panel width:
/// one row reads 4 panels at once (its 4 streams keep the hardware's
/// prefetchers busy enough), more rows one panel, the weights asked for
/// ahead ([`crate::PREFETCH_AHEAD_BYTES`]): memory-bound either way, and
/// one stream asked ahead beat 2 or 4 panels by 10-30 % at 2 to 6 rows
/// (Zen 5, AVX-512 and AVX2), 4 accumulators at 2 rows included.
pub(super) fn streaming_groups(mr: usize) -> usize {
    match mr {
        0..=1 => 4,
        _ => 1,
    }
}

/// One arm per block shape: `(MR, G) => Some(f::<MR, G>)`.
macro_rules! shapes {
    ($f:ident, $mr:expr, $g:expr; $(($m:literal, $gg:literal)),* $(,)?) => {
        match ($mr, $g) {
            $( ($m, $gg) => Some($f::<$m, $gg> as BlockFn<_>), )*
            _ => None,
        }
    };
}

/// The AVX-512 block of `mr` rows by `g` 32-column panels (`g` is
/// [`wide_groups`]`(mr)`, [`streaming_groups`]`(mr)` or 1; `mr` at most 14:
/// a stretched micro-panel).
pub(super) fn wide(isa: Supported, mr: usize, g: usize) -> Option<Kernel<NR>> {
    #[cfg(target_arch = "x86_64")]
    let f = match isa.isa() {
        Isa::Avx512 => shapes!(avx512, mr, g;
            (1, 4), (2, 4), (3, 2), (4, 2), (5, 2), (6, 2),
            (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1),
            (7, 1), (8, 1), (9, 1), (10, 1), (11, 1), (12, 1), (13, 1), (14, 1)),
        _ => None,
    };
    #[cfg(not(target_arch = "x86_64"))]
    let f: Option<BlockFn<NR>> = {
        let _ = (isa, mr, g);
        None
    };
    f.map(|f| Kernel { f })
}

/// The 16-column block of `mr` rows by `g` panels for AVX2 or the portable
/// path (`g` is [`narrow_groups`]`(mr)`, [`streaming_groups`]`(mr)` or 1;
/// `mr` at most 6).
pub(super) fn narrow(isa: Supported, mr: usize, g: usize) -> Option<Kernel<NR_NARROW>> {
    let f = match isa.isa() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => shapes!(avx2, mr, g;
            (1, 4), (2, 2),
            (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1)),
        Isa::Scalar => shapes!(portable, mr, g;
            (1, 4), (2, 2),
            (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1)),
        _ => None,
    };
    f.map(|f| Kernel { f })
}

/// The micro-kernel of [`block`] written with one instruction set's
/// vector intrinsics: `MR` rows by `G` panels of `W = 2 * LANES` columns,
/// `2 MR G` vector accumulators. The same chain per output as [`block`]
/// (start, one fused multiply-add per k in k order, epilogue), so the bits
/// are the portable path's; written out because LLVM's vectorizer left some
/// shapes of the generic code scalar (`vfmaddss` on one float at a time).
macro_rules! simd_block {
    (
        $(#[$doc:meta])*
        $name:ident, $features:literal, $w:expr,
        load: $load:ident, store: $store:ident, set1: $set1:ident, fmadd: $fmadd:ident,
        max: $max:ident, zero: $zero:ident
    ) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The CPU must support every feature in
        #[doc = concat!("`", $features, "`.")]
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        #[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
        unsafe fn $name<const MR: usize, const G: usize>(
            a: &[f32],
            b: &[Cols<{ $w }>],
            stride: usize,
            bias: &[Cols<{ $w }>],
            out: &mut [Cols<{ $w }>],
            start: Start,
            epilogue: Epilogue,
            ahead: usize,
        ) {
            use std::arch::x86_64::*;
            const LANES: usize = $w / 2;
            let kc = a.len() / MR;
            // every read below is inside these bounds
            assert!(G >= 1 && bias.len() >= G && out.len() >= MR * G);
            assert!(b.len() >= (G - 1) * stride + kc && (G == 1 || stride >= kc));
            let mut acc = [[[$zero(); 2]; G]; MR];
            for r in 0..MR {
                for g in 0..G {
                    let src = match start {
                        Start::Bias => &bias[g].0,
                        Start::Partial => &out[r * G + g].0,
                    };
                    for h in 0..2 {
                        // SAFETY: `src` is a whole 64-byte-aligned `Cols`,
                        // `h * LANES + LANES <= W` floats.
                        acc[r][g][h] = unsafe { $load(src.as_ptr().add(h * LANES)) };
                    }
                }
            }
            let ap = a.as_ptr();
            let bp = b.as_ptr().cast::<f32>();
            for kk in 0..kc {
                if ahead > 0 {
                    for g in 0..G {
                        // a hint: never faults, so the address may lie
                        // past `b` (wrapping, never dereferenced)
                        let p = bp.wrapping_add((g * stride + kk + ahead) * $w).cast::<i8>();
                        for line in 0..($w * 4).div_ceil(64) {
                            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line * 64));
                        }
                    }
                }
                let mut w = [[$zero(); 2]; G];
                for g in 0..G {
                    for h in 0..2 {
                        // SAFETY: row `g * stride + kk` of `b` exists (the
                        // asserts above: kk < kc); a `Cols` row is
                        // 64-byte-aligned and `W` floats long.
                        w[g][h] = unsafe { $load(bp.add((g * stride + kk) * $w + h * LANES)) };
                    }
                }
                for r in 0..MR {
                    // SAFETY: kk * MR + r < kc * MR <= a.len().
                    let x = $set1(unsafe { *ap.add(kk * MR + r) });
                    for g in 0..G {
                        for h in 0..2 {
                            acc[r][g][h] = $fmadd(x, w[g][h], acc[r][g][h]);
                        }
                    }
                }
            }
            for r in 0..MR {
                for g in 0..G {
                    let dst = &mut out[r * G + g].0;
                    for h in 0..2 {
                        // max(0, v): 0 for negatives, NaN and -0.0 kept
                        // (the second operand is returned for NaN and for
                        // two zeros), which is `relu`
                        let v = match epilogue {
                            Epilogue::Identity => acc[r][g][h],
                            Epilogue::Relu => $max($zero(), acc[r][g][h]),
                        };
                        // SAFETY: as for the loads of `src` above.
                        unsafe { $store(dst.as_mut_ptr().add(h * LANES), v) };
                    }
                }
            }
        }
    };
}

simd_block! {
    /// [`block`] for AVX-512 F + VL (with AVX2 and FMA): zmm registers.
    avx512, "avx512f,avx512vl,avx2,fma", NR,
    load: _mm512_load_ps, store: _mm512_store_ps, set1: _mm512_set1_ps, fmadd: _mm512_fmadd_ps,
    max: _mm512_max_ps, zero: _mm512_setzero_ps
}

simd_block! {
    /// [`block`] for AVX2 and FMA: ymm registers.
    avx2, "avx2,fma", NR_NARROW,
    load: _mm256_load_ps, store: _mm256_store_ps, set1: _mm256_set1_ps, fmadd: _mm256_fmadd_ps,
    max: _mm256_max_ps, zero: _mm256_setzero_ps
}

/// [`block`] for the target's baseline: on x86_64 without FMA,
/// `f32::mul_add` is libm's (correctly rounded, slow); on aarch64 it is
/// the baseline `fmla`. Safe to run anywhere; `unsafe` only to share the
/// pointer type.
#[allow(clippy::too_many_arguments)]
unsafe fn portable<const MR: usize, const G: usize>(
    a: &[f32],
    b: &[Cols<NR_NARROW>],
    stride: usize,
    bias: &[Cols<NR_NARROW>],
    out: &mut [Cols<NR_NARROW>],
    start: Start,
    epilogue: Epilogue,
    _ahead: usize,
) {
    block::<MR, NR_NARROW, G>(a, b, stride, bias, out, start, epilogue)
}
