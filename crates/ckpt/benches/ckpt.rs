//! Criterion benchmarks of checkpoint I/O on a ~384 MiB ProtoMotions-like
//! PPO checkpoint that the bench writes itself with [`save_torch`] (no torch
//! needed): two large MLPs (actor and critic) in an `OrderedDict` state dict
//! with f64 normalizer mean/var and i64 counts, Adam state (`exp_avg`,
//! `exp_avg_sq`, `step`) for every parameter, and the scalars ProtoMotions
//! saves.
//!
//! - `open`: `Checkpoint::open` + `tensors()` + `normalizers()`, what
//!   `pmstate inspect` does before printing; reads no tensor data (the
//!   storages stay mapped). Goal: < 5 ms.
//! - `convert_safetensors`: `Checkpoint::open` + `save_safetensors` of the
//!   whole checkpoint (the data comes from the source file), atomic (temp
//!   file, fsync, rename): what `pmstate convert X.ckpt X.safetensors` does.
//!   `convert_safetensors_no_fsync`: the same without the fsync
//!   (`convert --no-fsync`), the one to hold against `cp`.
//! - `convert_torch`: the same from that safetensors file with `save_torch`
//!   (`pmstate convert X.safetensors X.pt`).
//! - `cp` and `cp_fsync`: `std::fs::copy` of the source file (what `cp`
//!   does: copy_file_range on Linux), without and with an fsync of the copy:
//!   the baselines for the converts.
//!
//! Every write goes to a fresh file: the previous output is removed and
//! `sync` run before each timed run, untimed.
//!
//! Files go to a folder under `std::env::temp_dir()`, removed at the end.
//! Timings are with a warm page cache (the source was just written). Run
//! without `--bench` (e.g. `cargo test --benches`) it uses a 1/64-size
//! checkpoint and runs each benchmark once.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, SamplingMode, Throughput};
use pmstate_ckpt::{
    save_safetensors, save_torch, Bytes, Checkpoint, DType, Dict, DictKind, Durability, Node, SafetensorsOptions,
    Storage, TensorClass, TensorRef, WriteOptions,
};

/// A checkpoint under construction: the storages its tensors use.
struct Builder {
    storages: HashMap<String, Storage>,
    seed: u32,
}

impl Builder {
    fn tensor(&mut self, dtype: DType, shape: &[usize], data: Vec<u8>) -> Node {
        let key = self.storages.len().to_string();
        assert_eq!(data.len(), shape.iter().product::<usize>() * dtype.size());
        self.storages
            .insert(key.clone(), Storage { typed: true, dtype, location: "cpu".into(), data: Bytes::owned(data) });
        Node::Tensor(Box::new(TensorRef {
            storage: key,
            dtype,
            offset: 0,
            shape: shape.to_vec(),
            stride: TensorRef::contiguous_stride(shape),
            requires_grad: false,
            class: TensorClass::Tensor,
            object: None,
        }))
    }

    /// f32 values in [-scale, scale) from a cheap LCG (incompressible enough, fast to make).
    fn f32s(&mut self, shape: &[usize], scale: f32) -> Node {
        let n: usize = shape.iter().product();
        let mut data = Vec::with_capacity(n * 4);
        let mut s = self.seed;
        for _ in 0..n {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let x = ((s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0) * scale;
            data.extend_from_slice(&x.to_le_bytes());
        }
        self.seed = s;
        self.tensor(DType::F32, shape, data)
    }

    fn f64s(&mut self, shape: &[usize], value: f64) -> Node {
        let n: usize = shape.iter().product();
        self.tensor(DType::F64, shape, value.to_le_bytes().repeat(n))
    }

    fn scalar_i64(&mut self, v: i64) -> Node {
        self.tensor(DType::I64, &[], v.to_le_bytes().to_vec())
    }

    fn scalar_f32(&mut self, v: f32) -> Node {
        self.tensor(DType::F32, &[], v.to_le_bytes().to_vec())
    }
}

fn s(k: &str) -> Node {
    Node::Str(k.to_owned())
}

fn dict(kind: DictKind, entries: Vec<(Node, Node)>) -> Node {
    Node::Dict(Dict::from_entries(kind, entries).expect("unique keys"))
}

/// An MLP's parameter shapes: Linear layers at even indices (ReLU between).
fn mlp(dims: &[usize]) -> Vec<(String, Vec<usize>)> {
    let mut out = Vec::new();
    for (i, w) in dims.windows(2).enumerate() {
        out.push((format!("mlp.{}.weight", 2 * i), vec![w[1], w[0]]));
        out.push((format!("mlp.{}.bias", 2 * i), vec![w[1]]));
    }
    out
}

/// Adam's `state_dict()` for parameters with these shapes.
fn adam(b: &mut Builder, shapes: &[Vec<usize>], lr: f64) -> Node {
    let mut state = Vec::new();
    for (i, shape) in shapes.iter().enumerate() {
        let entry = vec![
            (s("step"), b.scalar_f32(2.0)),
            (s("exp_avg"), b.f32s(shape, 1e-3)),
            (s("exp_avg_sq"), b.f32s(shape, 1e-6)),
        ];
        state.push((Node::Int(i as i64), dict(DictKind::Plain, entry)));
    }
    let group = dict(
        DictKind::Plain,
        vec![
            (s("lr"), Node::Float(lr)),
            (s("betas"), Node::Tuple(vec![Node::Float(0.9), Node::Float(0.999)])),
            (s("eps"), Node::Float(1e-8)),
            (s("weight_decay"), Node::Int(0)),
            (s("amsgrad"), Node::Bool(false)),
            (s("maximize"), Node::Bool(false)),
            (s("foreach"), Node::None),
            (s("capturable"), Node::Bool(false)),
            (s("differentiable"), Node::Bool(false)),
            (s("fused"), Node::None),
            (s("params"), Node::List((0..shapes.len() as i64).map(Node::Int).collect())),
        ],
    );
    dict(
        DictKind::Plain,
        vec![(s("state"), dict(DictKind::Plain, state)), (s("param_groups"), Node::List(vec![group]))],
    )
}

/// A PPO checkpoint as ProtoMotions' agent saves it. `hidden` 2048 gives
/// about 384 MiB (32M parameters, each with two Adam moments).
fn ppo_checkpoint(hidden: usize) -> Checkpoint {
    let (obs, act) = (hidden / 2, 69);
    let mut b = Builder { storages: HashMap::new(), seed: 1 };
    let mut model = Vec::new();
    let mut param_shapes: HashMap<&str, Vec<Vec<usize>>> = HashMap::new();
    for (net, out) in [("_actor.mu.", act), ("_critic.", 1)] {
        let shapes = param_shapes.entry(if out == 1 { "critic" } else { "actor" }).or_default();
        if out != 1 {
            model.push((s("_actor.logstd"), b.f32s(&[act], 1.0)));
            shapes.push(vec![act]);
        }
        let norm = format!("{net}input_models.obs.running_obs_norm.");
        model.push((s(&format!("{norm}mean")), b.f64s(&[obs], 0.25)));
        model.push((s(&format!("{norm}var")), b.f64s(&[obs], 1.5)));
        model.push((s(&format!("{norm}count")), b.scalar_i64(123_456_789)));
        for (name, shape) in mlp(&[obs, hidden, hidden, hidden, hidden, hidden / 2, out]) {
            model.push((s(&format!("{net}{name}")), b.f32s(&shape, 0.05)));
            shapes.push(shape);
        }
    }
    let actor_opt = adam(&mut b, &param_shapes["actor"], 2e-5);
    let critic_opt = adam(&mut b, &param_shapes["critic"], 1e-4);
    let reward_norm = dict(
        DictKind::Ordered,
        vec![(s("mean"), b.f64s(&[1], 0.5)), (s("var"), b.f64s(&[1], 2.0)), (s("count"), b.scalar_i64(4096))],
    );
    let adv_mean = b.f32s(&[1], 0.1);
    let adv_std = b.f32s(&[1], 1.0);
    let root = dict(
        DictKind::Plain,
        vec![
            (s("model"), dict(DictKind::Ordered, model)),
            (s("epoch"), Node::Int(1234)),
            (s("step_count"), Node::Int(3_135_137_969)),
            (s("run_start_time"), Node::Float(1_700_000_000.25)),
            (s("best_evaluated_score"), Node::None),
            (s("running_reward_norm"), reward_norm),
            (s("evaluator"), dict(DictKind::Plain, vec![(s("eval_count"), Node::Int(3))])),
            (s("motion_shard_cycle"), Node::Int(4)),
            (s("actor_optimizer"), actor_opt),
            (s("critic_optimizer"), critic_opt),
            (s("adv_mean_ema"), adv_mean),
            (s("adv_std_ema"), adv_std),
            (
                s("adaptive_lr"),
                dict(
                    DictKind::Plain,
                    vec![(s("actor_lr"), Node::Float(3e-5)), (s("critic_lr"), Node::Float(1e-4 / 1.5))],
                ),
            ),
        ],
    );
    Checkpoint::from_parts(root, b.storages).expect("a valid checkpoint")
}

/// What `pmstate inspect` does before printing: open, list tensors, find normalizers.
fn open_and_scan(path: &Path) -> usize {
    let ckpt = Checkpoint::open(path).unwrap();
    let tensors = ckpt.tensors().len();
    let groups = ckpt.normalizers().unwrap();
    assert_eq!(groups.len(), 3);
    tensors + groups.len()
}

/// Removes `path` if present and syncs the file systems (`sync`), so the
/// next write starts from a settled disk.
fn fresh(path: &Path) {
    let _ = std::fs::remove_file(path);
    let _ = std::process::Command::new("sync").status();
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn benches(c: &mut Criterion, dir: &Path, quick: bool) {
    let src = dir.join("last.ckpt");
    let ckpt = ppo_checkpoint(if quick { 256 } else { 2048 });
    save_torch(&ckpt, &src, &WriteOptions::default()).unwrap();
    drop(ckpt);
    let size = std::fs::metadata(&src).unwrap().len();
    let st = dir.join("last.safetensors");
    let back = dir.join("back.pt");
    let copied = dir.join("copy.ckpt");
    eprintln!("checkpoint: {} ({:.1} MiB)", src.display(), size as f64 / (1 << 20) as f64);

    // The < 5 ms goal, checked outside criterion too (median of 21).
    let t: Vec<Duration> = (0..21)
        .map(|_| {
            let t0 = Instant::now();
            std::hint::black_box(open_and_scan(&src));
            t0.elapsed()
        })
        .collect();
    let m = median(t);
    let verdict = if m < Duration::from_millis(5) { "met" } else { "NOT met" };
    eprintln!("open + tensors + normalizers: median {:.3} ms (goal < 5 ms: {verdict})", m.as_secs_f64() * 1e3);

    let mut g = c.benchmark_group("ckpt");
    g.sample_size(20);
    g.bench_function("open", |b| b.iter(|| open_and_scan(&src)));

    g.sample_size(10);
    g.sampling_mode(SamplingMode::Flat);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(6));
    g.throughput(Throughput::Bytes(size));
    // Every writer gets a fresh output: the previous one is removed and the
    // file system synced before each run, untimed (freeing a 385 MiB file
    // costs up to ~0.2 s here, which would otherwise land in whichever run
    // replaces it). The converts open the input in each run, as `pmstate
    // convert` does: a fresh mapping pays its own page faults.
    g.bench_function("convert_safetensors", |b| {
        b.iter_batched(
            || fresh(&st),
            |()| {
                let ckpt = Checkpoint::open(&src).unwrap();
                save_safetensors(&ckpt, &st, &SafetensorsOptions::default()).unwrap()
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("convert_safetensors_no_fsync", |b| {
        b.iter_batched(
            || fresh(&st),
            |()| {
                let ckpt = Checkpoint::open(&src).unwrap();
                let write = WriteOptions { durability: Durability::NoFsync, ..Default::default() };
                let opts = SafetensorsOptions { write, select: None };
                save_safetensors(&ckpt, &st, &opts).unwrap()
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("cp", |b| {
        b.iter_batched(|| fresh(&copied), |()| std::fs::copy(&src, &copied).unwrap(), BatchSize::PerIteration)
    });
    g.bench_function("cp_fsync", |b| {
        b.iter_batched(
            || fresh(&copied),
            |()| {
                std::fs::copy(&src, &copied).unwrap();
                File::open(&copied).unwrap().sync_all().unwrap();
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("convert_torch", |b| {
        b.iter_batched(
            || fresh(&back),
            |()| {
                let ckpt = Checkpoint::open(&st).unwrap();
                save_torch(&ckpt, &back, &WriteOptions::default()).unwrap()
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

fn main() {
    // cargo bench passes --bench; without it (cargo test --benches) criterion runs each benchmark once.
    let quick = !std::env::args().any(|a| a == "--bench");
    let dir: PathBuf = std::env::temp_dir().join(format!("pmstate-ckpt-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = Criterion::default().configure_from_args();
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| benches(&mut c, &dir, quick)));
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = run {
        std::panic::resume_unwind(e);
    }
    c.final_summary();
}
