//! The model being served, swapped atomically: the batcher takes one
//! snapshot per batch, a reload replaces it between batches, so no
//! request ever runs on a mix of two checkpoints.

use std::sync::{Arc, RwLock};

use crate::model::LoadedModel;

/// Holds the current model.
pub struct ModelSlot {
    current: RwLock<Arc<LoadedModel>>,
}

impl ModelSlot {
    /// A slot serving `m`.
    pub fn new(m: LoadedModel) -> Self {
        ModelSlot { current: RwLock::new(Arc::new(m)) }
    }

    /// The model now (a reference-counted snapshot; later swaps do not change it).
    pub fn current(&self) -> Arc<LoadedModel> {
        // a writer that panicked cannot leave a half-swapped Arc: take it anyway
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Serves `m` from the next batch on; returns the model it replaces.
    pub fn swap(&self, m: LoadedModel) -> Arc<LoadedModel> {
        let mut g = self.current.write().unwrap_or_else(|e| e.into_inner());
        std::mem::replace(&mut *g, Arc::new(m))
    }
}
