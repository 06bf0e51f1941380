//! `pmstate replay`: replays pm-trace files and reports per trace.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pmstate_trace::{read_file, replay, Mode, ReplayOptions, Report};
use serde::Serialize;

use crate::CliError;

/// Expands folders into their `*.pmtrace.safetensors` files (sorted).
pub fn collect(paths: &[PathBuf]) -> Result<Vec<PathBuf>, CliError> {
    let mut out = vec![];
    for p in paths {
        if p.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|e| CliError::Usage(format!("{}: {e}", p.display())))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.to_string_lossy().ends_with(".pmtrace.safetensors"))
                .collect();
            found.sort();
            if found.is_empty() {
                return Err(CliError::Usage(format!("{}: no *.pmtrace.safetensors files", p.display())));
            }
            out.extend(found);
        } else if p.exists() {
            out.push(p.clone());
        } else {
            return Err(CliError::Usage(format!("{}: no such file or folder", p.display())));
        }
    }
    Ok(out)
}

#[derive(Serialize)]
struct Line<'a> {
    path: String,
    pass: bool,
    mode: Mode,
    world_size: usize,
    steps: usize,
    fields: usize,
    worst: Option<&'a pmstate_trace::FieldReport>,
    error: Option<String>,
}

fn name(p: &Path) -> String {
    p.display().to_string()
}

/// Replays every file; returns the process exit code (0 all pass, 1 a
/// mismatch, 2 a trace that could not be read).
pub fn run(paths: &[PathBuf], mode: Mode, json: bool, timeout: Duration) -> Result<u8, CliError> {
    let files = collect(paths)?;
    let opts = ReplayOptions { mode, timeout };
    let (mut passed, mut failed, mut broken) = (0, 0, 0);
    for f in &files {
        let outcome: Result<Report, String> =
            read_file(f).map_err(|e| e.to_string()).and_then(|t| replay(&t, &opts).map_err(|e| e.to_string()));
        match &outcome {
            Ok(r) if r.pass => passed += 1,
            Ok(_) => failed += 1,
            Err(_) => broken += 1,
        }
        if json {
            let line = match &outcome {
                Ok(r) => Line {
                    path: name(f),
                    pass: r.pass,
                    mode,
                    world_size: r.world_size,
                    steps: r.steps,
                    fields: r.fields.len(),
                    worst: r.worst(),
                    error: None,
                },
                Err(e) => Line {
                    path: name(f),
                    pass: false,
                    mode,
                    world_size: 0,
                    steps: 0,
                    fields: 0,
                    worst: None,
                    error: Some(e.clone()),
                },
            };
            println!("{}", serde_json::to_string(&line)?);
        } else {
            match &outcome {
                Ok(r) => {
                    let worst = r.worst().map_or("no fields".to_string(), |w| {
                        format!(
                            "worst: step {} {} {} max_ulps {} max_abs {:.3e}{}{}",
                            w.step,
                            w.op,
                            w.field,
                            if w.max_ulps == u64::MAX { "inf".into() } else { w.max_ulps.to_string() },
                            w.max_abs,
                            w.first_mismatch.map_or(String::new(), |i| format!(" first mismatch at element {i}")),
                            w.note.as_ref().map_or(String::new(), |n| format!(" ({n})")),
                        )
                    });
                    println!(
                        "{} {} ({} steps, world size {}, {} fields): {worst}",
                        if r.pass { "PASS" } else { "FAIL" },
                        name(f),
                        r.steps,
                        r.world_size,
                        r.fields.len()
                    );
                }
                Err(e) => println!("ERROR {}: {e}", name(f)),
            }
        }
    }
    let summary = format!("{passed} passed, {} failed", failed + broken);
    if json {
        println!(
            "{}",
            serde_json::json!({"summary": true, "mode": mode, "passed": passed, "failed": failed, "unreadable": broken})
        );
    } else {
        println!("replay ({}): {summary}", if mode == Mode::Pinned { "pinned" } else { "free" });
    }
    Ok(if broken > 0 {
        2
    } else if failed > 0 {
        1
    } else {
        0
    })
}
