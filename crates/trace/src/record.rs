//! Recording traces from Rust: run our normalizer and keep what it did, in
//! pm-trace v1 form (world size 1). Useful for conformance tests of other
//! implementations, and for checking the replay engine against itself.

use std::sync::Arc;

use candle_core::Tensor;
use pmstate_norm::{combine_moments, Arithmetic, Direction, NormState, SingleProcess};

use crate::error::{ReplayFailure, Result, TraceError};
use crate::live::Live;
use crate::model::*;

/// Builds a [`Trace`] step by step from a live normalizer.
///
/// ```
/// use candle_core::{Device, Tensor};
/// use pmstate_trace::{replay, Direction, ModuleClass, ModuleSpec, Recorder, ReplayOptions};
/// let spec = ModuleSpec { class: ModuleClass::RunningMeanStd, shape: None, epsilon: 1e-5,
///                         clamp_value: Some(5.0), ema_decay: None, gamma: None };
/// let mut rec = Recorder::new(spec, "doc example")?;
/// rec.record_moments(&Tensor::new(&[[1f32, 2.], [3., 5.]], &Device::Cpu)?)?;
/// rec.normalize(&Tensor::new(&[[0f32, 1.]], &Device::Cpu)?, Direction::Normalize)?;
/// let trace = rec.finish();
/// assert!(replay(&trace, &ReplayOptions::default())?.pass);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Recorder {
    module: Live,
    spec: ModuleSpec,
    description: String,
    steps: Vec<Step>,
}

fn err(e: pmstate_norm::NormError) -> TraceError {
    TraceError::Replay(ReplayFailure::Norm(Box::new(e)))
}

/// A step succeeded but left no state: a bug in the normalizer, reported as one.
fn no_state(op: &'static str) -> TraceError {
    TraceError::Replay(ReplayFailure::WrongModule { op, class: "normalizer that kept no state" })
}

impl Recorder {
    /// A recorder around a fresh normalizer built from `spec`.
    pub fn new(spec: ModuleSpec, description: &str) -> Result<Self> {
        let module = Live::build(&spec, Arc::new(SingleProcess)).map_err(err)?;
        Ok(Self { module, spec, description: description.to_string(), steps: vec![] })
    }

    fn state(&self, op: &'static str) -> Result<NormState> {
        self.module.norm_ref().state().ok_or_else(|| no_state(op))
    }

    fn push(&mut self, op: Op, error: Option<String>) {
        self.steps.push(Step { op, error });
    }

    /// record_moments(x); a failure is recorded as the step's error.
    pub fn record_moments(&mut self, x: &Tensor) -> Result<()> {
        match self.module.norm().record_moments(x) {
            Ok(u) => {
                let state = self.state("record_moments")?;
                let result = UpdateResult { batch: vec![u.batch], combined: None, state };
                self.push(Op::RecordMoments { x: vec![x.clone()], result: Some(result) }, None)
            }
            Err(e) => self.push(Op::RecordMoments { x: vec![x.clone()], result: None }, Some(e.to_string())),
        }
        Ok(())
    }

    /// record_reward(reward, terminated) on a reward normalizer.
    pub fn record_reward(&mut self, reward: &Tensor, terminated: &Tensor) -> Result<()> {
        let class = self.spec.class.name();
        let m = self
            .module
            .reward()
            .ok_or(TraceError::Replay(ReplayFailure::WrongModule { op: "record_reward", class }))?;
        let op =
            |result| Op::RecordReward { reward: vec![reward.clone()], terminated: vec![terminated.clone()], result };
        match m.record_reward(reward, terminated) {
            Ok(step) => {
                let state = self.state("record_reward")?;
                let result = UpdateResult { batch: vec![step.update.batch], combined: None, state };
                self.push(op(Some((vec![step.discounted], result))), None)
            }
            Err(e) => self.push(op(None), Some(e.to_string())),
        }
        Ok(())
    }

    /// normalize(x) or normalize(x, un_norm=True).
    pub fn normalize(&mut self, x: &Tensor, direction: Direction) -> Result<()> {
        let norm = self.module.norm();
        match norm.init_shape_from(x).and_then(|()| norm.apply(x, direction)) {
            Ok(out) => {
                let std = self.module.norm_ref().std_f32().cloned().ok_or_else(|| no_state("normalize"))?;
                let state = self.state("normalize")?;
                self.push(
                    Op::Normalize { x: x.clone(), direction, result: Some(NormalizeResult { out, std, state }) },
                    None,
                )
            }
            Err(e) => self.push(Op::Normalize { x: x.clone(), direction, result: None }, Some(e.to_string())),
        }
        Ok(())
    }

    /// load_state_dict(state).
    pub fn load_state(&mut self, mean: &Tensor, var: &Tensor, count: i64) -> Result<()> {
        let s = NormState { mean: mean.clone(), var: var.clone(), count };
        self.module.norm().load_state(s).map_err(err)?;
        let state = self.state("load_state_dict")?;
        self.push(Op::LoadStateDict { state }, None);
        Ok(())
    }

    /// Switches Welford/EMA.
    pub fn set_ema_decay(&mut self, ema_decay: Option<f64>) -> Result<()> {
        self.module.norm().set_ema_decay(ema_decay).map_err(err)?;
        let state = self.module.norm_ref().state();
        self.push(Op::SetEmaDecay { ema_decay, state }, None);
        Ok(())
    }

    /// combine_moments called directly (compat arithmetic).
    pub fn combine(&mut self, means: &[Tensor], vars: &[Tensor], counts: &[i64]) -> Result<()> {
        let op =
            |result| Op::CombineMoments { means: means.to_vec(), vars: vars.to_vec(), counts: counts.to_vec(), result };
        match combine_moments(means, vars, counts, Arithmetic::Compat) {
            Ok(m) => self.push(op(Some(m)), None),
            Err(e) => self.push(op(None), Some(e.to_string())),
        }
        Ok(())
    }

    /// The trace so far.
    pub fn finish(self) -> Trace {
        Trace {
            description: self.description,
            reference: Reference {
                implementation: "pmstate_norm".into(),
                source: concat!("pmstate ", env!("CARGO_PKG_VERSION")).into(),
                torch: "none".into(),
                device: "cpu".into(),
                dist_backend: None,
            },
            module: self.spec,
            world_size: 1,
            steps: self.steps,
        }
    }
}
