//! What a server is started with: where the model comes from, how requests
//! are batched, what is watched, and the limits that keep a hostile client
//! from hurting it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use candle_core::Device;
use pmstate_policy::Model;

/// Where the served policy comes from.
pub enum ModelSource {
    /// A ProtoMotions checkpoint and its resolved configs (default: next to
    /// it); the only source that can be reloaded.
    Checkpoint {
        /// `last.ckpt` (or `inference_last.ckpt`, a safetensors copy, ...).
        path: PathBuf,
        /// The resolved configs file, when not next to the checkpoint.
        config: Option<PathBuf>,
    },
    /// A ProtoMotions checkpoint served as its deployment pipeline
    /// (`pmstate_deploy::Pipeline`): the inputs and outputs of the ONNX
    /// graph ProtoMotions' exporter writes, on the CPU. Reloadable like
    /// [`ModelSource::Checkpoint`].
    Pipeline {
        /// `last.ckpt`.
        path: PathBuf,
        /// The resolved configs file, when not next to the checkpoint.
        config: Option<PathBuf>,
    },
    /// A model repository in Triton's layout (`DIR/<name>/<version>/`):
    /// several models at once, each version with its own batcher, reload
    /// thread and metrics, and Triton's repository extension (index, load,
    /// unload). [`ServeOptions::name`] and [`ServeOptions::widths`] do not
    /// apply (each model is named by its directory; widths by its configs);
    /// [`ServeOptions::batching`] is each model's default, which its
    /// `config.json` may override. See [`crate::repository`].
    Repository(crate::repository::RepositoryOptions),
    /// A model of any family built in process (`PolicyModel::new` over
    /// `Policy::from_parts`, a `MaskedMimicModel`, ...: widths are pinned
    /// when it is built, not by [`ServeOptions::widths`]); `label` stands
    /// for its checkpoint path in metadata. Cannot be reloaded.
    InProcess {
        /// The model.
        model: Box<dyn Model>,
        /// What to call it in metadata.
        label: String,
    },
}

/// How concurrent requests are merged into one forward (Triton's dynamic batcher).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    /// Most rows in one forward, and so in one request: as Triton does with
    /// `max_batch_size` (which the model configuration reports as this), a
    /// request with more rows is refused with 400, so a client that reads
    /// the configuration never meets a forward larger than it.
    pub max_batch: usize,
    /// How long the oldest waiting request may wait for more rows before
    /// the batch runs anyway. Zero (Triton's default): a batch takes what
    /// is queued when the worker is free, so merging happens only under load
    /// and a lone client pays no wait.
    pub max_wait: Duration,
    /// Most requests waiting; one more is refused with 503 and Retry-After.
    pub queue: usize,
    /// How long the batching thread polls its queue after a batch before
    /// it sleeps. A closed-loop client (a robot or simulator stepping at its
    /// control rate) sends its next request a transport round trip after
    /// its answer: polling meanwhile picks it up without a thread wake-up,
    /// which on a virtual machine whose idle vCPU has halted costs tens of
    /// microseconds (see docs/serve.md, Speed: gRPC). The cost is bounded:
    /// at most this much CPU per batch, and none under load, when the
    /// queue is never empty. Zero: sleep at once (onnxruntime's
    /// `allow_spinning=0`).
    pub spin: Duration,
}

impl Batching {
    /// [`Batching::spin`]'s default: longer than one client's round trip
    /// through the transport (about 80 µs on the machines of
    /// docs/serve.md), short enough that an idle server's last poll costs
    /// nothing worth counting.
    pub const DEFAULT_SPIN: Duration = Duration::from_micros(150);
    /// The longest spin the CLI and a repository's `config.json` take: a
    /// second (a poll that long is a busy thread, not a wake-up saved).
    pub const MAX_SPIN: Duration = Duration::from_secs(1);
}

impl Default for Batching {
    fn default() -> Self {
        Batching { max_batch: 256, max_wait: Duration::ZERO, queue: 1024, spin: Batching::DEFAULT_SPIN }
    }
}

/// Whether the checkpoint file is followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch {
    /// Load once; reload only on SIGHUP (or [`crate::ServerHandle::reload`]).
    Off,
    /// Look at the checkpoint's size, modification time and inode every
    /// `interval`; once a change has stayed unchanged for one more interval,
    /// load, validate and swap it in.
    Poll {
        /// How often to look.
        interval: Duration,
    },
}

/// What happens to NaN and infinite inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NonFinite {
    /// Run them: the answer is what `Policy::forward` gives on those rows
    /// (normalizer clamps apply; a non-finite output is written as the
    /// `NaN` / `Infinity` literal in JSON, as Triton does).
    #[default]
    Pass,
    /// Refuse the request with 400 naming the input, row and column. A
    /// request may also ask for this with the `reject_non_finite` parameter;
    /// under `Reject` a request cannot waive it.
    Reject,
}

/// Bounds on what one client can make the server hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest request body (JSON and binary together): 413 beyond it.
    pub max_body_bytes: usize,
    /// Request bodies held at once, all clients together; a request whose
    /// body does not fit is refused with 503 and Retry-After (memory stays
    /// bounded whatever the number of connections).
    pub max_inflight_body_bytes: usize,
    /// Bytes of answers held at once (waiting for their forward, being
    /// encoded or sent), all clients together. Each request reserves a
    /// bound of its answer's size before it is queued (its rows times the
    /// outputs it asks for, 16 bytes a JSON float, 21 a JSON int64, the
    /// element size in binary), and gives it back once the answer is sent:
    /// one that does not fit gets 503 and Retry-After, one that could never
    /// fit 400. What bounds a GPC prior's logits answers (a small request
    /// asking for many); a policy's answers are a few hundred values a row.
    pub max_inflight_answer_bytes: usize,
    /// Longest time to receive a body: 408 after it.
    pub body_timeout: Duration,
    /// Longest pause between two pieces of a body: a client that stalls
    /// mid-body gets 408 after it (and holds only the bytes it has sent,
    /// which are all it is charged for).
    pub body_stall_timeout: Duration,
    /// Longest wait for a request's head (request line and headers),
    /// counted from when the connection starts waiting for one: on a
    /// kept-alive connection that is when the previous answer was sent, so
    /// this is also how long an idle connection is kept. The connection is
    /// closed after it.
    pub header_timeout: Duration,
    /// Most connections open at once. At the cap (or when the process runs
    /// out of file descriptors), the connection idle the longest (no request
    /// being handled: kept alive, or still sending its head) is closed to
    /// make room; when none is idle, new connections wait in the listen
    /// backlog until one ends.
    pub max_connections: usize,
    /// Longest graceful shutdown: requests still running after it are dropped.
    pub drain_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 64 << 20,
            max_inflight_body_bytes: 512 << 20,
            max_inflight_answer_bytes: 1 << 30,
            body_timeout: Duration::from_secs(30),
            body_stall_timeout: Duration::from_secs(5),
            header_timeout: Duration::from_secs(30),
            max_connections: 1024,
            drain_timeout: Duration::from_secs(30),
        }
    }
}

/// Everything [`crate::Server::start`] needs.
pub struct ServeOptions {
    /// The model.
    pub source: ModelSource,
    /// Its name in URLs (`/v2/models/<name>`).
    pub name: String,
    /// Where to listen (port 0: a free port, see [`crate::Server::addr`]).
    pub addr: SocketAddr,
    /// Where the policy runs.
    pub device: Device,
    /// Dynamic batching.
    pub batching: Batching,
    /// Following the checkpoint.
    pub watch: Watch,
    /// Per-key observation widths the checkpoint leaves open, pinned
    /// (`("max_coords_obs", 358)`); checked against the checkpoint at load.
    pub widths: Vec<(String, usize)>,
    /// NaN and infinite inputs.
    pub non_finite: NonFinite,
    /// Request limits.
    pub limits: Limits,
    /// Threads of the forward (default: all cores).
    pub threads: Option<usize>,
    /// How checkpoint files are read, at start-up and on reload.
    pub files: FileLimits,
    /// Where to serve the KServe V2 gRPC API as well (None: HTTP only):
    /// the same model, batcher, limits and metrics as the HTTP endpoint.
    pub grpc: Option<GrpcAddr>,
}

/// Where the gRPC endpoint listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrpcAddr {
    /// A TCP address (port 0: a free port, see [`crate::Server::grpc_addr`]).
    Tcp(SocketAddr),
    /// A Unix domain socket, for clients on the same machine (no TCP port
    /// to expose, file permissions decide who may connect). A stale socket
    /// file nothing answers on is replaced; the file is removed at shutdown.
    Unix(PathBuf),
}

/// How gRPC clients name it: `grpc://127.0.0.1:8001`, `unix:/run/pmstate.sock`.
impl std::fmt::Display for GrpcAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GrpcAddr::Tcp(a) => write!(f, "grpc://{a}"),
            GrpcAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// How the checkpoint and its configs are read, at start-up and on every
/// reload. Each file is opened without blocking and checked on the open
/// descriptor (a regular file, at most [`FileLimits::max_file_bytes`])
/// before anything reads it; the checkpoint's sha256 is taken last, over
/// at most that many bytes, and gives up at the deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileLimits {
    /// Largest checkpoint or configs file (a 1 TiB sparse file is refused
    /// before a byte of it is read). Default 16 GiB.
    pub max_file_bytes: u64,
    /// Longest one reload may take, hashing included: a load still running
    /// then is abandoned and reported, and the served model stays. Default 120 s.
    pub reload_deadline: Duration,
    /// Globals torch's safe loader rejects in the checkpoint, or foreign
    /// ones in the configs: refused by default (`--allow-unsafe-globals`).
    pub globals: pmstate_policy::Globals,
}

impl Default for FileLimits {
    fn default() -> Self {
        FileLimits {
            max_file_bytes: 16 << 30,
            reload_deadline: Duration::from_secs(120),
            globals: pmstate_policy::Globals::Refuse,
        }
    }
}

impl ServeOptions {
    /// Defaults for everything but the model: name `policy`, 127.0.0.1:8080, CPU.
    pub fn new(source: ModelSource) -> Self {
        ServeOptions {
            source,
            name: "policy".into(),
            addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            device: Device::Cpu,
            batching: Batching::default(),
            watch: Watch::Off,
            widths: Vec::new(),
            non_finite: NonFinite::default(),
            limits: Limits::default(),
            threads: None,
            files: FileLimits::default(),
            grpc: None,
        }
    }
}
