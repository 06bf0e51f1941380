//! Structural errors name the step and field; nothing panics.

use candle_core::{Device, Tensor};
use pmstate_trace::{read_bytes, to_bytes, Direction, FieldProblem, ModuleClass, ModuleSpec, Recorder, TraceError};
use serde_json::Value;

/// A small valid trace's bytes.
fn valid() -> Vec<u8> {
    let spec = ModuleSpec {
        class: ModuleClass::RunningMeanStd,
        shape: Some(vec![2]),
        epsilon: 1e-5,
        clamp_value: None,
        ema_decay: None,
        gamma: None,
    };
    let mut r = Recorder::new(spec, "structure").unwrap();
    r.record_moments(&Tensor::new(&[[1f32, 2.], [3., 5.]], &Device::Cpu).unwrap()).unwrap();
    r.normalize(&Tensor::new(&[[1f32, 2.]], &Device::Cpu).unwrap(), Direction::Normalize).unwrap();
    to_bytes(&r.finish()).unwrap()
}

/// Rewrites the trace JSON inside a safetensors file.
fn with_doc(bytes: &[u8], edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut doc: Value = serde_json::from_str(header["__metadata__"]["trace"].as_str().unwrap()).unwrap();
    edit(&mut doc);
    header["__metadata__"]["trace"] = Value::String(doc.to_string());
    let mut h = header.to_string().into_bytes();
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(&bytes[8 + n..]);
    out
}

fn field_err(bytes: &[u8]) -> (usize, String, FieldProblem) {
    match read_bytes(bytes) {
        Err(TraceError::Field { step, field, problem, .. }) => (step, field, problem),
        other => panic!("expected a field error, got {other:?}"),
    }
}

#[test]
fn the_valid_trace_reads() {
    assert_eq!(read_bytes(&valid()).unwrap().steps.len(), 2);
}

#[test]
fn a_missing_tensor_names_step_and_field() {
    let b = with_doc(&valid(), |d| d["steps"][1]["out"] = Value::String("nope".into()));
    let (step, field, problem) = field_err(&b);
    assert_eq!((step, field.as_str()), (1, "out"));
    assert!(matches!(&problem, FieldProblem::NoSuchTensor(name) if name == "nope"), "{problem}");
}

#[test]
fn a_wrong_dtype_names_the_field() {
    // state.mean must be F64: point it at an F32 tensor.
    let b = with_doc(&valid(), |d| {
        let x = d["steps"][0]["batch_mean"][0].clone();
        d["steps"][0]["state"]["mean"] = x;
    });
    let (step, field, problem) = field_err(&b);
    assert_eq!((step, field.as_str()), (0, "state.mean"));
    assert!(matches!(problem, FieldProblem::WrongTensor { expected: "an F64 tensor", .. }), "{problem}");
}

#[test]
fn a_wrong_shape_names_the_field() {
    let b = with_doc(&valid(), |d| {
        let x = d["steps"][1]["out"].clone(); // [1, 2], not the module's [2]
        d["steps"][1]["std"] = x;
    });
    let (step, field, problem) = field_err(&b);
    assert_eq!((step, field.as_str()), (1, "std"));
    assert!(matches!(&problem, FieldProblem::ShapeMismatch { found, .. } if found == &[1, 2]), "{problem}");
}

#[test]
fn per_rank_lists_must_match_the_world_size() {
    let b = with_doc(&valid(), |d| d["world_size"] = Value::from(2));
    let (step, field, problem) = field_err(&b);
    assert_eq!((step, field.as_str()), (0, "x"));
    assert!(matches!(problem, FieldProblem::RankCount { found: 1, world_size: 2 }), "{problem}");
}

#[test]
fn unknown_ops_versions_and_missing_results_are_errors() {
    let (step, field, problem) = field_err(&with_doc(&valid(), |d| d["steps"][0]["op"] = Value::from("explode")));
    assert_eq!((step, field.as_str()), (0, "op"));
    assert!(matches!(&problem, FieldProblem::UnknownOp(op) if op == "\"explode\""), "{problem}");
    assert!(matches!(read_bytes(&with_doc(&valid(), |d| d["version"] = Value::from(2))), Err(TraceError::Version(2))));
    let b = with_doc(&valid(), |d| {
        d["steps"][0].as_object_mut().unwrap().remove("state");
    });
    let (step, field, problem) = field_err(&b);
    assert_eq!((step, field.as_str()), (0, "state"));
    assert!(matches!(problem, FieldProblem::Missing), "{problem}");
    let b = with_doc(&valid(), |d| d["module"]["class"] = Value::from("Other"));
    let err = read_bytes(&b).unwrap_err();
    assert!(matches!(err, TraceError::Json(_)), "{err}");
    // The class name table answers as serde does: the one wording check of a JSON error.
    assert!(err.to_string().contains("unknown variant `Other`, expected `RunningMeanStd`"), "{err}");
    // The format is ours: a field it does not define is an error, not ignored.
    let b = with_doc(&valid(), |d| d["steps"][0]["surprise"] = Value::from(1));
    let (step, field, problem) = field_err(&b);
    assert_eq!((step, field.as_str()), (0, "<step>"));
    assert!(matches!(problem, FieldProblem::Json(_)), "{problem}");
}

#[test]
fn not_a_trace_is_an_error() {
    assert!(matches!(read_bytes(b"hello"), Err(TraceError::Container(_))));
    let b = with_doc(&valid(), |d| d["format"] = Value::from("x"));
    assert!(matches!(read_bytes(&b), Err(TraceError::Header { field: "format", problem: FieldProblem::NotPmTrace })));
}

/// The bytes of a safetensors file whose header is `header` (JSON text, as
/// given: it may name a key twice) followed by `data`.
fn raw_file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut h = header.as_bytes().to_vec();
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    out
}

/// A header naming a tensor, `__metadata__` or a metadata key twice is
/// refused: the safetensors crate would keep one of the two silently.
#[test]
fn names_given_twice_in_the_header_are_refused() {
    let bytes = valid();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap().trim_end();
    let data = &bytes[8 + n..];
    let parsed: Value = serde_json::from_str(header).unwrap();
    let (name, entry) = parsed.as_object().unwrap().iter().find(|(k, _)| *k != "__metadata__").unwrap();
    let trace = parsed["__metadata__"]["trace"].to_string();
    // Each edit inserts a second copy of something right after the opening brace.
    let cases = [
        (format!("{{\"{name}\":{entry},"), format!("tensor '{name}' is listed twice")),
        ("{\"__metadata__\":{\"format\":\"pm-trace\"},".to_owned(), "__metadata__ is listed twice".to_owned()),
    ];
    for (prefix, message) in cases {
        let doubled = raw_file(&header.replacen('{', &prefix, 1), data);
        let err = read_bytes(&doubled).unwrap_err();
        assert!(
            matches!(&err, TraceError::Header { field: "safetensors header", problem: FieldProblem::DuplicateKey(_) }),
            "{err}"
        );
        assert!(err.to_string().contains(&message), "{err}");
    }
    let meta = header.replacen("\"__metadata__\":{", &format!("\"__metadata__\":{{\"trace\":{trace},"), 1);
    let err = read_bytes(&raw_file(&meta, data)).unwrap_err();
    assert!(matches!(err, TraceError::Header { field: "safetensors header", .. }), "{err}");
    assert_eq!(err.to_string(), "safetensors header: __metadata__ key 'trace' is listed twice");
}

/// The observation budget multiplies the module's dimensions with checked
/// arithmetic: `[2^32, 2^32]` (a shape no file can declare, built here in
/// memory) is over the limit, where a wrapped product would have been 0.
#[test]
fn a_module_shape_whose_size_overflows_is_over_the_replay_budget() {
    let mut trace = read_bytes(&valid()).unwrap();
    trace.module.shape = Some(vec![1 << 32, 1 << 32]);
    let err = pmstate_trace::replay(&trace, &pmstate_trace::ReplayOptions::default()).unwrap_err();
    assert!(matches!(err, TraceError::Limit { limit: pmstate_trace::TraceLimit::Observations { .. }, .. }), "{err}");
}

/// 8000 steps normalizing one shared input of 65,536 rows (256 KiB, one
/// tensor in memory however many steps name it) over a one-feature module:
/// the module is tiny, but each step's output has the input's size (2 GiB
/// kept in all), so the replay is refused before it runs, naming the
/// outputs, instead of keeping them.
#[test]
fn many_steps_normalizing_one_large_input_are_over_the_replay_budget() {
    use pmstate_trace::{Op, ReplayOptions, Step, TraceLimit};
    let spec = ModuleSpec {
        class: ModuleClass::RunningMeanStd,
        shape: Some(vec![1]),
        epsilon: 1e-5,
        clamp_value: None,
        ema_decay: None,
        gamma: None,
    };
    let mut trace = Recorder::new(spec, "one input, many steps").unwrap().finish();
    let x = Tensor::zeros((65_536, 1), candle_core::DType::F32, &Device::Cpu).unwrap();
    let step = Step { op: Op::Normalize { x, direction: Direction::Normalize, result: None }, error: None };
    trace.steps = vec![step; 8000];
    let err = pmstate_trace::replay(&trace, &ReplayOptions::default()).unwrap_err();
    let TraceError::Limit { limit: TraceLimit::Observations { kept_outputs, .. }, needed, max } = &err else {
        panic!("expected the observation budget, got {err}")
    };
    assert_eq!(*kept_outputs, 8000 * 65_536);
    assert!(needed > max, "{err}");
    assert!(err.to_string().contains("plus 524288000 elements of outputs the size of their inputs"), "{err}");
    // the same steps, few enough, fit and replay
    trace.steps.truncate(8);
    pmstate_trace::replay(&trace, &ReplayOptions::default()).unwrap();
}

/// `write_file` reads back what it wrote, leaves nothing else in the
/// folder, and a folder that does not exist is an I/O error naming the
/// file asked for (not the temporary file beside it).
#[test]
fn write_file_is_atomic_and_its_errors_name_the_target() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = valid();
    let trace = read_bytes(&bytes).unwrap();
    let out = dir.path().join("t.pmtrace");
    pmstate_trace::write_file(&trace, &out).unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), bytes);
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["t.pmtrace"]);
    let missing = dir.path().join("no_such_folder/t.pmtrace");
    let e = pmstate_trace::write_file(&trace, &missing).unwrap_err();
    assert!(matches!(&e, TraceError::Io { path, .. } if path == &missing.display().to_string()), "{e}");
}

/// A FIFO named as the output gets the trace's bytes as a stream and stays
/// a FIFO; a character device made here stays one (never the machine's
/// own /dev/null); nothing is left beside them.
#[cfg(unix)]
#[test]
fn write_file_streams_into_fifos_and_devices() {
    use std::io::Read;
    use std::os::unix::fs::FileTypeExt;
    let dir = tempfile::tempdir().unwrap();
    let bytes = valid();
    let trace = read_bytes(&bytes).unwrap();
    let fifo = dir.path().join("t.fifo");
    if std::process::Command::new("mkfifo").arg(&fifo).status().is_ok_and(|s| s.success()) {
        let p = fifo.clone();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            std::fs::File::open(&p).unwrap().read_to_end(&mut got).unwrap();
            got
        });
        let wrote = pmstate_trace::write_file(&trace, &fifo);
        // a reader still waiting in open (the write failed first) is released: a failure, not a hang
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&fifo);
        wrote.unwrap();
        assert_eq!(reader.join().unwrap(), bytes);
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    } else {
        eprintln!("SKIPPED the FIFO half: mkfifo is not available here");
    }
    let null = dir.path().join("null");
    if std::process::Command::new("mknod").arg(&null).args(["c", "1", "3"]).output().is_ok_and(|o| o.status.success()) {
        pmstate_trace::write_file(&trace, &null).unwrap();
        assert!(std::fs::metadata(&null).unwrap().file_type().is_char_device());
    } else {
        eprintln!("SKIPPED the device half: mknod is not permitted here (needs CAP_MKNOD)");
    }
    let names = std::fs::read_dir(dir.path()).unwrap().count();
    assert!(names <= 2, "a temporary file was left");
}
