//! `inspect`, `convert`, `normalizers`, `diff`: checkpoints from the command line.

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use candle_core::Device;
use pmstate_ckpt::{
    save_safetensors, save_torch, Checkpoint, CkptError, Node, NormalizerGroup, SafetensorsOptions, SaveOptions,
    TensorRef,
};
use serde_json::{json, Value as J};

use crate::CliError;

/// Files at least this large get a progress bar on stderr.
const PROGRESS_THRESHOLD: u64 = 64 << 20;

fn open(path: &Path) -> Result<Checkpoint, CliError> {
    Ok(Checkpoint::open(path)?)
}

fn is_safetensors(path: &Path) -> bool {
    path.extension().and_then(|e| e.to_str()).is_some_and(|e| e.eq_ignore_ascii_case("safetensors"))
}

fn is_torch(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| ["pt", "pth", "ckpt", "bin"].iter().any(|x| e.eq_ignore_ascii_case(x)))
}

fn shape_str(t: &TensorRef) -> String {
    pmstate_ckpt::Shape(&t.shape).to_string()
}

/// Mean, min and max of a small f64 tensor's elements (normalizer buffers).
fn summary(values: &[f64]) -> J {
    if values.is_empty() {
        return json!({ "min": null, "max": null, "mean": null });
    }
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    json!({ "min": min, "max": max, "mean": mean })
}

fn group_json(ckpt: &Checkpoint, g: &NormalizerGroup) -> Result<J, CliError> {
    let state = ckpt.normalizer_state(&g.name, &Device::Cpu)?;
    let mean: Vec<f64> = state.mean.flatten_all()?.to_vec1()?;
    let var: Vec<f64> = state.var.flatten_all()?.to_vec1()?;
    let std: Vec<f64> = var.iter().map(|v| v.sqrt()).collect();
    Ok(json!({
        "name": g.name,
        "shape": state.mean.dims(),
        "count": state.count,
        "mean": summary(&mean),
        "std": summary(&std),
    }))
}

/// Saved groups and the names of lazy ones (never ran, no buffers).
fn split_groups(ckpt: &Checkpoint) -> Result<(Vec<NormalizerGroup>, Vec<String>), CliError> {
    let (saved, lazy): (Vec<_>, Vec<_>) = ckpt.normalizers()?.into_iter().partition(|g| g.saved.is_some());
    Ok((saved, lazy.into_iter().map(|g| g.name).collect()))
}

fn tree_lines(node: &Node, depth: usize, key: &str, out: &mut Vec<String>) {
    let pad = "  ".repeat(depth);
    let label = if key.is_empty() { String::from("<root>") } else { key.to_owned() };
    match node {
        Node::Dict(d) => {
            let meta = if d.metadata().is_some() { ", _metadata" } else { "" };
            out.push(format!("{pad}{label}: {} ({} entries{meta})", node.kind(), d.entries.len()));
            for (k, v) in &d.entries {
                let k = match k {
                    Node::Str(s) => s.clone(),
                    other => other.to_string(),
                };
                tree_lines(v, depth + 1, &k, out);
            }
        }
        Node::List(xs) | Node::Tuple(xs) if xs.iter().any(|x| matches!(x, Node::Dict(_) | Node::Tensor(_))) => {
            out.push(format!("{pad}{label}: {} ({} items)", node.kind(), xs.len()));
            for (i, x) in xs.iter().enumerate() {
                tree_lines(x, depth + 1, &i.to_string(), out);
            }
        }
        Node::Tensor(t) => {
            let view = if t.offset != 0 || !t.is_contiguous() {
                format!(" view@{} stride {}", t.offset, pmstate_ckpt::Shape(&t.stride))
            } else {
                String::new()
            };
            out.push(format!("{pad}{label}: {} {} {}{view}", node.kind(), t.dtype, shape_str(t)));
        }
        Node::Opaque(_) => out.push(format!("{pad}{label}: opaque pickle value")),
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

pub fn inspect(path: &Path, json_out: bool) -> Result<ExitCode, CliError> {
    let t0 = Instant::now();
    let ckpt = open(path)?;
    let tensors = ckpt.tensors();
    let (groups, lazy) = split_groups(&ckpt)?;
    let flagged = ckpt.unsafe_globals();
    let storage_bytes: u64 = ckpt.storages.values().map(|s| s.data.len() as u64).sum();
    let groups_json = groups.iter().map(|g| group_json(&ckpt, g)).collect::<Result<Vec<_>, _>>()?;
    if json_out {
        let tensors_json: Vec<J> = tensors
            .iter()
            .map(|(k, t)| {
                json!({
                    "key": k, "dtype": t.dtype.torch_name(), "shape": t.shape, "stride": t.stride,
                    "offset": t.offset, "storage": t.storage, "parameter": t.parameter.is_some(),
                    "requires_grad": t.requires_grad,
                })
            })
            .collect();
        let out = json!({
            "file": path.display().to_string(),
            "format": ckpt.format.id(),
            "tensors": tensors_json,
            "storages": ckpt.storages.len(),
            "storage_bytes": storage_bytes,
            "normalizers": groups_json,
            "lazy_normalizers": lazy,
            "unsafe_globals": flagged.iter().map(|(k, g)| json!({ "key": k, "global": g })).collect::<Vec<_>>(),
            "unsafe_globals_distinct": distinct_globals(&flagged)
                .into_iter()
                .map(|(g, uses, first)| json!({ "global": g, "uses": uses, "first_key": first }))
                .collect::<Vec<_>>(),
            "tree": pmstate_ckpt::node_to_json(&ckpt.root),
            "seconds": t0.elapsed().as_secs_f64(),
        });
        crate::output::json_line(&out)?;
    } else {
        crate::output::line(format!(
            "{} ({}): {} tensors over {} storages, {} bytes",
            path.display(),
            ckpt.format,
            tensors.len(),
            ckpt.storages.len(),
            storage_bytes
        ));
        let mut lines = Vec::new();
        tree_lines(&ckpt.root, 0, "", &mut lines);
        for l in lines {
            crate::output::line(l);
        }
        print_groups(&groups_json, &lazy);
        for (g, uses, first) in distinct_globals(&flagged) {
            let uses = if uses == 1 { String::from("1 use") } else { format!("{uses} uses") };
            crate::output::line(format!(
                "UNSAFE GLOBAL {g} ({uses}, first at {first}; never executed; torch.load(weights_only=True) rejects it)"
            ));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Each distinct unsafe global once, in first-seen order, with how often it
/// occurs and where first: a resolved-configs file uses dozens of classes
/// hundreds of times.
fn distinct_globals(flagged: &[(String, String)]) -> Vec<(&str, usize, &str)> {
    let mut index: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut out: Vec<(&str, usize, &str)> = Vec::new();
    for (key, global) in flagged {
        match index.get(global.as_str()) {
            Some(&i) => out[i].1 += 1,
            None => {
                index.insert(global, out.len());
                out.push((global, 1, key));
            }
        }
    }
    out
}

fn print_groups(groups: &[J], lazy: &[String]) {
    if groups.is_empty() && lazy.is_empty() {
        crate::output::line("normalizers: none");
        return;
    }
    crate::output::line("normalizers:");
    for g in groups {
        crate::output::line(format!(
            "  {}: shape {} count {} mean [{:.4}, {:.4}] (avg {:.4}) std [{:.4}, {:.4}] (avg {:.4})",
            g["name"].as_str().unwrap_or("?"),
            g["shape"],
            g["count"],
            g["mean"]["min"].as_f64().unwrap_or(f64::NAN),
            g["mean"]["max"].as_f64().unwrap_or(f64::NAN),
            g["mean"]["mean"].as_f64().unwrap_or(f64::NAN),
            g["std"]["min"].as_f64().unwrap_or(f64::NAN),
            g["std"]["max"].as_f64().unwrap_or(f64::NAN),
            g["std"]["mean"].as_f64().unwrap_or(f64::NAN),
        ));
    }
    for l in lazy {
        crate::output::line(format!("  {l}: lazy (never ran; no buffers saved)"));
    }
}

pub fn normalizers(path: &Path, json_out: bool) -> Result<ExitCode, CliError> {
    let ckpt = open(path)?;
    let (groups, lazy) = split_groups(&ckpt)?;
    let groups_json = groups.iter().map(|g| group_json(&ckpt, g)).collect::<Result<Vec<_>, _>>()?;
    if json_out {
        crate::output::json_line(
            &json!({ "file": path.display().to_string(), "normalizers": groups_json, "lazy": lazy }),
        )?;
    } else {
        print_groups(&groups_json, &lazy);
    }
    Ok(ExitCode::SUCCESS)
}

struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    fn new(total: u64, what: &str) -> Self {
        if total < PROGRESS_THRESHOLD {
            return Progress(None);
        }
        let bar = indicatif::ProgressBar::new(total);
        if let Ok(style) =
            indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(what.to_owned());
        Progress(Some(bar))
    }
    fn update(&self, done: u64) {
        if let Some(b) = &self.0 {
            b.set_position(done);
        }
    }
    fn finish(&self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}

pub fn convert(
    input: &Path,
    output: &Path,
    select: Option<String>,
    allow_unsafe_globals: bool,
    no_fsync: bool,
    json_out: bool,
) -> Result<ExitCode, CliError> {
    if !(is_safetensors(output) || is_torch(output)) {
        return Err(CliError::Usage(format!(
            "{}: unknown output format (use .safetensors, or .pt/.pth/.ckpt/.bin for torch)",
            output.display()
        )));
    }
    if select.is_some() && !is_safetensors(output) {
        return Err(CliError::Usage(
            "--select exports to safetensors only (give an OUT ending in .safetensors)".into(),
        ));
    }
    let t0 = Instant::now();
    let ckpt = open(input)?;
    let total: u64 = ckpt.storages.values().map(|s| s.data.len() as u64).sum();
    let bar = Progress::new(total, "converting");
    let progress = |done: u64| bar.update(done);
    let result = if is_safetensors(output) {
        let opts =
            SafetensorsOptions { select: select.clone(), allow_unsafe_globals, no_fsync, progress: Some(&progress) };
        save_safetensors(&ckpt, output, &opts).map(Some)
    } else {
        let opts = SaveOptions { allow_unsafe_globals, no_fsync, progress: Some(&progress) };
        save_torch(&ckpt, output, &opts).map(|()| None)
    };
    bar.finish();
    let report = match result {
        Err(e @ CkptError::UnsafeGlobals { .. }) => {
            if json_out {
                crate::output::json_line(&json!({ "ok": false, "refused": e.to_string() }))?;
            } else {
                crate::output::err_line(format!("pmstate: refused: {e}"));
            }
            return Ok(ExitCode::from(1));
        }
        other => other?,
    };
    let skipped = report.as_ref().map(|r| r.skipped.clone()).unwrap_or_default();
    if json_out {
        crate::output::json_line(&json!({
            "ok": true, "input": input.display().to_string(), "output": output.display().to_string(),
            "select": select, "tensors": report.as_ref().map_or(ckpt.tensors().len(), |r| r.tensors),
            "skipped_non_tensors": skipped, "seconds": t0.elapsed().as_secs_f64(),
        }))?;
    } else {
        crate::output::line(format!("wrote {} ({:.3} s)", output.display(), t0.elapsed().as_secs_f64()));
        if !skipped.is_empty() {
            crate::output::line(format!(
                "skipped {} non-tensor value(s) safetensors cannot hold: {}",
                skipped.len(),
                skipped.join(", ")
            ));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Elements of a tensor as f64 when its dtype is a real number candle can convert; None otherwise.
fn as_f64(ckpt: &Checkpoint, t: &TensorRef) -> Result<Option<Vec<f64>>, CliError> {
    use pmstate_ckpt::DType as D;
    if !matches!(t.dtype, D::F64 | D::F32 | D::F16 | D::BF16 | D::I64 | D::I32 | D::I16 | D::U8 | D::U32 | D::F8E4M3) {
        return Ok(None);
    }
    let x = ckpt.to_candle(t, &Device::Cpu)?;
    Ok(Some(x.to_dtype(candle_core::DType::F64)?.flatten_all()?.to_vec1()?))
}

pub struct Tolerance {
    pub rtol: f64,
    pub atol: f64,
}

fn diff_tensors(
    a: &Checkpoint,
    ta: &TensorRef,
    b: &Checkpoint,
    tb: &TensorRef,
    tol: &Tolerance,
) -> Result<Option<J>, CliError> {
    if ta.dtype != tb.dtype || ta.shape != tb.shape {
        return Ok(Some(json!({
            "what": "tensor type",
            "a": format!("{} {}", ta.dtype, pmstate_ckpt::Shape(&ta.shape)),
            "b": format!("{} {}", tb.dtype, pmstate_ckpt::Shape(&tb.shape)),
        })));
    }
    match (as_f64(a, ta)?, as_f64(b, tb)?) {
        (Some(xa), Some(xb)) => {
            let mut bad = 0usize;
            let mut max_abs = 0f64;
            let mut first = None;
            for (i, (&x, &y)) in xa.iter().zip(&xb).enumerate() {
                let same_nan = x.is_nan() && y.is_nan();
                let d = (x - y).abs();
                // numpy.allclose: |a - b| <= atol + rtol * |b|; NaN equals NaN; equal infinities are equal.
                let ok = same_nan || x == y || d <= tol.atol + tol.rtol * y.abs();
                if !ok {
                    bad += 1;
                    first.get_or_insert(i);
                }
                if d.is_finite() {
                    max_abs = max_abs.max(d);
                } else if !same_nan && x != y {
                    max_abs = f64::INFINITY;
                }
            }
            Ok((bad > 0).then(|| {
                json!({ "what": "values", "mismatched": bad, "of": xa.len(), "max_abs": max_abs, "first_index": first })
            }))
        }
        _ => {
            let ba = a.tensor_bytes(ta)?;
            let bb = b.tensor_bytes(tb)?;
            Ok((ba != bb).then(|| json!({ "what": "bytes", "note": format!("{} compared bytewise", ta.dtype) })))
        }
    }
}

fn diff_nodes(
    a: &Checkpoint,
    na: &Node,
    b: &Checkpoint,
    nb: &Node,
    key: &str,
    tol: &Tolerance,
    out: &mut Vec<J>,
) -> Result<(), CliError> {
    let sub = |k: &Node| match k {
        Node::Str(s) => s.clone(),
        other => other.to_string(),
    };
    let join = |k: String| if key.is_empty() { k } else { format!("{key}.{k}") };
    match (na, nb) {
        (Node::Dict(da), Node::Dict(db)) => {
            for (k, va) in &da.entries {
                match db.entries.iter().find(|(kb, _)| kb == k) {
                    Some((_, vb)) => diff_nodes(a, va, b, vb, &join(sub(k)), tol, out)?,
                    None => out.push(json!({ "key": join(sub(k)), "what": "only in A" })),
                }
            }
            for (k, _) in &db.entries {
                if !da.entries.iter().any(|(ka, _)| ka == k) {
                    out.push(json!({ "key": join(sub(k)), "what": "only in B" }));
                }
            }
            if da.ordered != db.ordered {
                out.push(json!({ "key": key, "what": "dict type", "a": na.kind(), "b": nb.kind() }));
            }
        }
        (Node::List(xa), Node::List(xb)) | (Node::Tuple(xa), Node::Tuple(xb)) if xa.len() == xb.len() => {
            for (i, (x, y)) in xa.iter().zip(xb).enumerate() {
                diff_nodes(a, x, b, y, &join(i.to_string()), tol, out)?;
            }
        }
        (Node::Tensor(ta), Node::Tensor(tb)) => {
            if let Some(mut d) = diff_tensors(a, ta, b, tb, tol)? {
                d["key"] = json!(key);
                out.push(d);
            }
        }
        (Node::Float(x), Node::Float(y)) => {
            let same = x.to_bits() == y.to_bits()
                || (x.is_nan() && y.is_nan())
                || (x - y).abs() <= tol.atol + tol.rtol * y.abs();
            if !same {
                out.push(json!({ "key": key, "what": "value", "a": x, "b": y }));
            }
        }
        _ if na == nb => {}
        _ => out.push(json!({
            "key": key, "what": if na.kind() == nb.kind() { "value" } else { "type" },
            "a": na.to_string().chars().take(200).collect::<String>(),
            "b": nb.to_string().chars().take(200).collect::<String>(),
        })),
    }
    Ok(())
}

pub fn diff(pa: &Path, pb: &Path, tol: Tolerance, json_out: bool) -> Result<ExitCode, CliError> {
    if !(tol.rtol >= 0.0 && tol.atol >= 0.0) {
        return Err(CliError::Usage("--rtol and --atol must be >= 0".into()));
    }
    let a = open(pa)?;
    let b = open(pb)?;
    let mut diffs = Vec::new();
    diff_nodes(&a, &a.root, &b, &b.root, "", &tol, &mut diffs)?;
    if json_out {
        crate::output::json_line(&json!({
            "a": pa.display().to_string(), "b": pb.display().to_string(),
            "rtol": tol.rtol, "atol": tol.atol, "equal": diffs.is_empty(), "differences": diffs,
        }))?;
    } else if diffs.is_empty() {
        crate::output::line(format!("no differences (rtol {}, atol {})", tol.rtol, tol.atol));
    } else {
        for d in &diffs {
            crate::output::json_line(d)?;
        }
        crate::output::line(format!("{} difference(s)", diffs.len()));
    }
    Ok(if diffs.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
