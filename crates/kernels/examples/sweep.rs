//! Times the packed kernels over a sweep of batch sizes on one thread: a
//! stack of ten `Linear(1024, 1024) + ReLU` layers (40 MiB of weights, more
//! than most L3 caches, as the smpl tracker's 42 MB), the fastest of 40
//! calls per batch size, the sizes taking turns over `--rounds` rounds so
//! that a slow spell of a shared machine touches all of them.
//!
//! usage: `cargo run --release -p pmstate-kernels --example sweep -- [--rounds N] [--width W] [--layers L] [BATCH...]`
//! (default: ten layers 1024 wide, every batch from 1 to 64, then 128 and 256;
//! `--width 512 --layers 3` is a deploy actor's size, its weights in cache;
//! `--residency memory|cache` overrides how the layers read their weights;
//! `PMSTATE_CPU_ISA=avx2` times the AVX2 kernels on an AVX-512 CPU).
//!
//! Where `pmstate bench-policy` times a whole policy, this isolates the
//! matrix product: a step in its per-row time shows a kernel's block shape
//! (the latency-bound tail this was written to find).

use std::time::Instant;

use pmstate_kernels::testing::values;
use pmstate_kernels::{Epilogue, PackedLinear, Residency};

const CALLS: usize = 40;

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sweep: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let (mut rounds, mut width, mut layers, mut residency) = (2, 1024, 10, None);
    let mut batches = vec![];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut number = |name: &str| -> Result<usize, Box<dyn std::error::Error>> {
            Ok(args.next().ok_or(format!("{name} needs a number"))?.parse()?)
        };
        if a == "--rounds" {
            rounds = number("--rounds")?;
        } else if a == "--width" {
            width = number("--width")?;
        } else if a == "--layers" {
            layers = number("--layers")?;
        } else if a == "--residency" {
            residency = match args.next().as_deref() {
                Some("memory") => Some(Residency::Memory),
                Some("cache") => Some(Residency::Cache),
                other => {
                    return Err(format!("--residency takes memory or cache, not {}", other.unwrap_or("nothing")).into())
                }
            };
        } else {
            batches.push(a.parse::<usize>().map_err(|e| format!("batch size '{a}': {e}"))?);
        }
    }
    if batches.is_empty() {
        batches = (1..=64).chain([128, 256]).collect();
    }
    let (n_layers, scale) = (layers, 1.0 / (width as f32).sqrt());
    let layers = (0..n_layers as u32)
        .map(|i| {
            let w = values(width * width, 0x9e37_79b9 + i, scale);
            let b = values(width, 0x85eb_ca6b + i, 0.1);
            let layer = PackedLinear::new(&w, &b, width, width)?;
            Ok::<_, pmstate_kernels::IsaError>(match residency {
                Some(r) => layer.with_residency(r),
                None => layer,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (isa, reads) = (layers[0].isa(), layers[0].residency());
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let mut best = vec![f64::INFINITY; batches.len()];
    pool.install(|| {
        for _ in 0..rounds {
            for (m, best) in batches.iter().zip(&mut best) {
                let x = values(m * width, 7, 1.0);
                let mut y = Vec::new();
                for _ in 0..CALLS {
                    let t = Instant::now();
                    for layer in &layers {
                        layer.forward_into(&x, *m, Epilogue::Relu, &mut y);
                    }
                    *best = best.min(t.elapsed().as_secs_f64());
                }
            }
        }
    });
    let mib = (n_layers * width * width * 4) as f64 / (1 << 20) as f64;
    println!(
        "{n_layers} x Linear({width}, {width}) + ReLU ({mib:.1} MiB, {reads}), one thread, {isa}, fastest of {} calls",
        CALLS * rounds
    );
    println!("{:>6} {:>10} {:>10} {:>10}", "batch", "µs", "µs/row", "rows/s");
    for (m, t) in batches.iter().zip(best) {
        println!("{m:>6} {:>10.1} {:>10.1} {:>10.0}", t * 1e6, t * 1e6 / *m as f64, *m as f64 / t);
    }
    Ok(())
}
