//! Comparing two checkpoints: keys, kinds, scalars, and tensors element by
//! element, streamed a chunk at a time so two 2 GiB checkpoints cost a few
//! MiB, with integers compared exactly (two int64 differing by 1 above 2^53
//! differ).

use serde::Serialize;

use crate::checkpoint::Checkpoint;
use crate::dtype::DType;
use crate::error::Result;
use crate::tree::{Node, Object, Shape, TensorRef};

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
                write!(f, "{key}: {mismatched} of {of} elements differ (max |a - b| {max_abs}")?;
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
    let mut out = Vec::new();
    let mut d = Differ { a, b, tol, out: &mut out };
    d.nodes(a.root(), b.root(), "")?;
    Ok(out)
}

struct Differ<'a, 'o> {
    a: &'a Checkpoint,
    b: &'a Checkpoint,
    tol: Tolerance,
    out: &'o mut Vec<Difference>,
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
    fn push(&mut self, key: &str, kind: DifferenceKind) {
        self.out.push(Difference { key: key.to_owned(), kind });
    }

    fn nodes(&mut self, na: &Node, nb: &Node, key: &str) -> Result<()> {
        match (na, nb) {
            (Node::Dict(da), Node::Dict(db)) => {
                for (k, va) in da.entries() {
                    let found = match k {
                        Node::Str(s) => db.get(s),
                        other => db.entries().iter().find(|(kb, _)| kb == other).map(|(_, v)| v),
                    };
                    match found {
                        Some(vb) => self.nodes(va, vb, &join(key, &label(k)))?,
                        None => self.push(&join(key, &label(k)), DifferenceKind::OnlyInA),
                    }
                }
                for (k, _) in db.entries() {
                    let present = match k {
                        Node::Str(s) => da.get(s).is_some(),
                        other => da.entries().iter().any(|(ka, _)| ka == other),
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
                if let Some(kind) = self.tensors(ta, tb)? {
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
    fn tensors(&mut self, ta: &TensorRef, tb: &TensorRef) -> Result<Option<DifferenceKind>> {
        if ta.dtype != tb.dtype || ta.shape != tb.shape {
            return Ok(Some(DifferenceKind::TensorType {
                a: format!("{} {}", ta.dtype, Shape(&ta.shape)),
                b: format!("{} {}", tb.dtype, Shape(&tb.shape)),
            }));
        }
        let elem = ta.dtype.size();
        let n = ta.numel();
        let mut acc = Elements::default();
        if ta.is_contiguous() && tb.is_contiguous() {
            let (sa, sb) = (&self.a.storage_of(ta)?.data, &self.b.storage_of(tb)?.data);
            let chunk = (4 << 20) / elem.max(1);
            let mut start = 0;
            while start < n {
                let len = chunk.min(n - start);
                let xa = sa.read_range((ta.offset + start) * elem, len * elem)?;
                let xb = sb.read_range((tb.offset + start) * elem, len * elem)?;
                acc.compare(ta.dtype, &xa, &xb, start as u64, self.tol);
                start += len;
            }
        } else {
            // Views are gathered (bounded by ReadOptions::max_view_bytes).
            let xa = self.a.tensor_bytes(ta)?;
            let xb = self.b.tensor_bytes(tb)?;
            acc.compare(ta.dtype, &xa, &xb, 0, self.tol);
        }
        Ok((acc.mismatched > 0).then_some(DifferenceKind::Elements {
            mismatched: acc.mismatched,
            of: n as u64,
            max_abs: acc.max_abs,
            first_index: acc.first,
        }))
    }
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
    fn compare(&mut self, dtype: DType, xa: &[u8], xb: &[u8], base: u64, tol: Tolerance) {
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
                self.first.get_or_insert(base + i as u64);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_compared_exactly() {
        let t = Tolerance::default();
        let big = 1i128 << 60;
        assert!(!t.close_int(big, big + 1), "2^60 and 2^60+1 differ although equal as f64");
        assert!(Tolerance { atol: 1.0, rtol: 0.0 }.close_int(big, big + 1));
        let mut e = Elements::default();
        let a: Vec<u8> = [big as i64, 5].iter().flat_map(|x| x.to_le_bytes()).collect();
        let b: Vec<u8> = [(big + 1) as i64, 5].iter().flat_map(|x| x.to_le_bytes()).collect();
        e.compare(DType::I64, &a, &b, 10, t);
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
}
