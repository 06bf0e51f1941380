//! `RunningMeanStd`: the observation normalizer.

use std::sync::Arc;

use candle_core::{DType, Device, Shape, Tensor};

use crate::collective::{Collective, SingleProcess};
use crate::combine::{combine_moments, Moments};
use crate::config::{validate_ema_decay, Arithmetic, NormConfig};
use crate::direction::Direction;
use crate::error::{dims, CountProblem, NormError, Result, StateProblem};
use crate::kernels::{cpu, generic};
use crate::normalizer::{MomentUpdate, NormState, Normalizer};
use crate::promote;
use crate::tensor_io::with_cpu_slice;

/// The live buffers plus what normalize derives from them, computed once
/// per update instead of once per call.
#[derive(Debug, Clone)]
pub(crate) struct Stats {
    pub(crate) mean: Tensor,
    pub(crate) var: Tensor,
    pub(crate) count: i64,
    /// `mean.float()`
    mean_f32: Tensor,
    /// `torch.sqrt(var.float() + epsilon)`, correctly rounded.
    std_f32: Tensor,
}

impl Stats {
    fn new(mean: Tensor, var: Tensor, count: i64, epsilon: f64) -> Result<Self> {
        let mean_f32 = mean.to_dtype(DType::F32)?;
        let eps = promote::scalar(epsilon, DType::F32, var.device())?;
        let std_f32 = var.to_dtype(DType::F32)?.broadcast_add(&eps)?.sqrt()?;
        Ok(Self { mean, var, count, mean_f32, std_f32 })
    }

    /// The reference's fresh buffers: mean 0, var 1, count 1.
    fn fresh(shape: &Shape, device: &Device, epsilon: f64) -> Result<Self> {
        let mean = Tensor::zeros(shape, DType::F64, device)?;
        let var = Tensor::ones(shape, DType::F64, device)?;
        Self::new(mean, var, 1, epsilon)
    }
}

/// ProtoMotions' `RunningMeanStd`: running mean and variance of a stream of
/// batches, and normalization by them.
///
/// Welford mode (`ema_decay: None`) merges each batch's moments into the
/// running ones with [`combine_moments`]; EMA mode blends them with decay d.
/// The shape is fixed at construction or, when `None`, taken from the first
/// batch as `x.shape[1:]`. With a [`Collective`] of world size W > 1, every
/// rank's batch moments are gathered, rank 0 merges and updates, and all
/// ranks take rank 0's state.
///
/// ```
/// use candle_core::{Device, Tensor};
/// use pmstate_norm::{NormConfig, RunningMeanStd};
/// let dev = Device::Cpu;
/// let mut rms = RunningMeanStd::new(NormConfig::default(), None, &dev)?;
/// let x = Tensor::new(&[[1f32, 3.], [3., 5.], [5., 7.]], &dev)?;
/// rms.record_moments(&x)?;
/// assert_eq!(rms.shape(), Some(&[2usize][..]));
/// assert_eq!(rms.count(), Some(4)); // the 1-sample prior plus 3 rows
/// let y = rms.normalize(&x)?;
/// let back = rms.un_norm(&y)?;
/// let err = (back - &x)?.abs()?.max_all()?.to_scalar::<f32>()?;
/// assert!(err < 1e-5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct RunningMeanStd {
    config: NormConfig,
    device: Device,
    stats: Option<Stats>,
    collective: Arc<dyn Collective>,
}

impl std::fmt::Debug for RunningMeanStd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningMeanStd")
            .field("config", &self.config)
            .field("device", &self.device)
            .field("shape", &self.shape())
            .field("count", &self.count())
            .field("world_size", &self.collective.world_size())
            .finish()
    }
}

impl RunningMeanStd {
    /// A normalizer with the given shape (`None`: lazy) on `device`.
    pub fn new(config: NormConfig, shape: Option<&[usize]>, device: &Device) -> Result<Self> {
        config.validate()?;
        let stats = match shape {
            Some(s) => Some(Stats::fresh(&Shape::from(s.to_vec()), device, config.epsilon)?),
            None => None,
        };
        Ok(Self { config, device: device.clone(), stats, collective: Arc::new(SingleProcess) })
    }

    /// Aggregates over `collective`'s ranks from now on.
    pub fn with_collective(mut self, collective: Arc<dyn Collective>) -> Self {
        self.collective = collective;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &NormConfig {
        &self.config
    }

    /// The device the buffers live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The collective this normalizer aggregates over.
    pub fn collective(&self) -> &Arc<dyn Collective> {
        &self.collective
    }

    /// Whether the buffers exist (shape given, first batch seen, or state loaded).
    pub fn is_initialized(&self) -> bool {
        self.stats.is_some()
    }

    /// The module's shape, once known.
    pub fn shape(&self) -> Option<&[usize]> {
        self.stats.as_ref().map(|s| s.mean.dims())
    }

    /// The sample count, once initialized.
    pub fn count(&self) -> Option<i64> {
        self.stats.as_ref().map(|s| s.count)
    }

    /// A copy of the buffers (cheap: tensors are reference counted).
    pub fn state(&self) -> Option<NormState> {
        self.stats.as_ref().map(|s| NormState { mean: s.mean.clone(), var: s.var.clone(), count: s.count })
    }

    /// `mean.float()`, F32: what normalize subtracts.
    pub fn mean_f32(&self) -> Option<&Tensor> {
        self.stats.as_ref().map(|s| &s.mean_f32)
    }

    /// `torch.sqrt(var.float() + epsilon)`, correctly rounded, F32.
    pub fn std_f32(&self) -> Option<&Tensor> {
        self.stats.as_ref().map(|s| &s.std_f32)
    }

    /// Loads buffers as `load_state_dict` does: a lazy normalizer takes the
    /// state's shape (`materialize_lazy_running_stats_from_state_dict`), a
    /// shaped one requires the same shape. Float tensors of any float dtype
    /// are converted to F64, as `copy_` does.
    pub fn load_state(&mut self, state: NormState) -> Result<()> {
        let NormState { mean, var, count } = state;
        for (field, t) in [("mean", &mean), ("var", &var)] {
            if !t.dtype().is_float() {
                return Err(NormError::InvalidState { field, problem: StateProblem::DType(t.dtype()) });
            }
        }
        if mean.dims() != var.dims() {
            return Err(NormError::InvalidState {
                field: "var",
                problem: StateProblem::VarShape { var: var.dims().to_vec(), mean: mean.dims().to_vec() },
            });
        }
        if let Some(shape) = self.shape() {
            if shape != mean.dims() {
                return Err(NormError::InvalidState {
                    field: "mean",
                    problem: StateProblem::MeanShape { mean: mean.dims().to_vec(), normalizer: shape.to_vec() },
                });
            }
        }
        if count < 0 {
            return Err(NormError::InvalidState { field: "count", problem: StateProblem::NegativeCount(count) });
        }
        let mean = mean.to_device(&self.device)?.to_dtype(DType::F64)?;
        let var = var.to_device(&self.device)?.to_dtype(DType::F64)?;
        self.stats = Some(Stats::new(mean, var, count, self.config.epsilon)?);
        Ok(())
    }

    /// Creates fresh buffers of `shape` for a lazy normalizer, as
    /// `materialize_lazy_running_stats_from_state_dict` does before a load;
    /// returns false (and changes nothing) when it already has buffers.
    pub fn materialize(&mut self, shape: &[usize]) -> Result<bool> {
        if self.stats.is_some() {
            return Ok(false);
        }
        self.stats = Some(Stats::fresh(&Shape::from(shape.to_vec()), &self.device, self.config.epsilon)?);
        Ok(true)
    }

    /// Switches between Welford (`None`) and EMA (`Some(d)`), as resuming
    /// with another config does. Welford->EMA starts the EMA from the current
    /// mean/var and ignores count; EMA->Welford resumes with the count as it
    /// was when EMA began (it is stale: EMA never advances it).
    pub fn set_ema_decay(&mut self, ema_decay: Option<f64>) -> Result<()> {
        validate_ema_decay(ema_decay)?;
        self.config.ema_decay = ema_decay;
        Ok(())
    }

    /// Records a batch `x` of shape `[N, *shape]`: its moments, then the
    /// (possibly distributed) update. Returns the batch moments and (rank 0,
    /// W > 1) the combined moments the update used.
    pub fn record_moments(&mut self, x: &Tensor) -> Result<MomentUpdate> {
        let m = self.batch_moments_checked("record_moments", x)?;
        self.record_batch_moments(m)
    }

    pub(crate) fn batch_moments_checked(&self, op: &'static str, x: &Tensor) -> Result<Moments> {
        self.check_device(op, "x", x)?;
        check_float_input(op, "x", x)?;
        if x.rank() == 0 {
            return Err(NormError::ShapeMismatch {
                op,
                what: "x",
                got: vec![],
                expected: "[N, *shape] with a batch dimension".into(),
            });
        }
        if x.dims()[0] == 0 {
            return Err(NormError::EmptyBatch { op, what: "x", shape: x.dims().to_vec() });
        }
        self.check_fits(op, "x[0]", &x.dims()[1..])?;
        if self.config.reject_non_finite && !all_finite(x)? {
            return Err(NormError::NonFinite { op, what: "x" });
        }
        batch_moments(x)
    }

    /// Records precomputed batch moments (`count` rows): the update, with the
    /// gather/combine/broadcast when the world size is > 1. This is what
    /// pinned replay drives; `record_moments` computes the moments first.
    /// Returns the batch moments and, on rank 0 of a world larger than 1,
    /// the cross-rank combined moments the update used.
    pub fn record_batch_moments(&mut self, m: Moments) -> Result<MomentUpdate> {
        const OP: &str = "record_batch_moments";
        for (what, t) in [("batch_mean", &m.mean), ("batch_var", &m.var)] {
            self.check_device(OP, what, t)?;
            if !matches!(t.dtype(), DType::F32 | DType::F64) {
                return Err(NormError::UnsupportedDType {
                    op: OP,
                    what,
                    dtype: t.dtype(),
                    expected: "need F32 or F64",
                });
            }
            self.check_fits(OP, what, t.dims())?;
        }
        if m.count < 0 {
            return Err(NormError::InvalidCount { op: OP, problem: CountProblem::Negative(m.count) });
        }
        if self.config.reject_non_finite && !(all_finite(&m.mean)? && all_finite(&m.var)?) {
            return Err(NormError::NonFinite { op: OP, what: "batch moments" });
        }
        let current = match &self.stats {
            Some(s) => s.clone(),
            None => Stats::fresh(m.mean.shape(), &self.device, self.config.epsilon)?,
        };
        let coll = Arc::clone(&self.collective);
        if coll.world_size() <= 1 {
            self.stats = Some(self.updated(&current, &m)?);
            return Ok(MomentUpdate { batch: m, combined: None });
        }
        let means = coll.all_gather(&m.mean)?;
        let vars = coll.all_gather(&m.var)?;
        let counts_t = coll.all_gather(&Tensor::new(m.count, &self.device)?)?;
        let mut outcome = Ok(None);
        let mut next = current.clone();
        if coll.rank() == 0 {
            let counts = counts_t.iter().map(|c| c.to_scalar::<i64>()).collect::<Result<Vec<_>, _>>()?;
            match combine_moments(&means, &vars, &counts, self.config.arithmetic)
                .and_then(|c| Ok((self.updated(&current, &c)?, c)))
            {
                Ok((s, c)) => {
                    next = s;
                    outcome = Ok(Some(c));
                }
                // Rank 0 still broadcasts (its unchanged state), so that no
                // peer waits forever; the error is reported here.
                Err(e) => outcome = Err(e),
            }
        }
        let mean = coll.broadcast(&next.mean, 0)?;
        let var = coll.broadcast(&next.var, 0)?;
        let count = coll.broadcast(&Tensor::new(next.count, &self.device)?, 0)?.to_scalar::<i64>()?;
        self.stats = Some(Stats::new(mean, var, count, self.config.epsilon)?);
        outcome.map(|combined| MomentUpdate { batch: m, combined })
    }

    /// The local update (the reference's `update_from_moments`), returned
    /// rather than applied so that a failure leaves the state as it was.
    fn updated(&self, cur: &Stats, m: &Moments) -> Result<Stats> {
        let shape = cur.mean.shape();
        let (mean, var, count) = match (self.config.ema_decay, self.config.arithmetic) {
            (Some(d), Arithmetic::Compat) => {
                // d*mean is f64; (1-d)*batch_mean is in the batch's dtype.
                let mean = promote::add(&promote::scalar_mul(d, &cur.mean)?, &promote::scalar_mul(1.0 - d, &m.mean)?)?;
                let var = promote::add(&promote::scalar_mul(d, &cur.var)?, &promote::scalar_mul(1.0 - d, &m.var)?)?;
                (mean, var, cur.count)
            }
            (Some(d), Arithmetic::Exact) => {
                let bm = m.mean.to_dtype(DType::F64)?;
                let bv = m.var.to_dtype(DType::F64)?;
                let delta = promote::sub(&bm, &cur.mean)?;
                let mean = promote::add(&promote::scalar_mul(d, &cur.mean)?, &promote::scalar_mul(1.0 - d, &bm)?)?;
                let var = promote::add(
                    &promote::add(&promote::scalar_mul(d, &cur.var)?, &promote::scalar_mul(1.0 - d, &bv)?)?,
                    &promote::scalar_mul(d * (1.0 - d), &delta.sqr()?)?,
                )?;
                (mean, var, cur.count)
            }
            (None, arith) => {
                let c = combine_moments(
                    &[cur.mean.clone(), m.mean.clone()],
                    &[cur.var.clone(), m.var.clone()],
                    &[cur.count, m.count],
                    arith,
                )?;
                (c.mean, c.var, c.count)
            }
        };
        // `self.mean[:] = new` casts to f64 and broadcasts into the buffer.
        let mean = mean.to_dtype(DType::F64)?.broadcast_as(shape)?.contiguous()?;
        let var = var.to_dtype(DType::F64)?.broadcast_as(shape)?.contiguous()?;
        Stats::new(mean, var, count, self.config.epsilon)
    }

    /// `normalize(x)`: `clamp((x - mean) / sqrt(var + eps))` in float32 (or
    /// promote(x, f32)). A lazy normalizer takes its shape from `x` first,
    /// as the reference does. [`Normalizer::apply`] is the same without the
    /// lazy shape, through a shared reference.
    pub fn normalize(&mut self, x: &Tensor) -> Result<Tensor> {
        self.lazy_init_from("normalize", x)?;
        self.apply(x, Direction::Normalize)
    }

    /// `normalize(x, un_norm=True)`: `clamp(x) * sqrt(var + eps) + mean`.
    pub fn un_norm(&mut self, x: &Tensor) -> Result<Tensor> {
        self.lazy_init_from("un_norm", x)?;
        self.apply(x, Direction::UnNormalize)
    }

    /// Maps `x` in `direction` without touching the normalizer, for callers
    /// that share it (inference servers); errors when it has no state yet.
    pub fn apply(&self, x: &Tensor, direction: Direction) -> Result<Tensor> {
        let op = direction.op_name();
        let s = self.stats.as_ref().ok_or(NormError::Uninitialized { op })?;
        apply(self, x, Some(&s.mean_f32), &s.std_f32, direction)
    }

    /// [`RunningMeanStd::apply`] with a given float32 std (the module's
    /// shape) in place of the one computed from var: pinned replay feeds
    /// torch's recorded std, whose float32 sqrt is not always correctly rounded.
    pub fn apply_with_std(&self, x: &Tensor, std_f32: &Tensor, direction: Direction) -> Result<Tensor> {
        let op = direction.op_name();
        let s = self.stats.as_ref().ok_or(NormError::Uninitialized { op })?;
        check_std(op, std_f32, s)?;
        apply(self, x, Some(&s.mean_f32), std_f32, direction)
    }

    fn lazy_init_from(&mut self, op: &'static str, x: &Tensor) -> Result<()> {
        if self.stats.is_none() {
            if x.rank() == 0 {
                return Err(NormError::ShapeMismatch {
                    op,
                    what: "x",
                    got: vec![],
                    expected: "[N, *shape]: a lazy normalizer takes its shape from x.shape[1:]".into(),
                });
            }
            check_float_input(op, "x", x)?;
            self.stats = Some(Stats::fresh(&Shape::from(x.dims()[1..].to_vec()), &self.device, self.config.epsilon)?);
        }
        Ok(())
    }

    fn check_device(&self, op: &'static str, what: &'static str, t: &Tensor) -> Result<()> {
        if t.device().same_device(&self.device) {
            Ok(())
        } else {
            Err(NormError::DeviceMismatch { op, what, got: t.device().location(), expected: self.device.location() })
        }
    }

    /// A batch feature shape fits when broadcasting it against the buffers
    /// gives the buffers' shape (what `self.mean[:] = new_mean` accepts).
    fn check_fits(&self, op: &'static str, what: &'static str, dims: &[usize]) -> Result<()> {
        if let Some(shape) = self.shape() {
            if promote::broadcast_shapes(shape, dims).as_deref() != Some(shape) {
                return Err(NormError::ShapeMismatch {
                    op,
                    what,
                    got: dims.to_vec(),
                    expected: format!("a shape that broadcasts to the normalizer's {}", crate::error::dims(shape)),
                });
            }
        }
        Ok(())
    }
}

fn check_float_input(op: &'static str, what: &'static str, x: &Tensor) -> Result<()> {
    if matches!(x.dtype(), DType::F32 | DType::F64) {
        Ok(())
    } else {
        Err(NormError::UnsupportedDType { op, what, dtype: x.dtype(), expected: "need F32 or F64" })
    }
}

fn check_std(op: &'static str, std: &Tensor, s: &Stats) -> Result<()> {
    if std.dtype() != DType::F32 || std.dims() != s.std_f32.dims() {
        return Err(NormError::ShapeMismatch {
            op,
            what: "std",
            got: std.dims().to_vec(),
            expected: format!(
                "an F32 tensor of the normalizer's shape {} (got {})",
                dims(s.std_f32.dims()),
                std.dtype().as_str()
            ),
        });
    }
    Ok(())
}

/// normalize / un_norm of `x` by the given f32 mean (None: reward, no
/// offset) and std; the fused CPU kernel where the layout allows, candle's
/// ops elsewhere. Shared by both normalizer kinds.
pub(crate) fn apply(
    rms: &RunningMeanStd,
    x: &Tensor,
    mean_f32: Option<&Tensor>,
    std_f32: &Tensor,
    direction: Direction,
) -> Result<Tensor> {
    let op = direction.op_name();
    rms.check_device(op, "x", x)?;
    if !matches!(x.dtype(), DType::F16 | DType::BF16 | DType::F32 | DType::F64) {
        return Err(NormError::UnsupportedDType { op, what: "x", dtype: x.dtype(), expected: "need a float dtype" });
    }
    let state_dims = std_f32.dims();
    let Some(out_dims) = promote::broadcast_shapes(x.dims(), state_dims) else {
        return Err(NormError::ShapeMismatch {
            op,
            what: "x",
            got: x.dims().to_vec(),
            expected: format!("a shape that broadcasts with the normalizer's {}", dims(state_dims)),
        });
    };
    let clamp = rms.config.clamp_value;
    // f16/bf16 - f32 is f32 in torch, and widening is exact.
    let x = match x.dtype() {
        DType::F16 | DType::BF16 => x.to_dtype(DType::F32)?,
        _ => x.clone(),
    };
    let d = std_f32.elem_count();
    // The fused kernel needs x laid out as rows of the state (or a
    // one-element state, e.g. rewards [T, N] against shape (1,)) and an
    // output of x's own shape.
    let fast = x.device().is_cpu() && d > 0 && out_dims == x.dims() && (x.dims().ends_with(state_dims) || d == 1);
    if !fast {
        return generic::normalize(&x, mean_f32, std_f32, clamp, direction);
    }
    let out = match x.dtype() {
        DType::F32 => {
            // Borrow mean and std in place: no per-call copies on the hot path.
            let std_c = std_f32.to_dtype(DType::F32)?;
            let mean_c = mean_f32.map(|m| m.to_dtype(DType::F32)).transpose()?;
            let clamp = clamp.map(|c| ((-c) as f32, c as f32));
            let v = with_cpu_slice::<f32, _>(&std_c, |std| match &mean_c {
                Some(m) => with_cpu_slice::<f32, _>(m, |mean| {
                    let p = cpu::Affine { mean: Some(mean), std, clamp, direction };
                    with_cpu_slice::<f32, _>(&x, |xs| cpu::normalize(xs, &p))
                }),
                None => {
                    let p = cpu::Affine { mean: None, std, clamp, direction };
                    Ok(with_cpu_slice::<f32, _>(&x, |xs| cpu::normalize(xs, &p)))
                }
            })???;
            Tensor::from_vec(v, x.shape(), &Device::Cpu)?
        }
        _ => {
            let std: Vec<f64> = std_f32.to_vec_flat_f32()?.into_iter().map(f64::from).collect();
            let mean: Option<Vec<f64>> =
                mean_f32.map(|m| m.to_vec_flat_f32().map(|v| v.into_iter().map(f64::from).collect())).transpose()?;
            let p = cpu::Affine { mean: mean.as_deref(), std: &std, clamp: clamp.map(|c| (-c, c)), direction };
            let v = with_cpu_slice::<f64, _>(&x, |xs| cpu::normalize(xs, &p))?;
            Tensor::from_vec(v, x.shape(), &Device::Cpu)?
        }
    };
    Ok(out)
}

trait FlatF32 {
    fn to_vec_flat_f32(&self) -> Result<Vec<f32>>;
}
impl FlatF32 for Tensor {
    fn to_vec_flat_f32(&self) -> Result<Vec<f32>> {
        Ok(self.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
    }
}

/// Whether every element of a float tensor is finite, on any device.
pub(crate) fn all_finite(t: &Tensor) -> Result<bool> {
    if t.device().is_cpu() {
        return match t.dtype() {
            DType::F32 => with_cpu_slice::<f32, _>(t, cpu::all_finite),
            DType::F64 => with_cpu_slice::<f64, _>(t, cpu::all_finite),
            _ => Ok(true),
        };
    }
    // x - x is 0 for finite x and NaN otherwise; a NaN makes the sum NaN.
    let t64 = t.to_dtype(DType::F64)?;
    Ok(t64.sub(&t64)?.sum_all()?.to_scalar::<f64>()? == 0.0)
}

/// Batch mean and population variance over dim 0 (`torch.mean(x, 0)`,
/// `torch.var(x, 0, unbiased=False)`), accumulated in f64 and returned in
/// x's dtype; count = rows.
///
/// ```
/// use candle_core::{Device, Tensor};
/// let x = Tensor::new(&[[1f32, 2.], [3., 6.]], &Device::Cpu)?;
/// let m = pmstate_norm::batch_moments(&x)?;
/// assert_eq!(m.mean.to_vec1::<f32>()?, [2.0, 4.0]);
/// assert_eq!(m.var.to_vec1::<f32>()?, [1.0, 4.0]);
/// assert_eq!(m.count, 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn batch_moments(x: &Tensor) -> Result<Moments> {
    const OP: &str = "batch_moments";
    check_float_input(OP, "x", x)?;
    if x.rank() == 0 || x.dims()[0] == 0 {
        return Err(NormError::EmptyBatch { op: OP, what: "x", shape: x.dims().to_vec() });
    }
    let rows = x.dims()[0];
    let feat = Shape::from(x.dims()[1..].to_vec());
    let cols = feat.elem_count();
    let (mean, var) = if x.device().is_cpu() && cols > 0 {
        let (m, v) = match x.dtype() {
            DType::F32 => with_cpu_slice::<f32, _>(x, |s| cpu::moments(s, cols))?,
            _ => with_cpu_slice::<f64, _>(x, |s| cpu::moments(s, cols))?,
        };
        (Tensor::from_vec(m, &feat, &Device::Cpu)?, Tensor::from_vec(v, &feat, &Device::Cpu)?)
    } else {
        generic::moments(x)?
    };
    Ok(Moments { mean: mean.to_dtype(x.dtype())?, var: var.to_dtype(x.dtype())?, count: rows as i64 })
}

impl Normalizer for RunningMeanStd {
    fn state(&self) -> Option<NormState> {
        RunningMeanStd::state(self)
    }
    fn load_state(&mut self, state: NormState) -> Result<()> {
        RunningMeanStd::load_state(self, state)
    }
    fn set_ema_decay(&mut self, ema_decay: Option<f64>) -> Result<()> {
        RunningMeanStd::set_ema_decay(self, ema_decay)
    }
    fn record_moments(&mut self, x: &Tensor) -> Result<MomentUpdate> {
        RunningMeanStd::record_moments(self, x)
    }
    fn record_batch_moments(&mut self, batch: Moments) -> Result<MomentUpdate> {
        RunningMeanStd::record_batch_moments(self, batch)
    }
    fn apply(&self, x: &Tensor, direction: Direction) -> Result<Tensor> {
        RunningMeanStd::apply(self, x, direction)
    }
    fn apply_with_std(&self, x: &Tensor, std_f32: &Tensor, direction: Direction) -> Result<Tensor> {
        RunningMeanStd::apply_with_std(self, x, std_f32, direction)
    }
    fn std_f32(&self) -> Option<&Tensor> {
        RunningMeanStd::std_f32(self)
    }
    fn init_shape_from(&mut self, x: &Tensor) -> Result<()> {
        self.lazy_init_from("normalize", x)
    }
}
