//! The checkpoint tree: what `torch.load` would return, as inert data.

mod dict;
pub(crate) mod json;
mod node;
mod tensor;
mod walk;

use std::fmt;

pub use dict::{Dict, DuplicateKey};
pub use node::{Construct, Node, Object};
pub use tensor::TensorRef;
pub use walk::{dotted, Key};

/// A shape as torch prints one: `[2, 3]`.
pub struct Shape<'a>(pub &'a [usize]);

impl fmt::Display for Shape<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

#[cfg(test)]
mod size_tests {
    /// A tree of millions of scalars costs what its nodes cost: keep them small
    /// (tensors, dicts' indexes and raw pickle values are boxed).
    #[test]
    fn nodes_stay_small() {
        assert!(std::mem::size_of::<super::Node>() <= 56, "{}", std::mem::size_of::<super::Node>());
    }
}
