//! Between the pickle value tree and the checkpoint tree: recognizes what
//! torch pickles (tensors, parameters, OrderedDicts, sets, bytes, devices,
//! dtypes) and keeps everything else inert.

use std::collections::HashMap;

use pmstate_pickle::Value;

use crate::dtype::DType;
use crate::error::{Found, ValueProblem};
use crate::tree::{Construct, Dict, DictKind, Node, Object, TensorClass, TensorRef};

/// How a storage was declared in the pickle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageDecl {
    /// Typed (`torch.FloatStorage`, numel in elements) or untyped (`UntypedStorage`, numel in bytes).
    pub typed: bool,
    /// Element dtype (for untyped storages: the dtype of the first tensor over it).
    pub dtype: DType,
    /// Size in bytes.
    pub nbytes: usize,
    /// The location string (`cpu`, `cuda:0`).
    pub location: String,
}

/// Storages declared by the persistent ids of one pickle, by key, in first-seen order.
#[derive(Debug, Default)]
pub struct Declared {
    /// Declarations by key.
    pub by_key: HashMap<String, StorageDecl>,
    /// Keys in first-seen order.
    pub order: Vec<String>,
}

/// Whether the legacy (pre-1.6) persistent id form is expected (a 6-tuple with a view field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PidForm {
    /// `('storage', cls, key, location, numel)`.
    Zip,
    /// `('storage', cls, key, location, numel, view_metadata)`.
    Legacy,
}

pub(crate) struct Interpreter<'d> {
    pub declared: &'d mut Declared,
    pub form: PidForm,
    /// The keys down to the value being converted. On error they are left
    /// as they were at the fault, so the caller can name the key.
    pub keys: Vec<String>,
}

type Res<T> = Result<T, ValueProblem>;

fn is_global(v: &Value, module: &str, name: &str) -> bool {
    v.as_global() == Some((module, name))
}

fn is_builtin(v: &Value, name: &str) -> bool {
    is_global(v, "builtins", name) || is_global(v, "__builtin__", name)
}

fn empty_ordered_dict(v: &Value) -> bool {
    matches!(v, Value::Reduce { callable, args, setitems, appends }
        if is_global(callable, "collections", "OrderedDict")
            && args.as_tuple().is_some_and(|a| a.is_empty())
            && setitems.is_empty() && appends.is_empty())
}

fn usize_of(v: &Value, what: &'static str) -> Res<usize> {
    match v.as_i64() {
        Some(i) if i >= 0 => usize::try_from(i).map_err(|_| ValueProblem::Overflow { what }),
        Some(i) => Err(ValueProblem::Negative { what, value: i }),
        None => Err(ValueProblem::NotAnInt { what, found: v.to_string() }),
    }
}

fn usize_tuple(v: &Value, what: &'static str) -> Res<Vec<usize>> {
    let items = match v {
        Value::Tuple(t) | Value::List(t) => t,
        // torch.Size pickles as a tuple; accept its REDUCE form too.
        Value::Reduce { callable, args, .. } if is_global(callable, "torch", "Size") => {
            return match args.as_tuple() {
                Some([inner]) => usize_tuple(inner, what),
                _ => Err(ValueProblem::Malformed { what, found: Found::TorchSizeOf(args.to_string()) }),
            };
        }
        _ => return Err(ValueProblem::Malformed { what, found: Found::NotATuple(v.to_string()) }),
    };
    items.iter().map(|x| usize_of(x, what)).collect()
}

impl Interpreter<'_> {
    /// The dotted key of the value being converted (or of the fault, after an error).
    pub fn key_path(&self) -> String {
        if self.keys.is_empty() {
            "<root>".to_owned()
        } else {
            self.keys.join(".")
        }
    }

    /// Converts one pickle value. `Err` carries the problem; the caller adds file and key.
    pub fn node(&mut self, v: Value) -> Res<Node> {
        Ok(match v {
            Value::None => Node::None,
            Value::Bool(b) => Node::Bool(b),
            Value::Int(i) => Node::Int(i),
            Value::BigInt(b) => Node::BigInt(b),
            Value::Float(f) => Node::Float(f),
            Value::Str(s) => Node::Str(s),
            Value::Bytes(b) => Node::Bytes(b),
            Value::List(xs) => Node::List(self.nodes(xs)?),
            Value::Tuple(xs) => Node::Tuple(self.nodes(xs)?),
            Value::Set(xs) => Node::Set(self.nodes(xs)?),
            Value::Dict(kv) => Node::Dict(self.dict(DictKind::Plain, kv)?),
            Value::Global { module, name } if module == "torch" && DType::from_torch_name(&name).is_some() => {
                Node::TorchDtype(name)
            }
            Value::Global { module, name } => Node::Global { module, name },
            Value::NewObj { cls, args, kwargs, setitems, appends } => {
                let kwargs = kwargs.map(|k| self.node(*k)).transpose()?;
                Node::Object(Box::new(Object {
                    construct: Construct::NewObj,
                    callable: self.node(*cls)?,
                    args: self.node(*args)?,
                    kwargs,
                    state: None,
                    setitems: self.pairs(setitems)?,
                    appends: self.nodes(appends)?,
                }))
            }
            Value::Build { object, state } => {
                let object = self.node(*object)?;
                match object {
                    Node::Dict(d) if d.state().is_none() => {
                        let state = self.node(*state)?;
                        Node::Dict(d.with_state(Some(state)))
                    }
                    Node::Object(mut o) if o.state.is_none() => {
                        o.state = Some(self.node(*state)?);
                        Node::Object(o)
                    }
                    other => {
                        // Keep the BUILD inert around whatever it was.
                        let object = self.value_of_opaque(other)?;
                        Node::Opaque(Box::new(Value::Build { object: Box::new(object), state }))
                    }
                }
            }
            Value::Reduce { callable, args, setitems, appends } => self.reduce(*callable, *args, setitems, appends)?,
            // Identity is kept for tensors; other shared objects become copies.
            Value::Shared { id, value } => match self.node(*value)? {
                Node::Tensor(mut t) => {
                    t.object = Some(id);
                    Node::Tensor(t)
                }
                other => other,
            },
            other => Node::Opaque(Box::new(other)),
        })
    }

    fn nodes(&mut self, xs: Vec<Value>) -> Res<Vec<Node>> {
        let mut out = Vec::with_capacity(xs.len());
        for (i, x) in xs.into_iter().enumerate() {
            self.keys.push(i.to_string());
            out.push(self.node(x)?);
            self.keys.pop();
        }
        Ok(out)
    }

    fn pairs(&mut self, kv: Vec<(Value, Value)>) -> Res<Vec<(Node, Node)>> {
        let mut out = Vec::with_capacity(kv.len());
        for (k, v) in kv {
            let label = match &k {
                Value::Str(s) => s.clone(),
                Value::Int(i) => i.to_string(),
                other => other.to_string(),
            };
            let k = self.node(k)?;
            self.keys.push(label);
            out.push((k, self.node(v)?));
            self.keys.pop();
        }
        Ok(out)
    }

    /// A dict of these pairs; equal keys are an error (a reader could keep either).
    fn dict(&mut self, kind: DictKind, kv: Vec<(Value, Value)>) -> Res<Dict> {
        let entries = self.pairs(kv)?;
        Dict::from_entries(kind, entries).map_err(|d| ValueProblem::DuplicateKey(d.0))
    }

    /// An opaque BUILD may wrap something we interpreted: turn it back.
    fn value_of_opaque(&mut self, n: Node) -> Res<Value> {
        to_value(&n, &mut |_| Err(ValueProblem::StorageReference))
    }

    fn reduce(
        &mut self,
        callable: Value,
        args: Value,
        setitems: Vec<(Value, Value)>,
        appends: Vec<Value>,
    ) -> Res<Node> {
        let rebuild = |v: &Value| v.as_global().filter(|(m, _)| *m == "torch._utils").map(|(_, n)| n.to_owned());
        let no_items = setitems.is_empty() && appends.is_empty();
        match (callable.as_global(), rebuild(&callable).as_deref()) {
            (Some(("collections", "OrderedDict")), _) if appends.is_empty() && args.as_tuple() == Some(&[]) => {
                Ok(Node::Dict(self.dict(DictKind::Ordered, setitems)?))
            }
            (_, Some(name @ ("_rebuild_tensor_v2" | "_rebuild_tensor_v3"))) if no_items => {
                self.tensor(name == "_rebuild_tensor_v3", &args)
            }
            (_, Some("_rebuild_parameter")) if no_items => match args {
                Value::Tuple(mut a) if a.len() == 3 && empty_ordered_dict(&a[2]) => {
                    let requires_grad = matches!(a[1], Value::Bool(true));
                    let inner = a.swap_remove(0);
                    match self.node(inner)? {
                        Node::Tensor(mut t) if t.class == TensorClass::Tensor => {
                            t.class = TensorClass::Parameter { requires_grad };
                            Ok(Node::Tensor(t))
                        }
                        other => Err(ValueProblem::Malformed {
                            what: "_rebuild_parameter",
                            found: Found::ParameterOf(other.kind()),
                        }),
                    }
                }
                other => self.plain_reduce(callable, other),
            },
            _ if is_builtin(&callable, "set") && no_items => match args.as_tuple() {
                Some([Value::List(_)]) | Some([]) => {
                    let items = match args {
                        Value::Tuple(mut a) if !a.is_empty() => match a.swap_remove(0) {
                            Value::List(xs) => xs,
                            _ => unreachable!("matched above"),
                        },
                        _ => Vec::new(),
                    };
                    Ok(Node::Set(self.nodes(items)?))
                }
                _ => self.plain_reduce(callable, args),
            },
            // Protocol 2 pickles `b""` as `bytes()` (torch's safe loader refuses that form; we write `_codecs.encode`).
            _ if is_builtin(&callable, "bytes") && no_items && args.as_tuple() == Some(&[]) => {
                Ok(Node::Bytes(Vec::new()))
            }
            _ if is_builtin(&callable, "complex") && no_items => match args.as_tuple() {
                Some(&[Value::Float(re), Value::Float(im)]) => Ok(Node::Complex(re, im)),
                _ => self.plain_reduce(callable, args),
            },
            (Some(("_codecs", "encode")), _) if no_items => match args.as_tuple() {
                Some([Value::Str(s), Value::Str(enc)]) if enc == "latin1" => {
                    match s.chars().map(|c| u8::try_from(u32::from(c))).collect::<Result<Vec<u8>, _>>() {
                        Ok(bytes) => Ok(Node::Bytes(bytes)),
                        Err(_) => Err(ValueProblem::NotLatin1),
                    }
                }
                _ => self.plain_reduce(callable, args),
            },
            (Some(("torch", "device")), _) if no_items => match args.as_tuple() {
                Some([Value::Str(kind)]) => Ok(Node::Device { kind: kind.clone(), index: None }),
                Some([Value::Str(kind), Value::Int(i)]) => Ok(Node::Device { kind: kind.clone(), index: Some(*i) }),
                _ => self.plain_reduce(callable, args),
            },
            _ => Ok(Node::Object(Box::new(Object {
                construct: Construct::Reduce,
                callable: self.node(callable)?,
                args: self.node(args)?,
                kwargs: None,
                state: None,
                setitems: self.pairs(setitems)?,
                appends: self.nodes(appends)?,
            }))),
        }
    }

    /// A call this reader does not interpret further: an object of its parts.
    fn plain_reduce(&mut self, callable: Value, args: Value) -> Res<Node> {
        Ok(Node::Object(Box::new(Object {
            construct: Construct::Reduce,
            callable: self.node(callable)?,
            args: self.node(args)?,
            kwargs: None,
            state: None,
            setitems: Vec::new(),
            appends: Vec::new(),
        })))
    }

    fn tensor(&mut self, v3: bool, args: &Value) -> Res<Node> {
        let a = args.as_tuple().ok_or_else(|| ValueProblem::Malformed {
            what: "tensor rebuild args",
            found: Found::Value(args.to_string()),
        })?;
        let want = if v3 { 7 } else { 6 };
        if a.len() != want {
            // A 7th (v2) / 8th (v3) element is tensor metadata (e.g. conj bits); not carried.
            return Err(ValueProblem::Malformed {
                what: "tensor rebuild args",
                found: Found::Arguments { len: a.len(), expected: want },
            });
        }
        if !empty_ordered_dict(&a[5]) {
            return Err(ValueProblem::Unsupported("a tensor with backward hooks"));
        }
        let Value::PersistentId(pid) = &a[0] else {
            return Err(ValueProblem::Malformed {
                what: "tensor storage",
                found: Found::NotAPersistentId(a[0].to_string()),
            });
        };
        let (key, decl) = self.storage_decl(pid)?;
        let dtype = if v3 {
            match a[6].as_global() {
                Some(("torch", name)) => DType::from_torch_name(name)
                    .ok_or(ValueProblem::Unsupported("a dtype this reader does not carry"))?,
                _ => return Err(ValueProblem::Malformed { what: "v3 dtype", found: Found::Value(a[6].to_string()) }),
            }
        } else {
            decl.dtype
        };
        let shape = usize_tuple(&a[2], "size")?;
        let stride = usize_tuple(&a[3], "stride")?;
        if shape.len() != stride.len() {
            return Err(ValueProblem::RankMismatch { shape, stride });
        }
        let t = TensorRef {
            storage: key.clone(),
            dtype,
            offset: usize_of(&a[1], "storage offset")?,
            shape,
            stride,
            requires_grad: matches!(a[4], Value::Bool(true)),
            class: TensorClass::Tensor,
            object: None,
        };
        // Record (or check) the storage now that the dtype is known.
        let entry = self.declared.by_key.get(&key).cloned();
        let decl = match entry {
            Some(prev) => {
                if prev.typed != decl.typed || prev.location != decl.location || prev.nbytes != decl.nbytes {
                    return Err(ValueProblem::StorageRedeclared(key));
                }
                prev
            }
            None => {
                let decl = StorageDecl { dtype, ..decl };
                self.declared.by_key.insert(key.clone(), decl.clone());
                self.declared.order.push(key.clone());
                decl
            }
        };
        if decl.typed && decl.dtype != dtype {
            return Err(ValueProblem::DtypeMismatch { storage: key, tensor: dtype, declared: decl.dtype });
        }
        t.checked_nbytes().ok_or(ValueProblem::Overflow { what: "element count" })?;
        let extent = t.extent().ok_or(ValueProblem::Overflow { what: "view extent" })?;
        let need = extent.checked_mul(dtype.size()).ok_or(ValueProblem::Overflow { what: "view extent" })?;
        if !t.shape.contains(&0) && need > decl.nbytes {
            return Err(ValueProblem::ViewPastStorage(Box::new(crate::error::View {
                offset: t.offset,
                shape: t.shape,
                stride: t.stride,
                extent,
                storage_bytes: decl.nbytes,
            })));
        }
        Ok(Node::Tensor(Box::new(t)))
    }

    fn storage_decl(&self, pid: &Value) -> Res<(String, StorageDecl)> {
        let p = pid.as_tuple().ok_or_else(|| ValueProblem::Malformed {
            what: "persistent id",
            found: Found::NotATuple(pid.to_string()),
        })?;
        let n = match self.form {
            PidForm::Zip => 5,
            PidForm::Legacy => 6,
        };
        if p.len() != n || p[0].as_str() != Some("storage") {
            return Err(ValueProblem::Malformed {
                what: "persistent id",
                found: Found::NotAStorageTuple { pid: pid.to_string(), len: n },
            });
        }
        if self.form == PidForm::Legacy && p[5] != Value::None {
            return Err(ValueProblem::Unsupported("legacy storage views"));
        }
        let key = match &p[2] {
            Value::Str(s) => s.clone(),
            Value::Int(i) => i.to_string(),
            other => {
                return Err(ValueProblem::Malformed { what: "storage key", found: Found::Value(other.to_string()) })
            }
        };
        let location = p[3]
            .as_str()
            .ok_or_else(|| ValueProblem::Malformed { what: "storage location", found: Found::Value(p[3].to_string()) })?
            .to_owned();
        let numel = usize_of(&p[4], "storage numel")?;
        let (typed, dtype) = match p[1].as_global() {
            Some(("torch" | "torch.storage", "UntypedStorage")) => (false, DType::U8),
            Some(("torch", cls)) => (
                true,
                DType::from_storage_class(cls).ok_or_else(|| ValueProblem::StorageClass(format!("torch.{cls}")))?,
            ),
            _ => return Err(ValueProblem::StorageClass(p[1].to_string())),
        };
        let nbytes = numel
            .checked_mul(if typed { dtype.size() } else { 1 })
            .ok_or(ValueProblem::Overflow { what: "storage size" })?;
        Ok((key, StorageDecl { typed, dtype, nbytes, location }))
    }
}

/// What the writer does with each tensor: the storage key it is written
/// under, with its declaration.
pub(crate) type StorageResolver<'a> = dyn FnMut(&TensorRef) -> Result<(String, StorageDecl), ValueProblem> + 'a;

fn values(xs: &[Node], resolve: &mut StorageResolver<'_>) -> Res<Vec<Value>> {
    xs.iter().map(|x| to_value(x, resolve)).collect()
}

fn value_pairs(kv: &[(Node, Node)], resolve: &mut StorageResolver<'_>) -> Res<Vec<(Value, Value)>> {
    kv.iter().map(|(k, v)| Ok((to_value(k, resolve)?, to_value(v, resolve)?))).collect()
}

/// Converts a checkpoint tree back to the pickle value torch.save would
/// write; `resolve` names each tensor's storage.
pub(crate) fn to_value(n: &Node, resolve: &mut StorageResolver<'_>) -> Res<Value> {
    let g = Value::global;
    Ok(match n {
        Node::None => Value::None,
        Node::Bool(b) => Value::Bool(*b),
        Node::Int(i) => Value::Int(*i),
        Node::BigInt(b) => Value::BigInt(b.clone()),
        Node::Float(f) => Value::Float(*f),
        Node::Complex(re, im) => {
            Value::reduce(g("__builtin__", "complex"), Value::Tuple(vec![Value::Float(*re), Value::Float(*im)]))
        }
        Node::Str(s) => Value::Str(s.clone()),
        Node::Bytes(b) => Value::Bytes(b.clone()),
        Node::List(xs) => Value::List(values(xs, resolve)?),
        Node::Tuple(xs) => Value::Tuple(values(xs, resolve)?),
        Node::Set(xs) => Value::reduce(g("__builtin__", "set"), Value::Tuple(vec![Value::List(values(xs, resolve)?)])),
        Node::Dict(d) => {
            let pairs = value_pairs(d.entries(), resolve)?;
            let object = if d.is_ordered() {
                Value::Reduce {
                    callable: Box::new(g("collections", "OrderedDict")),
                    args: Box::new(Value::Tuple(vec![])),
                    setitems: pairs,
                    appends: vec![],
                }
            } else {
                Value::Dict(pairs)
            };
            match d.state() {
                Some(state) => Value::Build { object: Box::new(object), state: Box::new(to_value(state, resolve)?) },
                None => object,
            }
        }
        Node::Tensor(t) => tensor_value(t, resolve)?,
        Node::Device { kind, index } => {
            let mut args = vec![Value::Str(kind.clone())];
            if let Some(i) = index {
                args.push(Value::Int(*i));
            }
            Value::reduce(g("torch", "device"), Value::Tuple(args))
        }
        // Only names of real dtypes become globals: anything else would be a
        // global made up from data (`torch.load`).
        Node::TorchDtype(name) if DType::from_torch_name(name).is_some() => g("torch", name),
        Node::TorchDtype(name) => return Err(ValueProblem::NotADtype(name.clone())),
        Node::Global { module, name } => g(module, name),
        Node::Object(o) => object_value(o, resolve)?,
        Node::Opaque(v) => (**v).clone(),
    })
}

fn object_value(o: &Object, resolve: &mut StorageResolver<'_>) -> Res<Value> {
    let setitems = value_pairs(&o.setitems, resolve)?;
    let appends = values(&o.appends, resolve)?;
    let callable = Box::new(to_value(&o.callable, resolve)?);
    let args = Box::new(to_value(&o.args, resolve)?);
    let object = match o.construct {
        Construct::Reduce => Value::Reduce { callable, args, setitems, appends },
        Construct::NewObj => {
            let kwargs = o.kwargs.as_ref().map(|k| to_value(k, resolve).map(Box::new)).transpose()?;
            Value::NewObj { cls: callable, args, kwargs, setitems, appends }
        }
    };
    Ok(match &o.state {
        Some(state) => Value::Build { object: Box::new(object), state: Box::new(to_value(state, resolve)?) },
        None => object,
    })
}

fn empty_od() -> Value {
    Value::reduce(Value::global("collections", "OrderedDict"), Value::Tuple(vec![]))
}

/// An i64 for the pickle: torch's sizes, strides and offsets are int64.
pub(crate) fn int(x: usize) -> Res<Value> {
    i64::try_from(x).map(Value::Int).map_err(|_| ValueProblem::IntTooLarge(x.to_string()))
}

fn ints(xs: &[usize]) -> Res<Value> {
    Ok(Value::Tuple(xs.iter().map(|&x| int(x)).collect::<Res<_>>()?))
}

fn tensor_value(t: &TensorRef, resolve: &mut StorageResolver<'_>) -> Res<Value> {
    let (key, decl) = resolve(t)?;
    let v3 = t.dtype.storage_class().is_none();
    let (cls, numel) = match t.dtype.storage_class() {
        Some(cls) => (Value::global("torch", cls), decl.nbytes / t.dtype.size()),
        None => (Value::global("torch.storage", "UntypedStorage"), decl.nbytes),
    };
    let pid = Value::PersistentId(Box::new(Value::Tuple(vec![
        Value::Str("storage".into()),
        cls,
        Value::Str(key),
        Value::Str(decl.location),
        int(numel)?,
    ])));
    let mut args =
        vec![pid, int(t.offset)?, ints(&t.shape)?, ints(&t.stride)?, Value::Bool(t.requires_grad), empty_od()];
    if v3 {
        args.push(Value::global("torch", t.dtype.torch_name()));
    }
    let rebuild = if v3 { "_rebuild_tensor_v3" } else { "_rebuild_tensor_v2" };
    let tensor = Value::reduce(Value::global("torch._utils", rebuild), Value::Tuple(args));
    let tensor = match t.class {
        TensorClass::Parameter { requires_grad } => Value::reduce(
            Value::global("torch._utils", "_rebuild_parameter"),
            Value::Tuple(vec![tensor, Value::Bool(requires_grad), empty_od()]),
        ),
        TensorClass::Tensor => tensor,
    };
    Ok(match t.object {
        Some(id) => Value::Shared { id, value: Box::new(tensor) },
        None => tensor,
    })
}
