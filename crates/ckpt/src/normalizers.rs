//! Normalizer groups in a checkpoint: finding them, loading them into
//! `pmstate-norm` types, and writing updated state back.
//!
//! A ProtoMotions `RunningMeanStd` saves three buffers under one prefix:
//! `PREFIX.mean` (f64), `PREFIX.var` (f64, same shape), `PREFIX.count`
//! (0-dim int64). `running_reward_norm` is a dict with exactly
//! `mean`/`var`/`count`. A lazy normalizer that never ran saves nothing;
//! loading an absent group gives a lazy normalizer, and loading a present
//! one into a lazy normalizer takes the saved shape (the reference's
//! `materialize_lazy_running_stats_from_state_dict`). The normalizer
//! config (clamp, epsilon, EMA decay) is not in the checkpoint: the caller
//! supplies it.

use candle_core::{DType as CDType, Device};
use pmstate_norm::{NormConfig, NormState, RunningMeanStd};

use crate::checkpoint::Checkpoint;
use crate::dtype::DType;
use crate::error::{CkptError, Result};
use crate::storage::{Bytes, Storage};
use crate::tree::{dotted, Node, TensorRef};

/// One normalizer's buffers in a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct NormalizerGroup {
    /// Dotted key of the dict that holds the buffers (`model`, `running_reward_norm`).
    pub dict: String,
    /// The key prefix inside that dict, with its trailing dot (`_actor.mu.input_models.obs.running_obs_norm.`), or empty.
    pub base: String,
    /// The buffers' shape.
    pub shape: Vec<usize>,
    /// The saved count.
    pub count: i64,
}

impl NormalizerGroup {
    /// The group's full dotted name (`model._actor.mu.input_models.obs.running_obs_norm`).
    pub fn name(&self) -> String {
        let base = self.base.trim_end_matches('.');
        match (self.dict.is_empty(), base.is_empty()) {
            (true, _) => base.to_owned(),
            (false, true) => self.dict.clone(),
            (false, false) => format!("{}.{base}", self.dict),
        }
    }

    fn key(&self, field: &str) -> String {
        format!("{}{field}", self.base)
    }
}

/// A note from loading that the caller should see.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadWarning {
    /// Resuming a normalizer trained with EMA in Welford mode: EMA never
    /// advances `count`, so the saved count is the one from when EMA
    /// began, and the next Welford update weighs the saved mean by it.
    StaleCount {
        /// The group.
        group: String,
        /// The stale count.
        count: i64,
    },
}

impl std::fmt::Display for LoadWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadWarning::StaleCount { group, count } => write!(
                f,
                "{group}: switching EMA -> Welford: count {count} is stale (EMA never advances it); \
                 the next update weighs the saved mean as {count} samples"
            ),
        }
    }
}

fn is_norm_tensor(n: Option<&Node>, dtype: DType) -> Option<&TensorRef> {
    n.and_then(Node::as_tensor).filter(|t| t.dtype == dtype)
}

/// Every normalizer group in the checkpoint, in tree order.
pub fn find_normalizers(ckpt: &Checkpoint) -> Result<Vec<NormalizerGroup>> {
    let mut groups = Vec::new();
    let mut err = None;
    ckpt.root.walk(&mut |path, node| {
        let Node::Dict(d) = node else { return true };
        for (k, _) in &d.entries {
            let Some(base) = k.as_str().and_then(|k| k.strip_suffix("mean")) else { continue };
            if !(base.is_empty() || base.ends_with('.')) {
                continue;
            }
            let mean = is_norm_tensor(d.get(&format!("{base}mean")), DType::F64);
            let var = is_norm_tensor(d.get(&format!("{base}var")), DType::F64);
            let count = is_norm_tensor(d.get(&format!("{base}count")), DType::I64);
            let (Some(mean), Some(var), Some(count)) = (mean, var, count) else { continue };
            if mean.shape != var.shape || !count.shape.is_empty() {
                continue;
            }
            match read_count(ckpt, count) {
                Ok(c) => groups.push(NormalizerGroup {
                    dict: dotted(path),
                    base: base.to_owned(),
                    shape: mean.shape.clone(),
                    count: c,
                }),
                Err(e) => err = Some(e),
            }
        }
        true
    });
    match err {
        Some(e) => Err(e),
        None => Ok(groups),
    }
}

fn read_count(ckpt: &Checkpoint, t: &TensorRef) -> Result<i64> {
    let b = ckpt.tensor_bytes(t)?;
    let arr: [u8; 8] = b[..].try_into().map_err(|_| CkptError::Value {
        path: ckpt.path.clone(),
        key: t.storage.clone(),
        reason: format!("count holds {} bytes, not 8", b.len()),
    })?;
    Ok(i64::from_le_bytes(arr))
}

fn group_tensor<'a>(ckpt: &'a Checkpoint, g: &NormalizerGroup, field: &str) -> Result<&'a TensorRef> {
    let dict = ckpt.get(&g.dict).and_then(Node::as_dict);
    match dict.and_then(|d| d.get(&g.key(field))) {
        Some(Node::Tensor(t)) => Ok(t),
        _ => Err(CkptError::NotFound { path: ckpt.path.clone(), key: format!("{}.{field}", g.name()) }),
    }
}

/// The saved state of a group, on `device`.
pub fn load_state(ckpt: &Checkpoint, group: &NormalizerGroup, device: &Device) -> Result<NormState> {
    let mean = ckpt.to_candle(group_tensor(ckpt, group, "mean")?, device)?;
    let var = ckpt.to_candle(group_tensor(ckpt, group, "var")?, device)?;
    let count = read_count(ckpt, group_tensor(ckpt, group, "count")?)?;
    Ok(NormState { mean, var, count })
}

/// A `RunningMeanStd` with `config`, loaded from the group named `name`
/// (see [`NormalizerGroup::name`]). An absent group gives a lazy
/// normalizer (ProtoMotions saves nothing for one that never ran).
/// `trained_with_ema`: how the checkpoint was trained, when known; EMA
/// resumed as Welford returns [`LoadWarning::StaleCount`].
pub fn load_normalizer(
    ckpt: &Checkpoint,
    name: &str,
    config: NormConfig,
    trained_with_ema: Option<bool>,
    device: &Device,
) -> Result<(RunningMeanStd, Vec<LoadWarning>)> {
    let norm_err = |source| CkptError::Norm { group: name.to_owned(), source: Box::new(source) };
    let mut rms = RunningMeanStd::new(config, None, device).map_err(norm_err)?;
    let groups = find_normalizers(ckpt)?;
    let mut warnings = Vec::new();
    if let Some(g) = groups.iter().find(|g| g.name() == name) {
        rms.load_state(load_state(ckpt, g, device)?).map_err(norm_err)?;
        if trained_with_ema == Some(true) && config.ema_decay.is_none() {
            warnings.push(LoadWarning::StaleCount { group: name.to_owned(), count: g.count });
        }
    }
    Ok((rms, warnings))
}

/// Writes `state` into the group's buffers: new storages for mean, var and
/// count; every other value and storage unchanged. For a group that does
/// not exist yet (a lazy normalizer that has since run), give the dict key
/// and base: the three keys are appended to that dict.
pub fn store_state(ckpt: &mut Checkpoint, dict: &str, base: &str, state: &NormState) -> Result<()> {
    let group = if base.is_empty() { dict.to_owned() } else { format!("{dict}.{}", base.trim_end_matches('.')) };
    let bad = |reason: String| CkptError::Value { path: ckpt.path.clone(), key: group.clone(), reason };
    let shape = state.mean.dims().to_vec();
    if state.var.dims() != shape.as_slice() {
        return Err(bad(format!("var shape {:?} differs from mean's {shape:?}", state.var.dims())));
    }
    let f64_bytes = |t: &candle_core::Tensor| -> Result<Vec<u8>> {
        let v: Vec<f64> = t
            .to_dtype(CDType::F64)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1())
            .map_err(|source| CkptError::Candle { key: group.clone(), source: Box::new(source) })?;
        Ok(v.iter().flat_map(|x| x.to_le_bytes()).collect())
    };
    let buffers = [
        ("mean", DType::F64, shape.clone(), f64_bytes(&state.mean)?),
        ("var", DType::F64, shape.clone(), f64_bytes(&state.var)?),
        ("count", DType::I64, vec![], state.count.to_le_bytes().to_vec()),
    ];
    let mut new_storages = Vec::new();
    let mut nodes = Vec::new();
    for (field, dtype, shape, bytes) in buffers {
        let mut key = format!("pmstate:{group}.{field}");
        while ckpt.storages.contains_key(&key) {
            key.push('\'');
        }
        nodes.push((format!("{base}{field}"), Node::Tensor(TensorRef::contiguous(key.clone(), dtype, shape))));
        new_storages.push((key, Storage { typed: true, dtype, location: "cpu".into(), data: Bytes::owned(bytes) }));
    }
    let path = ckpt.path.clone();
    let target =
        lookup_dict_mut(&mut ckpt.root, dict).ok_or_else(|| CkptError::NotFound { path, key: dict.to_owned() })?;
    for (k, n) in nodes {
        target.insert(&k, n);
    }
    ckpt.storages.extend(new_storages);
    Ok(())
}

fn lookup_dict_mut<'a>(node: &'a mut Node, key: &str) -> Option<&'a mut crate::tree::Dict> {
    if key.is_empty() {
        return node.as_dict_mut();
    }
    let d = node.as_dict_mut()?;
    // Longest matching key first, as `Checkpoint::get`.
    let mut best: Option<(usize, usize)> = None;
    for (i, (k, _)) in d.entries.iter().enumerate() {
        let label = match k {
            Node::Str(s) => s.clone(),
            Node::Int(n) => n.to_string(),
            _ => continue,
        };
        let rest_len = if key == label {
            Some(0)
        } else {
            key.strip_prefix(label.as_str()).and_then(|r| r.strip_prefix('.')).map(str::len)
        };
        if let Some(r) = rest_len {
            if best.is_none_or(|(_, b)| r < b) {
                best = Some((i, r));
            }
        }
    }
    let (i, rest_len) = best?;
    let rest = key[key.len() - rest_len..].to_owned();
    lookup_dict_mut(&mut d.entries[i].1, &rest)
}
