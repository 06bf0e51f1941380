//! [`TensorRef`]: a tensor as a view of a storage.

use crate::dtype::DType;

/// Whether a tensor was pickled as a plain tensor or as an `nn.Parameter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TensorClass {
    /// A plain tensor (`_rebuild_tensor_v2` alone).
    #[default]
    Tensor,
    /// An `nn.Parameter` (`_rebuild_parameter`), which carries its own
    /// `requires_grad` besides the tensor's.
    Parameter {
        /// The parameter's `requires_grad`.
        requires_grad: bool,
    },
}

impl TensorClass {
    /// The parameter's `requires_grad`, or `None` for a plain tensor (the
    /// `parameter` field of pmstate's tree JSON).
    pub fn parameter_requires_grad(self) -> Option<bool> {
        match self {
            TensorClass::Tensor => None,
            TensorClass::Parameter { requires_grad } => Some(requires_grad),
        }
    }
}

/// A tensor: a view (offset, shape, strides in elements) of a storage.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorRef {
    /// Key of its storage ([`crate::Checkpoint::storage`]).
    pub storage: String,
    /// Element type.
    pub dtype: DType,
    /// Offset into the storage, in elements.
    pub offset: usize,
    /// Sizes.
    pub shape: Vec<usize>,
    /// Strides, in elements.
    pub stride: Vec<usize>,
    /// `requires_grad` of the tensor.
    pub requires_grad: bool,
    /// A plain tensor, or an `nn.Parameter` (`_rebuild_parameter`) with the
    /// parameter's own `requires_grad`.
    pub class: TensorClass,
    /// Python object identity: tensors with the same `Some(id)` are one
    /// object under several keys (torch pickles it once, then by memo).
    /// Distinct views of one storage (a state dict's tied weights) share
    /// the storage, not the object.
    pub object: Option<u64>,
}

impl TensorRef {
    /// Number of elements (saturating: a checkpoint's tensors are checked
    /// to have a count that fits, see [`TensorRef::checked_numel`]).
    pub fn numel(&self) -> usize {
        self.checked_numel().unwrap_or(usize::MAX)
    }

    /// Number of elements, or `None` when the product of the sizes overflows
    /// (legal in torch for stride-0 views, e.g. `(3, 6148914691236517206)`).
    pub fn checked_numel(&self) -> Option<usize> {
        self.shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }

    /// Bytes of its elements laid out contiguously, or `None` on overflow.
    pub fn checked_nbytes(&self) -> Option<usize> {
        self.checked_numel()?.checked_mul(self.dtype.size())
    }

    /// A plain tensor covering `storage` from its start, C-contiguous
    /// (what a freshly written buffer is).
    pub fn contiguous(storage: String, dtype: DType, shape: Vec<usize>) -> TensorRef {
        let stride = Self::contiguous_stride(&shape);
        TensorRef {
            storage,
            dtype,
            offset: 0,
            shape,
            stride,
            requires_grad: false,
            class: TensorClass::Tensor,
            object: None,
        }
    }

    /// What torch reports as `requires_grad`: the parameter's flag for an
    /// `nn.Parameter`, the tensor's otherwise.
    pub fn effective_requires_grad(&self) -> bool {
        self.class.parameter_requires_grad().unwrap_or(self.requires_grad)
    }

    /// Whether it was pickled as an `nn.Parameter`.
    pub fn is_parameter(&self) -> bool {
        matches!(self.class, TensorClass::Parameter { .. })
    }

    /// Bytes of its elements (contiguous; saturating, as [`TensorRef::numel`]).
    pub fn nbytes(&self) -> usize {
        self.checked_nbytes().unwrap_or(usize::MAX)
    }

    /// C-contiguous strides for `shape`.
    pub fn contiguous_stride(shape: &[usize]) -> Vec<usize> {
        let mut stride = vec![0; shape.len()];
        let mut acc = 1usize;
        for (s, &d) in stride.iter_mut().zip(shape).rev() {
            *s = acc;
            acc = acc.saturating_mul(d.max(1));
        }
        stride
    }

    /// Whether the elements are laid out C-contiguously (size-1 dims ignore their stride, as torch does).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1usize;
        for (&d, &s) in self.shape.iter().zip(&self.stride).rev() {
            if d == 0 {
                return true;
            }
            if d != 1 && s != expected {
                return false;
            }
            expected = expected.saturating_mul(d);
        }
        true
    }

    /// One past the last element the view touches, in elements (`offset` for an empty view).
    pub fn extent(&self) -> Option<usize> {
        if self.shape.contains(&0) {
            return Some(self.offset);
        }
        let mut last = self.offset;
        for (&d, &s) in self.shape.iter().zip(&self.stride) {
            last = last.checked_add((d - 1).checked_mul(s)?)?;
        }
        last.checked_add(1)
    }
}
