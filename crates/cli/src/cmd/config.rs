//! `pmstate config`: a resolved-configs file (or any part of it) as a
//! readable tree or as JSON, read inertly (nothing in it is executed).
//! A Hydra-dumped `config.yaml` (as ProtoMotions publishes beside its
//! pretrained models) is read with its OmegaConf interpolations resolved
//! (`pmstate_ckpt::hydra`), then printed by the same code.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use pmstate_ckpt::Checkpoint;
use serde_json::Value as J;

use crate::args::OutputFormat;
use crate::{output, CliError, Global};

/// `pmstate config FILE [--get DOTTED.PATH]`
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Only the value at this dotted path (e.g. agent.model.actor.mu_model.norm_clamp_value).
    #[arg(long)]
    get: Option<String>,
    /// A resolved-configs file (resolved_configs.pt, resolved_configs_inference.pt), any checkpoint,
    /// or a Hydra config.yaml (.yaml/.yml: interpolations resolved as OmegaConf does).
    file: PathBuf,
}

/// Largest YAML file read (the published v2.3 configs are about 30 KB).
const MAX_YAML_BYTES: u64 = 64 << 20;

fn is_yaml(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"))
}

/// The resolved tree of a Hydra `config.yaml`. Its errors name the file,
/// the dotted key and the problem (`--json` kind `hydra.<problem>`).
fn yaml_tree(path: &Path) -> Result<J, CliError> {
    let shown = path.display().to_string();
    let (file, meta) = pmstate_ckpt::open_regular(path)?;
    if meta.len() > MAX_YAML_BYTES {
        return Err(CliError::Usage(format!("{shown}: larger than {MAX_YAML_BYTES} bytes, not read as YAML")));
    }
    let mut text = String::new();
    file.take(MAX_YAML_BYTES + 1).read_to_string(&mut text)?;
    pmstate_ckpt::hydra::resolve_yaml(&text, &shown).map_err(|e| CliError::Hydra(Box::new(e)))
}

/// The value at a dotted path of a JSON tree: object keys, list indices.
fn json_get(mut v: J, key: &str) -> Option<J> {
    if key.is_empty() {
        return Some(v);
    }
    for part in key.split('.') {
        v = match v {
            J::Object(mut m) => m.swap_remove(part)?,
            J::Array(mut a) => {
                let i: usize = part.parse().ok()?;
                if i >= a.len() {
                    return None;
                }
                a.swap_remove(i)
            }
            _ => return None,
        };
    }
    Some(v)
}

/// Prints the config at `--get` (default: the whole file): the JSON tree
/// on one line (`--json`), or a readable indented tree (`--get` of a
/// scalar prints just it: `5`, `5.0`, `relu`).
pub fn run(a: Args, g: Global) -> Result<ExitCode, CliError> {
    let key = a.get.as_deref();
    let key_text = key.unwrap_or("");
    let no_key = || CliError::NoKey { file: a.file.display().to_string(), key: key_text.to_owned() };
    let value = if is_yaml(&a.file) {
        json_get(yaml_tree(&a.file)?, key_text).ok_or_else(no_key)?
    } else {
        Checkpoint::open(&a.file)?.config_json(key_text).ok_or_else(no_key)?
    };
    match g.format() {
        OutputFormat::Json => output::json_line(&value)?,
        OutputFormat::Text => {
            let mut lines = Vec::new();
            match (&value, key) {
                (J::String(s), Some(_)) => lines.push(s.clone()),
                (v, Some(_)) if is_scalar(v) => lines.push(scalar(v)),
                (v, _) => render_root(v, &mut lines),
            }
            for l in lines {
                output::line(l);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn is_scalar(v: &J) -> bool {
    !matches!(v, J::Array(_) | J::Object(_))
}

/// A scalar in its JSON form: ints stay ints (`5`), floats keep a point (`5.0`), strings are quoted.
fn scalar(v: &J) -> String {
    v.to_string()
}

const INDENT: &str = "  ";
/// Arrays of scalars up to this many characters print on one line.
const INLINE_WIDTH: usize = 100;

fn render_root(v: &J, out: &mut Vec<String>) {
    match v {
        J::Object(m) if m.contains_key("__class__") && !is_leafy(v) => {
            out.push(m["__class__"].as_str().unwrap_or("?").to_owned());
            render_children(v, 1, out);
        }
        J::Object(_) | J::Array(_) if !is_leafy(v) => render_children(v, 0, out),
        other => out.push(inline(other).unwrap_or_else(|| other.to_string())),
    }
}

/// Values that print on one line: scalars, enums, globals, tensors, short arrays of those.
fn is_leafy(v: &J) -> bool {
    inline(v).is_some()
}

/// The one-line form of `v`, if it has one.
fn inline(v: &J) -> Option<String> {
    match v {
        J::Object(m) => {
            if let (Some(c), Some(val), 2) = (m.get("__class__"), m.get("__value__"), m.len()) {
                return Some(format!("{} ({})", inline(val)?, c.as_str()?));
            }
            if let (Some(g), 1) = (m.get("__global__"), m.len()) {
                return Some(format!("<global {}>", g.as_str()?));
            }
            if let (Some(t), 1) = (m.get("__tensor__"), m.len()) {
                let dtype = t.get("dtype")?.as_str()?;
                let shape = t.get("shape")?;
                return Some(match t.get("values") {
                    Some(vals) => format!("tensor {dtype} {shape} = {vals}"),
                    None => format!("tensor {dtype} {shape}"),
                });
            }
            if m.len() == 1 {
                let (k, val) = m.iter().next()?;
                if matches!(k.as_str(), "__device__" | "__dtype__" | "__float__" | "__bigint__" | "__opaque__") {
                    return Some(inline(val)?.trim_matches('"').to_owned());
                }
            }
            if m.is_empty() {
                return Some("{}".into());
            }
            None
        }
        J::Array(xs) => {
            let parts: Option<Vec<String>> =
                xs.iter().map(|x| if is_scalar(x) { Some(scalar(x)) } else { None }).collect();
            let s = format!("[{}]", parts?.join(", "));
            (s.len() <= INLINE_WIDTH).then_some(s)
        }
        other => Some(scalar(other)),
    }
}

fn render_children(v: &J, depth: usize, out: &mut Vec<String>) {
    let pad = INDENT.repeat(depth);
    let entries: Vec<(String, &J)> = match v {
        J::Object(m) => m.iter().filter(|(k, _)| k.as_str() != "__class__").map(|(k, x)| (k.clone(), x)).collect(),
        J::Array(xs) => xs.iter().enumerate().map(|(i, x)| (format!("[{i}]"), x)).collect(),
        _ => return,
    };
    for (k, x) in entries {
        if let Some(s) = inline(x) {
            out.push(format!("{pad}{k}: {s}"));
            continue;
        }
        match x {
            J::Object(m) if m.contains_key("__class__") => {
                out.push(format!("{pad}{k}: {}", m["__class__"].as_str().unwrap_or("?")));
            }
            J::Array(xs) => {
                let plural = if xs.len() == 1 { "" } else { "s" };
                out.push(format!("{pad}{k}: ({} item{plural})", xs.len()));
            }
            _ => out.push(format!("{pad}{k}:")),
        }
        render_children(x, depth + 1, out);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn tree_text_is_readable() {
        let v = json!({
            "__class__": "m.Cfg",
            "units": 512,
            "clamp": 5.0,
            "act": "relu",
            "keys": ["a", "b"],
            "mode": {"__class__": "m.Mode", "__value__": 1},
            "fn": {"__global__": "m.f"},
            "t": {"__tensor__": {"dtype": "float32", "shape": [2], "values": [1.0, 2.5]}},
            "layers": [{"__class__": "m.Layer", "units": 4}],
            "none": null,
        });
        let mut out = vec![];
        render_root(&v, &mut out);
        assert_eq!(
            out,
            [
                "m.Cfg",
                "  units: 512",
                "  clamp: 5.0",
                "  act: \"relu\"",
                "  keys: [\"a\", \"b\"]",
                "  mode: 1 (m.Mode)",
                "  fn: <global m.f>",
                "  t: tensor float32 [2] = [1.0,2.5]",
                "  layers: (1 item)",
                "    [0]: m.Layer",
                "      units: 4",
                "  none: null",
            ]
        );
    }
}
