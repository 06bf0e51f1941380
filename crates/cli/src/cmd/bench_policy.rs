//! `pmstate bench-policy`: the forward of the full-size smpl tracker against
//! the time to read its weights once.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use clap::ValueEnum;
use pmstate_policy::config::{
    ActorConfig, Family, LayerConfig, MlpConfig, ModelConfig, ModuleConfig, NormSettings, Number,
};
use pmstate_policy::module_ops::ModuleOp;
use pmstate_policy::served::{Batch, Model, Named, Segment, Source, Wanted};
use pmstate_policy::{Activation, Policy, PolicyModel};
use serde::Serialize;

use crate::args::OutputFormat;
use crate::{output, CliError, Global};

/// Which CPU matrix product.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum KernelsArg {
    /// pmstate-policy's own packed float32 kernels.
    Packed,
    /// candle's matmul (the gemm crate), for comparison.
    Candle,
}

/// Which model family to time.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum FamilyArg {
    /// The full-size smpl PPO tracker (actor and critic).
    Tracker,
    /// MaskedMimic at the published smpl model's sizes (`forward_inference`: prior with its transformer, trunk).
    MaskedMimic,
    /// The GPC prior at the published size (teacher forced and generating).
    GpcPrior,
}

/// `pmstate bench-policy [--family tracker|masked-mimic|gpc-prior] [--threads N] [--batch B]... [--kernels packed|candle] [--write-weights P] [--min-time S] [--check]`
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Worker threads for the matrix products and the normalizer (default: all cores).
    #[arg(long, value_parser = crate::args::positive)]
    threads: Option<usize>,
    /// Seconds to keep timing each batch size (after at least 7 calls).
    #[arg(long, default_value_t = 1.0, value_parser = crate::args::non_negative)]
    min_time: f64,
    /// Only these batch sizes (repeatable).
    #[arg(long = "batch", value_parser = crate::args::positive)]
    batches: Vec<usize>,
    /// Also write the benchmark's weights (safetensors state dict) here, for benches/policy_side_by_side.py.
    #[arg(long)]
    write_weights: Option<PathBuf>,
    /// packed: pmstate-policy's own CPU kernels; candle: candle's matmul (the gemm crate), for comparison.
    #[arg(long, value_enum, default_value = "packed")]
    kernels: KernelsArg,
    /// A speed gate for CI, not a measurement: exit 1 if the batch-1 forward
    /// takes more than 3x the time to read the weights once, or the packed
    /// kernels more than 1.5x candle's matmul at batch 1, 2, 3, 4 or 8, or a
    /// row more than 1.15x a row's time at the next smaller batch of the
    /// sweep 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64 (a throughput dip)
    /// (fastest calls, ratios within this run, on this CPU's instruction set).
    #[arg(long, conflicts_with_all = ["batches", "kernels", "family"])]
    check: bool,
    /// Which model: the smpl tracker, MaskedMimic or the GPC prior at their published sizes
    /// (default batches: the sweep 1-64 and 256 for MaskedMimic, 1 and 256 for the prior;
    /// for MaskedMimic the --write-weights state dict uses ProtoMotions' names).
    #[arg(long, value_enum)]
    family: Option<FamilyArg>,
}

/// Runs the benchmark: a table, or (`--json`) one object per line with op,
/// batch, threads, seconds (median per call), rows_per_s, weight_bytes.
pub fn run(a: Args, g: Global) -> Result<ExitCode, CliError> {
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    // candle's CPU matmul sizes its gemm parallelism from RAYON_NUM_THREADS
    // (read on every call) and runs it on the current rayon pool: set
    // both, here on the main thread before any worker exists.
    std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| CliError::Usage(format!("--threads {threads}: {e}")))?;
    let family = a.family.unwrap_or(FamilyArg::Tracker);
    let batches = match (a.batches.is_empty(), family) {
        (false, _) => a.batches,
        (true, FamilyArg::Tracker) => BENCH_BATCHES.to_vec(),
        (true, FamilyArg::MaskedMimic) => SWEEP_BATCHES.iter().copied().chain([256]).collect(),
        (true, FamilyArg::GpcPrior) => super::bench_gpc::GPC_BATCHES.to_vec(),
    };
    let kernels = match a.kernels {
        KernelsArg::Packed => pmstate_policy::CpuKernels::Packed,
        KernelsArg::Candle => pmstate_policy::CpuKernels::Candle,
    };
    let opts = BenchOptions { threads, min_time: a.min_time, batches, write_weights: a.write_weights, kernels };
    let format = g.format();
    if family == FamilyArg::GpcPrior {
        pool.install(|| super::bench_gpc::bench(&opts, format))
    } else if a.check {
        pool.install(|| check(&opts, format))
    } else if family == FamilyArg::MaskedMimic {
        pool.install(|| bench_masked_mimic(&opts, format))
    } else {
        pool.install(|| bench(&opts, format))
    }
}

/// The full-size smpl tracker: obs widths, actor and critic hidden layers.
pub const BENCH_KEYS: [(&str, usize); 3] =
    [("max_coords_obs", 358), ("mimic_target_poses", 576), ("previous_actions", 69)];
/// Actions of the smpl tracker.
pub const BENCH_ACTIONS: usize = 69;
/// Batch sizes timed: the sweep of the sizes a server's dynamic batching
/// makes, then large batches.
pub const BENCH_BATCHES: [usize; 14] = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 1024, 4096];
/// The sweep from 1 to 64 rows the gate checks for throughput steps.
pub const SWEEP_BATCHES: [usize; 12] = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64];

/// One timing of `bench-policy`.
#[derive(Debug, Serialize)]
pub struct BenchRecord {
    /// `forward` (actor and critic) or `stream` (reading the weights once).
    pub op: &'static str,
    /// Batch size.
    pub batch: usize,
    /// Threads.
    pub threads: usize,
    /// Median seconds per call.
    pub seconds: f64,
    /// Fastest call (on a shared machine, the least disturbed one).
    pub min_seconds: f64,
    /// CPU seconds per call of all this process's threads, averaged over
    /// the timed calls (Linux: /proc/self/task/*/schedstat); time other
    /// processes take from the cores does not count. None elsewhere.
    pub cpu_seconds: Option<f64>,
    /// Rows per second.
    pub rows_per_s: f64,
    /// Weight bytes read per call.
    pub weight_bytes: usize,
}

pub(crate) fn xorshift(seed: u64) -> impl FnMut() -> f32 {
    let mut s = seed | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

fn mlp_cfg(out_key: &str, layers: usize, num_out: usize) -> MlpConfig {
    MlpConfig {
        in_keys: BENCH_KEYS.iter().map(|(k, _)| k.to_string()).collect(),
        out_key: out_key.into(),
        norm: NormSettings { normalize_obs: true, clamp: Some(Number::Int(5)), ema_decay: Some(0.999) },
        layers: vec![LayerConfig { units: 1024, activation: Activation::Relu, use_layer_norm: false }; layers],
        num_out,
        output_activation: None,
        module_operations: vec![ModuleOp::Forward],
    }
}

/// The smpl tracker's model config, built in Rust.
pub fn bench_config() -> ModelConfig {
    ModelConfig {
        family: Family::Ppo,
        in_keys: BENCH_KEYS.iter().map(|(k, _)| k.to_string()).collect(),
        actor: ActorConfig {
            mu_key: "actor_trunk_out".into(),
            num_out: BENCH_ACTIONS,
            actor_logstd: -2.9,
            learnable_std: false,
            mu_model: ModuleConfig::Mlp(mlp_cfg("actor_trunk_out", 6, BENCH_ACTIONS)),
        },
        critic: ModuleConfig::Mlp(mlp_cfg("value", 4, 1)),
        amp: None,
    }
}

/// Deterministic weights of the benchmark model as a state dict (kaiming-uniform scale).
pub fn bench_weights() -> Result<HashMap<String, Tensor>, CliError> {
    let dev = Device::Cpu;
    let width: usize = BENCH_KEYS.iter().map(|(_, w)| w).sum();
    let mut rnd = xorshift(0x5eed);
    let mut m = HashMap::new();
    for (prefix, layers, out) in [("_actor.mu", 6usize, BENCH_ACTIONS), ("_critic", 4, 1)] {
        let mut fan_in = width;
        for i in 0..=layers {
            let fan_out = if i == layers { out } else { 1024 };
            let bound = 1.0 / (fan_in as f32).sqrt();
            let w: Vec<f32> = (0..fan_in * fan_out).map(|_| rnd() * bound).collect();
            let b: Vec<f32> = (0..fan_out).map(|_| rnd() * bound).collect();
            m.insert(format!("{prefix}.mlp.{}.weight", 2 * i), Tensor::from_vec(w, (fan_out, fan_in), &dev)?);
            m.insert(format!("{prefix}.mlp.{}.bias", 2 * i), Tensor::from_vec(b, fan_out, &dev)?);
            fan_in = fan_out;
        }
        let mean: Vec<f64> = (0..width).map(|_| rnd() as f64 * 2.0).collect();
        let var: Vec<f64> = (0..width).map(|_| (rnd() as f64 + 1.5) * 2.0).collect();
        m.insert(format!("{prefix}.norm.running_obs_norm.mean"), Tensor::from_vec(mean, width, &dev)?);
        m.insert(format!("{prefix}.norm.running_obs_norm.var"), Tensor::from_vec(var, width, &dev)?);
        m.insert(format!("{prefix}.norm.running_obs_norm.count"), Tensor::new(1i64, &dev)?);
    }
    m.insert("_actor.logstd".into(), Tensor::full(-2.9f32, BENCH_ACTIONS, &dev)?);
    Ok(m)
}

/// Deterministic observations of `batch` rows.
pub fn bench_obs(batch: usize) -> Result<HashMap<String, Tensor>, CliError> {
    let mut rnd = xorshift(0x0b5 + batch as u64);
    let mut m = HashMap::new();
    for (k, w) in BENCH_KEYS {
        let v: Vec<f32> = (0..batch * w).map(|_| rnd() * 3.0).collect();
        m.insert(k.to_string(), Tensor::from_vec(v, (batch, w), &Device::Cpu)?);
    }
    Ok(m)
}

/// Options of `bench-policy`.
pub struct BenchOptions {
    /// Threads.
    pub threads: usize,
    /// Seconds to keep timing each batch size.
    pub min_time: f64,
    /// Batch sizes.
    pub batches: Vec<usize>,
    /// Write the weights (safetensors) here, for the side-by-side script.
    pub write_weights: Option<PathBuf>,
    /// Which CPU matrix product.
    pub kernels: pmstate_policy::CpuKernels,
}

/// CPU nanoseconds used so far by every thread of this process.
fn cpu_ns() -> Option<u64> {
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// How a benchmark times a call: `warmups` untimed calls, then at least
/// `min_calls` timed ones, and more until `min_time` seconds have passed
/// (at most 100 000).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub warmups: usize,
    pub min_calls: usize,
    pub min_time: f64,
}

/// What [`time_calls`] measured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timed {
    /// Median seconds per call.
    pub median: f64,
    /// Fastest call.
    pub min: f64,
    /// CPU seconds per call over all threads (Linux only).
    pub cpu: Option<f64>,
    /// Calls timed.
    pub calls: usize,
}

/// Times `f` as `timing` says.
pub(crate) fn time_calls(timing: Timing, mut f: impl FnMut() -> Result<(), CliError>) -> Result<Timed, CliError> {
    for _ in 0..timing.warmups {
        f()?;
    }
    let mut samples = vec![];
    let cpu0 = cpu_ns();
    let start = Instant::now();
    while samples.len() < timing.min_calls.max(1)
        || (start.elapsed().as_secs_f64() < timing.min_time && samples.len() < 100_000)
    {
        let t = Instant::now();
        f()?;
        samples.push(t.elapsed().as_secs_f64());
    }
    let cpu = match (cpu0, cpu_ns()) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 * 1e-9 / samples.len() as f64),
        _ => None,
    };
    samples.sort_by(f64::total_cmp);
    Ok(Timed { median: samples[samples.len() / 2], min: samples[0], cpu, calls: samples.len() })
}

/// (median, min, CPU seconds per call): 3 warm-up calls, at least 7 timed.
fn median_seconds(min_time: f64, f: impl FnMut() -> Result<(), CliError>) -> Result<(f64, f64, Option<f64>), CliError> {
    let t = time_calls(Timing { warmups: 3, min_calls: 7, min_time }, f)?;
    Ok((t.median, t.min, t.cpu))
}

/// The benchmark policy and its weights, loaded through a safetensors file
/// as a user's checkpoint would be (kept at `--write-weights`).
struct Loaded {
    weights: HashMap<String, Tensor>,
    ckpt: pmstate_ckpt::Checkpoint,
}

impl Loaded {
    fn new(opts: &BenchOptions) -> Result<Loaded, CliError> {
        let weights = bench_weights()?;
        let path = match &opts.write_weights {
            Some(p) => p.clone(),
            None => std::env::temp_dir().join(format!("pmstate-bench-policy-{}.safetensors", std::process::id())),
        };
        candle_core::safetensors::save(&weights, &path)?;
        let ckpt = pmstate_ckpt::Checkpoint::open(&path);
        if opts.write_weights.is_none() {
            let _ = std::fs::remove_file(&path);
        }
        Ok(Loaded { weights, ckpt: ckpt? })
    }

    /// The policy as a [`Model`], timed as serve and `policy run` run it.
    fn model(&self, kernels: pmstate_policy::CpuKernels) -> Result<PolicyModel, CliError> {
        let policy = Policy::from_parts(bench_config(), &self.ckpt, &Device::Cpu)?.with_cpu_kernels(kernels)?;
        Ok(PolicyModel::new(policy, &[])?)
    }

    /// Bytes of the Linear weights and biases.
    fn weight_bytes(&self) -> usize {
        self.weights
            .iter()
            .filter(|(k, _)| k.contains(".mlp."))
            .map(|(_, t)| t.elem_count() * t.dtype().size_in_bytes())
            .sum()
    }

    /// The physical floor at batch 1: reading every weight once.
    fn stream(&self, opts: &BenchOptions) -> Result<BenchRecord, CliError> {
        let flat: Vec<f32> = self
            .weights
            .iter()
            .filter(|(k, _)| k.contains(".mlp."))
            .map(|(_, t)| t.flatten_all().and_then(|t| t.to_dtype(DType::F32)).and_then(|t| t.to_vec1::<f32>()))
            .collect::<Result<Vec<_>, _>>()?
            .concat();
        let mut sink = 0f32;
        let stream = median_seconds(opts.min_time, || {
            use rayon::prelude::*;
            // 16 independent sums per chunk: bound by memory, not by add latency
            sink += flat
                .par_chunks(1 << 16)
                .map(|c| {
                    let mut acc = [0f32; 16];
                    for v in c.chunks_exact(16) {
                        for (a, &x) in acc.iter_mut().zip(v) {
                            *a += x;
                        }
                    }
                    acc.iter().sum::<f32>()
                })
                .sum::<f32>();
            Ok(())
        })?;
        std::hint::black_box(sink);
        Ok(BenchRecord {
            op: "stream",
            batch: 0,
            threads: opts.threads,
            seconds: stream.0,
            min_seconds: stream.1,
            cpu_seconds: stream.2,
            rows_per_s: 0.0,
            weight_bytes: self.weight_bytes(),
        })
    }
}

/// One call of `model` on `inputs` (one caller's rows, wanting every
/// output of `sources`, drawing with `seed`) through the model interface,
/// as serve and `policy run` call it.
pub(crate) fn run_once(
    model: &dyn Model,
    inputs: &HashMap<String, Tensor>,
    sources: &[Source],
    seed: Option<u64>,
) -> Result<Named, CliError> {
    let rows = inputs.values().next().and_then(|t| t.dims().first().copied()).unwrap_or(0);
    let segment = Segment { rows, seed, wanted: Wanted::Sources(sources) };
    let batch = Batch { inputs, segments: &[segment], chunk_rows: usize::MAX };
    Ok(model.run(&batch)?.into_iter().next().unwrap_or_default())
}

/// One forward timing (actor and critic) of `model` at batch `b`.
fn time_forward(
    model: &dyn Model,
    b: usize,
    opts: &BenchOptions,
    weight_bytes: usize,
) -> Result<BenchRecord, CliError> {
    let obs = bench_obs(b)?;
    let s = median_seconds(opts.min_time, || {
        std::hint::black_box(run_once(model, &obs, &[Source::Actor, Source::Critic], None)?);
        Ok(())
    })?;
    Ok(BenchRecord {
        op: "forward",
        batch: b,
        threads: opts.threads,
        seconds: s.0,
        min_seconds: s.1,
        cpu_seconds: s.2,
        rows_per_s: b as f64 / s.0,
        weight_bytes,
    })
}

/// `pmstate bench-policy --family masked-mimic`: `MaskedMimic::forward`
/// (with a `vae_noise`) per batch size.
pub fn bench_masked_mimic(opts: &BenchOptions, format: OutputFormat) -> Result<ExitCode, CliError> {
    let (model, weight_bytes) = super::bench_masked_mimic::load(opts.write_weights.as_deref())?;
    let mut records = Vec::new();
    for &b in &opts.batches {
        let obs = super::bench_masked_mimic::obs(b)?;
        let s = median_seconds(opts.min_time, || {
            std::hint::black_box(run_once(&model, &obs, &[Source::Actor], None)?);
            Ok(())
        })?;
        records.push(BenchRecord {
            op: "forward",
            batch: b,
            threads: opts.threads,
            seconds: s.0,
            min_seconds: s.1,
            cpu_seconds: s.2,
            rows_per_s: b as f64 / s.0,
            weight_bytes,
        });
    }
    print_records(&records, weight_bytes, opts, format)
}

/// `pmstate bench-policy`.
pub fn bench(opts: &BenchOptions, format: OutputFormat) -> Result<ExitCode, CliError> {
    let loaded = Loaded::new(opts)?;
    let model = loaded.model(opts.kernels)?;
    let weight_bytes = loaded.weight_bytes();
    let mut records = vec![loaded.stream(opts)?];
    for &b in &opts.batches {
        records.push(time_forward(&model, b, opts, weight_bytes)?);
    }
    print_records(&records, weight_bytes, opts, format)
}

fn print_records(
    records: &[BenchRecord],
    weight_bytes: usize,
    opts: &BenchOptions,
    format: OutputFormat,
) -> Result<ExitCode, CliError> {
    match format {
        OutputFormat::Json => {
            for r in records {
                output::json_line(r)?;
            }
        }
        OutputFormat::Text => {
            output::line(format!(
                "{:<8} {:>6} {:>3} {:>12} {:>12} {:>12} {:>12}",
                "op", "batch", "thr", "median µs", "min µs", "cpu µs", "rows/s"
            ));
            for r in records {
                output::line(format!(
                    "{:<8} {:>6} {:>3} {:>12.1} {:>12.1} {:>12.1} {:>12.0}",
                    r.op,
                    r.batch,
                    r.threads,
                    r.seconds * 1e6,
                    r.min_seconds * 1e6,
                    r.cpu_seconds.unwrap_or(f64::NAN) * 1e6,
                    r.rows_per_s
                ));
            }
            if records.iter().any(|r| r.op == "stream") {
                output::line(format!(
                    "weights {:.1} MB; stream = reading them once with {} threads",
                    weight_bytes as f64 / 1e6,
                    opts.threads
                ));
            } else {
                output::line(format!("weights {:.1} MB", weight_bytes as f64 / 1e6));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Batch sizes the gate compares the packed kernels with candle's matmul at.
pub const CHECK_BATCHES: [usize; 5] = [1, 2, 3, 4, 8];
/// The most the batch-1 forward may take, in times the weights' streaming time.
pub const CHECK_STREAM_LIMIT: f64 = 3.0;
/// The most the packed kernels may take, in times candle's matmul.
pub const CHECK_CANDLE_LIMIT: f64 = 1.5;
/// The most a row may take at one batch of [`SWEEP_BATCHES`], in times a
/// row at the next smaller one (rows/s may not fall by more than that
/// share). A kernel whose last rows ran latency-bound made it 1.19 from
/// 12 to 16 rows (AVX-512, Zen 5), onnxruntime-beating batches meanwhile;
/// healthy kernels stay under 1.0 there, and the fastest of many calls
/// moves by a few percent on a shared machine.
pub const CHECK_STEP_LIMIT: f64 = 1.15;
/// Passes over [`SWEEP_BATCHES`] whose fastest calls the step check takes
/// (a slow spell of the machine during one pass touches every batch).
const SWEEP_PASSES: usize = 2;

/// One ratio `bench-policy --check` judged.
#[derive(Debug, Serialize)]
pub struct CheckRecord {
    /// `forward_vs_stream` (batch 1), `packed_vs_candle`, or
    /// `throughput_step` (a row's time at `batch` over a row's at the next
    /// smaller batch of the sweep).
    pub check: &'static str,
    /// Batch size.
    pub batch: usize,
    /// Fastest packed forward over the fastest reference call.
    pub ratio: f64,
    /// The largest ratio that passes.
    pub limit: f64,
    /// `ratio <= limit`.
    pub pass: bool,
    /// The instruction set the packed kernels ran with.
    pub isa: String,
}

/// The throughput-step checks of a sweep: for each batch after the first,
/// a row's time (`seconds / batch`) over a row's time at the batch before,
/// at most [`CHECK_STEP_LIMIT`].
fn throughput_steps(batches: &[usize], seconds: &[f64], isa: &str) -> Vec<CheckRecord> {
    let per_row: Vec<f64> = batches.iter().zip(seconds).map(|(&b, &s)| s / b as f64).collect();
    per_row
        .windows(2)
        .zip(batches.iter().skip(1))
        .map(|(w, &batch)| {
            let ratio = w[1] / w[0];
            CheckRecord {
                check: "throughput_step",
                batch,
                ratio,
                limit: CHECK_STEP_LIMIT,
                pass: ratio <= CHECK_STEP_LIMIT,
                isa: isa.to_string(),
            }
        })
        .collect()
}

/// `pmstate bench-policy --check`: the speed gate of `.ci/run`.
///
/// Fastest calls (the least disturbed by other processes) and ratios within
/// one run, so the gate needs no reference machine; the margins are wide
/// because it is there to catch a kernel running 10x slow (compiled
/// without its instruction set, say), not to measure.
pub fn check(opts: &BenchOptions, format: OutputFormat) -> Result<ExitCode, CliError> {
    let loaded = Loaded::new(opts)?;
    let packed = loaded.model(pmstate_policy::CpuKernels::Packed)?;
    let candle = loaded.model(pmstate_policy::CpuKernels::Candle)?;
    let weight_bytes = loaded.weight_bytes();
    let isa = pmstate_norm::bench_support::try_isa().map_err(pmstate_policy::PolicyError::from)?.to_string();
    let stream = loaded.stream(opts)?;
    let mut records = vec![];
    let mut checks = vec![];
    for b in CHECK_BATCHES {
        // side by side, so both see the same machine
        let p = time_forward(&packed, b, opts, weight_bytes)?;
        let c = time_forward(&candle, b, opts, weight_bytes)?;
        if b == 1 {
            let ratio = p.min_seconds / stream.min_seconds;
            let pass = ratio <= CHECK_STREAM_LIMIT;
            checks.push(CheckRecord {
                check: "forward_vs_stream",
                batch: 1,
                ratio,
                limit: CHECK_STREAM_LIMIT,
                pass,
                isa: isa.clone(),
            });
        }
        let ratio = p.min_seconds / c.min_seconds;
        let pass = ratio <= CHECK_CANDLE_LIMIT;
        checks.push(CheckRecord {
            check: "packed_vs_candle",
            batch: b,
            ratio,
            limit: CHECK_CANDLE_LIMIT,
            pass,
            isa: isa.clone(),
        });
        records.push(("packed", p));
        records.push(("candle", c));
    }
    // the sweep, in passes (fastest call of each batch over all of them)
    let mut fastest = [f64::INFINITY; SWEEP_BATCHES.len()];
    for _ in 0..SWEEP_PASSES {
        for (&b, best) in SWEEP_BATCHES.iter().zip(&mut fastest) {
            *best = best.min(time_forward(&packed, b, opts, weight_bytes)?.min_seconds);
        }
    }
    checks.extend(throughput_steps(&SWEEP_BATCHES, &fastest, &isa));
    let passed = checks.iter().all(|c| c.pass);
    match format {
        OutputFormat::Json => {
            for c in &checks {
                output::json_line(c)?;
            }
        }
        OutputFormat::Text => {
            output::line(format!(
                "stream: {:.1} µs to read the {:.1} MB of weights once (fastest call); kernels: {isa}",
                stream.min_seconds * 1e6,
                weight_bytes as f64 / 1e6
            ));
            output::line(format!("{:<8} {:>6} {:>12}", "kernels", "batch", "fastest µs"));
            for (k, r) in &records {
                output::line(format!("{k:<8} {:>6} {:>12.1}", r.batch, r.min_seconds * 1e6));
            }
            let sweep: Vec<String> =
                SWEEP_BATCHES.iter().zip(fastest).map(|(b, t)| format!("{b}: {:.0}", t * 1e6)).collect();
            output::line(format!("sweep, fastest µs over {SWEEP_PASSES} passes: {}", sweep.join(", ")));
            for c in &checks {
                let what = match c.check {
                    "forward_vs_stream" => "packed forward / stream",
                    "throughput_step" => "time per row / the smaller batch's",
                    _ => "packed / candle",
                };
                output::line(format!(
                    "{} batch {:>2}: {what} = {:.2} (limit {:.2})",
                    if c.pass { "PASS" } else { "FAIL" },
                    c.batch,
                    c.ratio,
                    c.limit
                ));
            }
            output::line(if passed { "speed gate: passed" } else { "speed gate: FAILED" });
        }
    }
    Ok(if passed { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throughput_dip_in_the_sweep_fails_the_step_check() {
        let batches = [1, 2, 4, 8, 12, 16];
        // memory-bound small batches, then about 0.1 ms a row: passes
        let smooth = [0.55e-3, 0.73e-3, 0.68e-3, 0.79e-3, 1.10e-3, 1.49e-3];
        let checks = throughput_steps(&batches, &smooth, "avx512");
        assert_eq!(checks.iter().map(|c| c.batch).collect::<Vec<_>>(), [2, 4, 8, 12, 16]);
        assert!(checks.iter().all(|c| c.pass), "{checks:?}");
        assert!((checks[4].ratio - (1.49 / 16.0) / (1.10 / 12.0)).abs() < 1e-12);
        // the cliff this gate was written for (12 -> 16 rows 1.19x a row's time)
        let cliff = [0.55e-3, 0.82e-3, 1.11e-3, 1.35e-3, 1.59e-3, 2.52e-3];
        let failed: Vec<usize> =
            throughput_steps(&batches, &cliff, "avx512").iter().filter(|c| !c.pass).map(|c| c.batch).collect();
        assert_eq!(failed, [16]);
    }
}
