//! The passes over N×D data: batch moments and normalize.
//!
//! CPU has hand-written, fused, multithreaded kernels (`cpu`); every other
//! device goes through candle's own ops (`generic`), which gives the same
//! elementwise results and lets `--features cuda` run on the GPU.

pub mod cpu;
pub(crate) mod generic;
pub mod isa;

/// What `normalize` computes per element, with `m` = mean as f32 and `s` = std as f32.
pub(crate) use crate::direction::Direction;
