//! Comparing two checkpoints: keys, kinds, scalars, and tensors element by
//! element, streamed a chunk at a time so two 2 GiB checkpoints cost a few
//! MiB, with integers compared exactly (two int64 differing by 1 above 2^53
//! differ). Views (transposes, slices) are streamed too, walked in their
//! memory order; dict entries are matched through hash maps, whatever their
//! keys, so diffing a dict of 200,000 int keys is linear.

use std::collections::HashMap;

use serde::Serialize;

use crate::checkpoint::Checkpoint;
use crate::dtype::DType;
use crate::error::Result;
use crate::io::storage::Bytes;
use crate::tree::{Dict, Node, Object, Shape, TensorRef};

/// When two numbers count as equal: `|a - b| <= atol + rtol * |b|`
/// (numpy's `allclose`); NaN equals NaN, equal infinities are equal.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Tolerance {
    /// Relative tolerance (>= 0).
    pub rtol: f64,
    /// Absolute tolerance (>= 0).
    pub atol: f64,
}

impl Tolerance {
    fn close_f64(&self, a: f64, b: f64) -> bool {
        if a == b || (a.is_nan() && b.is_nan()) {
            return true;
        }
        // An infinity or a NaN is close only to itself (numpy's allclose).
        a.is_finite() && b.is_finite() && (a - b).abs() <= self.atol + self.rtol * b.abs()
    }

    /// Integers: equal, or within the tolerance measured on the exact difference.
    fn close_int(&self, a: i128, b: i128) -> bool {
        a == b || (a.abs_diff(b) as f64) <= self.atol + self.rtol * (b.unsigned_abs() as f64)
    }
}

/// One difference between two checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Difference {
    /// The dotted key (`model._actor.mu.mlp.0.weight`; empty for the root).
    pub key: String,
    /// What differs.
    #[serde(flatten)]
    pub kind: DifferenceKind,
}

/// What differs at a key.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "what", rename_all = "snake_case")]
#[non_exhaustive]
pub enum DifferenceKind {
    /// The key exists only in the first checkpoint.
    OnlyInA,
    /// The key exists only in the second checkpoint.
    OnlyInB,
    /// Different kinds of value (`dict` vs `OrderedDict`, `int` vs `float`).
    Kind {
        /// The first's kind.
        a: String,
        /// The second's kind.
        b: String,
    },
    /// Same kind, different value (shown in short form).
    Value {
        /// The first's value.
        a: String,
        /// The second's value.
        b: String,
    },
    /// Tensors of another dtype or shape.
    TensorType {
        /// The first's dtype and shape.
        a: String,
        /// The second's dtype and shape.
        b: String,
    },
    /// Tensors whose elements differ beyond the tolerance.
    Elements {
        /// Elements outside the tolerance.
        mismatched: u64,
        /// Elements compared.
        of: u64,
        /// The largest absolute difference (infinite when one side is infinite or NaN alone).
        max_abs: f64,
        /// The first mismatching element (flat, C order).
        first_index: Option<u64>,
    },
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let key = if self.key.is_empty() { "(root)" } else { self.key.as_str() };
        match &self.kind {
            DifferenceKind::OnlyInA => write!(f, "{key}: only in A"),
            DifferenceKind::OnlyInB => write!(f, "{key}: only in B"),
            DifferenceKind::Kind { a, b } => write!(f, "{key}: {a} in A, {b} in B"),
            DifferenceKind::Value { a, b } => write!(f, "{key}: {a} in A, {b} in B"),
            DifferenceKind::TensorType { a, b } => write!(f, "{key}: tensor {a} in A, {b} in B"),
            DifferenceKind::Elements { mismatched, of, max_abs, first_index } => {
                // `{:?}`: the shortest text that reads back as the same f64,
                // in exponent form when small (Display would print 1e-20 as 22 digits)
                write!(f, "{key}: {mismatched} of {of} elements differ (max |a - b| {max_abs:?}")?;
                if let Some(i) = first_index {
                    write!(f, ", first at flat index {i}")?;
                }
                f.write_str(")")
            }
        }
    }
}

/// Compares `a` with `b`. Dict entries are matched by key (in `a`'s
/// order, then keys only in `b`), lists and tuples by index.
pub fn diff(a: &Checkpoint, b: &Checkpoint, tol: Tolerance) -> Result<Vec<Difference>> {
    diff_with_progress(a, b, tol, &|_| {})
}

/// [`diff`], calling `progress` with the bytes of `a`'s tensor elements
/// compared so far (as they are read, every 4 MiB or so): what a progress
/// bar over [`tensor_bytes`]`(a)` shows.
pub fn diff_with_progress(
    a: &Checkpoint,
    b: &Checkpoint,
    tol: Tolerance,
    progress: &dyn Fn(u64),
) -> Result<Vec<Difference>> {
    let mut out = Vec::new();
    let mut d = Differ { a, b, tol, out: &mut out, progress, done: 0 };
    d.nodes(a.root(), b.root(), "")?;
    Ok(out)
}

/// The bytes of every tensor's elements in `c` (views count their own
/// elements): the total [`diff_with_progress`] counts up to for `a`, when
/// every tensor has its counterpart of the same dtype and shape.
pub fn tensor_bytes(c: &Checkpoint) -> u64 {
    c.tensors().iter().map(|(_, t)| t.nbytes() as u64).fold(0, u64::saturating_add)
}

struct Differ<'a, 'o> {
    a: &'a Checkpoint,
    b: &'a Checkpoint,
    tol: Tolerance,
    out: &'o mut Vec<Difference>,
    progress: &'o dyn Fn(u64),
    /// Bytes of `a`'s tensor elements compared so far.
    done: u64,
}

fn join(key: &str, k: &str) -> String {
    if key.is_empty() {
        k.to_owned()
    } else {
        format!("{key}.{k}")
    }
}

fn label(k: &Node) -> String {
    match k {
        Node::Str(s) => s.clone(),
        other => other.to_string(),
    }
}

fn short(n: &Node) -> String {
    let s = n.to_string();
    if s.chars().count() > 200 {
        s.chars().take(197).chain("...".chars()).collect()
    } else {
        s
    }
}

impl Differ<'_, '_> {
    fn advance(&mut self, bytes: u64) {
        self.done = self.done.saturating_add(bytes);
        (self.progress)(self.done);
    }

    fn push(&mut self, key: &str, kind: DifferenceKind) {
        self.out.push(Difference { key: key.to_owned(), kind });
    }

    fn nodes(&mut self, na: &Node, nb: &Node, key: &str) -> Result<()> {
        match (na, nb) {
            (Node::Dict(da), Node::Dict(db)) => {
                let b_others = other_keys_if(db, has_other_keys(da));
                for (k, va) in da.entries() {
                    let found = match k {
                        Node::Str(s) => db.get(s),
                        other => b_others.get(&KeyId::of(other)).map(|&i| &db.entries()[i].1),
                    };
                    match found {
                        Some(vb) => self.nodes(va, vb, &join(key, &label(k)))?,
                        None => self.push(&join(key, &label(k)), DifferenceKind::OnlyInA),
                    }
                }
                let a_others = other_keys_if(da, has_other_keys(db));
                for (k, _) in db.entries() {
                    let present = match k {
                        Node::Str(s) => da.get(s).is_some(),
                        other => a_others.contains_key(&KeyId::of(other)),
                    };
                    if !present {
                        self.push(&join(key, &label(k)), DifferenceKind::OnlyInB);
                    }
                }
                if da.is_ordered() != db.is_ordered() {
                    self.push(key, DifferenceKind::Kind { a: na.kind().into(), b: nb.kind().into() });
                }
                if da.state() != db.state() {
                    self.push(
                        &join(key, "<state>"),
                        DifferenceKind::Value { a: "BUILD state".into(), b: "another".into() },
                    );
                }
            }
            (Node::List(xa), Node::List(xb)) | (Node::Tuple(xa), Node::Tuple(xb)) if xa.len() == xb.len() => {
                for (i, (x, y)) in xa.iter().zip(xb).enumerate() {
                    self.nodes(x, y, &join(key, &i.to_string()))?;
                }
            }
            (Node::Object(oa), Node::Object(ob))
                if oa.construct == ob.construct
                    && oa.callable == ob.callable
                    && oa.kwargs.is_some() == ob.kwargs.is_some()
                    && oa.state.is_some() == ob.state.is_some()
                    && oa.setitems.len() == ob.setitems.len()
                    && oa.appends.len() == ob.appends.len() =>
            {
                self.objects(oa, ob, key)?;
            }
            (Node::Tensor(ta), Node::Tensor(tb)) => {
                if let Some(kind) = self.tensors(ta, tb, key)? {
                    self.push(key, kind);
                }
            }
            (Node::Float(x), Node::Float(y)) => {
                if !self.tol.close_f64(*x, *y) {
                    self.push(key, DifferenceKind::Value { a: x.to_string(), b: y.to_string() });
                }
            }
            (Node::Int(x), Node::Int(y)) => {
                if !self.tol.close_int(i128::from(*x), i128::from(*y)) {
                    self.push(key, DifferenceKind::Value { a: x.to_string(), b: y.to_string() });
                }
            }
            _ if na == nb => {}
            _ if na.kind() == nb.kind() => self.push(key, DifferenceKind::Value { a: short(na), b: short(nb) }),
            _ => self.push(key, DifferenceKind::Kind { a: na.kind().into(), b: nb.kind().into() }),
        }
        Ok(())
    }

    /// Two objects of one class built the same way, part by part (keys as
    /// the tree walk names them: dataclass fields under the object's key),
    /// so that their tensors are compared by value, not by storage name.
    fn objects(&mut self, oa: &Object, ob: &Object, key: &str) -> Result<()> {
        self.nodes(&oa.args, &ob.args, &join(key, "<args>"))?;
        if let (Some(ka), Some(kb)) = (&oa.kwargs, &ob.kwargs) {
            self.nodes(ka, kb, &join(key, "<kwargs>"))?;
        }
        if let (Some(sa), Some(sb)) = (&oa.state, &ob.state) {
            let fields = matches!((sa, sb), (Node::Dict(_), Node::Dict(_)));
            self.nodes(sa, sb, &if fields { key.to_owned() } else { join(key, "<state>") })?;
        }
        for ((ka, va), (kb, vb)) in oa.setitems.iter().zip(&ob.setitems) {
            if ka == kb {
                self.nodes(va, vb, &join(key, &label(ka)))?;
            } else {
                self.push(&join(key, &label(ka)), DifferenceKind::Value { a: short(ka), b: short(kb) });
            }
        }
        for (i, (xa, xb)) in oa.appends.iter().zip(&ob.appends).enumerate() {
            self.nodes(xa, xb, &join(key, &i.to_string()))?;
        }
        Ok(())
    }

    /// Compares two tensors a chunk of elements at a time.
    fn tensors(&mut self, ta: &TensorRef, tb: &TensorRef, key: &str) -> Result<Option<DifferenceKind>> {
        if ta.dtype != tb.dtype || ta.shape != tb.shape {
            return Ok(Some(DifferenceKind::TensorType {
                a: format!("{} {}", ta.dtype, Shape(&ta.shape)),
                b: format!("{} {}", tb.dtype, Shape(&tb.shape)),
            }));
        }
        let elem = ta.dtype.size();
        let n = ta.numel();
        let mut acc = Elements::default();
        let (sa, sb) = (&self.a.storage_of(ta)?.data, &self.b.storage_of(tb)?.data);
        if ta.is_contiguous() && tb.is_contiguous() {
            let chunk = (4 << 20) / elem.max(1);
            let mut start = 0;
            while start < n {
                let len = chunk.min(n - start);
                let xa = sa.read_range((ta.offset + start) * elem, len * elem)?;
                let xb = sb.read_range((tb.offset + start) * elem, len * elem)?;
                acc.compare(ta.dtype, &xa, &xb, |i| (start + i) as u64, self.tol);
                start += len;
                self.advance((len * elem) as u64);
            }
        } else {
            // Streamed, but a stride-0 view of one element can claim 10^12
            // of them: the work stays bounded by ReadOptions::max_view_bytes.
            for (ckpt, t) in [(self.a, ta), (self.b, tb)] {
                if !t.is_contiguous() {
                    ckpt.check_view_bytes(Some(key), t, t.nbytes())?;
                }
            }
            let mut walk = ViewWalk::new(ta, tb);
            let (mut oa, mut ob, mut flat) = (Vec::new(), Vec::new(), Vec::new());
            let (mut xa, mut xb) = (Vec::new(), Vec::new());
            while walk.next_chunk(VIEW_CHUNK, &mut oa, &mut ob, &mut flat) {
                xa.clear();
                xb.clear();
                read_elements(sa, &oa, elem, &mut xa)?;
                read_elements(sb, &ob, elem, &mut xb)?;
                acc.compare(ta.dtype, &xa, &xb, |i| flat[i], self.tol);
                self.advance((flat.len() * elem) as u64);
            }
        }
        Ok((acc.mismatched > 0).then_some(DifferenceKind::Elements {
            mismatched: acc.mismatched,
            of: n as u64,
            max_abs: acc.max_abs,
            first_index: acc.first,
        }))
    }
}

/// A dict key that is not a string, by identity: ints and bools by value
/// (as `Node` compares them), anything else by its exact JSON text.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum KeyId {
    Int(i64),
    Bool(bool),
    Other(String),
}

impl KeyId {
    fn of(k: &Node) -> KeyId {
        match k {
            Node::Int(i) => KeyId::Int(*i),
            Node::Bool(b) => KeyId::Bool(*b),
            other => KeyId::Other(crate::tree::fingerprint(other)),
        }
    }
}

fn has_other_keys(d: &Dict) -> bool {
    d.entries().iter().any(|(k, _)| !matches!(k, Node::Str(_)))
}

/// The positions of `d`'s non-string keys, when the other dict has any to
/// look up (string keys use the dict's own index).
fn other_keys_if(d: &Dict, needed: bool) -> HashMap<KeyId, usize> {
    if !needed {
        return HashMap::new();
    }
    d.entries()
        .iter()
        .enumerate()
        .filter(|(_, (k, _))| !matches!(k, Node::Str(_)))
        .map(|(i, (k, _))| (KeyId::of(k), i))
        .collect()
}

/// Elements of a view chunk compared at once: with their offsets and flat
/// indices, about 6 MiB plus the elements themselves per chunk.
const VIEW_CHUNK: usize = 1 << 18;

/// The widest storage window read for one view chunk; a chunk whose
/// elements spread wider is read in halves.
const MAX_WINDOW: usize = 16 << 20;

/// Two views of one shape, walked together in the memory order of the
/// first (its dimensions by decreasing stride: a transpose is read
/// forwards, not a stride apart), each element with its offset in both
/// storages and its flat C-order index (what differences report).
struct ViewWalk {
    /// Sizes in walk order.
    shape: Vec<usize>,
    /// Element strides of each side, in walk order.
    strides: [Vec<usize>; 2],
    /// C-order flat strides, in walk order.
    flat_stride: Vec<u64>,
    index: Vec<usize>,
    at: [usize; 2],
    flat: u64,
    left: usize,
}

impl ViewWalk {
    fn new(ta: &TensorRef, tb: &TensorRef) -> ViewWalk {
        let mut order: Vec<usize> = (0..ta.shape.len()).collect();
        order.sort_by_key(|&d| std::cmp::Reverse(ta.stride[d]));
        let c = TensorRef::contiguous_stride(&ta.shape);
        let pick = |v: &[usize]| order.iter().map(|&d| v[d]).collect::<Vec<usize>>();
        ViewWalk {
            shape: pick(&ta.shape),
            strides: [pick(&ta.stride), pick(&tb.stride)],
            flat_stride: order.iter().map(|&d| c[d] as u64).collect(),
            index: vec![0; ta.shape.len()],
            at: [ta.offset, tb.offset],
            flat: 0,
            left: ta.numel(),
        }
    }

    /// The next (up to) `n` elements' offsets and flat indices; false when none are left.
    fn next_chunk(&mut self, n: usize, oa: &mut Vec<usize>, ob: &mut Vec<usize>, flat: &mut Vec<u64>) -> bool {
        oa.clear();
        ob.clear();
        flat.clear();
        let take = n.min(self.left);
        for _ in 0..take {
            oa.push(self.at[0]);
            ob.push(self.at[1]);
            flat.push(self.flat);
            self.advance();
        }
        self.left -= take;
        take > 0
    }

    /// One step of the multi-index, last walk dimension fastest.
    fn advance(&mut self) {
        let [sa, sb] = &self.strides;
        for d in (0..self.shape.len()).rev() {
            if self.index[d] + 1 < self.shape[d] {
                self.index[d] += 1;
                self.at[0] += sa[d];
                self.at[1] += sb[d];
                self.flat += self.flat_stride[d];
                return;
            }
            let i = self.index[d];
            self.at[0] -= i * sa[d];
            self.at[1] -= i * sb[d];
            self.flat -= i as u64 * self.flat_stride[d];
            self.index[d] = 0;
        }
    }
}

/// Appends the elements at `offsets` (in elements; inside the storage, as
/// validated when the checkpoint was built) to `out`, reading windows of at
/// most [`MAX_WINDOW`] bytes.
fn read_elements(data: &Bytes, offsets: &[usize], elem: usize, out: &mut Vec<u8>) -> Result<()> {
    let (Some(&lo), Some(&hi)) = (offsets.iter().min(), offsets.iter().max()) else { return Ok(()) };
    let window = (hi - lo + 1) * elem;
    if window <= MAX_WINDOW || offsets.len() == 1 {
        let w = data.read_range(lo * elem, window)?;
        for &o in offsets {
            out.extend_from_slice(&w[(o - lo) * elem..(o - lo + 1) * elem]);
        }
        return Ok(());
    }
    let (first, second) = offsets.split_at(offsets.len() / 2);
    read_elements(data, first, elem, out)?;
    read_elements(data, second, elem, out)
}

#[derive(Default)]
struct Elements {
    mismatched: u64,
    max_abs: f64,
    first: Option<u64>,
}

/// How to read one element for comparison.
enum Decode {
    Float(fn(&[u8]) -> f64),
    Int(fn(&[u8]) -> i128),
    /// Compared bit for bit (bool, complex, float8).
    Bits,
}

fn decoder(d: DType) -> Decode {
    fn arr<const N: usize>(b: &[u8]) -> [u8; N] {
        b.try_into().unwrap_or([0; N])
    }
    match d {
        DType::F64 => Decode::Float(|b| f64::from_le_bytes(arr(b))),
        DType::F32 => Decode::Float(|b| f64::from(f32::from_le_bytes(arr(b)))),
        DType::F16 => Decode::Float(|b| half::f16::from_le_bytes(arr(b)).to_f64()),
        DType::BF16 => Decode::Float(|b| half::bf16::from_le_bytes(arr(b)).to_f64()),
        DType::I64 => Decode::Int(|b| i128::from(i64::from_le_bytes(arr(b)))),
        DType::I32 => Decode::Int(|b| i128::from(i32::from_le_bytes(arr(b)))),
        DType::I16 => Decode::Int(|b| i128::from(i16::from_le_bytes(arr(b)))),
        DType::I8 => Decode::Int(|b| i128::from(b[0] as i8)),
        DType::U8 => Decode::Int(|b| i128::from(b[0])),
        DType::U16 => Decode::Int(|b| i128::from(u16::from_le_bytes(arr(b)))),
        DType::U32 => Decode::Int(|b| i128::from(u32::from_le_bytes(arr(b)))),
        DType::U64 => Decode::Int(|b| i128::from(u64::from_le_bytes(arr(b)))),
        DType::Bool | DType::C64 | DType::C128 | DType::F8E4M3 | DType::F8E5M2 => Decode::Bits,
    }
}

impl Elements {
    /// Compares elements pairwise; `index(i)` is the flat C-order index of
    /// element `i` of the chunk (chunks of a view come in memory order, so
    /// the first mismatch is the least index, not the first seen).
    fn compare(&mut self, dtype: DType, xa: &[u8], xb: &[u8], index: impl Fn(usize) -> u64, tol: Tolerance) {
        let elem = dtype.size();
        let decode = decoder(dtype);
        for (i, (ea, eb)) in xa.chunks_exact(elem).zip(xb.chunks_exact(elem)).enumerate() {
            let ok = match &decode {
                Decode::Float(f) => {
                    let (x, y) = (f(ea), f(eb));
                    let d = (x - y).abs();
                    let same_nan = x.is_nan() && y.is_nan();
                    if d.is_finite() {
                        self.max_abs = self.max_abs.max(d);
                    } else if !same_nan && x != y {
                        self.max_abs = f64::INFINITY;
                    }
                    tol.close_f64(x, y)
                }
                Decode::Int(f) => {
                    let (x, y) = (f(ea), f(eb));
                    self.max_abs = self.max_abs.max(x.abs_diff(y) as f64);
                    tol.close_int(x, y)
                }
                Decode::Bits => ea == eb,
            };
            if !ok {
                self.mismatched += 1;
                let at = index(i);
                self.first = Some(self.first.map_or(at, |f| f.min(at)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DictKind;

    /// The progress a diff reports rises to every tensor byte of A, never back.
    #[test]
    fn progress_counts_up_to_every_tensor_byte_of_a() {
        let path = format!("{}/../../testdata/policy/smpl_tracker/last.ckpt", env!("CARGO_MANIFEST_DIR"));
        let (a, b) = (Checkpoint::open(&path).unwrap(), Checkpoint::open(&path).unwrap());
        let seen = std::cell::RefCell::new(Vec::new());
        let diffs = diff_with_progress(&a, &b, Tolerance::default(), &|done| seen.borrow_mut().push(done)).unwrap();
        assert!(diffs.is_empty());
        let seen = seen.into_inner();
        assert!(seen.windows(2).all(|w| w[0] <= w[1]), "went back");
        assert!(seen.len() > 10, "{} calls", seen.len());
        assert_eq!(seen.last().copied(), Some(tensor_bytes(&a)));
        assert!(tensor_bytes(&a) > 400_000, "{}", tensor_bytes(&a));
    }

    #[test]
    fn integers_are_compared_exactly() {
        let t = Tolerance::default();
        let big = 1i128 << 60;
        assert!(!t.close_int(big, big + 1), "2^60 and 2^60+1 differ although equal as f64");
        assert!(Tolerance { atol: 1.0, rtol: 0.0 }.close_int(big, big + 1));
        let mut e = Elements::default();
        let a: Vec<u8> = [big as i64, 5].iter().flat_map(|x| x.to_le_bytes()).collect();
        let b: Vec<u8> = [(big + 1) as i64, 5].iter().flat_map(|x| x.to_le_bytes()).collect();
        e.compare(DType::I64, &a, &b, |i| 10 + i as u64, t);
        assert_eq!((e.mismatched, e.first, e.max_abs), (1, Some(10), 1.0));
    }

    #[test]
    fn floats_follow_allclose_with_nan_equal_to_nan() {
        let t = Tolerance { rtol: 1e-3, atol: 0.0 };
        assert!(t.close_f64(f64::NAN, f64::NAN));
        assert!(t.close_f64(f64::INFINITY, f64::INFINITY));
        assert!(!t.close_f64(f64::INFINITY, f64::NEG_INFINITY));
        assert!(t.close_f64(1000.0, 1000.9));
        assert!(!t.close_f64(1000.0, 1001.5));
    }

    /// Differences print the shortest decimal that reads back as the same
    /// f64, not every digit of its exact value.
    #[test]
    fn differences_print_floats_in_their_shortest_form() {
        let max_abs = f64::from(f32::EPSILON) / 8.0;
        let d = Difference {
            key: "w".into(),
            kind: DifferenceKind::Elements { mismatched: 1, of: 4, max_abs, first_index: Some(2) },
        };
        let text = d.to_string();
        assert_eq!(text, "w: 1 of 4 elements differ (max |a - b| 1.4901161193847656e-8, first at flat index 2)");
        let shown = text.split("max |a - b| ").nth(1).and_then(|s| s.split(',').next()).unwrap();
        assert_eq!(shown.parse::<f64>().unwrap(), max_abs, "reads back as the same value");
    }

    fn one_tensor(t: TensorRef, values: &[f32]) -> Checkpoint {
        let data = crate::io::storage::Bytes::owned(values.iter().flat_map(|v| v.to_le_bytes()).collect());
        let storage = crate::io::storage::Storage { typed: true, dtype: DType::F32, location: "cpu".into(), data };
        let root =
            Dict::from_entries(DictKind::Plain, vec![(Node::Str("w".into()), Node::Tensor(Box::new(t)))]).unwrap();
        Checkpoint::from_parts(Node::Dict(root), [(String::from("s"), storage)].into()).unwrap()
    }

    /// A transposed view against a contiguous tensor of the same values but
    /// two: walked in the view's memory order, reported by C-order index.
    #[test]
    fn views_are_streamed_and_report_the_least_flat_index() {
        let storage: Vec<f32> = (0..12).map(|x| x as f32).collect();
        let view = TensorRef { stride: vec![1, 3], ..TensorRef::contiguous("s".into(), DType::F32, vec![3, 4]) };
        let a = one_tensor(view, &storage);
        // a[i][j] is storage[i + 3 j].
        let mut logical: Vec<f32> = (0..3).flat_map(|i| (0..4).map(move |j| (i + 3 * j) as f32)).collect();
        logical[4] += 1.0; // a[1][0] = storage[1]: read second
        logical[1] += 2.0; // a[0][1] = storage[3]: read fourth
        let b = one_tensor(TensorRef::contiguous("s".into(), DType::F32, vec![3, 4]), &logical);
        let d = diff(&a, &b, Tolerance::default()).unwrap();
        let want = DifferenceKind::Elements { mismatched: 2, of: 12, max_abs: 2.0, first_index: Some(1) };
        assert_eq!(d, [Difference { key: "w".into(), kind: want }]);
        let same = one_tensor(TensorRef::contiguous("s".into(), DType::F32, vec![3, 4]), &logical);
        assert!(diff(&b, &same, Tolerance::default()).unwrap().is_empty());
    }

    /// Elements spread wider than one window are read in pieces, in order.
    #[test]
    fn wide_reads_are_split_into_windows() {
        let n = MAX_WINDOW / 4 + 16;
        let bytes: Vec<u8> = (0..n as u32).flat_map(|i| i.to_le_bytes()).collect();
        let data = crate::io::storage::Bytes::owned(bytes);
        let offsets = [n - 1, 0, 5, n - 2, 1];
        let mut out = Vec::new();
        read_elements(&data, &offsets, 4, &mut out).unwrap();
        let got: Vec<u32> = out.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(got, offsets.iter().map(|&o| o as u32).collect::<Vec<_>>());
    }

    /// Int, bool and tuple keys are matched by value (through a hash map).
    #[test]
    fn non_string_keys_are_matched_by_value() {
        let dict = |entries: Vec<(Node, Node)>| {
            let root = Dict::from_entries(DictKind::Plain, entries).unwrap();
            Checkpoint::from_parts(Node::Dict(root), HashMap::new()).unwrap()
        };
        let tuple = || Node::Tuple(vec![Node::Int(2)]);
        let a = dict(vec![(Node::Int(1), Node::Int(1)), (tuple(), Node::Int(2)), (Node::Bool(false), Node::Int(3))]);
        let b = dict(vec![(tuple(), Node::Int(2)), (Node::Int(1), Node::Int(5)), (Node::Int(7), Node::Int(3))]);
        let d = diff(&a, &b, Tolerance::default()).unwrap();
        let keys: Vec<(&str, &DifferenceKind)> = d.iter().map(|x| (x.key.as_str(), &x.kind)).collect();
        assert_eq!(
            keys,
            [
                ("1", &DifferenceKind::Value { a: "1".into(), b: "5".into() }),
                ("False", &DifferenceKind::OnlyInA),
                ("7", &DifferenceKind::OnlyInB),
            ]
        );
    }
}
