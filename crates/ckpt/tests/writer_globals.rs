//! The `.pt` writer emits only globals on torch's weights_only allowlist,
//! or globals the tree carried itself when the caller allowed them: never a
//! global made up from data.

use std::collections::HashMap;

use pmstate_ckpt::{
    Checkpoint, CkptError, Construct, Dict, DictKind, Node, Object, UnsafeGlobals, ValueProblem, WriteOptions,
};

fn one(key: &str, value: Node) -> Result<Checkpoint, CkptError> {
    let root = Node::Dict(Dict::from_entries(DictKind::Plain, vec![(Node::Str(key.into()), value)]).unwrap());
    Checkpoint::from_parts(root, HashMap::new())
}

#[test]
fn a_dtype_node_naming_a_function_is_never_written() {
    let ckpt = one("d", Node::TorchDtype("load".into())).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for unsafe_globals in [UnsafeGlobals::Refuse, UnsafeGlobals::Allow] {
        let opts = WriteOptions { unsafe_globals, ..Default::default() };
        let err = pmstate_ckpt::save_torch(&ckpt, dir.path().join("x.pt"), &opts).unwrap_err();
        assert!(err.to_string().contains("torch.load"), "{err}");
        if unsafe_globals == UnsafeGlobals::Allow {
            assert!(
                matches!(&err, CkptError::Unwritable { problem: ValueProblem::NotADtype(n), .. } if n == "load"),
                "{err}"
            );
        }
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn a_real_dtype_node_is_written_and_read_back() {
    let ckpt = one("d", Node::TorchDtype("float32".into())).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.pt");
    ckpt.save(&path).unwrap();
    assert_eq!(Checkpoint::open(&path).unwrap().root(), ckpt.root());
}

#[test]
fn unsafe_globals_in_keys_are_refused_unless_allowed() {
    let call = Node::Object(Box::new(Object {
        construct: Construct::Reduce,
        callable: Node::Global { module: "os".into(), name: "system".into() },
        args: Node::Tuple(vec![Node::Str("true".into())]),
        kwargs: None,
        state: None,
        setitems: vec![],
        appends: vec![],
    }));
    let inner = Node::Dict(Dict::from_entries(DictKind::Plain, vec![(call, Node::None)]).unwrap());
    let ckpt = one("model", inner).unwrap();
    let flagged = vec![("model.<key of entry 0>.<callable>".to_owned(), "os.system".to_owned())];
    assert_eq!(ckpt.unsafe_globals(), flagged);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.pt");
    let err = ckpt.save(&path).unwrap_err();
    assert!(matches!(err, CkptError::UnsafeGlobals { count: 1, .. }), "{err}");
    let opts = WriteOptions { unsafe_globals: UnsafeGlobals::Allow, ..Default::default() };
    ckpt.save_with(&path, &opts).unwrap();
    let back = Checkpoint::open(&path).unwrap();
    assert_eq!(back.unsafe_globals(), ckpt.unsafe_globals());
}

/// ProtoMotions' resolved configs hold its own dataclasses, enums and
/// functions (which torch's safe loader rejects) and nothing foreign; a
/// global outside its, torch's and Python's inert builtins is listed with
/// its key, wherever it hides (a value, inside a call).
#[test]
fn foreign_config_globals_are_listed_and_protomotions_own_are_not() {
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy");
    for v in ["smpl_tracker", "g1_amp_deploy", "container_obsprocessor"] {
        let cfg = Checkpoint::open(data.join(v).join("resolved_configs.pt")).unwrap();
        assert!(!cfg.unsafe_globals().is_empty(), "{v}: its dataclasses are not weights_only-safe");
        assert_eq!(cfg.foreign_config_globals(), vec![], "{v}");
    }
    for (module, name, foreign) in [
        ("posix", "system", true),
        ("builtins", "eval", true),
        ("subprocess", "Popen", true),
        ("protomotionsx", "Cfg", true),
        ("builtins", "getattr", true),
        ("protomotions.agents.ppo.config", "PPOAgentConfig", false),
        ("builtins", "int", false),
        ("collections", "OrderedDict", false),
    ] {
        let call = Node::Object(Box::new(Object {
            construct: Construct::Reduce,
            callable: Node::Global { module: module.into(), name: name.into() },
            args: Node::Tuple(vec![Node::Str("x".into())]),
            kwargs: None,
            state: None,
            setitems: vec![],
            appends: vec![],
        }));
        let ckpt = one("evaluator", call).unwrap();
        let want = if foreign { vec![("evaluator.<callable>".to_owned(), format!("{module}.{name}"))] } else { vec![] };
        assert_eq!(ckpt.foreign_config_globals(), want, "{module}.{name}");
        assert_eq!(pmstate_ckpt::is_config_global(module, name), !foreign);
    }
}

/// Opening never blocks on a FIFO (no writer ever comes) and names what
/// the path is, checked on the open descriptor.
#[cfg(unix)]
#[test]
fn a_fifo_or_a_link_to_a_device_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("last.ckpt");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let zero = dir.path().join("zero.ckpt");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    for (path, kind) in [(&fifo, "a FIFO"), (&zero, "a device")] {
        let e = Checkpoint::open(path).err().unwrap();
        assert!(matches!(&e, CkptError::NotAFile { kind: k, .. } if *k == kind), "{e}");
        let e = pmstate_ckpt::open_regular(path).err().unwrap();
        assert!(matches!(&e, CkptError::NotAFile { kind: k, .. } if *k == kind), "{e}");
    }
}
