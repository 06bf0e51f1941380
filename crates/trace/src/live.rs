//! A live normalizer built from a trace's module spec: what the recorder
//! and the replay engine run.

use std::sync::Arc;

use candle_core::Device;
use pmstate_norm::{Collective, NormConfig, NormError, Normalizer, RewardConfig, RewardRunningMeanStd, RunningMeanStd};

use crate::model::{ModuleClass, ModuleSpec};

/// The two normalizer kinds; everything but `record_reward` goes through
/// [`Normalizer`].
pub(crate) enum Live {
    Obs(RunningMeanStd),
    Reward(RewardRunningMeanStd),
}

impl Live {
    /// The module `spec` describes, on the CPU, aggregating over `coll`.
    pub(crate) fn build(spec: &ModuleSpec, coll: Arc<dyn Collective>) -> Result<Self, NormError> {
        let norm = NormConfig {
            epsilon: spec.epsilon,
            clamp_value: spec.clamp_value,
            ema_decay: spec.ema_decay,
            ..NormConfig::default()
        };
        let shape = spec.shape.as_deref();
        Ok(match spec.class {
            ModuleClass::RunningMeanStd => {
                Live::Obs(RunningMeanStd::new(norm, shape, &Device::Cpu)?.with_collective(coll))
            }
            ModuleClass::RewardRunningMeanStd => {
                let config = RewardConfig { norm, gamma: spec.gamma.unwrap_or(1.0) };
                Live::Reward(RewardRunningMeanStd::new(config, shape, &Device::Cpu)?.with_collective(coll))
            }
        })
    }

    pub(crate) fn norm(&mut self) -> &mut dyn Normalizer {
        match self {
            Live::Obs(m) => m,
            Live::Reward(m) => m,
        }
    }

    pub(crate) fn norm_ref(&self) -> &dyn Normalizer {
        match self {
            Live::Obs(m) => m,
            Live::Reward(m) => m,
        }
    }

    pub(crate) fn reward(&mut self) -> Option<&mut RewardRunningMeanStd> {
        match self {
            Live::Obs(_) => None,
            Live::Reward(m) => Some(m),
        }
    }
}
