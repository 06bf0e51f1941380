//! The in-memory form of a pm-trace v1 file.

use candle_core::Tensor;

/// Where the trace came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Reference {
    pub implementation: String,
    pub source: String,
    pub torch: String,
    pub device: String,
    pub dist_backend: Option<String>,
}

/// Which normalizer ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModuleClass {
    RunningMeanStd,
    RewardRunningMeanStd,
}

impl ModuleClass {
    pub fn name(self) -> &'static str {
        match self {
            ModuleClass::RunningMeanStd => "RunningMeanStd",
            ModuleClass::RewardRunningMeanStd => "RewardRunningMeanStd",
        }
    }
}

/// The module's constructor arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct ModuleSpec {
    pub class: ModuleClass,
    pub shape: Option<Vec<usize>>,
    pub epsilon: f64,
    pub clamp_value: Option<f64>,
    pub ema_decay: Option<f64>,
    pub gamma: Option<f64>,
}

/// The module's buffers after a step.
#[derive(Debug, Clone)]
pub struct State {
    pub mean: Tensor,
    pub var: Tensor,
    pub count: i64,
}

/// Moments as torch produced them (a rank's batch, or the combined parts).
#[derive(Debug, Clone)]
pub struct RecordedMoments {
    pub mean: Tensor,
    pub var: Tensor,
    pub count: i64,
}

/// The results of an update step.
#[derive(Debug, Clone)]
pub struct UpdateResult {
    /// Per rank.
    pub batch: Vec<RecordedMoments>,
    /// Rank 0's combine over the gathered parts (world size > 1).
    pub combined: Option<RecordedMoments>,
    pub state: State,
}

/// One operation and what it produced.
#[derive(Debug, Clone)]
pub enum Op {
    RecordMoments { x: Vec<Tensor>, result: Option<UpdateResult> },
    RecordReward { reward: Vec<Tensor>, terminated: Vec<Tensor>, result: Option<(Vec<Tensor>, UpdateResult)> },
    Normalize { x: Tensor, un_norm: bool, result: Option<NormalizeResult> },
    LoadStateDict { state: State },
    SetEmaDecay { ema_decay: Option<f64>, state: Option<State> },
    CombineMoments { means: Vec<Tensor>, vars: Vec<Tensor>, counts: Vec<i64>, result: Option<RecordedMoments> },
}

/// What normalize returned, with torch's std and the buffers after.
#[derive(Debug, Clone)]
pub struct NormalizeResult {
    pub out: Tensor,
    pub std: Tensor,
    pub state: State,
}

/// A step; `error` is the reference's exception text when it raised (then
/// results are absent and a replayer must fail the step too).
#[derive(Debug, Clone)]
pub struct Step {
    pub op: Op,
    pub error: Option<String>,
}

impl Op {
    pub fn name(&self) -> &'static str {
        match self {
            Op::RecordMoments { .. } => "record_moments",
            Op::RecordReward { .. } => "record_reward",
            Op::Normalize { .. } => "normalize",
            Op::LoadStateDict { .. } => "load_state_dict",
            Op::SetEmaDecay { .. } => "set_ema_decay",
            Op::CombineMoments { .. } => "combine_moments",
        }
    }
}

/// A whole pm-trace v1 document with its tensors.
#[derive(Debug, Clone)]
pub struct Trace {
    pub description: String,
    pub reference: Reference,
    pub module: ModuleSpec,
    pub world_size: usize,
    pub steps: Vec<Step>,
}
