//! The workspace README and the guides under `docs/`, run as a newcomer
//! pastes them: every ```sh block of a file, in document order, in one bash
//! session (variables, functions and a server
//! started in the background carry over from block to block, as in a
//! terminal), with `pmstate` the binary this test was built with.
//!
//! Each command (a line, or the lines bash needs to complete one) must exit
//! 0, or the status a `# ... exit N` comment on its last line documents. A
//! block this test cannot run (a release build, an install, a Python client)
//! starts with `# not run by tests: <reason>`; any other block must run, so an
//! unmarked block that fails fails the test. Two rewrites keep the run
//! hermetic: `/tmp/` becomes a temporary directory and port `8080` a free
//! port; the script runs from the repository root (where the README's
//! `testdata/` paths lead), curl fails on an HTTP error, and the server a
//! block started is stopped (SIGTERM) when the script ends.
//!
//! A ```console block is a transcript (prompts and output), a ```text,
//! ```toml or ```json block is not a command; a ```python block must carry
//! the marker (the tests have no Python packages). The ```rust blocks are
//! doctests of the `pmstate` facade (its `src/lib.rs` includes the README as
//! crate docs and the guides with Rust examples under `cfg(doctest)`),
//! compiled and run by `cargo test` with warnings denied: this test checks
//! that each file holding one is included and that no block opts out of
//! running or hides lines a paste would miss. The crates' READMEs are their
//! crates' docs: their Rust blocks are held to the same rules.

use std::fmt::Write as _;
use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The first line of a block this test does not run, followed by the reason.
const SKIP_MARKER: &str = "# not run by tests:";
/// The same, in a ```c block.
const C_SKIP_MARKER: &str = "// not run by tests:";

/// The watchdog (coreutils `timeout`, which signals the script's whole
/// process group, servers included): a hang becomes a failure, not a speed check.
const WATCHDOG_SECS: &str = "600";

/// One fenced block of a Markdown file.
struct Block {
    /// The info string after the opening fence (`sh`, `rust`, ...).
    lang: String,
    /// 1-based line number of the block's first content line.
    first_line: usize,
    /// The content lines.
    lines: Vec<String>,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The fenced blocks of `text`, in order.
fn fenced_blocks(text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => {
                open = Some(Block { lang: info.trim().to_string(), first_line: i + 2, lines: Vec::new() })
            }
            (Some(_), Some(rest)) if rest.trim().is_empty() => blocks.extend(open.take()),
            (Some(b), _) => b.lines.push(line.to_string()),
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "a fenced block is not closed");
    blocks
}

/// Whether bash parses `text` as complete commands (`bash -n`).
fn complete(text: &str) -> bool {
    Command::new("bash").args(["-n", "-c", text]).stderr(Stdio::null()).status().expect("bash runs").success()
}

/// The exit status the comment on a command's last line documents (`exit N`), else 0.
fn documented_status(last_line: &str) -> i32 {
    let Some((_, comment)) = last_line.rsplit_once(" # ") else { return 0 };
    let words: Vec<&str> = comment.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| !w.is_empty()).collect();
    words.windows(2).find(|w| w[0] == "exit").and_then(|w| w[1].parse().ok()).unwrap_or(0)
}

/// A port nobody listens on now (the OS picks it; released before the server binds it).
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a port");
    l.local_addr().expect("local address").port()
}

/// Single-quotes `s` for bash.
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The bash script running the shell blocks of `blocks` (from the file
/// `name`), each command checked.
fn script(name: &str, blocks: &[&Block], tmp: &Path, port: u16) -> String {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_pmstate")).parent().expect("the binary's folder");
    let mut s = String::new();
    writeln!(s, "export PATH={}:\"$PATH\"", quoted(&bin_dir.display().to_string())).unwrap();
    writeln!(s, "cd {} || exit 99", quoted(&repo_root().display().to_string())).unwrap();
    s.push_str("curl() { command curl --fail \"$@\"; }\n");
    s.push_str("trap 'kill $(jobs -p) 2>/dev/null; wait' EXIT\n");
    writeln!(
        s,
        "__readme_check() {{ if [ \"$1\" != \"$2\" ]; then echo {}\"$3: exit $1, documented $2\" >&2; exit 1; fi; }}",
        quoted(&format!("{name}:"))
    )
    .unwrap();
    let tmp = format!("{}/", tmp.display());
    for b in blocks {
        let mut pending: Vec<(usize, String)> = Vec::new();
        for (i, line) in b.lines.iter().enumerate() {
            let line = line.replace("/tmp/", &tmp).replace("8080", &port.to_string());
            pending.push((b.first_line + i, line));
            let text: Vec<&str> = pending.iter().map(|(_, l)| l.as_str()).collect();
            let text = text.join("\n");
            if !complete(&text) {
                continue;
            }
            let (line_no, first) = (pending[0].0, pending[0].1.clone());
            let last = pending.last().map(|(_, l)| l.clone()).unwrap_or_default();
            pending.clear();
            let code = text.lines().any(|l| {
                let t = l.trim();
                !t.is_empty() && !t.starts_with('#')
            });
            if !code {
                continue;
            }
            writeln!(s, "echo {} >&2", quoted(&format!("+ {name}:{line_no}: {first}"))).unwrap();
            writeln!(s, "{text}").unwrap();
            writeln!(s, "__readme_check $? {} {line_no}", documented_status(&last)).unwrap();
        }
        assert!(pending.is_empty(), "{name}:{}: the block ends inside an unfinished command", pending[0].0);
    }
    s
}

/// The ```sh blocks of the file `name` (relative to the repository's root)
/// that must run; panics on a block that is neither runnable nor marked.
fn runnable_blocks(name: &str) -> Vec<Block> {
    let text = fs::read_to_string(repo_root().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut run = Vec::new();
    for b in fenced_blocks(&text) {
        // a C block carries the marker as a C comment
        let marker = if b.lang == "c" { C_SKIP_MARKER } else { SKIP_MARKER };
        let marked = b.lines.first().is_some_and(|l| l.starts_with(marker));
        if marked {
            let reason = b.lines[0][marker.len()..].trim();
            assert!(!reason.is_empty(), "{name}:{}: `{SKIP_MARKER}` without a reason", b.first_line);
            continue;
        }
        match b.lang.as_str() {
            "sh" | "bash" | "shell" => run.push(b),
            // doctests of the facade (checked by rust_blocks_are_doctests),
            // transcripts, and blocks that are not commands
            "rust" | "console" | "toml" | "text" | "json" => {}
            other => panic!(
                "{name}:{}: a ```{other} block this test cannot run: make it run as ```sh or \
                 mark it `{SKIP_MARKER} <reason>`",
                b.first_line
            ),
        }
    }
    run
}

/// Runs `blocks` of the file `name` in one bash session (see the module
/// docs); fails on the first command whose status differs from the
/// documented one. Returns the script's stdout.
fn run_blocks(name: &str, blocks: &[Block], tmp: &Path) -> String {
    let blocks: Vec<&Block> = blocks.iter().collect();
    let script_path = tmp.join("blocks.sh");
    fs::write(&script_path, script(name, &blocks, tmp, free_port())).expect("write the script");
    let out = Command::new("timeout")
        .args(["-k", "10", WATCHDOG_SECS, "bash"])
        .arg(&script_path)
        .stdin(Stdio::null())
        .output()
        .expect("run the commands");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{name}: the commands failed ({}):\n{stdout}\n{stderr}", out.status);
    stdout
}

/// The Markdown files whose blocks are checked: the README and the guides.
fn documents() -> Vec<String> {
    let mut docs: Vec<String> = fs::read_dir(repo_root().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("a docs/ entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    docs.insert(0, "README.md".to_string());
    docs
}

#[test]
fn readme_shell_blocks_run_as_written() {
    let run = runnable_blocks("README.md");
    assert!(run.len() >= 4, "README.md: only {} runnable shell blocks found", run.len());
    let curl = Command::new("curl").arg("--version").stdout(Stdio::null()).status();
    assert!(curl.is_ok_and(|s| s.success()), "curl is needed to run the README's server commands");
    let tmp = tempfile::tempdir().expect("temporary directory");
    let stdout = run_blocks("README.md", &run, tmp.path());
    // the commands ran, and did what their comments say
    assert!(stdout.contains("{\"ready\":true}"), "the server never said ready:\n{stdout}");
    assert!(stdout.contains("\"name\":\"mean_action\""), "no inference answer:\n{stdout}");
    for out_file in
        ["ppo.safetensors", "ppo.pt", "model.safetensors", "out.safetensors", "drawn.safetensors", "amp.safetensors"]
    {
        assert!(tmp.path().join(out_file).is_file(), "README's commands wrote no /tmp/{out_file}");
    }
}

#[test]
fn docs_shell_blocks_run_as_written() {
    let mut ran = 0;
    for name in documents().iter().filter(|n| n.starts_with("docs/")) {
        let run = runnable_blocks(name);
        if run.is_empty() {
            continue;
        }
        let tmp = tempfile::tempdir().expect("temporary directory");
        run_blocks(name, &run, tmp.path());
        ran += run.len();
    }
    assert!(ran >= 1, "docs/: no runnable shell block found");
}

#[test]
fn rust_blocks_are_doctests() {
    let lib = fs::read_to_string(repo_root().join("src/lib.rs")).expect("src/lib.rs");
    assert!(
        lib.contains("#![doc(test(attr(deny(warnings))))]"),
        "src/lib.rs: the doctests no longer deny warnings (a pasted example would warn)"
    );
    let mut seen = 0;
    for name in documents() {
        let text = fs::read_to_string(repo_root().join(&name)).expect("the document");
        let rust: Vec<Block> = fenced_blocks(&text).into_iter().filter(|b| b.lang.starts_with("rust")).collect();
        if rust.is_empty() {
            continue;
        }
        let include = format!("include_str!(\"../{name}\")");
        assert!(lib.contains(&include), "src/lib.rs does not include {name}: its Rust blocks would go untested");
        for b in &rust {
            assert_eq!(b.lang, "rust", "{name}:{}: ```{} does not run as a doctest", b.first_line, b.lang);
            assert!(
                b.lines.iter().all(|l| !l.trim_start().starts_with("# ") && l.trim() != "#"),
                "{name}:{}: doctest-hidden lines do not compile when pasted",
                b.first_line
            );
            assert!(
                b.lines.iter().any(|l| l.starts_with("fn main()")),
                "{name}:{}: not a whole program (no `fn main()`)",
                b.first_line
            );
            seen += 1;
        }
    }
    assert!(seen >= 5, "only {seen} Rust blocks found in the README and docs/");
}

/// Whether rustdoc runs a block with this info string as a doctest: no
/// language, `rust`, or only rustdoc's own attributes (`no_run`, `ignore`, ...).
fn is_rust(lang: &str) -> bool {
    const ATTRS: [&str; 7] =
        ["rust", "no_run", "ignore", "should_panic", "compile_fail", "edition2021", "test_harness"];
    lang.split(',').map(str::trim).all(|t| t.is_empty() || ATTRS.contains(&t))
}

/// The crates' READMEs are their crate docs (`#![doc = include_str!("../README.md")]`):
/// each Rust block there is a whole program that runs as a doctest with
/// warnings denied, as the root README's are, so it works when pasted.
#[test]
fn crate_readme_rust_blocks_are_whole_programs_run_as_doctests() {
    let mut seen = 0;
    for entry in fs::read_dir(repo_root().join("crates")).expect("crates/") {
        let dir = entry.expect("a crates/ entry").path();
        let Ok(text) = fs::read_to_string(dir.join("README.md")) else { continue };
        let name = format!("{}/README.md", dir.display());
        let rust: Vec<Block> = fenced_blocks(&text).into_iter().filter(|b| is_rust(&b.lang)).collect();
        if rust.is_empty() {
            continue;
        }
        let lib = fs::read_to_string(dir.join("src/lib.rs")).unwrap_or_default();
        assert!(
            lib.contains("#![doc = include_str!(\"../README.md\")]"),
            "{name}: not the crate's docs, so not tested"
        );
        assert!(lib.contains("#![doc(test(attr(deny(warnings))))]"), "{name}: its doctests do not deny warnings");
        for b in &rust {
            assert_eq!(b.lang, "rust", "{name}:{}: ```{} does not run as a doctest", b.first_line, b.lang);
            assert!(
                b.lines.iter().all(|l| !l.trim_start().starts_with("# ") && l.trim() != "#"),
                "{name}:{}: doctest-hidden lines do not compile when pasted",
                b.first_line
            );
            assert!(
                b.lines.iter().any(|l| l.starts_with("fn main()") || l.starts_with("async fn main()")),
                "{name}:{}: not a whole program (no `fn main()`)",
                b.first_line
            );
            seen += 1;
        }
    }
    // ckpt, norm, pickle, policy (2), serve
    assert!(seen >= 6, "only {seen} Rust blocks found in the crates' READMEs");
}

#[test]
fn documented_status_reads_exit_comments() {
    assert_eq!(documented_status("pmstate diff a b   # \"no differences\", exit 0"), 0);
    assert_eq!(documented_status("pmstate diff a c   # differ: exit 1"), 1);
    assert_eq!(documented_status("pmstate inspect x   # tree, dtypes"), 0);
    assert_eq!(documented_status("echo '#exit 3'"), 0);
}

#[test]
fn commands_span_the_lines_bash_needs() {
    let block = Block {
        lang: "sh".into(),
        first_line: 10,
        lines: vec![
            "# a comment".into(),
            "X=1".into(),
            "echo \"a".into(),
            "b\"   # exit 0".into(),
            "false   # exit 1".into(),
        ],
    };
    let s = script("X.md", &[&block], Path::new("/nowhere"), 1);
    assert!(s.contains("echo \"a\nb\"   # exit 0\n__readme_check $? 0 12\n"), "{s}");
    assert!(s.contains("false   # exit 1\n__readme_check $? 1 14\n"), "{s}");
    assert!(!s.contains("X.md:10"), "a comment is not a command: {s}");
}
