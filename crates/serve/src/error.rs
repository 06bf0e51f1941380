//! The errors of this crate: why a model could not be loaded (at start or
//! on reload), why the server could not start, and why a request was
//! refused (each with its HTTP status and the metrics label of its kind).

use std::fmt;
use std::sync::Arc;

use axum::http::StatusCode;

/// Most bytes of a client's input quoted in one refusal: a 60 MB name or
/// shape is not echoed back.
pub const QUOTE_BYTES: usize = 256;

/// `text`, or when longer than [`QUOTE_BYTES`] its start and end with the
/// length in between (the end of a JSON error holds the line and column).
pub(crate) fn clip(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= QUOTE_BYTES {
        return text.into();
    }
    let mut head = QUOTE_BYTES * 2 / 3;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - QUOTE_BYTES / 3;
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{} ... ({} bytes in all) ... {}", &text[..head], text.len(), &text[tail..]).into()
}

/// `text` as a JSON string, clipped by [`clip`].
pub(crate) fn clip_json(text: &str) -> String {
    // serializing a &str cannot fail
    serde_json::to_string(&*clip(text)).unwrap_or_default()
}

pub use pmstate_policy::served::PinProblem;

/// Why a checkpoint could not become the served model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// Reading or building the policy failed.
    #[error(transparent)]
    Policy(#[from] pmstate_policy::PolicyError),
    /// Reading or building a deployment pipeline failed (boxed: a
    /// `DeployError` is several times the size of the other variants).
    #[error(transparent)]
    Pipeline(Box<pmstate_deploy::DeployError>),
    /// Reading the checkpoint's bytes (for its sha256) failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What happened.
        source: std::io::Error,
    },
    /// The file changed while it was read (a writer is still at work).
    #[error("{path}: changed while it was read (still being written?)")]
    Changed {
        /// The file.
        path: String,
    },
    /// A `--width` pin the checkpoint contradicts.
    #[error("--width {key}: {problem}")]
    Pin {
        /// The observation key.
        key: String,
        /// What the checkpoint says against it.
        problem: PinProblem,
    },
    /// A new checkpoint that would change what clients send or get.
    #[error("{path}: not compatible with the model being served: {what} was {old}, is {new}")]
    Incompatible {
        /// The new checkpoint.
        path: String,
        /// What differs.
        what: Difference,
        /// The served model's.
        old: String,
        /// The new checkpoint's.
        new: String,
    },
    /// A checkpoint or configs file larger than [`crate::FileLimits::max_file_bytes`]
    /// (checked on the open descriptor, before any byte is read).
    #[error("{path}: {bytes} bytes, over the limit of {max} (FileLimits::max_file_bytes)")]
    TooLarge {
        /// The file.
        path: String,
        /// Its size.
        bytes: u64,
        /// The limit.
        max: u64,
    },
    /// A load given up before it finished; nothing was swapped in.
    #[error("{path}: load abandoned: {why}")]
    Abandoned {
        /// The checkpoint.
        path: String,
        /// Why.
        why: Abandon,
    },
    /// A GPC prior whose one row makes more logits than a forward may hold.
    #[error(
        "{path}: one row makes {per_row} logits (tokens x vocabulary), over the limit of {limit} a forward holds \
         (MAX_LOGITS_PER_FORWARD)"
    )]
    TooManyLogits {
        /// The checkpoint.
        path: String,
        /// Logits of one row.
        per_row: usize,
        /// The limit.
        limit: usize,
    },
    /// Reloading was asked of a model built in process.
    #[error("model {name} was built in process, not loaded from a checkpoint: nothing to reload")]
    NotReloadable {
        /// The model name.
        name: String,
    },
}

impl From<pmstate_policy::served::LoadError> for LoadError {
    fn from(e: pmstate_policy::served::LoadError) -> Self {
        use pmstate_policy::served::LoadError as Served;
        match e {
            Served::Policy(e) => LoadError::Policy(e),
            Served::Pin(p) => LoadError::Pin { key: p.key, problem: p.problem },
            Served::TooManyLogits { path, per_row, limit } => LoadError::TooManyLogits { path, per_row, limit },
        }
    }
}

impl From<pmstate_deploy::DeployError> for LoadError {
    fn from(e: pmstate_deploy::DeployError) -> Self {
        LoadError::Pipeline(Box::new(e))
    }
}

/// Why a load was given up ([`LoadError::Abandoned`]).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Abandon {
    /// It ran past [`crate::FileLimits::reload_deadline`].
    Deadline {
        /// The deadline, seconds.
        seconds: f64,
    },
    /// The server is shutting down.
    ShuttingDown,
}

impl std::fmt::Display for Abandon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Abandon::Deadline { seconds } => write!(f, "still running after the reload deadline of {seconds} s"),
            Abandon::ShuttingDown => f.write_str("the server is shutting down"),
        }
    }
}

pub use pmstate_policy::served::Difference;

/// Why [`crate::Server::start`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The model did not load.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The address could not be bound.
    #[error("listening on {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// What happened.
        source: std::io::Error,
    },
    /// The gRPC address could not be bound (or its Unix socket path is taken).
    #[error("listening for gRPC on {addr}: {source}")]
    BindGrpc {
        /// The address (`grpc://127.0.0.1:8001`, `unix:/path`).
        addr: String,
        /// What happened.
        source: std::io::Error,
    },
    /// An option makes no sense (`--max-batch 0`, a bad model name, ...).
    #[error(transparent)]
    Options(#[from] OptionsError),
    /// A thread or the runtime could not be started.
    #[error("starting the server: {0}")]
    Runtime(std::io::Error),
    /// The model repository could not be read, or a model named by
    /// `--load-model` did not load.
    #[error(transparent)]
    Repository(#[from] RepositoryError),
}

/// Why the model repository, one of its models or a repository request
/// (index, load, unload) failed. Each names the file or model concerned.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RepositoryError {
    /// The repository directory (or a model's directory) cannot be listed.
    #[error("reading the model repository {path}: {reason}")]
    Read {
        /// The directory.
        path: String,
        /// The I/O error's text.
        reason: String,
    },
    /// A model name that cannot be a directory of the repository (a path
    /// separator, `..`, a character outside `[A-Za-z0-9._-]`).
    #[error("invalid model name {}: expected letters, digits, '.', '_' or '-' (not '.' or '..')", clip(.name))]
    BadName {
        /// The name asked for.
        name: String,
    },
    /// No directory of that name in the repository.
    #[error("no model {} in the repository {repository}", clip(.name))]
    NoModel {
        /// The name asked for.
        name: String,
        /// The repository directory.
        repository: String,
    },
    /// A model directory without a numeric version directory.
    #[error("model {name}: no version directory (expected {path}/<N>/, N a number)")]
    NoVersion {
        /// The model.
        name: String,
        /// Its directory.
        path: String,
    },
    /// More versions (or models) than a repository request may load.
    #[error("{what}: {count} found, at most {max} are served")]
    TooMany {
        /// Versions of which model, or models of which repository.
        what: String,
        /// How many.
        count: usize,
        /// The bound.
        max: usize,
    },
    /// A version directory holds no checkpoint pmstate can find.
    #[error("model {name} version {version}: no checkpoint in {path} (expected one of {expected}, or `checkpoint` in config.json)")]
    NoCheckpoint {
        /// The model.
        name: String,
        /// The version.
        version: u64,
        /// The version directory.
        path: String,
        /// The file names looked for.
        expected: &'static str,
    },
    /// A model's `config.json` is not what pmstate reads.
    #[error("{file}: {problem}")]
    Config {
        /// The file.
        file: String,
        /// The key and what is wrong with it.
        problem: String,
    },
    /// A version failed to load: the model is not served.
    #[error("model {name} version {version}: {reason}")]
    Load {
        /// The model.
        name: String,
        /// The version.
        version: u64,
        /// The load error's text.
        reason: String,
    },
    /// Load and unload requests are refused in `--model-control-mode none`
    /// (Triton refuses them there too).
    #[error("explicit model load / unload is not allowed: the server runs with --model-control-mode none (use --model-control-mode explicit)")]
    ControlMode,
    /// A repository request to a server started on one checkpoint.
    #[error("this server serves no model repository (start it with --repository DIR)")]
    NoRepository,
    /// A repository request's body or parameters are not what it takes.
    #[error("bad repository request: {reason}")]
    BadRequest {
        /// What is wrong.
        reason: String,
    },
    /// The server is shutting down: nothing more is loaded.
    #[error("the server is shutting down")]
    ShuttingDown,
}

impl RepositoryError {
    /// The HTTP status of a refused repository request: 404 for a model
    /// the repository does not hold, 503 while shutting down, else 400 (a
    /// failed load too, as Triton answers it).
    pub fn status(&self) -> StatusCode {
        match self {
            RepositoryError::NoModel { .. } => StatusCode::NOT_FOUND,
            RepositoryError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

/// An option of [`crate::ServeOptions`] that makes no sense.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OptionsError {
    /// A limit that must be positive is 0.
    #[error("{what} must be positive")]
    ZeroLimit {
        /// The limit (`max_connections`, `header_timeout`, ...).
        what: &'static str,
    },
    /// `max_batch` or `queue` is 0.
    #[error("max_batch and queue must be at least 1")]
    Zero,
    /// A model name that cannot go into URLs.
    #[error("model name \"{name}\": use letters, digits, '-', '_' and '.' (it goes into URLs)")]
    Name {
        /// The name given.
        name: String,
    },
    /// The in-flight body budget is smaller than one largest body.
    #[error("the in-flight body budget ({budget} bytes) must hold at least one largest body ({body} bytes)")]
    Budget {
        /// `max_inflight_body_bytes`.
        budget: usize,
        /// `max_body_bytes`.
        body: usize,
    },
    /// An option that applies to policies only, given with a pipeline.
    #[error("{option} applies to policies only: a pipeline runs on the CPU with the shapes its checkpoint fixes")]
    PolicyOnly {
        /// The option (`device`, `widths`).
        option: &'static str,
    },
    /// Widths given for a model repository (each model's configs give them).
    #[error("widths do not apply to a model repository: each model's widths are those its configs give")]
    RepositoryWidths,
    /// Widths given for a model built in process (its widths were pinned when it was built).
    #[error("widths apply to a model loaded from a checkpoint: a model built in process is pinned when it is built")]
    PinnedWhenBuilt,
    /// The in-flight answer budget does not fit the semaphore.
    #[error("the in-flight answer budget ({budget} bytes) must be under 4 GiB")]
    AnswerBudgetTooLarge {
        /// `max_inflight_answer_bytes`.
        budget: usize,
    },
    /// The in-flight body budget does not fit the semaphore.
    #[error("the in-flight body budget ({budget} bytes) must be under 4 GiB")]
    BudgetTooLarge {
        /// `max_inflight_body_bytes`.
        budget: usize,
    },
}

/// A tensor shape as a client sent it, shown as `[2, 576, 1]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dims(pub Vec<u64>);

impl fmt::Display for Dims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        pmstate_norm::Dims(&self.0).fmt(f)
    }
}

/// `[rows, 358]`, or `[rows, D]` for a width the checkpoint leaves open.
fn rows_by(width: &Option<usize>) -> String {
    width.map_or("[rows, D]".to_string(), |w| format!("[rows, {w}]"))
}

/// `[rows, 4, 29]`: a pipeline input's shape, rows first.
fn rows_then(row: &[usize]) -> String {
    std::iter::once("rows".to_owned()).chain(row.iter().map(usize::to_string)).collect::<Vec<_>>().join(", ")
}

fn sum_of(parts: &[(String, usize)]) -> String {
    parts.iter().map(|(k, w)| format!("{k} {w}")).collect::<Vec<_>>().join(" + ")
}

/// A tensor, output or parameter the model cannot take; each names the
/// input, output or parameter at fault (and what was expected).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InputError {
    /// A request or output parameter of the wrong type.
    #[error("{scope} parameter {name}: expected {expected}, got {}", clip(.got))]
    Parameter {
        /// `request`, or `output <name>`.
        scope: String,
        /// The parameter.
        name: &'static str,
        /// What it must be.
        expected: &'static str,
        /// What was sent (as JSON).
        got: String,
    },
    /// An input the model does not read or accept.
    #[error("unexpected input {input}: the model's inputs are {}", .known.join(", "))]
    UnexpectedInput {
        /// The input.
        input: String,
        /// The model's inputs.
        known: Vec<String>,
    },
    /// An input given twice.
    #[error("input {input} is given twice")]
    DuplicateInput {
        /// The input.
        input: String,
    },
    /// A datatype other than the input's (FP32; INT64 for a GPC prior's
    /// tokens; FP32 or BOOL for an older MaskedMimic's inputs).
    #[error("input {input}: datatype {}, expected {expected}", clip(.datatype))]
    Datatype {
        /// The input.
        input: String,
        /// The datatype sent.
        datatype: String,
        /// What the input takes (`FP32`, `INT64`, `FP32 or BOOL`).
        expected: &'static str,
    },
    /// An element of INT64 JSON data that is not a JSON integer in the int64 range.
    #[error("input {input}: element {index} ({}) {problem} (INT64 data takes JSON integers)", clip(.value))]
    IntData {
        /// The input.
        input: String,
        /// Its row-major position.
        index: usize,
        /// What was sent (JSON text).
        value: String,
        /// What is wrong with it.
        problem: crate::json_floats::IntProblem,
    },
    /// An element of BOOL JSON data that is not `true` or `false`.
    #[error("input {input}: element {index} ({}) is not true or false (BOOL data takes JSON true and false)", clip(.value))]
    BoolData {
        /// The input.
        input: String,
        /// Its row-major position.
        index: usize,
        /// What was sent (JSON text).
        value: String,
    },
    /// An INT64 value outside the range the input takes (a token outside the vocabulary).
    #[error("input {input}: row {row}, position {position}: {value} is outside [0, {below})")]
    IntRange {
        /// The input.
        input: String,
        /// Its row.
        row: usize,
        /// Its position in the row.
        position: usize,
        /// The value.
        value: i64,
        /// The end of the range (a GPC prior's vocabulary size).
        below: usize,
    },
    /// A GPC prior's tokens given while the request samples (generation draws its own).
    #[error("input {input} is given and the request samples: generation draws its own tokens (leave {input} out to generate, or sample false to teacher-force)")]
    GivenAndSampled {
        /// The token input.
        input: String,
    },
    /// A GPC prior's tokens left out of a request that does not sample.
    #[error(
        "missing input {input} (INT64 {}): teacher forcing reads the tokens; set the request parameter sample to \
         true (and seed) to generate them instead",
        rows_by(.width)
    )]
    NotGiven {
        /// The token input.
        input: String,
        /// Tokens per row.
        width: Option<usize>,
    },
    /// A GPC prior's request whose logits pass the limit of one forward.
    #[error(
        "{rows} rows make {per_row} logits each (tokens x vocabulary), over the limit of {limit} one forward holds \
         (MAX_LOGITS_PER_FORWARD): send at most {max_rows} rows a request"
    )]
    TooManyLogits {
        /// Rows of the request.
        rows: usize,
        /// Logits of one row.
        per_row: usize,
        /// The limit.
        limit: usize,
        /// Most rows a request may hold.
        max_rows: usize,
    },
    /// A shape that is not `[rows, width]`.
    #[error("input {input}: shape {shape}, expected {}", rows_by(.width))]
    Rank {
        /// The input.
        input: String,
        /// The shape sent.
        shape: Dims,
        /// The width the model fixes, if any.
        width: Option<usize>,
    },
    /// A shape whose element count does not fit in memory sizes.
    #[error("input {input}: shape {shape} is too large")]
    TooLarge {
        /// The input.
        input: String,
        /// The shape sent.
        shape: Dims,
    },
    /// A shape with no rows or no columns.
    #[error("input {input}: shape {shape} is empty, expected {} with rows >= 1", rows_by(.width))]
    Empty {
        /// The input.
        input: String,
        /// The shape sent.
        shape: Dims,
        /// The width the model fixes, if any.
        width: Option<usize>,
    },
    /// A width other than the one the checkpoint (or a `--width` pin) fixes.
    #[error("input {input}: width {width}, expected {expected}")]
    Width {
        /// The input.
        input: String,
        /// The width sent.
        width: usize,
        /// The width the model takes.
        expected: usize,
    },
    /// A pipeline input whose shape is not `[rows, ...]` with the row
    /// shape the pipeline fixes (and rows >= 1).
    #[error("input {input}: shape {shape}, expected [{}] with rows >= 1", rows_then(.expected))]
    Shape {
        /// The input.
        input: String,
        /// The shape sent.
        shape: Dims,
        /// The shape of one row.
        expected: Vec<usize>,
    },
    /// Inputs with different numbers of rows.
    #[error("input {input}: {rows} rows, but input {first} has {first_rows}")]
    Rows {
        /// The input.
        input: String,
        /// Its rows.
        rows: usize,
        /// The first input.
        first: String,
        /// Its rows.
        first_rows: usize,
    },
    /// More rows than `max_batch_size` (Triton refuses these too).
    #[error(
        "input {input}: {rows} rows, but a request may hold at most max_batch_size = {max_batch} \
         (--max-batch); split it"
    )]
    Batch {
        /// The (first) input.
        input: String,
        /// Its rows.
        rows: usize,
        /// `--max-batch`.
        max_batch: usize,
    },
    /// Both `data` and `binary_data_size`.
    #[error("input {input}: both data and binary_data_size are given")]
    DataTwice {
        /// The input.
        input: String,
    },
    /// Neither `data` nor `binary_data_size`.
    #[error("input {input}: no data (neither data nor binary_data_size)")]
    NoData {
        /// The input.
        input: String,
    },
    /// JSON data that does not fill the shape.
    #[error("input {input}: {values} values, but shape {shape} needs {needed}")]
    DataLength {
        /// The input.
        input: String,
        /// Values sent.
        values: usize,
        /// Its shape as sent (any rank: a pipeline's inputs have more than two dims).
        shape: Dims,
        /// Values the shape needs.
        needed: usize,
    },
    /// A `binary_data_size` that is not a byte count.
    #[error("input {input}: binary_data_size {size} is not a byte count")]
    BinarySizeValue {
        /// The input.
        input: String,
        /// What was sent (as JSON).
        size: String,
    },
    /// A `binary_data_size` that does not match the shape.
    #[error("input {input}: binary_data_size {size}, but {datatype} shape {shape} needs {needed} bytes")]
    BinarySize {
        /// The input.
        input: String,
        /// The size sent.
        size: usize,
        /// The input's datatype (`FP32`, `INT64`).
        datatype: &'static str,
        /// Its shape as sent (any rank: a pipeline's inputs have more than two dims).
        shape: Dims,
        /// Bytes the shape needs.
        needed: usize,
    },
    /// A `binary_data_size` past the end of the body.
    #[error("input {input}: binary_data_size {size}, but only {left} bytes of binary data are left")]
    BinaryShort {
        /// The input.
        input: String,
        /// The size sent.
        size: usize,
        /// Binary bytes left.
        left: usize,
    },
    /// Binary data no input claims.
    #[error("{bytes} bytes of binary data after the last binary input")]
    BinaryLeftOver {
        /// How many.
        bytes: usize,
    },
    /// A request without inputs.
    #[error("no inputs")]
    NoInputs,
    /// An input a needed network reads is missing.
    #[error("missing input {input} (shape {})", rows_by(.width))]
    MissingInput {
        /// The input.
        input: String,
        /// Its width, if fixed.
        width: Option<usize>,
    },
    /// A pipeline input is missing.
    #[error("missing input {input} (shape [{}])", rows_then(.expected))]
    MissingShaped {
        /// The input.
        input: String,
        /// The shape of one row.
        expected: Vec<usize>,
    },
    /// Widths that do not add up to what a first layer takes.
    #[error("input {input}: {module} reads {} = {sum} columns, expected {total} in all", sum_of(.parts))]
    WidthSum {
        /// The input whose own width is open (or the first of the module's).
        input: String,
        /// The module's config path.
        module: String,
        /// Its in_keys and the widths sent.
        parts: Vec<(String, usize)>,
        /// Their sum.
        sum: usize,
        /// What the checkpoint takes.
        total: usize,
    },
    /// An output the model does not have.
    #[error("unknown output {output}: the model's outputs are {}", .known.join(", "))]
    UnknownOutput {
        /// The output.
        output: String,
        /// The model's outputs.
        known: Vec<&'static str>,
    },
    /// An output asked for twice.
    #[error("output {output} is asked for twice")]
    DuplicateOutput {
        /// The output.
        output: &'static str,
    },
    /// `action` or `neglogp` without `"sample": true`.
    #[error("output {output} is drawn (actions, or a GPC prior's tokens); set the request parameter sample to true (and seed)")]
    NeedsSample {
        /// The output.
        output: &'static str,
    },
    /// Nothing to compute.
    #[error("no outputs asked for")]
    NoOutputs,
    /// JSON data that is not an array of numbers.
    #[error("input {input}: data: {}", clip(.reason))]
    Data {
        /// The input.
        input: String,
        /// What is wrong (serde_json's words, with the column).
        reason: String,
    },
    /// A gRPC list longer than REST's JSON allows (inputs, outputs,
    /// parameters, shape dimensions: [`crate::protocol`]'s bounds).
    #[error("{count} {what}, at most {max} are allowed")]
    TooMany {
        /// What the list holds.
        what: &'static str,
        /// Items sent.
        count: usize,
        /// The bound.
        max: usize,
    },
    /// A gRPC shape with a negative dimension.
    #[error("input {input}: shape {shape} has a negative dimension")]
    NegativeShape {
        /// The input.
        input: String,
        /// The shape sent, as text (`[2, -1]`).
        shape: String,
    },
    /// A gRPC `raw_input_contents` entry whose length does not match the shape.
    #[error("input {input}: raw_input_contents holds {bytes} bytes, but {datatype} shape {shape} needs {needed}")]
    RawSize {
        /// The input.
        input: String,
        /// Bytes sent.
        bytes: usize,
        /// The input's datatype.
        datatype: &'static str,
        /// Its shape as sent.
        shape: Dims,
        /// Bytes the shape needs.
        needed: usize,
    },
    /// A gRPC request whose `raw_input_contents` are not one entry per input.
    #[error(
        "raw_input_contents has {raw} entries for {inputs} inputs: when raw contents are used, every input \
         comes that way, one entry each, in the order of inputs"
    )]
    RawCount {
        /// Entries of `raw_input_contents`.
        raw: usize,
        /// Inputs of the request.
        inputs: usize,
    },
    /// A gRPC input given both typed `contents` and a raw entry.
    #[error("input {input}: both contents and raw_input_contents are given")]
    RawAndTyped {
        /// The input.
        input: String,
    },
    /// A gRPC input with neither typed `contents` nor raw contents.
    #[error("input {input}: no values (neither contents nor raw_input_contents)")]
    NoContents {
        /// The input.
        input: String,
    },
    /// Typed gRPC values in a list other than the datatype's.
    #[error("input {input}: values in contents.{field}, but {datatype} values go in contents.{expected}")]
    ContentsField {
        /// The input.
        input: String,
        /// The list that holds values.
        field: &'static str,
        /// The input's datatype.
        datatype: &'static str,
        /// The list its values belong in.
        expected: &'static str,
    },
    /// JSON data with more values than the shape holds (refused when one more is read).
    #[error("input {input}: more values than shape {shape} holds ({needed})")]
    DataOverflow {
        /// The input.
        input: String,
        /// Its shape as sent (any rank: a pipeline's inputs have more than two dims).
        shape: Dims,
        /// Values the shape needs.
        needed: usize,
    },
}

/// Why a request was refused; `Display` is the `{"error": ...}` text.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// A model this server does not serve.
    #[error("unknown model {}: this server serves {served}", clip(.name))]
    UnknownModel {
        /// The name asked for.
        name: String,
        /// The name served.
        served: String,
    },
    /// A version other than the one served.
    #[error("model {} has no version {}: version {served} is served", clip(.name), clip(.version))]
    UnknownVersion {
        /// The model.
        name: String,
        /// The version asked for.
        version: String,
        /// The version served.
        served: u64,
    },
    /// A model of the repository that is not serving (unloaded, or its
    /// load failed): the reason the repository index gives.
    #[error("model {} is unavailable: {}", clip(.name), clip(.reason))]
    Unavailable {
        /// The model.
        name: String,
        /// Why.
        reason: String,
    },
    /// No such route.
    #[error("no route {} {}", clip(.method), clip(.path))]
    NoRoute {
        /// The method.
        method: String,
        /// The path.
        path: String,
    },
    /// The method is not one the route takes.
    #[error("{} is not allowed on {}", clip(.method), clip(.path))]
    Method {
        /// The method.
        method: String,
        /// The path.
        path: String,
    },
    /// The body is not the JSON the protocol defines.
    #[error("malformed request: {}", clip(&.0.to_string()))]
    BadJson(Arc<serde_json::Error>),
    /// An `Inference-Header-Content-Length` that is not a number.
    #[error("Inference-Header-Content-Length {} is not a byte count", clip(.value))]
    HeaderLength {
        /// The header's value (lossy text).
        value: String,
    },
    /// An `Inference-Header-Content-Length` past the end of the body.
    #[error("Inference-Header-Content-Length is {header}, but the body has only {body} bytes")]
    HeaderPastBody {
        /// The header's value.
        header: usize,
        /// The body's length.
        body: usize,
    },
    /// A tensor, output or parameter the model cannot take (names it).
    #[error(transparent)]
    BadInput(#[from] InputError),
    /// A NaN or infinity where the policy refuses them.
    #[error("input {input}: row {row}, column {column} is {value} (non-finite inputs are refused: reject_non_finite)")]
    NonFinite {
        /// The input.
        input: String,
        /// Its row.
        row: usize,
        /// Its column.
        column: usize,
        /// `NaN`, `inf` or `-inf`.
        value: f32,
    },
    /// The body is over the limit.
    #[error("request body is over the limit of {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: usize,
    },
    /// The body did not arrive in time.
    #[error("request body not received within {seconds} s")]
    BodyTimeout {
        /// The limit.
        seconds: u64,
    },
    /// No byte of the body arrived for too long (a client that stalls mid-body).
    #[error("no byte of the request body arrived for {seconds} s")]
    BodyStalled {
        /// The limit.
        seconds: f64,
    },
    /// A transfer coding other than `chunked`: the body cannot be read as sent.
    #[error("transfer coding {} is not implemented (only chunked is)", clip(.coding))]
    TransferCoding {
        /// The coding (as sent).
        coding: String,
    },
    /// The body could not be read (the client went away mid-body).
    #[error("reading the request body: {0}")]
    BodyRead(Arc<axum::Error>),
    /// The queue is full.
    #[error("the queue of {queue} requests is full; retry later")]
    QueueFull {
        /// Its capacity.
        queue: usize,
    },
    /// Request bodies in flight already fill the memory budget.
    #[error("request bodies in flight fill the budget of {budget} bytes; retry later")]
    Busy {
        /// The budget.
        budget: usize,
    },
    /// Answers in flight already fill their budget.
    #[error("answers in flight fill the budget of {budget} bytes; retry later")]
    AnswersBusy {
        /// The budget.
        budget: usize,
    },
    /// An answer larger than the whole answer budget (it could never be held).
    #[error(
        "the outputs asked for may take {bytes} bytes, over the budget of {budget} for all answers in flight: \
         ask for fewer rows or outputs, or binary outputs"
    )]
    AnswerTooLarge {
        /// The bound of the answer's size.
        bytes: usize,
        /// The budget.
        budget: usize,
    },
    /// The server is draining before it stops.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The model's forward failed (a bug or a device failure: decoding
    /// refuses every input it would). A pipeline's `DeployError` is
    /// [`pmstate_policy::RunError::Family`]'s source.
    #[error("internal error: the forward failed: {0}")]
    Forward(Arc<pmstate_policy::RunError>),
    /// The contract was asked of a model that is not a pipeline.
    #[error("model {} is a policy, not a pipeline (pmstate serve --pipeline): it has no deployment contract", clip(.name))]
    NoContract {
        /// The model.
        name: String,
    },
    /// The policy's forward panicked (a bug); the server goes on.
    #[error("internal error: the forward panicked")]
    Panicked,
    /// An output asked for was not computed (a bug).
    #[error("internal error: output {output} was not computed")]
    NotComputed {
        /// The output.
        output: &'static str,
    },
    /// A blocking task (decoding a large body) did not finish.
    #[error("internal error: {what}: {source}")]
    Task {
        /// What the task did.
        what: &'static str,
        /// Why it did not finish.
        source: Arc<tokio::task::JoinError>,
    },
}

impl RequestError {
    /// The HTTP status the protocol (or Triton, where it leaves room) uses.
    pub fn status(&self) -> StatusCode {
        match self {
            RequestError::UnknownModel { .. }
            | RequestError::UnknownVersion { .. }
            | RequestError::Unavailable { .. }
            | RequestError::NoRoute { .. }
            | RequestError::NoContract { .. } => StatusCode::NOT_FOUND,
            RequestError::Method { .. } => StatusCode::METHOD_NOT_ALLOWED,
            RequestError::BadJson(_)
            | RequestError::HeaderLength { .. }
            | RequestError::HeaderPastBody { .. }
            | RequestError::BadInput(_)
            | RequestError::NonFinite { .. }
            | RequestError::AnswerTooLarge { .. }
            | RequestError::BodyRead(_) => StatusCode::BAD_REQUEST,
            RequestError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            RequestError::BodyTimeout { .. } | RequestError::BodyStalled { .. } => StatusCode::REQUEST_TIMEOUT,
            RequestError::TransferCoding { .. } => StatusCode::NOT_IMPLEMENTED,
            RequestError::QueueFull { .. }
            | RequestError::Busy { .. }
            | RequestError::AnswersBusy { .. }
            | RequestError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            RequestError::Forward(_)
            | RequestError::Panicked
            | RequestError::NotComputed { .. }
            | RequestError::Task { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Seconds a client should wait before retrying (`Retry-After`), for refusals that pass.
    pub fn retry_after(&self) -> Option<u32> {
        match self {
            RequestError::QueueFull { .. } | RequestError::Busy { .. } | RequestError::AnswersBusy { .. } => Some(1),
            _ => None,
        }
    }

    /// The `kind` label of `pmstate_infer_errors_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            RequestError::UnknownModel { .. }
            | RequestError::UnknownVersion { .. }
            | RequestError::Unavailable { .. }
            | RequestError::NoRoute { .. }
            | RequestError::NoContract { .. } => "not_found",
            RequestError::Method { .. } => "method",
            RequestError::BadJson(_) | RequestError::HeaderLength { .. } | RequestError::HeaderPastBody { .. } => {
                "bad_json"
            }
            RequestError::BadInput(_) => "bad_input",
            RequestError::NonFinite { .. } => "non_finite",
            RequestError::TooLarge { .. } | RequestError::AnswerTooLarge { .. } => "too_large",
            RequestError::BodyTimeout { .. } | RequestError::BodyStalled { .. } => "body_timeout",
            RequestError::TransferCoding { .. } => "transfer_coding",
            RequestError::BodyRead(_) => "body_read",
            RequestError::QueueFull { .. } => "queue_full",
            RequestError::Busy { .. } | RequestError::AnswersBusy { .. } => "busy",
            RequestError::ShuttingDown => "shutting_down",
            RequestError::Forward(_)
            | RequestError::Panicked
            | RequestError::NotComputed { .. }
            | RequestError::Task { .. } => "internal",
        }
    }

    /// Every kind, so that each series exists (at 0) from the start.
    pub const KINDS: [&'static str; 13] = [
        "not_found",
        "method",
        "bad_json",
        "bad_input",
        "non_finite",
        "too_large",
        "body_timeout",
        "body_read",
        "transfer_coding",
        "queue_full",
        "busy",
        "shutting_down",
        "internal",
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_what_is_at_fault_without_debug_formatting() {
        let e = RequestError::from(InputError::Rank {
            input: "mimic_target_poses".into(),
            shape: Dims(vec![2, 576, 1]),
            width: Some(576),
        });
        assert_eq!(e.to_string(), "input mimic_target_poses: shape [2, 576, 1], expected [rows, 576]");
        assert_eq!((e.status(), e.kind()), (StatusCode::BAD_REQUEST, "bad_input"));
        let e = InputError::WidthSum {
            input: "max_coords_obs".into(),
            module: "agent.model.actor.mu".into(),
            parts: vec![("max_coords_obs".into(), 357), ("previous_actions".into(), 69)],
            sum: 426,
            total: 427,
        };
        assert_eq!(
            e.to_string(),
            "input max_coords_obs: agent.model.actor.mu reads max_coords_obs 357 + previous_actions 69 = 426 \
             columns, expected 427 in all"
        );
        let e = InputError::MissingInput { input: "previous_actions".into(), width: None };
        assert_eq!(e.to_string(), "missing input previous_actions (shape [rows, D])");
        let e = LoadError::Incompatible {
            path: "last.ckpt".into(),
            what: Difference::Width { key: "obs".into() },
            old: "3".into(),
            new: "4".into(),
        };
        assert_eq!(
            e.to_string(),
            "last.ckpt: not compatible with the model being served: the width of obs was 3, is 4"
        );
        assert_eq!(OptionsError::Name { name: "a/b".into() }.to_string().split(':').next(), Some("model name \"a/b\""));
    }

    #[test]
    fn quotes_of_client_input_are_clipped_keeping_start_end_and_length() {
        assert_eq!(clip("max_coords_obs"), "max_coords_obs");
        // a multi-byte character across the cut is not split
        let long = format!("{}{}{}", "a".repeat(169), "é".repeat(100_000), "the end at line 1 column 9");
        let c = clip(&long);
        assert!(c.len() < QUOTE_BYTES + 64, "{} bytes", c.len());
        assert!(c.starts_with(&"a".repeat(169)), "{c}");
        assert!(c.contains(&format!("({} bytes in all)", long.len())), "{c}");
        assert!(c.ends_with("the end at line 1 column 9"), "{c}");
        assert_eq!(clip_json("a\"b"), r#""a\"b""#);
        let e = RequestError::NoRoute { method: "GET".into(), path: "/".repeat(1 << 20) };
        assert!(e.to_string().len() < 2 * QUOTE_BYTES);
    }

    #[test]
    fn every_kind_is_listed() {
        let samples = [
            RequestError::NoRoute { method: "GET".into(), path: "/".into() },
            RequestError::Method { method: "GET".into(), path: "/".into() },
            RequestError::HeaderLength { value: "x".into() },
            RequestError::BadInput(InputError::NoInputs),
            RequestError::TooLarge { limit: 1 },
            RequestError::BodyTimeout { seconds: 1 },
            RequestError::BodyStalled { seconds: 0.5 },
            RequestError::TransferCoding { coding: "gzip".into() },
            RequestError::QueueFull { queue: 1 },
            RequestError::Busy { budget: 1 },
            RequestError::ShuttingDown,
            RequestError::Panicked,
        ];
        for e in samples {
            assert!(RequestError::KINDS.contains(&e.kind()), "{e}");
        }
        assert_eq!(RequestError::Busy { budget: 1 }.retry_after(), Some(1));
        assert_eq!(RequestError::Panicked.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
