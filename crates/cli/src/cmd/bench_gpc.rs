//! `pmstate bench-policy --family gpc-prior`: the GPC prior at the
//! published size (`gpc_prior/soma_bones`: d_model 1024, 4 heads, 6
//! layers, ff 4096, 8 tokens of a 59049-token vocabulary, the FSQ tracker's
//! decoder), deterministic weights, teacher forced and generating.
//! `benches/gpc_side_by_side.py` times torch eager on the same structure.

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use pmstate_policy::config::{ContainerConfig, FsqConfig, LayerConfig, MlpConfig, ModuleConfig, NormSettings, Number};
use pmstate_policy::gpc::config::{PriorModelConfig, TransformerPriorConfig};
use pmstate_policy::gpc::served::PriorModel;
use pmstate_policy::gpc::tokens::Tokenization;
use pmstate_policy::gpc::LatentPrior;
use pmstate_policy::module_ops::ModuleOp;
use pmstate_policy::served::Source;
use pmstate_policy::Activation;
use serde::Serialize;

use super::bench_policy::{run_once, time_calls, xorshift, BenchOptions, Timed, Timing};
use crate::args::OutputFormat;
use crate::{output, CliError};

/// `max_coords_obs` of the soma23 robot.
pub const GPC_OBS: usize = 343;
/// Transformer width.
pub const GPC_D: usize = 1024;
/// Layers.
pub const GPC_LAYERS: usize = 6;
/// Feed-forward width.
pub const GPC_FF: usize = 4096;
/// Heads.
pub const GPC_HEADS: usize = 4;
/// FSQ levels, scalars, scalars per token: 8 tokens of 9^5.
pub const GPC_FSQ: (usize, usize, usize) = (9, 40, 5);
/// Actions of the decoder.
pub const GPC_ACTIONS: usize = 66;
/// Batch sizes timed by default.
pub const GPC_BATCHES: [usize; 2] = [1, 256];

fn mlp(in_keys: &[&str], out: &str, layers: &[(usize, Activation)], num_out: usize, normalize: bool) -> MlpConfig {
    MlpConfig {
        in_keys: in_keys.iter().map(|k| k.to_string()).collect(),
        out_key: out.into(),
        norm: NormSettings { normalize_obs: normalize, clamp: Some(Number::Int(5)), ema_decay: Some(0.999) },
        layers: layers
            .iter()
            .map(|&(units, activation)| LayerConfig { units, activation, use_layer_norm: false })
            .collect(),
        num_out,
        output_activation: None,
        module_operations: vec![ModuleOp::Forward],
    }
}

fn container(m: MlpConfig) -> ModuleConfig {
    ModuleConfig::Container(ContainerConfig {
        in_keys: m.in_keys.clone(),
        out_keys: vec![m.out_key.clone()],
        models: vec![ModuleConfig::Mlp(m)],
    })
}

const DECODER_LAYERS: [(usize, Activation); 5] = [
    (1024, Activation::Relu),
    (1024, Activation::Relu),
    (1024, Activation::Relu),
    (512, Activation::Relu),
    (256, Activation::Relu),
];

/// The published prior's config, built in Rust.
pub fn gpc_config() -> PriorModelConfig {
    let (levels, scalars, per_token) = GPC_FSQ;
    let tokenization = Tokenization::new(levels, scalars, per_token).expect("the published sizes fit");
    let decoder = FsqConfig {
        in_keys: vec!["mimic_target_poses".into(), "max_coords_obs".into()],
        encoder: ModuleConfig::Mlp(mlp(&["mimic_target_poses"], "latent", &DECODER_LAYERS, scalars, true)),
        decoder: ModuleConfig::Mlp(mlp(&["max_coords_obs", "latent"], "mu", &DECODER_LAYERS, GPC_ACTIONS, true)),
        latent_key: "latent".into(),
        num_fsq_levels: levels,
        num_fsq_scalars: scalars,
    };
    let prior = TransformerPriorConfig {
        in_keys: vec!["max_coords_obs".into(), "prior_tokens".into()],
        token_key: "prior_tokens".into(),
        logits_key: "latent_logits".into(),
        context_embedding_key: "context_embedding".into(),
        token_embedding_key: "_ar_token_embedding".into(),
        hidden_key: "_ar_hidden".into(),
        context_encoder: container(mlp(
            &["max_coords_obs"],
            "context_embedding",
            &[(GPC_D, Activation::Gelu)],
            GPC_D,
            true,
        )),
        token_encoder: container(mlp(&["prior_tokens"], "_ar_token_embedding", &[], GPC_D, false)),
        output_head: container(mlp(&["_ar_hidden"], "latent_logits", &[], tokenization.vocab, false)),
        d_model: GPC_D,
        num_heads: GPC_HEADS,
        num_layers: GPC_LAYERS,
        ff_size: GPC_FF,
        activation: Activation::Gelu,
        max_seq_len: tokenization.tokens + 1,
    };
    PriorModelConfig {
        decoder,
        prior,
        tokenization,
        fsq_scalars_per_prior_token: per_token,
        temperature: 1.0,
        top_p: 0.9,
        rollout_action_std: 1e-4,
    }
}

/// Deterministic weights of [`gpc_config`] (uniform, 1/sqrt(fan_in) scale).
pub fn gpc_weights() -> Result<HashMap<String, Tensor>, CliError> {
    let dev = Device::Cpu;
    let mut rnd = xorshift(0x6bc);
    let mut m = HashMap::new();
    let mut linear = |m: &mut HashMap<String, Tensor>, w: &str, b: &str, out: usize, inp: usize| {
        let bound = 1.0 / (inp as f32).sqrt();
        let wv: Vec<f32> = (0..out * inp).map(|_| rnd() * bound).collect();
        let bv: Vec<f32> = (0..out).map(|_| rnd() * bound).collect();
        m.insert(w.to_owned(), Tensor::from_vec(wv, (out, inp), &dev)?);
        m.insert(b.to_owned(), Tensor::from_vec(bv, out, &dev)?);
        Ok::<(), CliError>(())
    };
    let mut mlp_w = |m: &mut HashMap<String, Tensor>, prefix: &str, widths: &[usize]| {
        for (i, pair) in widths.windows(2).enumerate() {
            let k = format!("{prefix}.mlp.{}", 2 * i);
            linear(m, &format!("{k}.weight"), &format!("{k}.bias"), pair[1], pair[0])?;
        }
        Ok::<(), CliError>(())
    };
    let (_, scalars, _) = GPC_FSQ;
    let vocab = gpc_config().tokenization.vocab;
    mlp_w(&mut m, "prior._context_encoder.models.0", &[GPC_OBS, GPC_D, GPC_D])?;
    mlp_w(&mut m, "prior._token_encoder.models.0", &[vocab, GPC_D])?;
    mlp_w(&mut m, "prior._output_head.models.0", &[GPC_D, vocab])?;
    mlp_w(&mut m, "latent_decoder.decoder", &[GPC_OBS + scalars, 1024, 1024, 1024, 512, 256, GPC_ACTIONS])?;
    for i in 0..GPC_LAYERS {
        let l = format!("prior._transformer.layers.{i}");
        linear(
            &mut m,
            &format!("{l}.self_attn.in_proj_weight"),
            &format!("{l}.self_attn.in_proj_bias"),
            3 * GPC_D,
            GPC_D,
        )?;
        let o = format!("{l}.self_attn.out_proj");
        linear(&mut m, &format!("{o}.weight"), &format!("{o}.bias"), GPC_D, GPC_D)?;
        linear(&mut m, &format!("{l}.linear1.weight"), &format!("{l}.linear1.bias"), GPC_FF, GPC_D)?;
        linear(&mut m, &format!("{l}.linear2.weight"), &format!("{l}.linear2.bias"), GPC_D, GPC_FF)?;
        for n in ["norm1", "norm2"] {
            m.insert(format!("{l}.{n}.weight"), Tensor::ones(GPC_D, candle_core::DType::F32, &dev)?);
            m.insert(format!("{l}.{n}.bias"), Tensor::zeros(GPC_D, candle_core::DType::F32, &dev)?);
        }
    }
    let pos: Vec<f32> = (0..(gpc_config().tokenization.tokens + 1) * GPC_D).map(|_| rnd()).collect();
    m.insert("prior._pos_emb".into(), Tensor::from_vec(pos, (1, gpc_config().tokenization.tokens + 1, GPC_D), &dev)?);
    for (prefix, width) in [("prior._context_encoder.models.0", GPC_OBS), ("latent_decoder.decoder", GPC_OBS + scalars)]
    {
        let mean: Vec<f64> = (0..width).map(|_| rnd() as f64).collect();
        let var: Vec<f64> = (0..width).map(|_| rnd() as f64 + 2.0).collect();
        m.insert(format!("{prefix}.norm.running_obs_norm.mean"), Tensor::from_vec(mean, width, &dev)?);
        m.insert(format!("{prefix}.norm.running_obs_norm.var"), Tensor::from_vec(var, width, &dev)?);
        m.insert(format!("{prefix}.norm.running_obs_norm.count"), Tensor::new(1i64, &dev)?);
    }
    Ok(m)
}

/// One timing of the GPC benchmark.
#[derive(Debug, Serialize)]
pub struct GpcRecord {
    /// `teacher_forced` (one forward over the context and 8 tokens, and the
    /// decoder) or `generate` (8 sampling steps, and the decoder).
    pub op: &'static str,
    /// Batch size.
    pub batch: usize,
    /// Threads.
    pub threads: usize,
    /// Median seconds per call.
    pub seconds: f64,
    /// Fastest call.
    pub min_seconds: f64,
    /// CPU seconds per call, all threads (Linux only).
    pub cpu_seconds: Option<f64>,
    /// Calls timed.
    pub calls: usize,
}

/// One warm-up call (a generation at batch 256 takes tens of seconds), at least 3 timed.
fn time(min_time: f64, f: impl FnMut() -> Result<(), CliError>) -> Result<Timed, CliError> {
    time_calls(Timing { warmups: 1, min_calls: 3, min_time }, f)
}

impl GpcRecord {
    fn new(op: &'static str, batch: usize, threads: usize, t: Timed) -> Self {
        GpcRecord { op, batch, threads, seconds: t.median, min_seconds: t.min, cpu_seconds: t.cpu, calls: t.calls }
    }
}

/// `pmstate bench-policy --family gpc-prior`.
pub fn bench(opts: &BenchOptions, format: OutputFormat) -> Result<std::process::ExitCode, CliError> {
    let weights = gpc_weights()?;
    let path = match &opts.write_weights {
        Some(p) => p.clone(),
        None => std::env::temp_dir().join(format!("pmstate-bench-gpc-{}.safetensors", std::process::id())),
    };
    candle_core::safetensors::save(&weights, &path)?;
    drop(weights);
    let ckpt = pmstate_ckpt::Checkpoint::open(&path);
    if opts.write_weights.is_none() {
        let _ = std::fs::remove_file(&path);
    }
    let prior = LatentPrior::from_parts(gpc_config(), &ckpt?, &Device::Cpu)?;
    let tokens = prior.tokenization().tokens;
    let vocab = prior.tokenization().vocab as i64;
    // timed as serve and `policy run` run it: through the model interface,
    // whose forwards hold at most MAX_LOGITS_PER_FORWARD logits
    let model = PriorModel::new(prior, &path.display().to_string())?;
    let batches = if opts.batches.is_empty() { GPC_BATCHES.to_vec() } else { opts.batches.clone() };
    let mut records = vec![];
    for &b in &batches {
        let mut rnd = xorshift(0x0b5 + b as u64);
        let obs: Vec<f32> = (0..b * GPC_OBS).map(|_| rnd() * 3.0).collect();
        let mut ctx = HashMap::new();
        ctx.insert("max_coords_obs".to_owned(), Tensor::from_vec(obs, (b, GPC_OBS), &Device::Cpu)?);
        let toks: Vec<i64> = (0..b * tokens).map(|i| (i as i64 * 7919) % vocab).collect();
        let mut tf = ctx.clone();
        tf.insert("prior_tokens".to_owned(), Tensor::from_vec(toks, (b, tokens), &Device::Cpu)?);
        let t = time(opts.min_time, || {
            std::hint::black_box(run_once(&model, &tf, &[Source::Actor], None)?);
            Ok(())
        })?;
        records.push(GpcRecord::new("teacher_forced", b, opts.threads, t));
        let mut seed = 0u64;
        let t = time(opts.min_time, || {
            seed += 1;
            std::hint::black_box(run_once(&model, &ctx, &[Source::Actor, Source::Sample], Some(seed))?);
            Ok(())
        })?;
        records.push(GpcRecord::new("generate", b, opts.threads, t));
    }
    match format {
        OutputFormat::Json => {
            for r in &records {
                output::json_line(r)?;
            }
        }
        OutputFormat::Text => {
            output::line(format!(
                "{:<15} {:>6} {:>3} {:>12} {:>12} {:>12} {:>6}",
                "op", "batch", "thr", "median ms", "min ms", "cpu ms", "calls"
            ));
            for r in &records {
                let cpu = r.cpu_seconds.map_or("-".to_owned(), |c| format!("{:.2}", c * 1e3));
                output::line(format!(
                    "{:<15} {:>6} {:>3} {:>12.2} {:>12.2} {:>12} {:>6}",
                    r.op,
                    r.batch,
                    r.threads,
                    r.seconds * 1e3,
                    r.min_seconds * 1e3,
                    cpu,
                    r.calls
                ));
            }
            output::line(format!(
                "GPC prior at the published size: d_model {GPC_D}, {GPC_LAYERS} layers, ff {GPC_FF}, {tokens} tokens of {vocab}"
            ));
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}
