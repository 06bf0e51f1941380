//! The checkpoint tree: what `torch.load` would return, as inert data.

mod dict;
pub(crate) mod json;
pub(crate) mod json_problem;
mod node;
mod tensor;
mod walk;

pub(crate) use dict::fingerprint;
pub use dict::DuplicateKey;
pub use node::{Construct, Dict, DictKind, Node, Object};
pub use tensor::{TensorClass, TensorRef};
pub use walk::{dotted, Key};

/// A shape as torch prints one: `[2, 3]`.
pub use pmstate_norm::Dims as Shape;

#[cfg(test)]
mod size_tests {
    /// A tree of millions of scalars costs what its nodes cost: keep them small
    /// (tensors, dicts' indexes and raw pickle values are boxed).
    #[test]
    fn nodes_stay_small() {
        assert!(std::mem::size_of::<super::Node>() <= 56, "{}", std::mem::size_of::<super::Node>());
    }
}
