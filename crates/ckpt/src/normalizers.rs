//! Normalizer groups in a checkpoint: finding them, loading them into
//! `pmstate-norm` types, and writing updated state back.
//!
//! A ProtoMotions `RunningMeanStd` saves three buffers under one prefix:
//! `PREFIX.mean` (f64), `PREFIX.var` (f64, same shape), `PREFIX.count`
//! (0-dim int64). `running_reward_norm` is a dict with exactly
//! `mean`/`var`/`count`. A lazy normalizer that never ran saves nothing but
//! its module's `_metadata` entry; loading one gives a lazy normalizer, and
//! loading a saved group into a lazy normalizer takes the saved shape (the
//! reference's `materialize_lazy_running_stats_from_state_dict`). The
//! normalizer config (clamp, epsilon, EMA decay) is not in the checkpoint:
//! the caller supplies it (`pmstate-policy` reads it from the resolved configs).

use std::collections::{HashMap, HashSet};

use candle_core::{DType as CDType, Device};
use pmstate_norm::{NormConfig, NormState, RunningMeanStd};
use serde::Serialize;

use crate::checkpoint::Checkpoint;
use crate::dtype::DType;
use crate::error::{CkptError, Found, Result, ValueProblem};
use crate::io::storage::{Bytes, Storage};
use crate::tree::{dotted, Dict, Node, TensorRef};

/// One normalizer module in a checkpoint: saved buffers, or a lazy module
/// that never ran (named only by its dict's `_metadata`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NormalizerGroup {
    /// The full dotted name (`model._actor.mu.norm.running_obs_norm`, `running_reward_norm`).
    pub name: String,
    /// Dotted key of the dict that holds (or would hold) the buffers (`model`, `running_reward_norm`).
    pub dict: String,
    /// The key prefix inside that dict, with its trailing dot (`_actor.mu.norm.running_obs_norm.`), or empty.
    pub base: String,
    /// What was saved; `None` for a lazy normalizer that never ran.
    pub saved: Option<SavedBuffers>,
}

/// The saved buffers' shape and count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SavedBuffers {
    /// The buffers' shape.
    pub shape: Vec<usize>,
    /// The saved count.
    pub count: i64,
}

/// What `inspect` and `normalizers` show of a saved group: shape, count,
/// and the spread of its mean and std (`sqrt(var)`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NormalizerSummary {
    /// The group's name.
    pub name: String,
    /// The buffers' shape.
    pub shape: Vec<usize>,
    /// The saved count.
    pub count: i64,
    /// min / max / mean over the elements of `mean`.
    pub mean: Summary,
    /// min / max / mean over the elements of `sqrt(var)`.
    pub std: Summary,
}

/// min, max and mean of some values (`None` for none).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    /// The smallest.
    pub min: Option<f64>,
    /// The largest.
    pub max: Option<f64>,
    /// The average.
    pub mean: Option<f64>,
}

impl Summary {
    fn of(values: impl Iterator<Item = f64>) -> Summary {
        let (mut min, mut max, mut sum, mut n) = (f64::INFINITY, f64::NEG_INFINITY, 0.0, 0usize);
        for v in values {
            min = min.min(v);
            max = max.max(v);
            sum += v;
            n += 1;
        }
        if n == 0 {
            Summary { min: None, max: None, mean: None }
        } else {
            Summary { min: Some(min), max: Some(max), mean: Some(sum / n as f64) }
        }
    }
}

/// How a checkpoint's normalizers were trained, when the caller knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Trained {
    /// All-time statistics (`norm_ema_decay: None`).
    Welford,
    /// Exponential moving average (`norm_ema_decay: d`): `count` never advanced.
    Ema,
    /// Not known: no warning can be given.
    #[default]
    Unknown,
}

/// A note from loading that the caller should see.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
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

fn join(dict: &str, base: &str) -> String {
    let base = base.trim_end_matches('.');
    match (dict.is_empty(), base.is_empty()) {
        (true, _) => base.to_owned(),
        (false, true) => dict.to_owned(),
        (false, false) => format!("{dict}.{base}"),
    }
}

fn typed(n: Option<&Node>, dtype: DType) -> Option<&TensorRef> {
    n.and_then(Node::as_tensor).filter(|t| t.dtype == dtype)
}

impl Checkpoint {
    /// Every normalizer module, in tree order: groups of saved buffers, then
    /// (per dict) the lazy ones its `_metadata` names under a saved group's
    /// module name (`running_obs_norm`) without buffers. Linear in the tree.
    pub fn normalizers(&self) -> Result<Vec<NormalizerGroup>> {
        let mut groups = Vec::new();
        let mut err = None;
        let mut leaves: HashSet<String> = HashSet::new();
        let mut dicts: Vec<(String, &Dict)> = Vec::new();
        self.root().walk(&mut |path, node| {
            let Node::Dict(d) = node else { return true };
            let keys: HashMap<&str, &Node> = d.entries().iter().filter_map(|(k, v)| Some((k.as_str()?, v))).collect();
            for (k, _) in d.entries() {
                let Some(base) = k.as_str().and_then(|k| k.strip_suffix("mean")) else { continue };
                if !(base.is_empty() || base.ends_with('.')) {
                    continue;
                }
                let field = |f: &str| keys.get(format!("{base}{f}").as_str()).copied();
                let (Some(mean), Some(var), Some(count)) = (
                    typed(field("mean"), DType::F64),
                    typed(field("var"), DType::F64),
                    typed(field("count"), DType::I64),
                ) else {
                    continue;
                };
                if mean.shape != var.shape || !count.shape.is_empty() {
                    continue;
                }
                let dict = dotted(path);
                match self.read_count(&format!("{}.count", join(&dict, base)), count) {
                    Ok(c) => {
                        let trimmed = base.trim_end_matches('.');
                        if let Some(leaf) = trimmed.rsplit('.').next().filter(|l| !l.is_empty()) {
                            leaves.insert(leaf.to_owned());
                        }
                        groups.push(NormalizerGroup {
                            name: join(&dict, base),
                            dict,
                            base: base.to_owned(),
                            saved: Some(SavedBuffers { shape: mean.shape.clone(), count: c }),
                        });
                    }
                    Err(e) => err = Some(e),
                }
            }
            if d.metadata().is_some() {
                dicts.push((dotted(path), d));
            }
            true
        });
        if let Some(e) = err {
            return Err(e);
        }
        for (dict, d) in dicts {
            let Some(Node::Dict(meta)) = d.metadata() else { continue };
            let keys: HashSet<&str> = d.entries().iter().filter_map(|(k, _)| k.as_str()).collect();
            for (k, _) in meta.entries() {
                let Some(prefix) = k.as_str().filter(|p| !p.is_empty()) else { continue };
                let leaf = prefix.rsplit('.').next().unwrap_or(prefix);
                if leaves.contains(leaf) && !keys.contains(format!("{prefix}.mean").as_str()) {
                    let base = format!("{prefix}.");
                    groups.push(NormalizerGroup { name: join(&dict, &base), dict: dict.clone(), base, saved: None });
                }
            }
        }
        Ok(groups)
    }

    /// The group named `name` ([`NormalizerGroup::name`]), or an error that
    /// names the closest existing groups.
    pub fn normalizer(&self, name: &str) -> Result<NormalizerGroup> {
        let groups = self.normalizers()?;
        if let Some(g) = groups.iter().find(|g| g.name == name) {
            return Ok(g.clone());
        }
        Err(CkptError::NormalizerNotFound {
            path: self.path_str().to_owned(),
            name: name.to_owned(),
            closest: crate::suggest::closest(name, groups.iter().map(|g| g.name.as_str())),
        })
    }

    /// The [`NormalizerSummary`] of the saved group named `name`.
    pub fn normalizer_summary(&self, name: &str) -> Result<NormalizerSummary> {
        self.group_summary(&self.normalizer(name)?)
    }

    /// The [`NormalizerSummary`] of a saved group [`Checkpoint::normalizers`]
    /// returned: no second walk over the tree, so summarizing every group
    /// stays linear in the tree (a checkpoint of 15,000 groups).
    pub fn group_summary(&self, g: &NormalizerGroup) -> Result<NormalizerSummary> {
        let saved = g.saved.clone().ok_or_else(|| CkptError::WrongKind {
            path: self.path_str().to_owned(),
            key: g.name.clone(),
            expected: "normalizer with saved buffers",
            found: "lazy normalizer that never ran",
        })?;
        let f64s = |field: &str| -> Result<Vec<f64>> {
            let t = self.group_tensor(g, field)?;
            let bytes = self.tensor_bytes_at(Some(&format!("{}.{field}", g.name)), t)?;
            Ok(bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect())
        };
        let mean = f64s("mean")?;
        let var = f64s("var")?;
        Ok(NormalizerSummary {
            name: g.name.clone(),
            shape: saved.shape,
            count: saved.count,
            mean: Summary::of(mean.into_iter()),
            std: Summary::of(var.into_iter().map(f64::sqrt)),
        })
    }

    /// The saved state of the group named `name`, on `device`. A lazy group
    /// has no state: an error.
    pub fn normalizer_state(&self, name: &str, device: &Device) -> Result<NormState> {
        let g = self.normalizer(name)?;
        self.group_state(&g, device)?.ok_or_else(|| CkptError::WrongKind {
            path: self.path_str().to_owned(),
            key: name.to_owned(),
            expected: "normalizer with saved buffers",
            found: "lazy normalizer that never ran",
        })
    }

    /// A `RunningMeanStd` with `config`, loaded from the group named
    /// `name`; a lazy group gives a lazy normalizer. A name that is not a
    /// normalizer of this checkpoint is an error naming the closest ones
    /// (never a silently empty normalizer).
    pub fn load_normalizer(&self, name: &str, config: NormConfig, device: &Device) -> Result<RunningMeanStd> {
        self.load_normalizer_with(name, config, Trained::Unknown, device).map(|(rms, _)| rms)
    }

    /// [`Checkpoint::load_normalizer`] knowing how the checkpoint was
    /// trained: EMA resumed as Welford returns [`LoadWarning::StaleCount`].
    pub fn load_normalizer_with(
        &self,
        name: &str,
        config: NormConfig,
        trained: Trained,
        device: &Device,
    ) -> Result<(RunningMeanStd, Vec<LoadWarning>)> {
        let norm_err = |source| CkptError::Norm { group: name.to_owned(), source: Box::new(source) };
        let g = self.normalizer(name)?;
        let mut rms = RunningMeanStd::new(config, None, device).map_err(norm_err)?;
        let mut warnings = Vec::new();
        if let Some(state) = self.group_state(&g, device)? {
            let count = state.count;
            rms.load_state(state).map_err(norm_err)?;
            if trained == Trained::Ema && config.ema_decay.is_none() {
                warnings.push(LoadWarning::StaleCount { group: name.to_owned(), count });
            }
        }
        Ok((rms, warnings))
    }

    /// Writes `state` into the group named `name`: new storages for mean,
    /// var and count, every other value and storage unchanged. A lazy group
    /// (one that has since run) gets its three keys appended to its dict.
    pub fn store_normalizer(&mut self, name: &str, state: &NormState) -> Result<()> {
        let g = self.normalizer(name)?;
        let shape = state.mean.dims().to_vec();
        if state.var.dims() != shape.as_slice() {
            let source = pmstate_norm::NormError::InvalidState {
                field: "var",
                problem: pmstate_norm::StateProblem::VarShape { var: state.var.dims().to_vec(), mean: shape.clone() },
            };
            return Err(CkptError::Norm { group: name.to_owned(), source: Box::new(source) });
        }
        let f64_bytes = |t: &candle_core::Tensor| -> Result<Vec<u8>> {
            let v: Vec<f64> =
                t.to_dtype(CDType::F64).and_then(|t| t.flatten_all()).and_then(|t| t.to_vec1()).map_err(|source| {
                    CkptError::Candle { key: Some(name.to_owned()), storage: None, source: Box::new(source) }
                })?;
            Ok(v.iter().flat_map(|x| x.to_le_bytes()).collect())
        };
        let buffers = [
            ("mean", DType::F64, shape.clone(), f64_bytes(&state.mean)?),
            ("var", DType::F64, shape.clone(), f64_bytes(&state.var)?),
            ("count", DType::I64, vec![], state.count.to_le_bytes().to_vec()),
        ];
        let mut nodes = Vec::new();
        for (field, dtype, shape, bytes) in buffers {
            let mut key = format!("pmstate:{name}.{field}");
            while self.storages().contains_key(&key) {
                key.push('\'');
            }
            nodes.push((
                format!("{}{field}", g.base),
                Node::Tensor(Box::new(TensorRef::contiguous(key.clone(), dtype, shape))),
            ));
            self.add_storage(key, Storage { typed: true, dtype, location: "cpu".into(), data: Bytes::owned(bytes) });
        }
        let missing = self.not_found(&g.dict);
        let target = lookup_dict_mut(self.root_mut(), &g.dict).ok_or(missing)?;
        for (k, n) in nodes {
            target.insert(&k, n);
        }
        Ok(())
    }

    /// The saved state of a group (None for a lazy one).
    fn group_state(&self, g: &NormalizerGroup, device: &Device) -> Result<Option<NormState>> {
        if g.saved.is_none() {
            return Ok(None);
        }
        let field = |f: &str| format!("{}.{f}", g.name);
        let mean = self.to_candle_at(Some(&field("mean")), self.group_tensor(g, "mean")?, device)?;
        let var = self.to_candle_at(Some(&field("var")), self.group_tensor(g, "var")?, device)?;
        let count = self.read_count(&field("count"), self.group_tensor(g, "count")?)?;
        Ok(Some(NormState { mean, var, count }))
    }

    fn group_tensor(&self, g: &NormalizerGroup, field: &str) -> Result<&TensorRef> {
        let dict = self.get(&g.dict).and_then(Node::as_dict);
        match dict.and_then(|d| d.get(&format!("{}{field}", g.base))) {
            Some(Node::Tensor(t)) => Ok(t),
            _ => Err(self.not_found(&format!("{}.{field}", g.name))),
        }
    }

    fn read_count(&self, key: &str, t: &TensorRef) -> Result<i64> {
        let b = self.tensor_bytes_at(Some(key), t)?;
        let arr: [u8; 8] = b[..].try_into().map_err(|_| CkptError::Value {
            path: self.path_str().to_owned(),
            key: key.to_owned(),
            problem: ValueProblem::Malformed {
                what: "normalizer count",
                found: Found::Bytes { len: b.len(), expected: 8 },
            },
        })?;
        Ok(i64::from_le_bytes(arr))
    }
}

fn lookup_dict_mut<'a>(node: &'a mut Node, key: &str) -> Option<&'a mut Dict> {
    if key.is_empty() {
        return node.as_dict_mut();
    }
    let d = node.as_dict_mut()?;
    // Longest matching key first, as `Checkpoint::get`.
    let (position, rest) = crate::checkpoint::split_key(d, key)?;
    let rest = rest.to_owned();
    lookup_dict_mut(d.value_at_mut(position), &rest)
}
