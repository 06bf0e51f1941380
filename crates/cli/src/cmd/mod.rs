//! One module per command: its `Args` (clap derive) and its `run`.

pub mod bench;
pub mod bench_collective;
pub mod bench_deploy;
pub mod bench_gpc;
pub mod bench_masked_mimic;
pub mod bench_policy;
pub mod bench_serve;
pub mod clean_tmp;
pub mod config;
pub mod convert;
pub mod deploy;
pub mod deploy_sim;
pub mod diff;
pub mod inspect;
pub mod migrate;
pub mod normalizers;
pub mod policy;
pub(crate) mod realtime_args;
pub mod replay;
pub(crate) mod sensor_stream;
pub mod serve;
