//! `pmstate bench`: times the normalizer's hot paths against a plain copy.

use std::process::ExitCode;
use std::time::Instant;

use candle_core::{Device, Tensor};
use pmstate_norm::bench_support::{select_isa, Isa};
use pmstate_norm::{NormConfig, RunningMeanStd};
use serde::Serialize;

use crate::args::DeviceArg;
use crate::{output, CliError, Global};

/// `pmstate bench [--threads N] [--device cpu|cuda] [--min-time S] [--shape RxC]...`
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Worker threads (default: all cores).
    #[arg(long, value_parser = crate::args::positive)]
    threads: Option<usize>,
    /// Where the batches live.
    #[arg(long, value_enum, default_value = "cpu")]
    device: DeviceArg,
    /// Seconds to keep timing each op (after at least 7 calls).
    #[arg(long, default_value_t = 0.5, value_parser = crate::args::non_negative)]
    min_time: f64,
    /// Only these shapes, as ROWSxCOLS (repeatable).
    #[arg(long = "shape", value_parser = crate::args::shape)]
    shapes: Vec<(usize, usize)>,
    /// CPU kernels' instruction set (an error if the CPU lacks it); auto: the best, or PMSTATE_CPU_ISA.
    #[arg(long, value_enum, default_value = "auto")]
    isa: IsaArg,
}

/// `--isa`: the instruction set the CPU kernels run with (never one the CPU lacks).
#[derive(Clone, Copy, Debug, Default, clap::ValueEnum)]
pub enum IsaArg {
    /// The best the CPU has, or what PMSTATE_CPU_ISA asks for.
    #[default]
    Auto,
    /// AVX-512 (F, VL) with AVX2 and FMA.
    Avx512,
    /// AVX2 and FMA.
    Avx2,
    /// The baseline (no vector extensions beyond the target's default).
    Scalar,
}

/// Runs the benchmark: a table, or (`--json`) one object per line with op,
/// rows, cols, device, threads, isa, seconds (median per call) and gbps.
pub fn run(a: Args, g: Global) -> Result<ExitCode, CliError> {
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let (device, device_name) = a.device.open()?;
    let shapes = if a.shapes.is_empty() { SHAPES.to_vec() } else { a.shapes };
    let opts = Options { threads, device, device_name, min_time: a.min_time, shapes, quiet: g.quiet, isa: a.isa };
    let mut rows = vec![];
    let mut failed = None;
    bench(&opts, |r| {
        if g.json {
            if let Err(e) = output::json_line(r) {
                failed.get_or_insert(e);
            }
        } else {
            rows.push(format!(
                "{:<20} {:>6}x{:<4} {:>7} {:>3} {:>6} {:>12.1} {:>8.2}",
                r.op,
                r.rows,
                r.cols,
                r.device,
                r.threads,
                r.isa.unwrap_or("-"),
                r.seconds * 1e6,
                r.gbps
            ));
        }
    })?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    if !g.json {
        output::line(format!(
            "{:<20} {:>11} {:>7} {:>3} {:>6} {:>12} {:>8}",
            "op", "shape", "device", "thr", "isa", "median µs", "GB/s"
        ));
        for r in rows {
            output::line(r);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The shapes ProtoMotions-sized observation batches come in.
const SHAPES: [(usize, usize); 3] = [(4096, 358), (16384, 512), (65536, 64)];

/// One timing: `seconds` is the median per call, `gbps` the bytes the op
/// must move (read and written) per second.
#[derive(Debug, Serialize)]
struct Record {
    op: &'static str,
    rows: usize,
    cols: usize,
    device: String,
    threads: usize,
    /// The instruction set of the CPU kernels (null on other devices).
    isa: Option<&'static str>,
    seconds: f64,
    gbps: f64,
}

struct Options {
    threads: usize,
    device: Device,
    device_name: String,
    min_time: f64,
    shapes: Vec<(usize, usize)>,
    quiet: bool,
    isa: IsaArg,
}

/// Deterministic observation-like data: offset features, spread ~1.
fn data(rows: usize, cols: usize) -> Vec<f32> {
    let mut s: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..rows * cols)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            (i % cols) as f32 * 0.01 + 3.0 * (u - 0.5)
        })
        .collect()
}

/// Median seconds per call: 2 warm-up calls, then calls until `min_time`
/// has passed and at least 7 were timed.
fn time(min_time: f64, device: &Device, mut f: impl FnMut() -> Result<(), CliError>) -> Result<f64, CliError> {
    for _ in 0..2 {
        f()?;
    }
    device.synchronize()?;
    let mut samples = vec![];
    let start = Instant::now();
    while samples.len() < 7 || (start.elapsed().as_secs_f64() < min_time && samples.len() < 10_000) {
        let t = Instant::now();
        f()?;
        device.synchronize()?;
        samples.push(t.elapsed().as_secs_f64());
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

fn bench(opts: &Options, mut on_record: impl FnMut(&Record) + Send) -> Result<(), CliError> {
    let choice = match opts.isa {
        IsaArg::Auto => None,
        IsaArg::Avx512 => Some(Isa::Avx512),
        IsaArg::Avx2 => Some(Isa::Avx2),
        IsaArg::Scalar => Some(Isa::Scalar),
    };
    let isa = select_isa(choice)
        .map_err(|e| CliError::Usage(if choice.is_some() { format!("--isa: {e}") } else { e.to_string() }))?;
    let isa = opts.device.is_cpu().then_some(isa.name());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.threads)
        .build()
        .map_err(|e| CliError::Usage(format!("--threads {}: {e}", opts.threads)))?;
    pool.install(|| {
        for &(rows, cols) in &opts.shapes {
            let host = data(rows, cols);
            let x = Tensor::from_vec(host.clone(), (rows, cols), &Device::Cpu)?.to_device(&opts.device)?;
            let bytes = (rows * cols * 4) as f64;
            let obs = NormConfig { clamp_value: Some(5.0), ..NormConfig::default() };
            let ema = NormConfig { ema_decay: Some(0.999), ..obs };
            let mut welford = RunningMeanStd::new(obs, Some(&[cols]), &opts.device)?;
            let mut ema_rms = RunningMeanStd::new(ema, Some(&[cols]), &opts.device)?;
            welford.record_moments(&x)?;
            let ops: [(&'static str, f64); 4] =
                [("normalize", 2.0), ("record_moments", 1.0), ("record_moments_ema", 1.0), ("copy", 2.0)];
            for (op, passes) in ops {
                if !opts.quiet {
                    output::err_line(format!(
                        "bench: {op} {rows}x{cols} on {} ({} threads, {})...",
                        opts.device_name,
                        opts.threads,
                        isa.unwrap_or("-")
                    ));
                }
                let seconds = match op {
                    "normalize" => time(opts.min_time, &opts.device, || {
                        std::hint::black_box(welford.normalize(&x)?);
                        Ok(())
                    })?,
                    "record_moments" => {
                        time(opts.min_time, &opts.device, || Ok(welford.record_moments(&x).map(drop)?))?
                    }
                    "record_moments_ema" => {
                        time(opts.min_time, &opts.device, || Ok(ema_rms.record_moments(&x).map(drop)?))?
                    }
                    _ if opts.device.is_cpu() => time(opts.min_time, &opts.device, || {
                        std::hint::black_box(pmstate_norm::bench_support::copy(&host, cols));
                        Ok(())
                    })?,
                    _ => time(opts.min_time, &opts.device, || {
                        std::hint::black_box(x.copy()?);
                        Ok(())
                    })?,
                };
                on_record(&Record {
                    op,
                    rows,
                    cols,
                    device: opts.device_name.clone(),
                    threads: opts.threads,
                    isa,
                    seconds,
                    gbps: passes * bytes / seconds / 1e9,
                });
            }
        }
        Ok(())
    })
}
