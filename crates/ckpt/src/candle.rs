//! Checkpoint tensors as candle tensors, and a candle-nn `VarBuilder` over a
//! checkpoint's state dict, so a candle model loads its weights straight
//! from a ProtoMotions `.ckpt`.

use std::sync::Arc;

use candle_core::{DType as CDType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};

use crate::checkpoint::Checkpoint;
use crate::error::{CkptError, Result};
use crate::tree::{Node, TensorRef};

impl Checkpoint {
    /// The tensor as a candle tensor on `device` (copied; candle owns its memory).
    ///
    /// Errors name the tensor's storage; [`Checkpoint::candle_tensor`] also
    /// names its key.
    pub fn to_candle(&self, t: &TensorRef, device: &Device) -> Result<Tensor> {
        self.to_candle_at(None, t, device)
    }

    /// The tensor at dotted `key` as a candle tensor on `device`.
    pub fn candle_tensor(&self, key: &str, device: &Device) -> Result<Tensor> {
        match self.get(key) {
            Some(Node::Tensor(t)) => self.to_candle_at(Some(key), t, device),
            Some(other) => Err(CkptError::WrongKind {
                path: self.path_str().to_owned(),
                key: key.to_owned(),
                expected: "tensor",
                found: other.kind(),
            }),
            None => Err(self.not_found(key)),
        }
    }

    pub(crate) fn to_candle_at(&self, key: Option<&str>, t: &TensorRef, device: &Device) -> Result<Tensor> {
        let dtype = t.dtype.candle().ok_or_else(|| CkptError::UnsupportedDtype {
            path: self.path_str().to_owned(),
            key: key.map(str::to_owned),
            storage: Some(t.storage.clone()),
            dtype: format!("{} (candle has no such dtype)", t.dtype),
        })?;
        let bytes = self.tensor_bytes(t)?;
        Tensor::from_raw_buffer(&bytes, dtype, &t.shape, device).map_err(|source| CkptError::Candle {
            key: key.map(str::to_owned),
            storage: Some(t.storage.clone()),
            source: Box::new(source),
        })
    }
}

/// Serves the tensors of one dict of a checkpoint (the state dict under
/// `model`, typically) by their state-dict names. Stored entries are
/// read from the file mapping when a tensor is requested.
#[derive(Debug, Clone)]
pub struct CheckpointBackend {
    ckpt: Arc<Checkpoint>,
    dict: String,
}

impl CheckpointBackend {
    /// A backend over the dict at dotted key `dict` (`""` for the root).
    pub fn new(ckpt: impl Into<Arc<Checkpoint>>, dict: &str) -> Result<Self> {
        let ckpt = ckpt.into();
        match ckpt.get(dict) {
            Some(Node::Dict(_)) => Ok(CheckpointBackend { ckpt, dict: dict.to_owned() }),
            Some(other) => Err(CkptError::WrongKind {
                path: ckpt.path_str().to_owned(),
                key: dict.to_owned(),
                expected: "state dict",
                found: other.kind(),
            }),
            None => Err(ckpt.not_found(dict)),
        }
    }

    fn lookup(&self, name: &str) -> candle_core::Result<&TensorRef> {
        let d = self.ckpt.get(&self.dict).and_then(Node::as_dict);
        match d.and_then(|d| d.get(name)) {
            Some(Node::Tensor(t)) => Ok(t),
            _ => Err(candle_core::Error::CannotFindTensor { path: format!("{}.{name}", self.dict) }),
        }
    }

    fn load(&self, name: &str, dtype: CDType, dev: &Device) -> candle_core::Result<Tensor> {
        let t = self.lookup(name)?;
        let key = format!("{}.{name}", self.dict);
        let tensor = self.ckpt.to_candle_at(Some(&key), t, dev).map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        tensor.to_dtype(dtype)
    }
}

impl SimpleBackend for CheckpointBackend {
    fn get(&self, s: Shape, name: &str, _h: Init, dtype: CDType, dev: &Device) -> candle_core::Result<Tensor> {
        let t = self.load(name, dtype, dev)?;
        if t.shape() != &s {
            return Err(candle_core::Error::UnexpectedShape {
                msg: format!("shape mismatch for {}.{name}", self.dict),
                expected: s,
                got: t.shape().clone(),
            }
            .bt());
        }
        Ok(t)
    }

    fn get_unchecked(&self, name: &str, dtype: CDType, dev: &Device) -> candle_core::Result<Tensor> {
        self.load(name, dtype, dev)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.lookup(name).is_ok()
    }
}

/// A `VarBuilder` over the state dict at `dict` (`"model"` in ProtoMotions
/// checkpoints), producing tensors of `dtype` on `device`.
///
/// ```no_run
/// use pmstate_ckpt::{var_builder, Checkpoint};
/// let ckpt = Checkpoint::open("last.ckpt")?;
/// let vb = var_builder(ckpt, "model", candle_core::DType::F32, &candle_core::Device::Cpu)?;
/// let layer = candle_nn::linear(358, 1024, vb.pp("_actor.mu.mlp.0"))?;
/// println!("{:?}", layer.weight().dims());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
/// `ckpt` is a `Checkpoint` or an `Arc<Checkpoint>` the caller keeps using.
pub fn var_builder(
    ckpt: impl Into<Arc<Checkpoint>>,
    dict: &str,
    dtype: CDType,
    device: &Device,
) -> Result<VarBuilder<'static>> {
    let backend = CheckpointBackend::new(ckpt, dict)?;
    Ok(VarBuilder::from_backend(Box::new(backend), dtype, device.clone()))
}
