#![doc = include_str!("../README.md")]
// The README's examples are pasted into new crates: a warning there (an
// unused import) is a failure here.
#![doc(test(attr(deny(warnings))))]
#![forbid(unsafe_code)]

pub mod batcher;
mod blocking;
pub mod client;
mod conns;
pub mod decode;
pub mod encode;
mod error;
pub mod events;
pub mod grpc;
pub mod json_floats;
pub mod load;
pub mod metrics;
pub mod model;
pub mod options;
pub mod protocol;
pub mod reload;
pub mod repository;
mod routes;
mod server;
pub mod signals;
pub mod slot;
mod state;

pub use blocking::{default_transport_threads, serve_until_signalled, transport_threads_for, Stopped};
pub use error::{
    Abandon, Difference, Dims, InputError, LoadError, OptionsError, PinProblem, RepositoryError, RequestError,
    StartError, QUOTE_BYTES,
};
pub use events::{ignore_events, Event, EventSink};
pub use options::{Batching, FileLimits, GrpcAddr, Limits, ModelSource, NonFinite, ServeOptions, Watch};
pub use repository::{IndexEntry, ModelConfig, ModelControl, RepositoryOptions};
pub use routes::HEADER_LENGTH;
pub use server::{Server, ServerHandle};
pub use state::{AppState, Served};
