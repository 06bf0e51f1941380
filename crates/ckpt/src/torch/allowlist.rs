//! Which globals `torch.load(weights_only=True)` accepts: anything else in
//! a tree is flagged by `inspect` and refused by the `.pt` writer unless
//! the caller allows it.

use pmstate_pickle::Value;

use crate::dtype::DType;
use crate::tree::{dotted, Node};

/// Whether torch 2.15's weights_only unpickler allows `module.name` by
/// default (`torch/_weights_only_unpickler.py`, `_get_allowed_globals`).
pub fn is_safe_global(module: &str, name: &str) -> bool {
    match module {
        "collections" => matches!(name, "OrderedDict" | "Counter"),
        "_codecs" => name == "encode",
        "builtins" | "__builtin__" => matches!(name, "bytearray" | "set" | "complex"),
        "torch" => {
            DType::from_torch_name(name).is_some()
                || DType::from_storage_class(name).is_some()
                || name.ends_with("Storage")
                || name.ends_with("Tensor")
                || matches!(
                    name,
                    "Size"
                        | "device"
                        | "per_tensor_affine"
                        | "per_channel_affine"
                        | "per_tensor_symmetric"
                        | "per_channel_symmetric"
                        | "per_channel_affine_float_qparams"
                        | "strided"
                        | "sparse_coo"
                        | "sparse_csr"
                        | "sparse_csc"
                        | "sparse_bsr"
                        | "sparse_bsc"
                        | "_mkldnn"
                )
                || is_other_torch_dtype(name)
        }
        "torch.nn.parameter" => name == "Parameter",
        "torch.storage" => matches!(name, "TypedStorage" | "UntypedStorage"),
        "torch.serialization" => name == "_get_layout",
        "torch._tensor" => name == "_rebuild_from_type_v2",
        "torch._utils" => matches!(
            name,
            "_rebuild_tensor"
                | "_rebuild_tensor_v2"
                | "_rebuild_tensor_v3"
                | "_rebuild_parameter"
                | "_rebuild_parameter_with_state"
                | "_rebuild_qtensor"
                | "_rebuild_sparse_tensor"
                | "_rebuild_meta_tensor_no_storage"
                | "_rebuild_wrapper_subclass"
                | "_rebuild_device_tensor_from_numpy"
                | "_rebuild_device_tensor_from_cpu_tensor"
        ),
        _ => false,
    }
}

/// torch dtypes this crate does not carry but torch's loader accepts by name.
fn is_other_torch_dtype(name: &str) -> bool {
    name.starts_with("float8_")
        || name.starts_with("float4_")
        || name.starts_with("bits")
        || matches!(name, "complex32" | "chalf" | "qint8" | "quint8" | "qint32" | "quint4x2" | "quint2x4")
        || (name.starts_with("int") || name.starts_with("uint"))
            && name[name.find(char::is_numeric).unwrap_or(0)..].chars().all(|c| c.is_ascii_digit())
}

/// Whether a global may appear in ProtoMotions' resolved configs
/// (`resolved_configs*.pt`): what torch's safe loader accepts, anything of
/// ProtoMotions' own package (its config dataclasses, enums and the
/// functions its configs name), and Python's inert builtins (types and
/// containers that build plain values). Anything else there
/// (`posix.system`, `builtins.eval`, `subprocess.Popen`) has no business in
/// a config and marks a hostile file.
pub fn is_config_global(module: &str, name: &str) -> bool {
    is_safe_global(module, name)
        || module == "protomotions"
        || module.starts_with("protomotions.")
        || match module {
            "builtins" | "__builtin__" => matches!(
                name,
                "int"
                    | "float"
                    | "complex"
                    | "bool"
                    | "str"
                    | "bytes"
                    | "bytearray"
                    | "list"
                    | "tuple"
                    | "dict"
                    | "set"
                    | "frozenset"
                    | "slice"
                    | "range"
                    | "object"
            ),
            "collections" => matches!(name, "OrderedDict" | "Counter" | "defaultdict" | "deque"),
            // how pickle rebuilds a plain object of a class: `object.__new__(cls)`
            "copyreg" => name == "_reconstructor",
            _ => false,
        }
}

/// Which globals a walk flags: those the predicate does not accept.
pub(crate) type GlobalRule = fn(&str, &str) -> bool;

fn globals_in(v: &Value, ok: GlobalRule, out: &mut Vec<String>) {
    let globals_in = |v: &Value, out: &mut Vec<String>| globals_in(v, ok, out);
    match v {
        Value::Global { module, name } if !ok(module, name) => out.push(format!("{module}.{name}")),
        Value::List(xs) | Value::Tuple(xs) | Value::Set(xs) | Value::FrozenSet(xs) => {
            xs.iter().for_each(|x| globals_in(x, out))
        }
        Value::Dict(kv) => kv.iter().for_each(|(k, v)| {
            globals_in(k, out);
            globals_in(v, out)
        }),
        Value::Reduce { callable, args, setitems, appends } => {
            globals_in(callable, out);
            globals_in(args, out);
            setitems.iter().for_each(|(k, v)| {
                globals_in(k, out);
                globals_in(v, out)
            });
            appends.iter().for_each(|x| globals_in(x, out));
        }
        Value::NewObj { cls, args, kwargs, setitems, appends } => {
            globals_in(cls, out);
            globals_in(args, out);
            if let Some(k) = kwargs {
                globals_in(k, out);
            }
            setitems.iter().for_each(|(k, v)| {
                globals_in(k, out);
                globals_in(v, out)
            });
            appends.iter().for_each(|x| globals_in(x, out));
        }
        Value::Build { object, state } => {
            globals_in(object, out);
            globals_in(state, out);
        }
        Value::PersistentId(p) | Value::Shared { value: p, .. } => globals_in(p, out),
        _ => {}
    }
}

/// Every unsafe global in the tree as `(dotted key, module.name)`, in tree
/// order: in values, dict keys, BUILD states (`_metadata`), and everywhere
/// inside opaque values (call arguments, keyword arguments, stored items,
/// set members). A dtype node whose name is not a torch dtype would be
/// written as the global `torch.<name>`, so it is listed too. This is the
/// one walk behind `inspect`, both writers and the safetensors reader.
pub(crate) fn unsafe_globals(root: &Node) -> Vec<(String, String)> {
    globals_outside(root, is_safe_global)
}

/// Every global `ok` does not accept, as [`unsafe_globals`] lists them.
pub(crate) fn globals_outside(root: &Node, ok: GlobalRule) -> Vec<(String, String)> {
    let mut found = Vec::new();
    root.walk_all(&mut |path, node| {
        let mut here = Vec::new();
        match node {
            Node::Opaque(v) => globals_in(v, ok, &mut here),
            Node::Global { module, name } if !ok(module, name) => here.push(format!("{module}.{name}")),
            Node::TorchDtype(name) if !ok("torch", name) => here.push(format!("torch.{name}")),
            _ => {}
        }
        if !here.is_empty() {
            let key = if path.is_empty() { "<root>".to_owned() } else { dotted(path) };
            found.extend(here.into_iter().map(|g| (key.clone(), g)));
        }
        true
    });
    found
}
