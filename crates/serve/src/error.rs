//! The errors of this crate: why a model could not be loaded (at start or
//! on reload), why the server could not start, and why a request was
//! refused (each with its HTTP status and the metrics label of its kind).

use axum::http::StatusCode;

/// Why a checkpoint could not become the served model.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Reading or building the policy failed.
    #[error(transparent)]
    Policy(#[from] pmstate_policy::PolicyError),
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
    /// A `--widths` pin the checkpoint contradicts.
    #[error("--widths {key}: {reason}")]
    Pin {
        /// The observation key.
        key: String,
        /// What the checkpoint says.
        reason: String,
    },
    /// A new checkpoint that would change what clients send or get.
    #[error("{path}: not compatible with the model being served: {what} was {old}, is {new}")]
    Incompatible {
        /// The new checkpoint.
        path: String,
        /// What differs (in_keys, the width of a key, action size, family).
        what: String,
        /// The served model's.
        old: String,
        /// The new checkpoint's.
        new: String,
    },
    /// Reloading was asked of a model built in process.
    #[error("model {name} was built in process, not loaded from a checkpoint: nothing to reload")]
    NotReloadable {
        /// The model name.
        name: String,
    },
}

/// Why [`crate::Server::start`] failed.
#[derive(Debug, thiserror::Error)]
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
    /// An option makes no sense (`--max-batch 0`, a bad model name, ...).
    #[error("{0}")]
    Options(String),
    /// A thread or the runtime could not be started.
    #[error("starting the server: {0}")]
    Runtime(std::io::Error),
}

/// Why a request was refused; `Display` is the `{"error": ...}` text.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RequestError {
    /// No such model, version or route.
    #[error("{0}")]
    NotFound(String),
    /// The method is not one the route takes.
    #[error("{0}")]
    Method(String),
    /// The body is not the JSON the protocol defines.
    #[error("malformed request: {0}")]
    BadJson(String),
    /// A tensor, output or parameter the model cannot take (names it).
    #[error("{0}")]
    BadInput(String),
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
    /// The body could not be read (the client went away mid-body).
    #[error("reading the request body: {0}")]
    BodyRead(String),
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
    /// The server is draining before it stops.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// A bug or a device failure.
    #[error("internal error: {0}")]
    Internal(String),
}

impl RequestError {
    /// The HTTP status the protocol (or Triton, where it leaves room) uses.
    pub fn status(&self) -> StatusCode {
        match self {
            RequestError::NotFound(_) => StatusCode::NOT_FOUND,
            RequestError::Method(_) => StatusCode::METHOD_NOT_ALLOWED,
            RequestError::BadJson(_) | RequestError::BadInput(_) | RequestError::NonFinite { .. } => {
                StatusCode::BAD_REQUEST
            }
            RequestError::BodyRead(_) => StatusCode::BAD_REQUEST,
            RequestError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            RequestError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            RequestError::QueueFull { .. } | RequestError::Busy { .. } | RequestError::ShuttingDown => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            RequestError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Seconds a client should wait before retrying (`Retry-After`), for refusals that pass.
    pub fn retry_after(&self) -> Option<u32> {
        match self {
            RequestError::QueueFull { .. } | RequestError::Busy { .. } => Some(1),
            _ => None,
        }
    }

    /// The `kind` label of `pmstate_infer_errors_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            RequestError::NotFound(_) => "not_found",
            RequestError::Method(_) => "method",
            RequestError::BadJson(_) => "bad_json",
            RequestError::BadInput(_) => "bad_input",
            RequestError::NonFinite { .. } => "non_finite",
            RequestError::TooLarge { .. } => "too_large",
            RequestError::BodyTimeout { .. } => "body_timeout",
            RequestError::BodyRead(_) => "body_read",
            RequestError::QueueFull { .. } => "queue_full",
            RequestError::Busy { .. } => "busy",
            RequestError::ShuttingDown => "shutting_down",
            RequestError::Internal(_) => "internal",
        }
    }

    /// Every kind, so that each series exists (at 0) from the start.
    pub const KINDS: [&'static str; 12] = [
        "not_found",
        "method",
        "bad_json",
        "bad_input",
        "non_finite",
        "too_large",
        "body_timeout",
        "body_read",
        "queue_full",
        "busy",
        "shutting_down",
        "internal",
    ];
}
