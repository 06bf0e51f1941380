//! The in-memory form of a pm-trace v1 file.

use candle_core::Tensor;
pub use pmstate_norm::{Direction, Moments, NormState};

/// Where the trace came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Reference {
    /// The module path of the reference.
    pub implementation: String,
    /// Reference commit or version.
    pub source: String,
    /// torch version that recorded it.
    pub torch: String,
    /// torch's device.
    pub device: String,
    /// torch.distributed backend (`gloo`), or None for one process.
    pub dist_backend: Option<String>,
}

/// Which normalizer ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModuleClass {
    /// The observation normalizer.
    RunningMeanStd,
    /// The reward normalizer.
    RewardRunningMeanStd,
}

/// The one table of class names (the trace JSON's `module.class`).
const CLASSES: [(ModuleClass, &str); 2] =
    [(ModuleClass::RunningMeanStd, "RunningMeanStd"), (ModuleClass::RewardRunningMeanStd, "RewardRunningMeanStd")];

impl ModuleClass {
    /// Every class's name, as the trace JSON spells it.
    pub(crate) const NAMES: [&'static str; 2] = names(&CLASSES);

    /// The Python class name.
    pub fn name(self) -> &'static str {
        CLASSES.iter().find(|(c, _)| *c == self).map_or("", |(_, n)| n)
    }

    /// The class of a Python class name.
    pub(crate) fn from_name(name: &str) -> Option<ModuleClass> {
        CLASSES.iter().find(|(_, n)| *n == name).map(|(c, _)| *c)
    }
}

/// The names column of a name table, for serde's "expected one of" messages.
const fn names<T: Copy, const N: usize>(table: &[(T, &'static str); N]) -> [&'static str; N] {
    let mut out = [""; N];
    let mut i = 0;
    while i < N {
        out[i] = table[i].1;
        i += 1;
    }
    out
}

/// The module's constructor arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct ModuleSpec {
    /// RunningMeanStd or RewardRunningMeanStd.
    pub class: ModuleClass,
    /// `None`: lazy (taken from the first input).
    pub shape: Option<Vec<usize>>,
    /// Added to var under the sqrt.
    pub epsilon: f64,
    /// `None` or the clamp.
    pub clamp_value: Option<f64>,
    /// `None` (Welford) or the EMA decay.
    pub ema_decay: Option<f64>,
    /// Discount (RewardRunningMeanStd only).
    pub gamma: Option<f64>,
}

/// The results of an update step.
#[derive(Debug, Clone)]
pub struct UpdateResult {
    /// Per rank.
    pub batch: Vec<Moments>,
    /// Rank 0's combine over the gathered parts (world size > 1).
    pub combined: Option<Moments>,
    /// The module's buffers after the step.
    pub state: NormState,
}

/// One operation and what it produced.
#[derive(Debug, Clone)]
pub enum Op {
    /// `record_moments(x)` on every rank.
    RecordMoments {
        /// Input (per rank for updates).
        x: Vec<Tensor>,
        /// Results; None when the step raised.
        result: Option<UpdateResult>,
    },
    /// `record_reward(reward, terminated)` on every rank.
    RecordReward {
        /// Per-rank rewards.
        reward: Vec<Tensor>,
        /// Per-rank termination masks.
        terminated: Vec<Tensor>,
        /// Results; None when the step raised.
        result: Option<(Vec<Tensor>, UpdateResult)>,
    },
    /// `normalize(x, un_norm)` on rank 0.
    Normalize {
        /// Input (per rank for updates).
        x: Tensor,
        /// `normalize(x)` or `normalize(x, un_norm=True)`.
        direction: Direction,
        /// Results; None when the step raised.
        result: Option<NormalizeResult>,
    },
    /// `load_state_dict(state)` (after materializing a lazy module).
    LoadStateDict {
        /// The module's buffers after the step.
        state: NormState,
    },
    /// Switch Welford/EMA, as a resume with another config does.
    SetEmaDecay {
        /// `None` (Welford) or the EMA decay.
        ema_decay: Option<f64>,
        /// The module's buffers after the step.
        state: Option<NormState>,
    },
    /// `combine_moments` called directly.
    CombineMoments {
        /// Parts’ means.
        means: Vec<Tensor>,
        /// Parts’ variances.
        vars: Vec<Tensor>,
        /// Parts’ counts.
        counts: Vec<i64>,
        /// Results; None when the step raised.
        result: Option<Moments>,
    },
}

/// What normalize returned, with torch's std and the buffers after.
#[derive(Debug, Clone)]
pub struct NormalizeResult {
    /// What normalize returned.
    pub out: Tensor,
    /// Float32 std, `sqrt(var.float() + eps)`.
    pub std: Tensor,
    /// The module's buffers after the step.
    pub state: NormState,
}

/// A step; `error` is the reference's exception text when it raised (then
/// results are absent and a replayer must fail the step too).
#[derive(Debug, Clone)]
pub struct Step {
    /// The operation.
    pub op: Op,
    /// The reference's exception text, when it raised.
    pub error: Option<String>,
}

/// The operations of pm-trace v1, without their data (what a step's `op` names).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum OpKind {
    RecordMoments,
    RecordReward,
    Normalize,
    LoadStateDict,
    SetEmaDecay,
    CombineMoments,
}

/// The one table of op names (the trace JSON's `op`).
const OPS: [(OpKind, &str); 6] = [
    (OpKind::RecordMoments, "record_moments"),
    (OpKind::RecordReward, "record_reward"),
    (OpKind::Normalize, "normalize"),
    (OpKind::LoadStateDict, "load_state_dict"),
    (OpKind::SetEmaDecay, "set_ema_decay"),
    (OpKind::CombineMoments, "combine_moments"),
];

impl OpKind {
    /// Every op's name.
    pub(crate) const NAMES: [&'static str; 6] = names(&OPS);

    /// The op's name in the trace JSON.
    pub(crate) fn name(self) -> &'static str {
        OPS.iter().find(|(k, _)| *k == self).map_or("", |(_, n)| n)
    }

    /// The op of a name in the trace JSON.
    pub(crate) fn from_name(name: &str) -> Option<OpKind> {
        OPS.iter().find(|(_, n)| *n == name).map(|(k, _)| *k)
    }
}

impl Op {
    /// Which operation it is.
    pub(crate) fn kind(&self) -> OpKind {
        match self {
            Op::RecordMoments { .. } => OpKind::RecordMoments,
            Op::RecordReward { .. } => OpKind::RecordReward,
            Op::Normalize { .. } => OpKind::Normalize,
            Op::LoadStateDict { .. } => OpKind::LoadStateDict,
            Op::SetEmaDecay { .. } => OpKind::SetEmaDecay,
            Op::CombineMoments { .. } => OpKind::CombineMoments,
        }
    }

    /// The op's name in the trace JSON.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }
}

/// A whole pm-trace v1 document with its tensors.
#[derive(Debug, Clone)]
pub struct Trace {
    /// Free text.
    pub description: String,
    /// Where the trace came from.
    pub reference: Reference,
    /// The module's constructor arguments.
    pub module: ModuleSpec,
    /// Number of ranks (W).
    pub world_size: usize,
    /// The steps, in order.
    pub steps: Vec<Step>,
}
