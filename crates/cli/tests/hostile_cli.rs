//! The CLI on hostile files (`testdata/hostile/`, written by
//! `make_hostile.py`, plus bombs too large to commit, generated here), each
//! run under a 2 GiB address-space limit (`ulimit -v`): every command either
//! succeeds within it or exits 2 naming the limit or the problem, never
//! crashes (exit 101/134/135/137), and a refused write leaves nothing.
//! Memory is bounded by the address-space limit, not measured by a clock.

#![cfg(unix)]

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// 2 GiB, in the KiB `ulimit -v` takes.
const ADDRESS_SPACE_KIB: u64 = 2 << 20;

fn hostile(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/hostile").join(name)
}

/// `pmstate ARGS` under the address-space limit.
fn limited(args: &[&str]) -> Output {
    Command::new("bash")
        .arg("-c")
        .arg(format!("ulimit -v {ADDRESS_SPACE_KIB}; exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_pmstate"))
        .args(args)
        .output()
        .expect("run pmstate under bash")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Exit 0, or exit 2 with `message` in what it printed; never a crash.
fn expect(o: &Output, code: i32, message: &str, what: &str) {
    let out = text(o);
    assert_eq!(o.status.code(), Some(code), "{what}: {out}");
    assert!(out.contains(message), "{what}: expected {message:?} in: {out}");
    assert!(!out.contains("panicked"), "{what}: {out}");
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// (file, exit code and message of `inspect --json`) for every read-side bomb.
const READS: &[(&str, i32, &str)] = &[
    ("amplified_memo_list.pt", 2, "max_nodes"),
    ("memo_bomb.pkl", 2, "neither a torch zip archive"),
    ("dict_50k_keys.pt", 0, "\"format\":\"torch-zip\""),
    ("st_25k_tensors.safetensors", 0, "\"format\":\"safetensors\""),
    ("shape_wraps_u64.pt", 2, "element count overflows"),
    ("shape_2p63.pt", 2, "element count overflows"),
    ("shape_2p32_squared.pt", 2, "element count overflows"),
    ("view_1e12.pt", 0, "[1000000,1000000]"),
    ("two_million_floats.pt", 0, "\"format\":\"torch-zip\""),
    ("big_bytes_value.pt", 0, "\"format\":\"torch-zip\""),
    ("zip_bomb.pt", 2, "limit on inflated data"),
    ("st_huge_header.safetensors", 2, "safetensors"),
    ("st_duplicate_key.safetensors", 2, "tensor 'a' is listed twice"),
    ("st_duplicate_metadata.safetensors", 2, "__metadata__ key 'format' is listed twice"),
    ("zip64_duplicate_entries.pt", 2, "duplicate entry names"),
    ("legacy_duplicate_storage.pt", 2, "listed twice"),
    ("st_object_identity.safetensors", 2, "one object identity"),
];

#[test]
fn reading_hostile_files_stays_within_the_address_space_limit() {
    for &(file, code, message) in READS {
        let f = hostile(file);
        let f = f.to_str().unwrap();
        expect(&limited(&["inspect", "--json", f]), code, message, &format!("inspect {file}"));
        let n = limited(&["normalizers", "--json", f]);
        assert!(matches!(n.status.code(), Some(0 | 2)), "normalizers {file}: {}", text(&n));
        let d = limited(&["diff", "--json", f, f]);
        assert!(matches!(d.status.code(), Some(0 | 2)), "diff {file}: {}", text(&d));
    }
    // The view of 10^12 elements is summarized, never gathered: diffing or
    // exporting it is refused naming the limit.
    let v = hostile("view_1e12.pt");
    let v = v.to_str().unwrap();
    expect(&limited(&["diff", v, v]), 2, "max_view_bytes", "diff view_1e12");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.safetensors");
    expect(&limited(&["convert", "--select", "model", v, out.to_str().unwrap()]), 2, "max_view_bytes", "select");
    assert!(files_in(dir.path()).is_empty(), "a refused export left {:?}", files_in(dir.path()));
}

/// (file, output extension, exit code, message) for writes: exit 0 means
/// the output reads back equal; refusals leave nothing.
const WRITES: &[(&str, &str, i32, &str)] = &[
    ("two_million_floats.pt", "safetensors", 0, "wrote"),
    ("two_million_floats.pt", "pt", 0, "wrote"),
    ("dict_50k_keys.pt", "safetensors", 0, "wrote"),
    ("deep_list_70.pt", "safetensors", 0, "wrote"),
    ("deep_list_70.pt", "pt", 0, "wrote"),
    ("big_bytes_value.pt", "safetensors", 2, "readers accept 100000000"),
    ("big_bytes_value.pt", "pt", 0, "wrote"),
    ("f32_over_6_byte_storage.pt", "pt", 2, "not a whole number of 4-byte elements"),
    ("f32_over_6_byte_storage.pt", "safetensors", 0, "wrote"),
    ("two_dtypes_one_storage.pt", "pt", 2, "over one untyped storage"),
    ("two_dtypes_one_storage.pt", "safetensors", 0, "wrote"),
    ("persistent_id_as_key.pt", "pt", 2, "a storage reference outside a tensor"),
];

#[test]
fn writes_are_faithful_or_refused_leaving_nothing() {
    for &(file, ext, code, message) in WRITES {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join(format!("out.{ext}"));
        let (src, out_s) = (hostile(file), out.to_str().unwrap().to_owned());
        let o = limited(&["convert", src.to_str().unwrap(), &out_s]);
        expect(&o, code, message, &format!("{file} -> .{ext}"));
        if code != 0 {
            assert!(files_in(dir.path()).is_empty(), "{file} -> .{ext} left {:?}", files_in(dir.path()));
            continue;
        }
        // Exit 0: the output reads back equal to the input.
        let d = limited(&["diff", src.to_str().unwrap(), &out_s]);
        expect(&d, 0, "no differences", &format!("{file} -> .{ext} read back"));
        assert_eq!(files_in(dir.path()), [format!("out.{ext}")]);
    }
}

/// A safetensors file whose `pmstate.tree` is 20 MB of ints: refused before
/// it is parsed (it used to take 2.2 GB).
#[test]
fn a_twenty_megabyte_tree_is_refused_before_it_is_parsed() {
    let dir = tempfile::tempdir().unwrap();
    let mut tree = String::from(r#"{"t":"list","v":["#);
    tree.push_str(&"1,".repeat(10_000_000));
    tree.push_str("1]}");
    let header = serde_json::json!({ "__metadata__": { "pmstate.tree": tree, "pmstate.storages": "{}" } });
    let mut h = header.to_string().into_bytes();
    h.resize(h.len().next_multiple_of(8), b' ');
    let path = dir.path().join("tree_bomb.safetensors");
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
    f.write_all(&h).unwrap();
    drop(f);
    expect(&limited(&["inspect", path.to_str().unwrap()]), 2, "max_tree_values", "tree bomb");
}

/// A 1 MB file whose deflated `data.pkl` holds a 1 GiB string: `data.pkl`
/// counts against the inflate budget (it used to take 4 GB).
#[test]
fn a_deflated_pickle_counts_against_the_inflate_budget() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("string_bomb.pt");
    let mut z = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    let deflated =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated).large_file(true);
    z.start_file("archive/data.pkl", deflated).unwrap();
    // Just under the pickle input limit (1 GiB): what stops it is the inflate budget.
    let len: u64 = (1 << 30) - (1 << 20);
    z.write_all(b"\x80\x04\x8d").unwrap(); // BINUNICODE8
    z.write_all(&len.to_le_bytes()).unwrap();
    let chunk = vec![b'a'; 1 << 20];
    for _ in 0..(len >> 20) {
        z.write_all(&chunk).unwrap();
    }
    z.write_all(b".").unwrap();
    z.start_file("archive/version", zip::write::SimpleFileOptions::default()).unwrap();
    z.write_all(b"3\n").unwrap();
    z.finish().unwrap();
    assert!(std::fs::metadata(&path).unwrap().len() < 2 << 20);
    expect(&limited(&["inspect", path.to_str().unwrap()]), 2, "limit on inflated data", "string bomb");
}

#[test]
fn trace_bombs_are_refused_naming_the_limit() {
    let t = |f: &str| hostile(f).to_str().unwrap().to_owned();
    expect(
        &limited(&["replay", &t("trace_8000_steps_one_tensor.pmtrace.safetensors")]),
        2,
        "max_observation_bytes",
        "8000 steps",
    );
    expect(&limited(&["replay", &t("trace_world_4096.pmtrace.safetensors")]), 2, "MAX_INPROC_WORLD_SIZE", "world 4096");
    expect(&limited(&["replay", &t("trace_shape_1e12.pmtrace.safetensors")]), 2, "module shape", "shape 1e12");
    expect(&limited(&["replay", "/dev/zero"]), 2, "not a regular file (a device)", "/dev/zero");
    let o = limited(&["replay", "--timeout", "1e20", &t("trace_shape_1e12.pmtrace.safetensors")]);
    expect(&o, 2, "must be a number of seconds", "--timeout 1e20");
}

/// A FIFO, a directory or a device is an error that says so (a FIFO would
/// otherwise block forever).
#[test]
fn inputs_that_are_not_files_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.pt");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    expect(&limited(&["inspect", fifo.to_str().unwrap()]), 2, "not a regular file (a FIFO)", "fifo");
    expect(&limited(&["inspect", dir.path().to_str().unwrap()]), 2, "not a regular file (a directory)", "dir");
    expect(&limited(&["inspect", "/dev/null"]), 2, "not a regular file (a device)", "/dev/null");
    let out = dir.path().join("x.safetensors");
    expect(&limited(&["convert", "/dev/zero", out.to_str().unwrap()]), 2, "not a regular file", "convert /dev/zero");
}

/// `pmstate inspect X | head`: the reader goes away, pmstate ends quietly.
#[test]
fn a_closed_pipe_ends_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pmstate"))
        .args(["inspect", hostile("dict_50k_keys.pt").to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 64];
    child.stdout.as_mut().unwrap().read_exact(&mut first).unwrap();
    drop(child.stdout.take());
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(err.is_empty(), "{err}");
}

/// A foreign safetensors file of one f32 tensor of `elements` elements,
/// sparse (all zeros, costing no disk), with `last` as its last element.
fn sparse_safetensors(path: &Path, elements: u64, last: f32) {
    let bytes = elements * 4;
    let mut header =
        format!(r#"{{"w":{{"dtype":"F32","shape":[{elements}],"data_offsets":[0,{bytes}]}}}}"#).into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
    f.write_all(&header).unwrap();
    let data_start = 8 + header.len() as u64;
    f.set_len(data_start + bytes).unwrap();
    if last != 0.0 {
        use std::io::Seek;
        f.seek(std::io::SeekFrom::Start(data_start + bytes - 4)).unwrap();
        f.write_all(&last.to_le_bytes()).unwrap();
    }
}

#[test]
fn diff_streams_two_checkpoints_larger_than_the_address_space_limit() {
    // Two 1 GiB tensors under a 2 GiB limit: holding both (or one plus its
    // f64 copy) would not fit; streaming them a chunk at a time does.
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.safetensors"), dir.path().join("b.safetensors"));
    let elements = (1u64 << 30) / 4;
    sparse_safetensors(&a, elements, 0.0);
    sparse_safetensors(&b, elements, 1.5);
    let o = limited(&["diff", "--json", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let d = &report["differences"][0];
    assert_eq!(report["differences"].as_array().unwrap().len(), 1, "{report}");
    assert_eq!(d["key"], "w");
    assert_eq!(d["mismatched"], 1);
    assert_eq!(d["of"], elements);
    assert_eq!(d["max_abs"], 1.5);
    assert_eq!(d["first_index"], elements - 1);
    let o = limited(&["diff", a.to_str().unwrap(), a.to_str().unwrap()]);
    expect(&o, 0, "no differences", "diff a a");
}
