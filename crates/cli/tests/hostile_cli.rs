//! The CLI on hostile files (`testdata/hostile/`, written by
//! `make_hostile.py`, plus bombs too large to commit, generated here), each
//! run under a 2 GiB address-space limit (`ulimit -v`): every command either
//! succeeds within it or exits 2 naming the limit or the problem, never
//! crashes (exit 101/134/135/137), and a refused write leaves nothing.
//! Memory is bounded by the address-space limit, not measured by a clock;
//! generous CPU-time limits (`ulimit -t`) and a watchdog (`timeout 600`)
//! only turn a runaway, a hang or a quadratic walk into a failure.

#![cfg(unix)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use pmstate_ckpt::{Checkpoint, Node, TensorRef};

/// 2 GiB, in the KiB `ulimit -v` takes.
const ADDRESS_SPACE_KIB: u64 = 2 << 20;

fn hostile(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/hostile").join(name)
}

/// The watchdog: a command still running after this long has hung (exit 124).
const WATCHDOG_SECONDS: u32 = 600;

/// CPU seconds any command may use (`ulimit -t`, a resource limit like the
/// address space, whatever the machine's load): a runaway's bound.
const CPU_SECONDS: u32 = 300;

/// CPU seconds for the inputs that were quadratic: the linear code takes
/// about a second of CPU on them here, the quadratic code took more than
/// two minutes (and was killed unfinished).
const QUADRATIC_CPU_SECONDS: u32 = 30;

/// `pmstate ARGS` under the address-space limit (and the CPU limit and the watchdog).
fn limited(args: &[&str]) -> Output {
    limited_cpu(args, CPU_SECONDS)
}

/// [`limited`] with `cpu_seconds` of CPU time.
fn limited_cpu(args: &[&str], cpu_seconds: u32) -> Output {
    Command::new("bash")
        .arg("-c")
        .arg(format!(
            "ulimit -v {ADDRESS_SPACE_KIB}; ulimit -t {cpu_seconds}; exec timeout {WATCHDOG_SECONDS} \"$0\" \"$@\""
        ))
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
    ("many_normalizer_groups.pt", 0, "\"format\":\"torch-zip\""),
    ("dict_200k_int_keys.pt", 0, "\"format\":\"torch-zip\""),
    ("zip_understated_count.pt", 2, "readers would disagree on the archive's entries"),
    ("deep_list_255.pt", 0, "\"format\":\"torch-zip\""),
];

/// Every read-side bomb, through every reading command: a file `inspect`
/// refuses, `normalizers` and `diff` refuse with the same message; one it
/// reads, they read too (`diff F F`: equal), but for the 10^12-element view,
/// which `diff` refuses to expand.
#[test]
fn reading_hostile_files_stays_within_the_address_space_limit() {
    for &(file, code, message) in READS {
        let f = hostile(file);
        let f = f.to_str().unwrap();
        expect(&limited(&["inspect", "--json", f]), code, message, &format!("inspect {file}"));
        let n = limited(&["normalizers", "--json", f]);
        let d = limited(&["diff", "--json", f, f]);
        if code == 2 {
            expect(&n, 2, message, &format!("normalizers {file}"));
            expect(&d, 2, message, &format!("diff {file}"));
        } else {
            expect(&n, 0, "\"normalizers\":[", &format!("normalizers {file}"));
            if file == "view_1e12.pt" {
                expect(&d, 2, "max_view_bytes", &format!("diff {file}"));
            } else {
                expect(&d, 0, "\"equal\":true", &format!("diff {file}"));
            }
        }
    }
    // The view of 10^12 elements is summarized, never gathered: diffing or
    // exporting it is refused naming the limit and the tensor's key.
    let v = hostile("view_1e12.pt");
    let v = v.to_str().unwrap();
    let d = limited(&["diff", v, v]);
    expect(&d, 2, "max_view_bytes", "diff view_1e12");
    expect(&d, 2, "gathering the view model.w (storage 0", "diff view_1e12 names the key");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.safetensors");
    let o = limited(&["convert", "--select", "model", v, out.to_str().unwrap()]);
    expect(&o, 2, "max_view_bytes", "select");
    expect(&o, 2, "gathering the view model.w (storage 0", "select names the key");
    assert!(files_in(dir.path()).is_empty(), "a refused export left {:?}", files_in(dir.path()));
}

/// Shapes whose element count overflows u64 (legal in torch for stride-0
/// views): every command refuses them naming the tensor's key (`t`), and
/// none crashes (exit 101 or 134 would be an overflow panic or an abort).
#[test]
fn overflowing_shapes_are_refused_by_every_command_naming_the_key() {
    for file in ["shape_wraps_u64.pt", "shape_2p63.pt", "shape_2p32_squared.pt"] {
        let f = hostile(file);
        let f = f.to_str().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("m.safetensors");
        let out = out.to_str().unwrap();
        let runs = [
            ("inspect", limited(&["inspect", f])),
            ("normalizers", limited(&["normalizers", "--json", f])),
            ("diff", limited(&["diff", f, f])),
            ("convert --select", limited(&["convert", "--select", "model", f, out])),
            ("convert", limited(&["convert", f, out])),
        ];
        for (what, o) in &runs {
            let what = format!("{what} {file}");
            expect(o, 2, "element count overflows", &what);
            expect(o, 2, &format!("{f}: t: "), &what);
        }
        assert!(files_in(dir.path()).is_empty(), "{file}: a refused convert left {:?}", files_in(dir.path()));
    }
}

/// 15,000 normalizer groups (`n{i}.mean/var/count`): `inspect` and
/// `normalizers` list every one, within [`QUADRATIC_CPU_SECONDS`].
/// Summarizing them used to re-walk the tree once per group.
#[test]
fn fifteen_thousand_normalizer_groups_are_listed() {
    let f = hostile("many_normalizer_groups.pt");
    let f = f.to_str().unwrap();
    for cmd in ["inspect", "normalizers"] {
        let o = limited_cpu(&[cmd, "--json", f], QUADRATIC_CPU_SECONDS);
        expect(&o, 0, "\"name\":\"n14999\"", cmd);
        let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let groups = j["normalizers"].as_array().unwrap();
        assert_eq!(groups.len(), 15_000, "{cmd}");
        assert_eq!(groups[0]["name"], "n0");
        assert_eq!(groups[0]["count"], 4);
        assert_eq!(groups[0]["mean"]["max"], 0.5);
        assert_eq!(groups[0]["std"]["max"], 2.0, "std is sqrt(var = 4)");
    }
}

/// A dict of 200,000 int keys diffed against itself, within
/// [`QUADRATIC_CPU_SECONDS`]: each key is found through a hash map (a
/// linear search per key used to make it quadratic).
#[test]
fn diff_of_a_dict_of_200k_int_keys_is_linear() {
    let f = hostile("dict_200k_int_keys.pt");
    let f = f.to_str().unwrap();
    let o = limited_cpu(&["diff", f, f], QUADRATIC_CPU_SECONDS);
    expect(&o, 0, "no differences", "diff dict_200k_int_keys");
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
    ("persistent_id_as_key.pt", "safetensors", 0, "wrote"),
    ("deep_list_255.pt", "pt", 0, "wrote"),
    ("deep_list_255.pt", "safetensors", 0, "wrote"),
    ("many_normalizer_groups.pt", "pt", 0, "wrote"),
    ("many_normalizer_groups.pt", "safetensors", 0, "wrote"),
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
        // Exit 0: the output reads back equal to the input, as `diff` sees
        // it and exactly: the same tree, flags, aliasing and bytes.
        let d = limited(&["diff", src.to_str().unwrap(), &out_s]);
        expect(&d, 0, "no differences", &format!("{file} -> .{ext} read back"));
        assert_eq!(files_in(dir.path()), [format!("out.{ext}")]);
        let (a, b) = (Checkpoint::open(&src).unwrap(), Checkpoint::open(&out).unwrap());
        if let Err(e) = same_checkpoint(&a, &b) {
            panic!("{file} -> .{ext}: the output's tree differs from the input's: {e}");
        }
    }
}

/// What a faithful write may rename: storage keys and object identities,
/// each one to one (so what shared a storage or an identity still does,
/// and what did not still does not).
#[derive(Default)]
struct Renaming {
    storages: (HashMap<String, String>, HashMap<String, String>),
    objects: (HashMap<u64, u64>, HashMap<u64, u64>),
}

/// Whether `a -> b` agrees with the renaming so far (recording it if new).
fn one_to_one<K: std::hash::Hash + Eq + Clone>(m: &mut (HashMap<K, K>, HashMap<K, K>), a: &K, b: &K) -> bool {
    match (m.0.get(a), m.1.get(b)) {
        (None, None) => {
            m.0.insert(a.clone(), b.clone());
            m.1.insert(b.clone(), a.clone());
            true
        }
        (Some(x), Some(y)) => x == b && y == a,
        _ => false,
    }
}

fn same_nodes(xs: &[Node], ys: &[Node], r: &mut Renaming, at: &str) -> Result<(), String> {
    if xs.len() != ys.len() {
        return Err(format!("{at}: {} items, then {}", xs.len(), ys.len()));
    }
    xs.iter().zip(ys).enumerate().try_for_each(|(i, (x, y))| same_node(x, y, r, &format!("{at}.{i}")))
}

fn same_pairs(xs: &[(Node, Node)], ys: &[(Node, Node)], r: &mut Renaming, at: &str) -> Result<(), String> {
    if xs.len() != ys.len() {
        return Err(format!("{at}: {} entries, then {}", xs.len(), ys.len()));
    }
    for (i, ((ka, va), (kb, vb))) in xs.iter().zip(ys).enumerate() {
        same_node(ka, kb, r, &format!("{at}.<key {i}>"))?;
        same_node(va, vb, r, &format!("{at}.{ka}"))?;
    }
    Ok(())
}

fn same_option(x: &Option<Node>, y: &Option<Node>, r: &mut Renaming, at: &str) -> Result<(), String> {
    match (x, y) {
        (Some(x), Some(y)) => same_node(x, y, r, at),
        (None, None) => Ok(()),
        _ => Err(format!("{at}: present on one side only")),
    }
}

/// The first difference between two trees: every node of the same kind and
/// value (floats by their bits), tensors with the same dtype, shape,
/// stride, offset, `requires_grad` and parameter flag, over storages and
/// identities that correspond one to one.
fn same_node(a: &Node, b: &Node, r: &mut Renaming, at: &str) -> Result<(), String> {
    let differ = || Err(format!("{at}: {a} then {b}"));
    match (a, b) {
        (Node::Float(x), Node::Float(y)) if x.to_bits() != y.to_bits() => differ(),
        (Node::Complex(xr, xi), Node::Complex(yr, yi))
            if (xr.to_bits(), xi.to_bits()) != (yr.to_bits(), yi.to_bits()) =>
        {
            differ()
        }
        (Node::List(xs), Node::List(ys)) | (Node::Tuple(xs), Node::Tuple(ys)) | (Node::Set(xs), Node::Set(ys)) => {
            same_nodes(xs, ys, r, at)
        }
        (Node::Dict(x), Node::Dict(y)) => {
            if x.is_ordered() != y.is_ordered() {
                return Err(format!("{at}: {} then {}", a.kind(), b.kind()));
            }
            same_pairs(x.entries(), y.entries(), r, at)?;
            same_option(&x.state().cloned(), &y.state().cloned(), r, &format!("{at}.<state>"))
        }
        (Node::Tensor(x), Node::Tensor(y)) => {
            let view = |t: &TensorRef| (t.dtype, t.shape.clone(), t.stride.clone(), t.offset, t.requires_grad, t.class);
            if view(x) != view(y) {
                return Err(format!("{at}: tensor {:?} then {:?}", view(x), view(y)));
            }
            if !one_to_one(&mut r.storages, &x.storage, &y.storage) {
                return Err(format!("{at}: storage {} then {}: aliasing changed", x.storage, y.storage));
            }
            match (x.object, y.object) {
                (Some(p), Some(q)) if one_to_one(&mut r.objects, &p, &q) => Ok(()),
                (None, None) => Ok(()),
                _ => Err(format!("{at}: object identity {:?} then {:?}", x.object, y.object)),
            }
        }
        (Node::Object(x), Node::Object(y)) => {
            if x.construct != y.construct {
                return Err(format!("{at}: built by {:?} then {:?}", x.construct, y.construct));
            }
            same_node(&x.callable, &y.callable, r, &format!("{at}.<callable>"))?;
            same_node(&x.args, &y.args, r, &format!("{at}.<args>"))?;
            same_option(&x.kwargs, &y.kwargs, r, &format!("{at}.<kwargs>"))?;
            same_option(&x.state, &y.state, r, &format!("{at}.<state>"))?;
            same_pairs(&x.setitems, &y.setitems, r, &format!("{at}.<setitems>"))?;
            same_nodes(&x.appends, &y.appends, r, &format!("{at}.<appends>"))
        }
        (Node::Float(_), Node::Float(_)) | (Node::Complex(..), Node::Complex(..)) => Ok(()),
        _ if a == b => Ok(()),
        _ => differ(),
    }
}

/// `b` holds exactly `a`: the same tree (up to renamed storages and
/// identities) over storages of the same bytes, typed-ness and dtype.
fn same_checkpoint(a: &Checkpoint, b: &Checkpoint) -> Result<(), String> {
    let mut r = Renaming::default();
    same_node(a.root(), b.root(), &mut r, "<root>")?;
    if a.storages().len() != b.storages().len() {
        return Err(format!("{} storages, then {}", a.storages().len(), b.storages().len()));
    }
    for (ka, kb) in &r.storages.0 {
        let (sa, sb) = (a.storage(ka).unwrap(), b.storage(kb).unwrap());
        if (sa.typed, sa.dtype) != (sb.typed, sb.dtype) {
            return Err(format!("storage {ka}: {:?} then {:?}", (sa.typed, sa.dtype), (sb.typed, sb.dtype)));
        }
        if sa.data.read().unwrap() != sb.data.read().unwrap() {
            return Err(format!("storage {ka}: its bytes differ"));
        }
    }
    Ok(())
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
    let dup = limited(&["replay", &t("trace_duplicate_tensor.pmtrace.safetensors")]);
    expect(&dup, 2, "safetensors header: tensor 'c' is listed twice", "duplicate tensor");
    let dup = limited(&["replay", &t("trace_duplicate_metadata.pmtrace.safetensors")]);
    expect(&dup, 2, "safetensors header: __metadata__ key 'trace' is listed twice", "duplicate metadata");
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

/// A pmstate safetensors file whose tree holds one f32 tensor `w`, the
/// transpose (shape `[n, n]`, stride `[1, n]`) of a storage of `n * n`
/// elements, sparse (all zeros, costing no disk) but for `set`
/// (storage element, value).
fn sparse_transposed(path: &Path, n: u64, set: &[(u64, f32)]) {
    let bytes = n * n * 4;
    let tree = format!(
        r#"{{"t":"dict","items":[["w",{{"t":"tensor","storage":"0","dtype":"float32","offset":0,"shape":[{n},{n}],"stride":[1,{n}],"requires_grad":false,"parameter":null,"object":null}}]]}}"#
    );
    let storages = r#"{"0":{"tensor":"s","typed":true,"dtype":"float32","location":"cpu"}}"#;
    let header = serde_json::json!({
        "__metadata__": { "pmstate.tree": tree, "pmstate.storages": storages },
        "s": { "dtype": "F32", "shape": [n * n], "data_offsets": [0, bytes] },
    });
    let mut h = header.to_string().into_bytes();
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
    f.write_all(&h).unwrap();
    let data_start = 8 + h.len() as u64;
    f.set_len(data_start + bytes).unwrap();
    for &(at, v) in set {
        use std::io::Seek;
        f.seek(std::io::SeekFrom::Start(data_start + 4 * at)).unwrap();
        f.write_all(&v.to_le_bytes()).unwrap();
    }
}

#[test]
fn diff_streams_transposed_views_larger_than_the_address_space_limit() {
    // Two transposed views of 1 GiB storages under a 2 GiB limit: gathering
    // either (its storage span plus the gathered copy) would not fit.
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.safetensors"), dir.path().join("b.safetensors"));
    let n = 1u64 << 14;
    sparse_transposed(&a, n, &[]);
    // Storage element 1 is w[1, 0] (flat index n), storage element n is
    // w[0, 1] (flat index 1): read first in memory order, reported second.
    sparse_transposed(&b, n, &[(1, 2.5), (n, -1.0)]);
    let o = limited(&["diff", "--json", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["differences"].as_array().unwrap().len(), 1, "{report}");
    let d = &report["differences"][0];
    assert_eq!(d["key"], "w");
    assert_eq!(d["mismatched"], 2);
    assert_eq!(d["of"], n * n);
    assert_eq!(d["max_abs"], 2.5);
    assert_eq!(d["first_index"], 1, "the least flat (C-order) index, not the first read");
    expect(&limited(&["diff", a.to_str().unwrap(), a.to_str().unwrap()]), 0, "no differences", "diff a a");
}

// ---- files that are not what they claim, for `policy` and `serve` ----

/// 1 GiB of address space, in KiB: what one refusal may cost at most.
const REFUSAL_KIB: u64 = 1 << 20;

/// `pmstate ARGS` under [`REFUSAL_KIB`] of address space (and the CPU limit and the watchdog).
fn limited_tight(args: &[&str]) -> Output {
    Command::new("bash")
        .arg("-c")
        .arg(format!("ulimit -v {REFUSAL_KIB}; ulimit -t {CPU_SECONDS}; exec timeout {WATCHDOG_SECONDS} \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_pmstate"))
        .args(args)
        .output()
        .expect("run pmstate under bash")
}

fn policy_data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy").join(rel)
}

/// A safetensors file of the smpl tracker's recorded observations (their
/// header entries and data as recorded) followed by `extra` empty tensors.
fn obs_with_extra_tensors(path: &Path, extra: usize) {
    let bytes = std::fs::read(policy_data("smpl_tracker/obs.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut text = String::from("{");
    for (k, v) in header.as_object().unwrap() {
        if k != "__metadata__" {
            text.push_str(&format!("{}:{v},", serde_json::Value::from(k.as_str())));
        }
    }
    for i in 0..extra {
        text.push_str(&format!(r#""extra{i}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}},"#));
    }
    text.pop();
    text.push('}');
    let mut h = text.into_bytes();
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
    f.write_all(&h).unwrap();
    f.write_all(&bytes[8 + n..]).unwrap();
}

/// `policy run --obs` on 1.4 million empty extra tensors is refused from
/// the header, at the first extra key, within 1 GiB of address space; the
/// same file without them runs within the same limit. Nothing is written.
#[test]
fn observations_with_a_million_extra_tensors_are_refused_from_the_header() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = policy_data("smpl_tracker/last.ckpt");
    let ckpt = ckpt.to_str().unwrap();
    let out = dir.path().join("out.safetensors");
    let run = |obs: &Path| {
        limited_tight(&["policy", "run", ckpt, "--obs", obs.to_str().unwrap(), "--out", out.to_str().unwrap()])
    };
    let bomb = dir.path().join("bomb.safetensors");
    obs_with_extra_tensors(&bomb, 1_400_000);
    assert!(std::fs::metadata(&bomb).unwrap().len() > 50 << 20);
    expect(&run(&bomb), 2, "unexpected observation extra0: the model's in_keys are", "1.4M extra tensors");
    assert_eq!(files_in(dir.path()), ["bomb.safetensors"], "a refusal wrote something");

    let fine = dir.path().join("fine.safetensors");
    obs_with_extra_tensors(&fine, 0);
    expect(&run(&fine), 0, "wrote", "the recorded observations");
    assert!(out.is_file());
}

/// Observation headers that lie: a shape of a million dimensions, data
/// offsets outside the file, a key given twice, a FIFO. Each is refused
/// naming the tensor (or the file kind), and nothing is written.
#[test]
fn observation_headers_that_lie_are_refused_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = policy_data("smpl_tracker/last.ckpt");
    let ckpt = ckpt.to_str().unwrap();
    let out = dir.path().join("out.safetensors");
    let raw = |name: &str, header: &str, data_len: u64| {
        let p = dir.path().join(name);
        let mut h = header.as_bytes().to_vec();
        h.resize(h.len().next_multiple_of(8), b' ');
        let mut f = std::fs::File::create(&p).unwrap();
        f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
        f.write_all(&h).unwrap();
        f.set_len(8 + h.len() as u64 + data_len).unwrap();
        p
    };
    let dims = vec!["1"; 1_000_000].join(",");
    let cases = [
        (
            raw(
                "dims.safetensors",
                &format!(r#"{{"max_coords_obs":{{"dtype":"F32","shape":[{dims}],"data_offsets":[0,4]}}}}"#),
                4,
            ),
            "tensor max_coords_obs: a shape of more than 8 dimensions",
        ),
        (
            raw(
                "offsets.safetensors",
                r#"{"max_coords_obs":{"dtype":"F32","shape":[1000000,358],"data_offsets":[0,1432000000]}}"#,
                16,
            ),
            "tensor max_coords_obs: data offsets [0, 1432000000] do not hold its 1432000000 bytes inside the file's 16",
        ),
        (
            raw(
                "twice.safetensors",
                r#"{"max_coords_obs":{"dtype":"F32","shape":[0,358],"data_offsets":[0,0]},"max_coords_obs":{"dtype":"F32","shape":[0,358],"data_offsets":[0,0]}}"#,
                0,
            ),
            "tensor max_coords_obs is listed twice",
        ),
        (
            raw(
                "dtype.safetensors",
                r#"{"max_coords_obs":{"dtype":"F64","shape":[1,358],"data_offsets":[0,2864]}}"#,
                2864,
            ),
            "observation max_coords_obs: dtype f64, expected float32",
        ),
    ];
    for (path, message) in &cases {
        let o =
            limited_tight(&["policy", "run", ckpt, "--obs", path.to_str().unwrap(), "--out", out.to_str().unwrap()]);
        expect(&o, 2, message, &path.display().to_string());
    }
    let fifo = dir.path().join("fifo.safetensors");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let o = limited_tight(&["policy", "run", ckpt, "--obs", fifo.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    expect(&o, 2, "not a regular file (a FIFO)", "a FIFO as observations");
    assert!(!out.exists() && files_in(dir.path()).iter().all(|f| !f.starts_with(".out")), "{:?}", files_in(dir.path()));
}

/// The smpl tracker's checkpoint and configs in a folder, with `global`
/// added at the root key `evaluator` of the file `which` ("last.ckpt" or
/// "resolved_configs.pt").
fn tracker_with_global(which: &str, module: &str, name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["last.ckpt", "resolved_configs.pt"] {
        std::fs::copy(policy_data("smpl_tracker").join(f), dir.path().join(f)).unwrap();
    }
    let path = dir.path().join(which);
    let (mut root, storages) = Checkpoint::open(&path).unwrap().into_parts();
    root.as_dict_mut().unwrap().insert("evaluator", Node::Global { module: module.into(), name: name.into() });
    let opts = pmstate_ckpt::WriteOptions { unsafe_globals: pmstate_ckpt::UnsafeGlobals::Allow, ..Default::default() };
    Checkpoint::from_parts(root, storages).unwrap().save_with(&path, &opts).unwrap();
    dir
}

/// A checkpoint carrying `posix.system` under an unrelated key, and
/// configs carrying `builtins.eval` or `subprocess.Popen`: `policy
/// describe|run` refuse them naming the global and its key (as `convert`
/// refuses the checkpoint), and write nothing; `--allow-unsafe-globals`
/// runs them, naming each global on stderr.
#[test]
fn policy_commands_refuse_foreign_globals_unless_allowed() {
    let obs = policy_data("smpl_tracker/obs.safetensors");
    let obs = obs.to_str().unwrap();
    for (which, module, name, message) in [
        ("last.ckpt", "posix", "system", "refusing 1 unsafe global(s) (posix.system at evaluator)"),
        ("resolved_configs.pt", "builtins", "eval", "global(s) (builtins.eval at evaluator)"),
        ("resolved_configs.pt", "subprocess", "Popen", "global(s) (subprocess.Popen at evaluator)"),
    ] {
        let dir = tracker_with_global(which, module, name);
        let ckpt = dir.path().join("last.ckpt");
        let ckpt = ckpt.to_str().unwrap();
        let out = dir.path().join("out.safetensors");
        let out = out.to_str().unwrap();
        let what = format!("{module}.{name} in {which}");
        expect(&limited(&["policy", "describe", ckpt]), 2, message, &what);
        expect(&limited(&["policy", "run", ckpt, "--obs", obs, "--out", out]), 2, message, &what);
        assert_eq!(files_in(dir.path()), ["last.ckpt", "resolved_configs.pt"], "{what}: a refusal wrote something");

        let o = limited(&["policy", "run", "--allow-unsafe-globals", ckpt, "--obs", obs, "--out", out]);
        expect(&o, 0, &format!("loading the global {module}.{name} at evaluator"), &what);
        expect(&limited(&["policy", "describe", "--allow-unsafe-globals", ckpt]), 0, "in_keys", &what);
    }
    // ProtoMotions' own files hold only what the rules expect
    for v in ["smpl_tracker", "g1_amp_deploy", "container_obsprocessor"] {
        let ckpt = policy_data(v).join("last.ckpt");
        let o = limited(&["policy", "describe", ckpt.to_str().unwrap()]);
        expect(&o, 0, "in_keys", v);
        assert!(!text(&o).contains("warning"), "{v}: {}", text(&o));
    }
}

/// Waits for `child` with a generous deadline that only guards against a
/// hang (the assertion is on how it exited, not on when).
fn wait_guarded(child: &mut std::process::Child) -> std::process::ExitStatus {
    let start = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > std::time::Duration::from_secs(WATCHDOG_SECONDS.into()) {
            let _ = child.kill();
            panic!("pmstate serve hung");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `pmstate serve` on a FIFO (nobody ever writes it) or /dev/zero: refused
/// at start-up naming the kind of file (a FIFO's open never blocks), and a
/// SIGTERM sent the instant it starts stops it whatever it is doing.
#[test]
fn serve_on_a_fifo_or_dev_zero_is_refused_and_sigterm_stops_it_from_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("last.ckpt");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    std::fs::copy(policy_data("smpl_tracker/resolved_configs.pt"), dir.path().join("resolved_configs.pt")).unwrap();
    let zero = dir.path().join("zero.ckpt");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    for (path, kind) in [(&fifo, "a FIFO"), (&zero, "a device")] {
        let args = ["serve", path.to_str().unwrap(), "--addr", "127.0.0.1:0"];
        expect(&limited(&args), 2, &format!("not a regular file ({kind})"), kind);

        let mut child = Command::new(env!("CARGO_BIN_EXE_pmstate"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
        let status = wait_guarded(&mut child);
        // refused before the signal landed (2), or stopped by it: drained (0) or, in the
        // instant before the handlers exist, by the default action (SIGTERM)
        use std::os::unix::process::ExitStatusExt;
        assert!(matches!(status.code(), Some(0) | Some(2)) || status.signal() == Some(15), "{kind}: {status:?}");
    }
}

/// A valid clip at a tiny frame rate asks the motion player for ten million
/// frames (under the frame-count limit; 19 GB at the g1's size): under the 2 GiB address
/// space, `deploy replay` and `bench-deploy` refuse it by the player's
/// stated bound (exit 2 naming it) before anything is allocated; a NaN in
/// the clip is refused naming its key and index. Never an abort.
#[test]
fn deploy_clips_sized_past_the_bound_are_refused_not_allocated() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let (mut tree, storages) =
        Checkpoint::open(root.join("testdata/deploy/synthetic.motion")).expect("clip").into_parts();
    // 9.9 million control frames at 50 Hz
    let frames = pmstate_deploy::MotionClip::load(root.join("testdata/deploy/synthetic.motion")).expect("clip").frames;
    let fps = (frames - 1) as f64 / (9.9e6 * 0.02);
    *tree.as_dict_mut().and_then(|d| d.get_mut("fps")).expect("fps") = Node::Float(fps);
    let dir = tempfile::tempdir().expect("tempdir");
    let slow = dir.path().join("slow.motion");
    let edited = Checkpoint::from_parts(tree, storages).expect("parts");
    pmstate_ckpt::save_torch(&edited, &slow, &Default::default()).expect("save");
    let ckpt = root.join("testdata/policy/g1_amp_deploy/last.ckpt");
    let sensors = root.join("testdata/deploy/g1_amp_deploy/sensors.safetensors");
    let out = dir.path().join("o.safetensors");
    let s = |p: &Path| p.display().to_string();
    for args in [
        vec!["deploy", "replay", &s(&ckpt), "--motion", &s(&slow), "--sensors", &s(&sensors), "--out", &s(&out)],
        vec!["bench-deploy", &s(&ckpt), "--motion", &s(&slow), "--sensors", &s(&sensors), "--steps", "10"],
    ] {
        let o = limited(&args);
        assert_eq!(o.status.code(), Some(2), "{}: {}", args[0], text(&o));
        assert!(text(&o).contains("past the player's bound"), "{}", text(&o));
    }
    assert!(!out.exists(), "a refused replay wrote its output");
}

/// `bench-deploy --steps` at its largest (10^8 steps, 800 MB of step times)
/// under 512 MiB of address space (the whole run needs under 128 MiB
/// otherwise; the step times can never fit): an error naming `--steps`
/// (exit 2), not an abort on the failed allocation.
#[test]
fn bench_deploy_steps_past_the_memory_at_hand_are_an_error_naming_them() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let s = |rel: &str| root.join(rel).display().to_string();
    let o = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "ulimit -v {}; ulimit -t {CPU_SECONDS}; exec timeout {WATCHDOG_SECONDS} \"$0\" \"$@\"",
            512 * 1024
        ))
        .arg(env!("CARGO_BIN_EXE_pmstate"))
        .args([
            "bench-deploy",
            &s("testdata/policy/g1_amp_deploy/last.ckpt"),
            "--motion",
            &s("testdata/deploy/synthetic.motion"),
            "--sensors",
            &s("testdata/deploy/g1_amp_deploy/sensors.safetensors"),
            "--steps",
            "100000000",
        ])
        .output()
        .expect("run pmstate under bash");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--steps 100000000: could not allocate 800000000 bytes"), "{}", text(&o));
}
