//! The recorded data the integration tests read (testdata/ at the
//! repository root), shared by them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A safetensors file's tensors, on the CPU.
pub fn load(p: &Path) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(p, &Device::Cpu).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A float32 tensor's values, flattened.
pub fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().and_then(|t| t.to_vec1::<f32>()).expect("f32 tensor")
}
