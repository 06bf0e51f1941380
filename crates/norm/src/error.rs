//! The one error type of `pmstate-norm`.

use std::fmt;

use candle_core::DType;

/// Everything that can go wrong in a normalizer operation.
///
/// Every variant names the operation (`op`) and the value or field at fault,
/// and an operation that returns an error has left the normalizer's state
/// exactly as it was.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NormError {
    /// A configuration value outside its domain.
    #[error("invalid config: {field} = {value}: {reason}")]
    InvalidConfig {
        /// The configuration or state field at fault.
        field: &'static str,
        /// The offending value.
        value: f64,
        /// Why it is refused.
        reason: &'static str,
    },
    /// An input whose shape does not fit the normalizer (or another input).
    #[error("{op}: shape mismatch: {what} has shape {}, expected {expected}", dims(got))]
    ShapeMismatch {
        /// The operation that failed.
        op: &'static str,
        /// The input or field at fault.
        what: &'static str,
        /// What was given.
        got: Vec<usize>,
        /// What was expected.
        expected: String,
    },
    /// An input of a dtype the operation does not take.
    #[error("{op}: {what} has dtype {}; {expected}", dtype.as_str())]
    UnsupportedDType {
        /// The operation that failed.
        op: &'static str,
        /// The input or field at fault.
        what: &'static str,
        /// The dtype given.
        dtype: DType,
        /// What was expected.
        expected: &'static str,
    },
    /// A batch with no rows: the reference would silently turn the state into NaN.
    #[error("{op}: empty batch ({what} has shape {}); the state is unchanged", dims(shape))]
    EmptyBatch {
        /// The operation that failed.
        op: &'static str,
        /// The input or field at fault.
        what: &'static str,
        /// The shape given.
        shape: Vec<usize>,
    },
    /// Non-finite data rejected by the opt-in guard (`NormConfig::reject_non_finite`).
    #[error(
        "{op}: {what} contains a non-finite value (NaN or infinity); the batch was rejected and the state is unchanged"
    )]
    NonFinite {
        /// The operation that failed.
        op: &'static str,
        /// The input at fault.
        what: &'static str,
    },
    /// A lazy normalizer used before its shape is known.
    #[error("{op}: the normalizer has no state yet (lazy shape, nothing recorded or loaded)")]
    Uninitialized {
        /// The operation that failed.
        op: &'static str,
    },
    /// A sample count that no longer fits in an i64 (exact mode) or is negative.
    #[error("{op}: invalid count: {problem}")]
    InvalidCount {
        /// The operation that failed.
        op: &'static str,
        /// Why the count is refused.
        problem: CountProblem,
    },
    /// Inputs to `combine_moments` that do not line up.
    #[error("combine_moments: {problem}")]
    InvalidParts {
        /// Which part and what is wrong with it.
        problem: PartsProblem,
    },
    /// A loaded state that is not a normalizer state.
    #[error("load_state: {field}: {problem}")]
    InvalidState {
        /// The configuration or state field at fault.
        field: &'static str,
        /// Why it is refused.
        problem: StateProblem,
    },
    /// A tensor on a different device than the normalizer.
    #[error("{op}: {what} is on {}, the normalizer lives on {}", location(got), location(expected))]
    DeviceMismatch {
        /// The operation that failed.
        op: &'static str,
        /// The input or field at fault.
        what: &'static str,
        /// What was given.
        got: candle_core::DeviceLocation,
        /// What was expected.
        expected: candle_core::DeviceLocation,
    },
    /// A collective operation that failed on this rank.
    #[error("collective {op} on rank {rank} of {world_size}: {problem}")]
    Collective {
        /// The operation that failed.
        op: &'static str,
        /// This participant's rank.
        rank: usize,
        /// The number of participants.
        world_size: usize,
        /// What went wrong.
        problem: CollectiveProblem,
    },
    /// An error from candle itself (allocation, device, backend).
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Why a sample count is refused ([`NormError::InvalidCount`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CountProblem {
    /// A batch count below zero.
    Negative(i64),
    /// Two counts whose sum overflows i64 (exact arithmetic).
    Overflow(i64, i64),
}

impl fmt::Display for CountProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CountProblem::Negative(c) => write!(f, "negative batch count {c}"),
            CountProblem::Overflow(a, b) => write!(f, "{a} + {b} overflows i64"),
        }
    }
}

/// What is wrong with the parts given to `combine_moments`
/// ([`NormError::InvalidParts`]); `part` is the index of the part at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PartsProblem {
    /// No parts at all.
    Empty,
    /// Not one mean, one var and one count per part.
    Lengths {
        /// Means given.
        means: usize,
        /// Vars given.
        vars: usize,
        /// Counts given.
        counts: usize,
    },
    /// A mean or var that is neither F32 nor F64.
    DType {
        /// The part.
        part: usize,
        /// `mean` or `var`.
        what: &'static str,
        /// Its dtype.
        dtype: DType,
    },
    /// A mean or var on another device than part 0's.
    Device {
        /// The part.
        part: usize,
        /// `mean` or `var`.
        what: &'static str,
    },
    /// A part whose mean and var do not broadcast together.
    MeanVar {
        /// The part.
        part: usize,
        /// Its mean's shape.
        mean: Vec<usize>,
        /// Its var's shape.
        var: Vec<usize>,
    },
    /// A part whose shape does not broadcast with the parts before it.
    Shape {
        /// The part.
        part: usize,
        /// Its shape.
        shape: Vec<usize>,
        /// The shape the parts before it broadcast to.
        others: Vec<usize>,
    },
    /// A count below zero.
    NegativeCount {
        /// The part.
        part: usize,
        /// Its count.
        count: i64,
    },
}

impl fmt::Display for PartsProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PartsProblem::Empty => f.write_str("no parts to combine"),
            PartsProblem::Lengths { means, vars, counts } => {
                write!(f, "{means} means, {vars} vars and {counts} counts: one of each per part")
            }
            PartsProblem::DType { part, what, dtype } => {
                write!(f, "part {part}: {what} has dtype {}; need F32 or F64", dtype.as_str())
            }
            PartsProblem::Device { part, what } => write!(f, "part {part}: {what} is on another device than part 0"),
            PartsProblem::MeanVar { part, mean, var } => {
                write!(f, "part {part}: mean {} and var {} do not broadcast", Dims(mean), Dims(var))
            }
            PartsProblem::Shape { part, shape, others } => write!(
                f,
                "part {part}: shape {} does not broadcast with the other parts ({})",
                Dims(shape),
                Dims(others)
            ),
            PartsProblem::NegativeCount { part, count } => write!(f, "part {part}: negative count {count}"),
        }
    }
}

/// What is wrong with a state given to `load_state` ([`NormError::InvalidState`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StateProblem {
    /// A buffer that is not of a float dtype.
    DType(DType),
    /// A var whose shape differs from the mean's.
    VarShape {
        /// The var's shape.
        var: Vec<usize>,
        /// The mean's shape.
        mean: Vec<usize>,
    },
    /// A mean whose shape differs from the normalizer's.
    MeanShape {
        /// The mean's shape.
        mean: Vec<usize>,
        /// The normalizer's shape.
        normalizer: Vec<usize>,
    },
    /// A count below zero.
    NegativeCount(i64),
}

impl fmt::Display for StateProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateProblem::DType(d) => write!(f, "dtype {}; need a float dtype (F64 in checkpoints)", d.as_str()),
            StateProblem::VarShape { var, mean } => write!(f, "shape {} differs from mean's {}", Dims(var), Dims(mean)),
            StateProblem::MeanShape { mean, normalizer } => {
                write!(f, "shape {} differs from the normalizer's {}", Dims(mean), Dims(normalizer))
            }
            StateProblem::NegativeCount(c) => write!(f, "negative count {c}"),
        }
    }
}

/// One rank's call of a collective as its peers see it: `all_gather of F32 [2, 3]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// `all_gather`, `broadcast from rank 1` (or an unknown op's code).
    pub op: String,
    /// The tensor's dtype (or an unknown dtype's code).
    pub dtype: String,
    /// The tensor's shape.
    pub dims: Vec<usize>,
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} of {} {}", self.op, self.dtype, Dims(&self.dims))
    }
}

/// Why a rank cannot send its tensor through a collective.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unsendable {
    /// More dimensions than the wire header describes.
    TooManyDims {
        /// The tensor's rank.
        dims: usize,
        /// The most the header holds.
        max: usize,
    },
    /// A dtype the collective does not carry.
    DType(DType),
    /// The tensor is on another device than the collective's.
    WrongDevice {
        /// Where it is.
        found: String,
    },
    /// Its elements could not be read (candle's message).
    Unreadable(String),
}

impl fmt::Display for Unsendable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unsendable::TooManyDims { dims, max } => write!(f, "{dims} dimensions; at most {max} are supported"),
            Unsendable::DType(d) => write!(f, "dtype {} is not supported", d.as_str()),
            Unsendable::WrongDevice { found } => write!(f, "the tensor is on {found}, not on this rank's NCCL device"),
            Unsendable::Unreadable(e) => write!(f, "its elements could not be read: {e}"),
        }
    }
}

/// What went wrong in a collective ([`NormError::Collective`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CollectiveProblem {
    /// Not every peer arrived within the timeout: a rank exited, stalled,
    /// or called another collective. Raise the timeout if the ranks are
    /// merely slow.
    TimedOut {
        /// The timeout.
        after: std::time::Duration,
    },
    /// This rank called one collective while a peer called another.
    OpMismatch {
        /// This rank's operation.
        here: &'static str,
        /// The peer's.
        peer: &'static str,
    },
    /// Two ranks called the collective with different operations, roots,
    /// dtypes or shapes.
    Disagree {
        /// One rank (rank 0 for MPI and NCCL, this rank in process).
        first_rank: usize,
        /// Its call (boxed, as is `call`: an error stays small).
        first: Box<Call>,
        /// A rank whose call differs.
        rank: usize,
        /// That rank's call.
        call: Box<Call>,
    },
    /// This rank cannot send its tensor; its peers fail with
    /// [`CollectiveProblem::PeerCannotSend`].
    CannotSend(Unsendable),
    /// A peer could not send its tensor (its own error says why).
    PeerCannotSend {
        /// The peer.
        rank: usize,
    },
    /// Headers that are not whole (a peer speaking another protocol).
    BadHeaders {
        /// Header bytes received.
        bytes: usize,
        /// Bytes per header.
        per_header: usize,
    },
    /// A rank gave up and aborted the in-process group
    /// ([`InProcessGroup::abort`](crate::InProcessGroup::abort)).
    Aborted {
        /// The rank that aborted.
        rank: usize,
        /// What it said.
        reason: String,
    },
    /// An earlier failure (this one) broke the communicator: the ranks are
    /// out of step, so every later call fails at once.
    Broken(Box<CollectiveProblem>),
    /// `broadcast` from a rank outside the group.
    SourceOutOfRange {
        /// The source rank asked for.
        src: usize,
    },
    /// A message too large for the library's counts (MPI counts are C ints).
    TooLarge {
        /// Bytes per rank.
        bytes: usize,
    },
    /// Received bytes that do not rebuild the announced tensor (candle's message).
    Received(String),
    /// A dtype code no dtype has (the header agreement should have caught it).
    DTypeCode(u64),
    /// MPI is already initialized in this process.
    AlreadyInitialized,
    /// The MPI library's threading level is below `MPI_THREAD_SERIALIZED`.
    Threading {
        /// The level it provides.
        provided: &'static str,
    },
    /// The collective needs a device of another kind (NCCL: a CUDA device).
    Device {
        /// The device given.
        found: String,
    },
    /// The communication library (MPI, NCCL, CUDA) reported an error.
    Library {
        /// The call that failed (`MPI_Iallgather`, `ncclCommInitRank`).
        call: &'static str,
        /// The library's message.
        message: String,
    },
}

impl fmt::Display for CollectiveProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CollectiveProblem::TimedOut { after } => write!(
                f,
                "timed out after {} s waiting for peers (a rank exited, stalled, or called another collective)",
                after.as_secs_f64()
            ),
            CollectiveProblem::OpMismatch { here, peer } => {
                write!(f, "rank mismatch: this rank called {here}, a peer called {peer}")
            }
            CollectiveProblem::Disagree { first_rank, first, rank, call } => {
                write!(f, "ranks disagree: rank {first_rank} calls {first}, rank {rank} calls {call}")
            }
            CollectiveProblem::CannotSend(why) => write!(f, "this rank cannot send its tensor: {why}"),
            CollectiveProblem::PeerCannotSend { rank } => {
                write!(f, "rank {rank} could not send its tensor (see its error)")
            }
            CollectiveProblem::BadHeaders { bytes, per_header } => {
                write!(f, "{bytes} header bytes, not a multiple of {per_header}")
            }
            CollectiveProblem::Aborted { rank, reason } => write!(f, "rank {rank} aborted: {reason}"),
            CollectiveProblem::Broken(first) => {
                write!(f, "the communicator is broken by an earlier failure: {first}")
            }
            CollectiveProblem::SourceOutOfRange { src } => write!(f, "source rank {src} out of range"),
            CollectiveProblem::TooLarge { bytes } => write!(f, "{bytes} bytes per rank: too large for one call"),
            CollectiveProblem::Received(e) => write!(f, "rebuilding the received tensor: {e}"),
            CollectiveProblem::DTypeCode(c) => write!(f, "unknown dtype code {c}"),
            CollectiveProblem::AlreadyInitialized => f.write_str("MPI is already initialized in this process"),
            CollectiveProblem::Threading { provided } => {
                write!(f, "the MPI library provides only {provided} threading; need Serialized")
            }
            CollectiveProblem::Device { found } => write!(f, "NCCL needs a CUDA device, got {found}"),
            CollectiveProblem::Library { call, message } => write!(f, "{call}: {message}"),
        }
    }
}

/// A shape as torch prints one: `[2, 3]`. Shared by every crate of the
/// workspace that names a shape in a message.
/// Any integer type serves (`u64` for shapes a client sent).
#[derive(Debug, Clone, Copy)]
pub struct Dims<'a, T = usize>(pub &'a [T]);

impl<T: fmt::Display> fmt::Display for Dims<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// A shape as `[2, 3]`.
pub(crate) fn dims(d: &[usize]) -> String {
    Dims(d).to_string()
}

/// A device as people name it: `cpu`, `cuda:0`, `metal:0`.
pub(crate) fn location(l: &candle_core::DeviceLocation) -> String {
    match l {
        candle_core::DeviceLocation::Cpu => "cpu".into(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

/// Result alias of this crate.
pub type Result<T, E = NormError> = std::result::Result<T, E>;
