//! `pmstate`: ProtoMotions normalizer state and checkpoints from the command line.
//!
//! Exit codes: 0 fine, 1 a difference or a refusal, 2 an error.

mod bench;
mod bench_collective;
mod ckpt_cmds;
mod config_cmd;
mod output;
mod policy_cmds;
mod replay;

/// mimalloc keeps freed large blocks for reuse: glibc returns every block
/// over its 32 MiB mmap threshold to the OS, so each 32 MiB+ output (and
/// torch's too) pays a page fault per 4 KiB on its first write.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::process::ExitCode;

use candle_core::Device;
use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Norm(#[from] pmstate_norm::NormError),
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    #[error("writing output: {0}")]
    Io(#[from] std::io::Error),
    #[error("encoding JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Ckpt(#[from] pmstate_ckpt::CkptError),
    #[error(transparent)]
    Policy(#[from] pmstate_policy::PolicyError),
}

#[derive(Parser)]
#[command(name = "pmstate", version, about = "ProtoMotions normalizer state and checkpoints, in Rust")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum DeviceArg {
    Cpu,
    Cuda,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum CollectiveArg {
    /// W threads in this process, one per rank.
    Inproc,
    /// One rank per MPI process (start with `mpirun -np W`; needs the `mpi` feature).
    Mpi,
}

#[derive(Clone, Copy, ValueEnum)]
enum KernelsArg {
    Packed,
    Candle,
}

#[derive(Clone, Copy, ValueEnum)]
enum ModeArg {
    Pinned,
    Free,
}

#[derive(Subcommand)]
enum Command {
    /// Replay pm-trace files (or folders of them) and compare every recorded
    /// result. Exit 0 iff every trace passes.
    Replay {
        /// pinned: torch's batch moments and std fed in, results bit for bit;
        /// free: computed here, results within the documented bounds.
        #[arg(long, value_enum, default_value = "pinned")]
        mode: ModeArg,
        /// One JSON object per trace, then a summary object.
        #[arg(long)]
        json: bool,
        /// Seconds a rank waits for its peers before the replay fails.
        #[arg(long, default_value_t = 60.0)]
        timeout: f64,
        /// inproc: W threads; mpi: this process is one rank of `mpirun -np W`
        /// (rank 0 prints, every rank exits with rank 0's code).
        #[arg(long, value_enum, default_value = "inproc")]
        collective: CollectiveArg,
        #[arg(required = true)]
        paths: Vec<std::path::PathBuf>,
    },
    /// Time normalize, record_moments (Welford and EMA) and a plain copy on f32
    /// batches of 4096x358, 16384x512 and 65536x64.
    Bench {
        /// One JSON object per line: op, rows, cols, device, threads, seconds (median per call), gbps.
        #[arg(long)]
        json: bool,
        /// Worker threads (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
        #[arg(long, value_enum, default_value = "cpu")]
        device: DeviceArg,
        /// Seconds to keep timing each op (after at least 7 calls).
        #[arg(long, default_value_t = 0.5)]
        min_time: f64,
        /// Only these shapes, as ROWSxCOLS (repeatable).
        #[arg(long = "shape", value_parser = parse_shape)]
        shapes: Vec<(usize, usize)>,
    },
    /// Time one distributed update (3 all_gathers, combine and update on rank
    /// 0, 3 broadcasts) and one all_gather alone, per call, on W ranks.
    BenchCollective {
        /// One JSON object per line: op, collective, world_size, dim, iters, median_s, mean_s.
        #[arg(long)]
        json: bool,
        /// inproc: W threads (each --world-size); mpi: this process is one
        /// rank of `mpirun -np W`, rank 0 prints.
        #[arg(long, value_enum, default_value = "inproc")]
        collective: CollectiveArg,
        /// World sizes for inproc (repeatable; default 2 and 4).
        #[arg(long = "world-size")]
        world_sizes: Vec<usize>,
        /// Features per state (D).
        #[arg(long, default_value_t = 358)]
        dim: usize,
        /// Timed calls per op (after a tenth as many warm-up calls).
        #[arg(long, default_value_t = 2000)]
        iters: usize,
    },
    /// Show a checkpoint's tree (dtypes, shapes), its normalizer groups and any
    /// unsafe globals. Reads no tensor data except the normalizers' buffers.
    Inspect {
        #[arg(long)]
        json: bool,
        file: PathBuf,
    },
    /// Convert between torch (.pt/.pth/.ckpt/.bin) and .safetensors, by
    /// extension. Exit 1 when refused (unsafe globals).
    Convert {
        /// Export only the dict at this dotted key (e.g. `model`) as plain tensors.
        #[arg(long)]
        select: Option<String>,
        /// Write globals torch's safe loader rejects (the output then needs weights_only=False).
        #[arg(long)]
        allow_unsafe_globals: bool,
        /// Do not fsync the output before renaming it into place: still
        /// atomic, but not durable against a power loss until written back.
        #[arg(long)]
        no_fsync: bool,
        #[arg(long)]
        json: bool,
        input: PathBuf,
        output: PathBuf,
    },
    /// List normalizer groups: shape, count, mean and std summaries; lazy ones that never ran.
    Normalizers {
        #[arg(long)]
        json: bool,
        file: PathBuf,
    },
    /// Show a resolved-configs file (resolved_configs.pt), or the part of it
    /// at `--get`, read without executing anything: dataclasses with their
    /// class, enums with their value, ints and floats kept apart.
    Config {
        /// The JSON tree on one line instead of an indented tree.
        #[arg(long)]
        json: bool,
        /// Only the value at this dotted path (e.g. agent.model.actor.mu_model.norm_clamp_value).
        #[arg(long)]
        get: Option<String>,
        file: PathBuf,
    },
    /// Load a ProtoMotions policy (checkpoint + resolved configs) and describe or run it.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Time the forward (actor and critic) of the full-size smpl tracker
    /// (actor 6x1024, critic 4x1024, obs 358 + 576 + 69) at batch 1, 64,
    /// 1024 and 4096, and reading its weights once (the batch-1 floor).
    BenchPolicy {
        /// One JSON object per line: op, batch, threads, seconds (median per call), rows_per_s, weight_bytes.
        #[arg(long)]
        json: bool,
        /// Worker threads for the matrix products and the normalizer (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
        /// Seconds to keep timing each batch size (after at least 7 calls).
        #[arg(long, default_value_t = 1.0)]
        min_time: f64,
        /// Only these batch sizes (repeatable).
        #[arg(long = "batch")]
        batches: Vec<usize>,
        /// Also write the benchmark's weights (safetensors state dict) here, for benches/policy_side_by_side.py.
        #[arg(long)]
        write_weights: Option<PathBuf>,
        /// packed: pmstate-policy's own CPU kernels; candle: candle's matmul (the gemm crate), for comparison.
        #[arg(long, value_enum, default_value = "packed")]
        kernels: KernelsArg,
    },
    /// Compare two checkpoints: keys, types, scalars, tensors within
    /// |a - b| <= atol + rtol * |b| (NaN equals NaN). Exit 1 if they differ.
    Diff {
        #[arg(long)]
        json: bool,
        #[arg(long, default_value_t = 0.0)]
        rtol: f64,
        #[arg(long, default_value_t = 0.0)]
        atol: f64,
        a: PathBuf,
        b: PathBuf,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// in_keys and their widths, action size, layers, normalizer settings and counts.
    Describe {
        /// The resolved configs (default: resolved_configs_inference.pt, else resolved_configs.pt, next to CHECKPOINT).
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long)]
        json: bool,
        checkpoint: PathBuf,
    },
    /// Run the eval-mode forward on observations: OBS holds one f32 [B, D]
    /// tensor per in_key; OUT gets mean_action, value, std, norm_obs (and
    /// action, neglogp with --sample; disc_logits, disc_reward, disc_value
    /// with --discriminator).
    Run {
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long)]
        obs: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, value_enum, default_value = "cpu")]
        device: DeviceArg,
        /// Also draw actions around the mean (the noise stream of --seed).
        #[arg(long)]
        sample: bool,
        #[arg(long, default_value_t = 0, requires = "sample")]
        seed: u64,
        /// Also run the AMP discriminator and its critic.
        #[arg(long)]
        discriminator: bool,
        #[arg(long)]
        json: bool,
        checkpoint: PathBuf,
    },
}

fn parse_shape(s: &str) -> Result<(usize, usize), String> {
    let (r, c) = s.split_once('x').ok_or_else(|| format!("{s:?}: expected ROWSxCOLS, e.g. 4096x358"))?;
    let p = |v: &str| {
        v.parse::<usize>().map_err(|e| format!("{s:?}: {e}")).and_then(|n| {
            if n == 0 {
                Err(format!("{s:?}: sizes must be > 0"))
            } else {
                Ok(n)
            }
        })
    };
    Ok((p(r)?, p(c)?))
}

fn device(arg: DeviceArg) -> Result<(Device, String), CliError> {
    match arg {
        DeviceArg::Cpu => Ok((Device::Cpu, "cpu".into())),
        DeviceArg::Cuda if cfg!(feature = "cuda") => Ok((Device::new_cuda(0)?, "cuda:0".into())),
        DeviceArg::Cuda => Err(CliError::Usage("this pmstate was built without the `cuda` feature".into())),
    }
}

#[cfg(not(feature = "mpi"))]
fn no_mpi() -> CliError {
    CliError::Usage(
        "this pmstate was built without the `mpi` feature (cargo build -p pmstate-cli --features mpi)".into(),
    )
}

fn run(cli: Cli) -> Result<ExitCode, CliError> {
    match cli.command {
        Command::Replay { mode, json, timeout, collective, paths } => {
            if !(timeout > 0.0 && timeout.is_finite()) {
                return Err(CliError::Usage(format!("--timeout {timeout}: must be a positive number of seconds")));
            }
            let mode = match mode {
                ModeArg::Pinned => pmstate_trace::Mode::Pinned,
                ModeArg::Free => pmstate_trace::Mode::Free,
            };
            let timeout = std::time::Duration::from_secs_f64(timeout);
            let code = match collective {
                CollectiveArg::Inproc => replay::run(&paths, mode, json, timeout)?,
                #[cfg(feature = "mpi")]
                CollectiveArg::Mpi => replay::run_mpi(&paths, mode, json, timeout)?,
                #[cfg(not(feature = "mpi"))]
                CollectiveArg::Mpi => return Err(no_mpi()),
            };
            Ok(ExitCode::from(code))
        }
        Command::Bench { json, threads, device: dev, min_time, shapes } => {
            let threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            if threads == 0 {
                return Err(CliError::Usage("--threads must be at least 1".into()));
            }
            let (device, device_name) = device(dev)?;
            let shapes = if shapes.is_empty() { bench::SHAPES.to_vec() } else { shapes };
            let opts = bench::Options { threads, device, device_name, min_time, shapes };
            let mut rows = vec![];
            bench::run(&opts, |r| {
                if json {
                    output::json_line(r).expect("a Record always serializes");
                } else {
                    rows.push(format!(
                        "{:<20} {:>6}x{:<4} {:>7} {:>3} {:>12.1} {:>8.2}",
                        r.op,
                        r.rows,
                        r.cols,
                        r.device,
                        r.threads,
                        r.seconds * 1e6,
                        r.gbps
                    ));
                }
            })?;
            if !json {
                output::line(format!(
                    "{:<20} {:>11} {:>7} {:>3} {:>12} {:>8}",
                    "op", "shape", "device", "thr", "median µs", "GB/s"
                ));
                for r in rows {
                    output::line(r);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::BenchCollective { json, collective, world_sizes, dim, iters } => {
            if dim == 0 || iters == 0 {
                return Err(CliError::Usage("--dim and --iters must be at least 1".into()));
            }
            let opts = bench_collective::Options { dim, iters };
            let (print, records) = match collective {
                CollectiveArg::Inproc => {
                    let ws = if world_sizes.is_empty() { vec![2, 4] } else { world_sizes };
                    let mut all = vec![];
                    for w in ws {
                        if w == 0 {
                            return Err(CliError::Usage("--world-size must be at least 1".into()));
                        }
                        all.extend(bench_collective::run_inproc(w, &opts)?);
                    }
                    (true, all)
                }
                #[cfg(feature = "mpi")]
                CollectiveArg::Mpi => bench_collective::run_mpi(&opts)?,
                #[cfg(not(feature = "mpi"))]
                CollectiveArg::Mpi => return Err(no_mpi()),
            };
            if print {
                if !json {
                    output::line(format!(
                        "{:<11} {:<7} {:>2} {:>5} {:>12} {:>12}",
                        "op", "coll", "W", "D", "median µs", "mean µs"
                    ));
                }
                for r in &records {
                    if json {
                        output::json_line(r)?;
                    } else {
                        output::line(format!(
                            "{:<11} {:<7} {:>2} {:>5} {:>12.1} {:>12.1}",
                            r.op,
                            r.collective,
                            r.world_size,
                            r.dim,
                            r.median_s * 1e6,
                            r.mean_s * 1e6
                        ));
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Inspect { json, file } => ckpt_cmds::inspect(&file, json),
        Command::Convert { select, allow_unsafe_globals, no_fsync, json, input, output } => {
            ckpt_cmds::convert(&input, &output, select, allow_unsafe_globals, no_fsync, json)
        }
        Command::Normalizers { json, file } => ckpt_cmds::normalizers(&file, json),
        Command::Policy { command } => match command {
            PolicyCommand::Describe { config, json, checkpoint } => {
                let format = if json { policy_cmds::Format::Json } else { policy_cmds::Format::Text };
                policy_cmds::describe(&checkpoint, config.as_deref(), format)
            }
            PolicyCommand::Run { config, obs, out, device: dev, sample, seed, discriminator, json, checkpoint } => {
                let (device, _) = device(dev)?;
                let opts = policy_cmds::RunOptions {
                    checkpoint,
                    config,
                    obs,
                    out,
                    device,
                    sample: sample.then_some(seed),
                    discriminator,
                };
                policy_cmds::run(&opts, if json { policy_cmds::Format::Json } else { policy_cmds::Format::Text })
            }
        },
        Command::BenchPolicy { json, threads, min_time, batches, write_weights, kernels } => {
            let threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            if threads == 0 || batches.contains(&0) {
                return Err(CliError::Usage("--threads and --batch must be at least 1".into()));
            }
            // candle's CPU matmul sizes its gemm parallelism from RAYON_NUM_THREADS
            // (read on every call) and runs it on the current rayon pool: set
            // both, here on the main thread before any worker exists.
            std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .map_err(|e| CliError::Usage(format!("--threads {threads}: {e}")))?;
            let batches = if batches.is_empty() { policy_cmds::BENCH_BATCHES.to_vec() } else { batches };
            let kernels = match kernels {
                KernelsArg::Packed => pmstate_policy::CpuKernels::Packed,
                KernelsArg::Candle => pmstate_policy::CpuKernels::Candle,
            };
            let opts = policy_cmds::BenchOptions { threads, min_time, batches, write_weights, kernels };
            let format = if json { policy_cmds::Format::Json } else { policy_cmds::Format::Text };
            pool.install(|| policy_cmds::bench(&opts, format))
        }
        Command::Config { json, get, file } => {
            let format = if json { config_cmd::Format::Json } else { config_cmd::Format::Text };
            config_cmd::run(&file, get.as_deref(), format)
        }
        Command::Diff { json, rtol, atol, a, b } => ckpt_cmds::diff(&a, &b, ckpt_cmds::Tolerance { rtol, atol }, json),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            output::err_line(format!("pmstate: error: {e}"));
            ExitCode::from(2)
        }
    }
}
