//! `pmstate`: ProtoMotions normalizer state, checkpoints and policies from
//! the command line.
//!
//! Exit codes: 0 fine, 1 a difference or a refusal (a failed replay, a
//! `diff` that found one, a convert refused for unsafe globals), 2 an error
//! (bad arguments, an unreadable or hostile file, a limit crossed). With
//! `--json`, the error is one JSON object on stderr (`error::ErrorReport`).
//! SIGINT and SIGTERM remove any temporary output file before exiting.

mod args;
mod cmd;
mod error;
mod output;
mod progress;
mod test_pause;

/// mimalloc keeps freed large blocks for reuse: glibc returns every block
/// over its 32 MiB mmap threshold to the OS, so each 32 MiB+ output (and
/// torch's too) pays a page fault per 4 KiB on its first write.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use crate::args::Global;
pub use crate::error::CliError;

#[derive(Parser)]
#[command(name = "pmstate", version, about = "ProtoMotions normalizer state, checkpoints and policies, in Rust")]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay pm-trace files (or folders of them) and compare every recorded
    /// result. Exit 0 iff every trace passes.
    Replay(cmd::replay::Args),
    /// Time normalize, record_moments (Welford and EMA) and a plain copy on
    /// f32 batches of 4096x358, 16384x512 and 65536x64.
    Bench(cmd::bench::Args),
    /// Time one distributed update (3 all_gathers, combine and update on rank
    /// 0, 3 broadcasts) and one all_gather alone, per call, on W ranks.
    BenchCollective(cmd::bench_collective::Args),
    /// Show a checkpoint's tree (dtypes, shapes), its normalizer groups and
    /// any unsafe globals. Reads no tensor data except the normalizers' buffers.
    Inspect(cmd::inspect::Args),
    /// Convert between torch (.pt/.pth/.ckpt/.bin) and .safetensors, by
    /// extension. Exit 1 when refused (unsafe globals).
    Convert(cmd::convert::Args),
    /// List normalizer groups: shape, count, mean and std summaries; lazy ones that never ran.
    Normalizers(cmd::normalizers::Args),
    /// Compare two checkpoints: keys, types, scalars, tensors within
    /// |a - b| <= atol + rtol * |b| (NaN equals NaN; integers exactly). Exit 1 if they differ.
    Diff(cmd::diff::Args),
    /// Show a resolved-configs file (or any part of it) as a readable tree or
    /// as JSON, read inertly: dataclasses as objects with `__class__`, enums
    /// as values, tensors by dtype and shape.
    Config(cmd::config::Args),
    /// Load a ProtoMotions policy (checkpoint + resolved configs) and describe or run it.
    Policy(cmd::policy::Args),
    /// A tracker's deployment pipeline from its checkpoint: sensors and
    /// reference motion in, PD targets out, as ProtoMotions' exported ONNX
    /// pipeline computes them; its contract (unified_pipeline.yaml).
    Deploy(cmd::deploy::Args),
    /// Time the forward (actor and critic) of the full-size smpl tracker
    /// (actor 6x1024, critic 4x1024, obs 358 + 576 + 69) at batch 1, 64,
    /// 1024 and 4096, and reading its weights once (the batch-1 floor).
    BenchPolicy(cmd::bench_policy::Args),
    /// Load-test the inference server on the full-size smpl tracker: rows/s
    /// and p50/p99 latency for 1, 16 and 256 concurrent one-row clients,
    /// with dynamic batching and with --max-batch 1, against the in-process forward.
    BenchServe(cmd::bench_serve::Args),
    /// Time the tracker's control step (sensors to PD targets) at batch 1
    /// over a sensor stream: p50, p99 and the share of the control period.
    BenchDeploy(cmd::bench_deploy::Args),
    /// Serve a policy over the Open Inference Protocol (KServe V2 REST, as
    /// Triton and KServe speak it): dynamic batching, hot reload (--watch,
    /// SIGHUP), Prometheus metrics. Prints the address it listens on; stops
    /// gracefully on SIGINT/SIGTERM (a second one stops at once, exit 130/143).
    Serve(cmd::serve::Args),
    /// List (and with --delete remove) temporary files that a killed pmstate
    /// left in a folder (`.pmstate-<pid>-*.tmp` whose process is gone).
    CleanTmp(cmd::clean_tmp::Args),
    /// Make an older release's motion tracker (v3.1) loadable by today's
    /// ProtoMotions: checkpoint and resolved configs of today's classes in
    /// OUT_DIR, with a report of what was mapped, renamed, dropped. Exit 1
    /// when refused (the error names the key and why).
    Migrate(cmd::migrate::Args),
}

fn run(cli: Cli) -> Result<ExitCode, CliError> {
    let g = cli.global;
    match cli.command {
        Command::Replay(a) => cmd::replay::run(a, g),
        Command::Bench(a) => cmd::bench::run(a, g),
        Command::BenchCollective(a) => cmd::bench_collective::run(a, g),
        Command::Inspect(a) => cmd::inspect::run(a, g),
        Command::Convert(a) => cmd::convert::run(a, g),
        Command::Normalizers(a) => cmd::normalizers::run(a, g),
        Command::Diff(a) => cmd::diff::run(a, g),
        Command::CleanTmp(a) => cmd::clean_tmp::run(a, g),
        Command::Config(a) => cmd::config::run(a, g),
        Command::Policy(a) => cmd::policy::run(a, g),
        Command::Deploy(a) => cmd::deploy::run(a, g),
        Command::BenchPolicy(a) => cmd::bench_policy::run(a, g),
        Command::Serve(a) => cmd::serve::run(a, g),
        Command::BenchServe(a) => cmd::bench_serve::run(a, g),
        Command::BenchDeploy(a) => cmd::bench_deploy::run(a, g),
        Command::Migrate(a) => cmd::migrate::run(a, g),
    }
}

/// On SIGINT/SIGTERM: remove the temporary files of writes in flight, then
/// exit as the signal would (128 + its number).
fn handle_termination_signals() {
    #[cfg(unix)]
    {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) else { return };
        std::thread::spawn(move || {
            if let Some(sig) = signals.forever().next() {
                pmstate_ckpt::abandon_temporary_files();
                std::process::exit(128 + sig);
            }
        });
    }
}

/// Whether the command line asks for JSON (`--json` anywhere before a
/// `--`): read from the raw arguments, so that an error clap finds in them
/// is reported as JSON too.
fn json_requested() -> bool {
    std::env::args_os().skip(1).take_while(|a| a != "--").any(|a| a == "--json")
}

/// Prints an error as text (`pmstate: error: ...`) or, under `--json`, as
/// one JSON object on stderr.
fn report(e: error::ErrorReport, json: bool) {
    match (json, serde_json::to_string(&e)) {
        (true, Ok(line)) => output::err_line(line),
        _ => output::err_line(format!("pmstate: error: {}", e.message)),
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version print and exit 0, as do errors without --json
        Err(e) if !e.use_stderr() || !json_requested() => e.exit(),
        Err(e) => {
            let message = e.render().to_string();
            let first = message.lines().next().unwrap_or_default().trim_start_matches("error: ").to_owned();
            report(error::ErrorReport::new("usage", first), true);
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let json = cli.global.json;
    // a server drains on SIGINT/SIGTERM itself (pmstate-serve); every other
    // command removes its temporary files and exits
    if !matches!(cli.command, Command::Serve(_)) {
        handle_termination_signals();
    }
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            report(e.report(), json);
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// The subcommands `crates/cli/README.md` shows as `pmstate NAME` (and
    /// `pmstate policy NAME`, `pmstate deploy NAME`) in its command list.
    fn readme_commands(readme: &str) -> Vec<String> {
        let mut names = Vec::new();
        for line in readme.lines() {
            let mut words = line.split_whitespace();
            if words.next() != Some("pmstate") {
                continue;
            }
            let Some(first) = words.next() else { continue };
            names.push(match (first, words.next()) {
                ("policy" | "deploy", Some(sub)) => format!("{first} {sub}"),
                (first, _) => first.to_owned(),
            });
        }
        names
    }

    /// The crate README lists every subcommand clap knows (nested ones
    /// too) and none it does not, so the list cannot fall behind again.
    #[test]
    fn the_crate_readme_lists_every_subcommand() {
        let readme = include_str!("../README.md");
        let listed = readme_commands(readme);
        let mut known = Vec::new();
        for c in Cli::command().get_subcommands() {
            let subs: Vec<String> = c.get_subcommands().map(|s| format!("{} {}", c.get_name(), s.get_name())).collect();
            if subs.is_empty() {
                known.push(c.get_name().to_owned());
            } else {
                known.extend(subs);
            }
        }
        assert!(known.len() >= 14, "clap's subcommands: {known:?}");
        for name in &known {
            assert!(listed.contains(name), "crates/cli/README.md does not show `pmstate {name}`");
        }
        for name in &listed {
            assert!(known.contains(name), "crates/cli/README.md shows `pmstate {name}`, which is no subcommand");
        }
    }
}
