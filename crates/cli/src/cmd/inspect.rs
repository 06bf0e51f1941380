//! `pmstate inspect`: a checkpoint's tree, normalizers and unsafe globals.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use pmstate_ckpt::{Checkpoint, Node, NodeJson, NormalizerSummary, Shape};
use serde::Serialize;

use crate::{output, CliError, Global};

/// `pmstate inspect FILE`
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A .pt/.pth/.ckpt/.bin (torch zip or legacy) or .safetensors file.
    file: PathBuf,
}

#[derive(Serialize)]
struct TensorLine<'a> {
    key: String,
    dtype: &'static str,
    shape: &'a [usize],
    stride: &'a [usize],
    offset: usize,
    storage: &'a str,
    parameter: bool,
    requires_grad: bool,
}

#[derive(Serialize)]
struct UnsafeGlobal<'a> {
    key: &'a str,
    global: &'a str,
}

/// Each distinct unsafe global once: a resolved-configs file uses dozens of
/// classes hundreds of times.
#[derive(Serialize)]
struct DistinctGlobal<'a> {
    global: &'a str,
    uses: usize,
    first_key: &'a str,
}

#[derive(Serialize)]
struct Report<'a> {
    file: String,
    format: &'static str,
    tensors: Vec<TensorLine<'a>>,
    storages: usize,
    storage_bytes: u64,
    normalizers: Vec<NormalizerSummary>,
    lazy_normalizers: Vec<String>,
    unsafe_globals: Vec<UnsafeGlobal<'a>>,
    unsafe_globals_distinct: Vec<DistinctGlobal<'a>>,
    tree: NodeJson<'a>,
    seconds: f64,
}

/// Saved groups' summaries and the names of lazy ones (never ran, no buffers).
pub fn normalizer_report(ckpt: &Checkpoint) -> Result<(Vec<NormalizerSummary>, Vec<String>), CliError> {
    let mut saved = Vec::new();
    let mut lazy = Vec::new();
    for g in ckpt.normalizers()? {
        if g.saved.is_some() {
            saved.push(ckpt.group_summary(&g)?);
        } else {
            lazy.push(g.name);
        }
    }
    Ok((saved, lazy))
}

fn distinct(flagged: &[(String, String)]) -> Vec<DistinctGlobal<'_>> {
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut out: Vec<DistinctGlobal<'_>> = Vec::new();
    for (key, global) in flagged {
        match index.get(global.as_str()) {
            Some(&i) => out[i].uses += 1,
            None => {
                index.insert(global, out.len());
                out.push(DistinctGlobal { global, uses: 1, first_key: key });
            }
        }
    }
    out
}

/// Runs the command.
pub fn run(a: Args, g: Global) -> Result<ExitCode, CliError> {
    let t0 = Instant::now();
    let ckpt = crate::progress::open_checkpoint(&a.file, g)?;
    crate::test_pause::point();
    let tensors = ckpt.tensors();
    let (normalizers, lazy) = normalizer_report(&ckpt)?;
    // The normalizers' buffers were read after the structure: both from one file's content?
    ckpt.check_unchanged()?;
    let flagged = ckpt.unsafe_globals();
    let storage_bytes: u64 = ckpt.storages().values().map(|s| s.data.len() as u64).sum();
    if g.json {
        let report = Report {
            file: a.file.display().to_string(),
            format: ckpt.format().id(),
            tensors: tensors
                .iter()
                .map(|(k, t)| TensorLine {
                    key: k.clone(),
                    dtype: t.dtype.torch_name(),
                    shape: &t.shape,
                    stride: &t.stride,
                    offset: t.offset,
                    storage: &t.storage,
                    parameter: t.is_parameter(),
                    requires_grad: t.requires_grad,
                })
                .collect(),
            storages: ckpt.storages().len(),
            storage_bytes,
            normalizers,
            lazy_normalizers: lazy,
            unsafe_globals: flagged.iter().map(|(k, g)| UnsafeGlobal { key: k, global: g }).collect(),
            unsafe_globals_distinct: distinct(&flagged),
            tree: NodeJson(ckpt.root()),
            seconds: t0.elapsed().as_secs_f64(),
        };
        output::json_line(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    output::line(format!(
        "{} ({}): {} tensors over {} storages, {} bytes",
        a.file.display(),
        ckpt.format(),
        tensors.len(),
        ckpt.storages().len(),
        storage_bytes
    ));
    let mut lines = Vec::new();
    tree_lines(ckpt.root(), 0, "", &mut lines);
    for l in lines {
        output::line(l);
    }
    print_normalizers(&normalizers, &lazy);
    for d in distinct(&flagged) {
        let uses = if d.uses == 1 { String::from("1 use") } else { format!("{} uses", d.uses) };
        output::line(format!(
            "UNSAFE GLOBAL {} ({uses}, first at {}; never executed; torch.load(weights_only=True) rejects it)",
            d.global, d.first_key
        ));
    }
    Ok(ExitCode::SUCCESS)
}

/// The normalizer lines of `inspect` and `normalizers`.
pub fn print_normalizers(groups: &[NormalizerSummary], lazy: &[String]) {
    if groups.is_empty() && lazy.is_empty() {
        output::line("normalizers: none");
        return;
    }
    output::line("normalizers:");
    let f = |x: Option<f64>| x.map_or("-".to_owned(), |v| format!("{v:.4}"));
    for g in groups {
        output::line(format!(
            "  {}: shape {} count {} mean [{}, {}] (avg {}) std [{}, {}] (avg {})",
            g.name,
            Shape(&g.shape),
            g.count,
            f(g.mean.min),
            f(g.mean.max),
            f(g.mean.mean),
            f(g.std.min),
            f(g.std.max),
            f(g.std.mean),
        ));
    }
    for l in lazy {
        output::line(format!("  {l}: lazy (never ran; no buffers saved)"));
    }
}

fn tree_lines(node: &Node, depth: usize, key: &str, out: &mut Vec<String>) {
    let pad = "  ".repeat(depth);
    let label = if key.is_empty() { String::from("<root>") } else { key.to_owned() };
    let label_of = |k: &Node| match k {
        Node::Str(s) => s.clone(),
        other => other.to_string(),
    };
    match node {
        Node::Dict(d) => {
            let meta = if d.metadata().is_some() { ", _metadata" } else { "" };
            out.push(format!("{pad}{label}: {} ({} entries{meta})", node.kind(), d.len()));
            for (k, v) in d.entries() {
                tree_lines(v, depth + 1, &label_of(k), out);
            }
        }
        Node::Object(o) if o.fields().is_some() => {
            out.push(format!("{pad}{label}: {node}"));
            for (k, v) in o.fields().map(|f| f.entries()).unwrap_or_default() {
                tree_lines(v, depth + 1, &label_of(k), out);
            }
        }
        Node::List(xs) | Node::Tuple(xs)
            if xs.iter().any(|x| matches!(x, Node::Dict(_) | Node::Tensor(_) | Node::Object(_))) =>
        {
            out.push(format!("{pad}{label}: {} ({} items)", node.kind(), xs.len()));
            for (i, x) in xs.iter().enumerate() {
                tree_lines(x, depth + 1, &i.to_string(), out);
            }
        }
        Node::Tensor(t) => {
            let view = if t.offset != 0 || !t.is_contiguous() {
                format!(" view@{} stride {}", t.offset, Shape(&t.stride))
            } else {
                String::new()
            };
            out.push(format!("{pad}{label}: {} {} {}{view}", node.kind(), t.dtype, Shape(&t.shape)));
        }
        other => {
            let mut shown = other.to_string();
            if shown.chars().count() > 80 {
                shown = shown.chars().take(77).collect();
                shown.push_str("...");
            }
            out.push(format!("{pad}{label}: {shown}"));
        }
    }
}
