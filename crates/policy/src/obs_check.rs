//! The observation checks every model family runs before its forward: no
//! key it does not accept, every key it needs, each float32 `[B, W]` with
//! the width the checkpoint fixes (where it fixes one) and one `B` for all.

use std::collections::{BTreeMap, HashMap};

use candle_core::{DType, Tensor};

use crate::error::{PolicyError, Result};

/// The keys a forward takes.
pub(crate) struct ObsKeys<'a> {
    /// Every key it accepts (named in the error for any other).
    pub accepted: &'a [String],
    /// The keys it needs.
    pub required: &'a [String],
    /// Keys it reads when present, with their width (MaskedMimic's `vae_noise`).
    pub optional: &'a [(&'a str, usize)],
    /// The widths the checkpoint fixes.
    pub known: &'a BTreeMap<String, usize>,
}

/// Checks `obs` against `keys`; returns the batch size (0 when no key is
/// checked).
pub(crate) fn check_obs(obs: &HashMap<String, Tensor>, keys: &ObsKeys<'_>) -> Result<usize> {
    let mut names: Vec<&String> = obs.keys().collect();
    names.sort();
    for k in names {
        if !keys.accepted.contains(k) {
            return Err(PolicyError::ExtraObs { key: k.clone(), expected: keys.accepted.to_vec() });
        }
    }
    let mut batch = None;
    let mut check_one = |k: &str, t: &Tensor, known: Option<usize>| -> Result<()> {
        if t.dtype() != DType::F32 {
            return Err(PolicyError::ObsDtype { key: k.into(), dtype: t.dtype().as_str().into(), width: known });
        }
        let [b, d] = t.dims() else {
            return Err(PolicyError::ObsRank { key: k.into(), shape: t.dims().to_vec(), width: known });
        };
        if let Some(w) = known {
            if *d != w {
                return Err(PolicyError::ObsWidth { key: k.into(), got: *d, expected: w });
            }
        }
        match batch {
            None => batch = Some(*b),
            Some(b0) if b0 != *b => return Err(PolicyError::ObsBatch { key: k.into(), got: *b, others: b0 }),
            _ => {}
        }
        Ok(())
    };
    for k in keys.required {
        let known = keys.known.get(k).copied();
        let t = obs.get(k).ok_or_else(|| PolicyError::MissingObs { key: k.clone(), width: known })?;
        check_one(k, t, known)?;
    }
    for &(k, width) in keys.optional {
        if let Some(t) = obs.get(k) {
            check_one(k, t, Some(width))?;
        }
    }
    Ok(batch.unwrap_or(0))
}
