//! Recording traces from Rust: run our normalizer and keep what it did, in
//! pm-trace v1 form (world size 1). Useful for conformance tests of other
//! implementations, and for checking the replay engine against itself.

use candle_core::{Device, Tensor};
use pmstate_norm::{combine_moments, Arithmetic, NormConfig, NormState, RewardRunningMeanStd, RunningMeanStd};

use crate::error::{Result, TraceError};
use crate::model::*;

enum Module {
    Obs(RunningMeanStd),
    Reward(RewardRunningMeanStd),
}

/// Builds a [`Trace`] step by step from a live normalizer.
///
/// ```
/// use candle_core::{Device, Tensor};
/// use pmstate_trace::{replay, ModuleClass, ModuleSpec, Recorder, ReplayOptions};
/// let spec = ModuleSpec { class: ModuleClass::RunningMeanStd, shape: None, epsilon: 1e-5,
///                         clamp_value: Some(5.0), ema_decay: None, gamma: None };
/// let mut rec = Recorder::new(spec, "doc example")?;
/// rec.record_moments(&Tensor::new(&[[1f32, 2.], [3., 5.]], &Device::Cpu)?)?;
/// rec.normalize(&Tensor::new(&[[0f32, 1.]], &Device::Cpu)?, false)?;
/// let trace = rec.finish();
/// assert!(replay(&trace, &ReplayOptions::default())?.pass);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Recorder {
    module: Module,
    spec: ModuleSpec,
    description: String,
    steps: Vec<Step>,
}

fn err(e: pmstate_norm::NormError) -> TraceError {
    TraceError::Replay(e.to_string())
}

impl Recorder {
    /// A recorder around a fresh normalizer built from `spec`.
    pub fn new(spec: ModuleSpec, description: &str) -> Result<Self> {
        let cfg = NormConfig {
            epsilon: spec.epsilon,
            clamp_value: spec.clamp_value,
            ema_decay: spec.ema_decay,
            ..NormConfig::default()
        };
        let module = match spec.class {
            ModuleClass::RunningMeanStd => {
                Module::Obs(RunningMeanStd::new(cfg, spec.shape.as_deref(), &Device::Cpu).map_err(err)?)
            }
            ModuleClass::RewardRunningMeanStd => Module::Reward(
                RewardRunningMeanStd::new(cfg, spec.gamma.unwrap_or(1.0), spec.shape.as_deref(), &Device::Cpu)
                    .map_err(err)?,
            ),
        };
        Ok(Self { module, spec, description: description.to_string(), steps: vec![] })
    }

    fn state(&self) -> Option<State> {
        let s = match &self.module {
            Module::Obs(m) => m.state(),
            Module::Reward(m) => m.state(),
        }?;
        Some(State { mean: s.mean, var: s.var, count: s.count })
    }

    fn push(&mut self, op: Op, error: Option<String>) {
        self.steps.push(Step { op, error });
    }

    /// record_moments(x); a failure is recorded as the step's error.
    pub fn record_moments(&mut self, x: &Tensor) -> Result<()> {
        let r = match &mut self.module {
            Module::Obs(m) => m.record_moments_traced(x),
            Module::Reward(m) => m.record_moments_traced(x),
        };
        match r {
            Ok((b, _)) => {
                let state = self.state().ok_or_else(|| TraceError::Replay("no state after record_moments".into()))?;
                let batch = vec![RecordedMoments { mean: b.mean, var: b.var, count: b.count }];
                self.push(
                    Op::RecordMoments {
                        x: vec![x.clone()],
                        result: Some(UpdateResult { batch, combined: None, state }),
                    },
                    None,
                )
            }
            Err(e) => self.push(Op::RecordMoments { x: vec![x.clone()], result: None }, Some(e.to_string())),
        }
        Ok(())
    }

    /// record_reward(reward, terminated) on a reward normalizer.
    pub fn record_reward(&mut self, reward: &Tensor, terminated: &Tensor) -> Result<()> {
        let Module::Reward(m) = &mut self.module else {
            return Err(TraceError::Replay("record_reward needs a RewardRunningMeanStd".into()));
        };
        let op =
            |result| Op::RecordReward { reward: vec![reward.clone()], terminated: vec![terminated.clone()], result };
        match m.record_reward_traced(reward, terminated) {
            Ok((g, b, _)) => {
                let state = self.state().ok_or_else(|| TraceError::Replay("no state after record_reward".into()))?;
                let batch = vec![RecordedMoments { mean: b.mean, var: b.var, count: b.count }];
                self.push(op(Some((vec![g], UpdateResult { batch, combined: None, state }))), None)
            }
            Err(e) => self.push(op(None), Some(e.to_string())),
        }
        Ok(())
    }

    /// normalize(x, un_norm).
    pub fn normalize(&mut self, x: &Tensor, un_norm: bool) -> Result<()> {
        let r = match &mut self.module {
            Module::Obs(m) if un_norm => m.un_norm(x),
            Module::Obs(m) => m.normalize(x),
            Module::Reward(m) if un_norm => m.un_norm(x),
            Module::Reward(m) => m.normalize(x),
        };
        match r {
            Ok(out) => {
                let std = match &self.module {
                    Module::Obs(m) => m.std_f32().cloned(),
                    Module::Reward(m) => m.running().std_f32().cloned(),
                }
                .ok_or_else(|| TraceError::Replay("no std after normalize".into()))?;
                let state = self.state().ok_or_else(|| TraceError::Replay("no state after normalize".into()))?;
                self.push(
                    Op::Normalize { x: x.clone(), un_norm, result: Some(NormalizeResult { out, std, state }) },
                    None,
                )
            }
            Err(e) => self.push(Op::Normalize { x: x.clone(), un_norm, result: None }, Some(e.to_string())),
        }
        Ok(())
    }

    /// load_state_dict(state).
    pub fn load_state(&mut self, mean: &Tensor, var: &Tensor, count: i64) -> Result<()> {
        let s = NormState { mean: mean.clone(), var: var.clone(), count };
        match &mut self.module {
            Module::Obs(m) => m.load_state(s),
            Module::Reward(m) => m.load_state(s),
        }
        .map_err(err)?;
        let state = self.state().ok_or_else(|| TraceError::Replay("no state after load".into()))?;
        self.push(Op::LoadStateDict { state }, None);
        Ok(())
    }

    /// Switches Welford/EMA.
    pub fn set_ema_decay(&mut self, ema_decay: Option<f64>) -> Result<()> {
        match &mut self.module {
            Module::Obs(m) => m.set_ema_decay(ema_decay),
            Module::Reward(m) => m.set_ema_decay(ema_decay),
        }
        .map_err(err)?;
        let state = self.state();
        self.push(Op::SetEmaDecay { ema_decay, state }, None);
        Ok(())
    }

    /// combine_moments called directly (compat arithmetic).
    pub fn combine(&mut self, means: &[Tensor], vars: &[Tensor], counts: &[i64]) -> Result<()> {
        let op =
            |result| Op::CombineMoments { means: means.to_vec(), vars: vars.to_vec(), counts: counts.to_vec(), result };
        match combine_moments(means, vars, counts, Arithmetic::Compat) {
            Ok(m) => self.push(op(Some(RecordedMoments { mean: m.mean, var: m.var, count: m.count })), None),
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
