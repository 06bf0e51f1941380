//! The passes over N×D data: batch moments and normalize.
//!
//! CPU has hand-written, fused, multithreaded kernels (`cpu`); every other
//! device goes through candle's own ops (`generic`), which gives the same
//! elementwise results and lets `--features cuda` run on the GPU.

pub mod cpu;
pub(crate) mod generic;

/// What `normalize` computes per element, with `m` = mean as f32 and `s` = std as f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// `clamp((x - m) / s)`; without a mean, `clamp(x / s)`.
    Normalize,
    /// `clamp(x) * s + m`; without a mean, `clamp(x) * s`.
    UnNormalize,
}
