//! The server against real HTTP clients, one test binary (each binary
//! links candle: one link instead of five): the protocol, dynamic
//! batching, bad input, hot reload, shutdown, pipelines.

mod common;

mod bad_input;
mod batching;
mod files;
mod gpc;
mod hostile;
mod pipeline;
mod protocol;
mod reload;
mod shutdown;
