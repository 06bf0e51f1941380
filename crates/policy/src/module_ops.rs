//! ProtoMotions' module operations (`apply_module_operations`): shape
//! changes, sphere projection, and `Forward` (normalizer, then the MLP).
//!
//! The batch size a `Reshape` may name is the input's first dim, taken
//! once before any operation, as in the reference. Only element 0 of a
//! reshape may be a string: `"batch_size"` or an integer expression in it
//! (`"batch_size * 2"`; the reference `eval`s it, here `+ - * // %` and
//! parentheses are understood and anything else is refused at load).

use candle_core::{Tensor, D};
use serde::Serialize;

use crate::config_object::op_fields;
use crate::error::{PolicyError, Result};
use crate::problem::{ExprProblem, FieldProblem, OpProblem};
use pmstate_ckpt::Node;

/// One module operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum ModuleOp {
    /// Normalizer (if any), then the MLP (if any) on the last dim.
    Forward,
    /// `obs.permute(*new_order)`.
    Permute(Vec<i64>),
    /// `obs.reshape(*new_shape)`; element 0 may be a batch-size expression.
    Reshape(Vec<ReshapeDim>),
    /// `obs.squeeze(dim)` (a no-op when that dim is not 1).
    Squeeze(i64),
    /// `obs.unsqueeze(dim)`.
    Unsqueeze(i64),
    /// `obs.expand(*shape)` (-1 keeps a size).
    Expand(Vec<i64>),
    /// `F.normalize(obs, dim=-1)`: `x / max(||x||, 1e-12)`.
    SphereProjection,
}

/// An element of a reshape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum ReshapeDim {
    /// A size (-1 inferred).
    Size(i64),
    /// An expression in `batch_size` (element 0 only).
    Batch(String),
}

const OPS_MODULE: &str = "protomotions.agents.common.config.";

impl ModuleOp {
    /// The config class name (without module).
    pub fn name(&self) -> &'static str {
        match self {
            ModuleOp::Forward => "ModuleOperationForwardConfig",
            ModuleOp::Permute(_) => "ModuleOperationPermuteConfig",
            ModuleOp::Reshape(_) => "ModuleOperationReshapeConfig",
            ModuleOp::Squeeze(_) => "ModuleOperationSqueezeConfig",
            ModuleOp::Unsqueeze(_) => "ModuleOperationUnsqueezeConfig",
            ModuleOp::Expand(_) => "ModuleOperationExpandConfig",
            ModuleOp::SphereProjection => "ModuleOperationSphereProjectionConfig",
        }
    }

    /// Parses an operation config object (dispatch on its class, as `isinstance` does).
    pub fn from_node(node: &Node, path: &str) -> Result<Self> {
        let (class, fields) = op_fields(node, path)?;
        let short = class.strip_prefix(OPS_MODULE).unwrap_or(&class);
        let bad = |field: &str, problem: FieldProblem| PolicyError::BadField {
            path: path.to_owned(),
            field: field.into(),
            problem,
        };
        let wrong = |field: &str, expected: &'static str, found: &Node| PolicyError::FieldType {
            path: path.to_owned(),
            field: field.into(),
            expected,
            found: found.to_string(),
        };
        let missing = |field: &str| PolicyError::MissingField {
            path: path.to_owned(),
            class: short.to_owned(),
            field: field.into(),
        };
        let ints = |field: &str| -> Result<Vec<i64>> {
            match fields.iter().find(|(k, _)| k == field).map(|(_, v)| v) {
                Some(Node::List(xs)) | Some(Node::Tuple(xs)) => xs
                    .iter()
                    .map(|x| match x {
                        Node::Int(i) => Ok(*i),
                        other => Err(wrong(field, "a list of ints", other)),
                    })
                    .collect(),
                Some(other) => Err(wrong(field, "a list of ints", other)),
                None => Err(missing(field)),
            }
        };
        let int = |field: &str| -> Result<i64> {
            match fields.iter().find(|(k, _)| k == field).map(|(_, v)| v) {
                Some(Node::Int(i)) => Ok(*i),
                Some(other) => Err(wrong(field, "an int", other)),
                None => Err(missing(field)),
            }
        };
        let (op, known): (ModuleOp, &[&str]) = match short {
            "ModuleOperationForwardConfig" => (ModuleOp::Forward, &[]),
            "ModuleOperationSphereProjectionConfig" => (ModuleOp::SphereProjection, &[]),
            "ModuleOperationPermuteConfig" => (ModuleOp::Permute(ints("new_order")?), &["new_order"]),
            "ModuleOperationSqueezeConfig" => (ModuleOp::Squeeze(int("squeeze_dim")?), &["squeeze_dim"]),
            "ModuleOperationUnsqueezeConfig" => (ModuleOp::Unsqueeze(int("unsqueeze_dim")?), &["unsqueeze_dim"]),
            "ModuleOperationExpandConfig" => (ModuleOp::Expand(ints("expand_shape")?), &["expand_shape"]),
            "ModuleOperationReshapeConfig" => {
                let shape = match fields.iter().find(|(k, _)| k == "new_shape").map(|(_, v)| v) {
                    Some(Node::List(xs)) | Some(Node::Tuple(xs)) => xs,
                    Some(other) => return Err(wrong("new_shape", "a list", other)),
                    None => return Err(missing("new_shape")),
                };
                let mut dims = Vec::new();
                for (i, x) in shape.iter().enumerate() {
                    dims.push(match x {
                        Node::Int(v) => ReshapeDim::Size(*v),
                        Node::Str(s) if i == 0 && s.contains("batch_size") => {
                            eval_batch_expr(s, 1).map_err(|problem| {
                                bad("new_shape", FieldProblem::BatchExpr { expr: s.clone(), problem })
                            })?;
                            ReshapeDim::Batch(s.clone())
                        }
                        other => {
                            return Err(bad(
                                "new_shape",
                                FieldProblem::ReshapeElement { index: i, found: other.to_string() },
                            ))
                        }
                    });
                }
                (ModuleOp::Reshape(dims), &["new_shape"])
            }
            _ => {
                return Err(PolicyError::UnsupportedClass {
                    path: path.to_owned(),
                    class,
                    supported: vec![
                        "ModuleOperationForwardConfig",
                        "ModuleOperationPermuteConfig",
                        "ModuleOperationReshapeConfig",
                        "ModuleOperationSqueezeConfig",
                        "ModuleOperationUnsqueezeConfig",
                        "ModuleOperationExpandConfig",
                        "ModuleOperationSphereProjectionConfig",
                    ],
                })
            }
        };
        for (k, v) in &fields {
            if !known.contains(&k.as_str()) && !matches!(v, Node::None) {
                return Err(PolicyError::UnsupportedField {
                    path: path.to_owned(),
                    class: class.clone(),
                    field: k.clone(),
                    value: v.to_string(),
                });
            }
        }
        Ok(op)
    }

    /// The shape after this operation (not for `Forward`, which the caller
    /// handles), or why it cannot apply.
    pub fn out_shape(&self, shape: &[usize], batch: usize) -> std::result::Result<Vec<usize>, OpProblem> {
        let rank = shape.len();
        match self {
            ModuleOp::Forward | ModuleOp::SphereProjection => Ok(shape.to_vec()),
            ModuleOp::Permute(order) => {
                if order.len() != rank {
                    return Err(OpProblem::PermuteRank { given: order.len(), rank });
                }
                let dims = order.iter().map(|&d| norm_dim(d, rank)).collect::<std::result::Result<Vec<_>, _>>()?;
                let mut seen = vec![false; rank];
                for &d in &dims {
                    if std::mem::replace(&mut seen[d], true) {
                        return Err(OpProblem::PermuteRepeat { dim: d });
                    }
                }
                Ok(dims.iter().map(|&d| shape[d]).collect())
            }
            ModuleOp::Squeeze(d) => {
                let d = norm_dim(*d, rank)?;
                let mut s = shape.to_vec();
                if s[d] == 1 {
                    s.remove(d);
                }
                Ok(s)
            }
            ModuleOp::Unsqueeze(d) => {
                let d = norm_dim(*d, rank + 1)?;
                let mut s = shape.to_vec();
                s.insert(d, 1);
                Ok(s)
            }
            ModuleOp::Expand(target) => {
                if target.len() < rank {
                    return Err(OpProblem::ExpandRank { target: target.len(), rank });
                }
                let lead = target.len() - rank;
                let mut out = Vec::with_capacity(target.len());
                for (i, &t) in target.iter().enumerate() {
                    let have = if i >= lead { Some(shape[i - lead]) } else { None };
                    out.push(match (t, have) {
                        (-1, Some(h)) => h,
                        (-1, None) => return Err(OpProblem::ExpandInferredNewDim),
                        (t, _) if t < 0 => return Err(OpProblem::ExpandNegative { size: t }),
                        (t, Some(h)) if h != 1 && h as i64 != t => {
                            return Err(OpProblem::ExpandSize { dim: i, have: h, to: t })
                        }
                        (t, _) => t as usize,
                    });
                }
                Ok(out)
            }
            ModuleOp::Reshape(dims) => {
                let numel: usize = shape.iter().product();
                let mut sizes = Vec::with_capacity(dims.len());
                for d in dims {
                    sizes.push(match d {
                        ReshapeDim::Size(v) => *v,
                        ReshapeDim::Batch(expr) => eval_batch_expr(expr, batch as i64)
                            .map_err(|problem| OpProblem::BatchExpr { expr: expr.clone(), problem })?,
                    });
                }
                infer_reshape(&sizes, numel)
            }
        }
    }

    /// Applies a shape operation or the sphere projection to `x` (not `Forward`).
    pub(crate) fn apply(&self, x: &Tensor, batch: usize) -> std::result::Result<Tensor, ApplyError> {
        let shape = self.out_shape(x.dims(), batch).map_err(ApplyError::Op)?;
        let r = match self {
            ModuleOp::Forward => return Ok(x.clone()),
            ModuleOp::SphereProjection => {
                let norm = x
                    .sqr()
                    .and_then(|s| s.sum_keepdim(D::Minus1))
                    .and_then(|s| s.sqrt())
                    .and_then(|n| n.maximum(1e-12));
                norm.and_then(|n| x.broadcast_div(&n))
            }
            ModuleOp::Permute(order) => {
                let rank = x.rank();
                let dims: Vec<usize> = order.iter().filter_map(|&d| norm_dim(d, rank).ok()).collect();
                x.permute(dims)
            }
            ModuleOp::Expand(_) => x.broadcast_as(shape),
            ModuleOp::Reshape(_) | ModuleOp::Squeeze(_) | ModuleOp::Unsqueeze(_) => x.reshape(shape),
        };
        r.map_err(ApplyError::Candle)
    }
}

/// Why [`ModuleOp::apply`] failed: the operation does not fit its input, or
/// candle failed on a shape already checked.
#[derive(Debug)]
pub(crate) enum ApplyError {
    Op(OpProblem),
    Candle(candle_core::Error),
}

fn norm_dim(d: i64, rank: usize) -> std::result::Result<usize, OpProblem> {
    let r = rank as i64;
    let v = if d < 0 { d + r } else { d };
    if (0..r).contains(&v) {
        Ok(v as usize)
    } else {
        Err(OpProblem::DimOutOfRange { dim: d, rank })
    }
}

/// torch's reshape: at most one -1, inferred; the element count must match.
pub(crate) fn infer_reshape(sizes: &[i64], numel: usize) -> std::result::Result<Vec<usize>, OpProblem> {
    let mut infer = None;
    let mut known: usize = 1;
    for (i, &s) in sizes.iter().enumerate() {
        if s == -1 {
            if infer.replace(i).is_some() {
                return Err(OpProblem::ReshapeTwoInferred);
            }
        } else if s < 0 {
            return Err(OpProblem::ReshapeNegative { size: s });
        } else {
            known = known.checked_mul(s as usize).ok_or(OpProblem::ReshapeOverflow)?;
        }
    }
    let mut out: Vec<usize> = sizes.iter().map(|&s| s.max(0) as usize).collect();
    match infer {
        Some(i) => {
            if known == 0 || !numel.is_multiple_of(known) {
                return Err(OpProblem::ReshapeNumel { sizes: sizes.to_vec(), numel });
            }
            out[i] = numel / known;
        }
        None if known != numel => return Err(OpProblem::ReshapeNumel { sizes: sizes.to_vec(), numel }),
        None => {}
    }
    Ok(out)
}

/// Evaluates an integer expression in `batch_size`: ints, `batch_size`,
/// `+ - * // %`, unary minus and parentheses (Python semantics: `//` and
/// `%` floor). `/` gives a float in Python, which reshape rejects.
pub(crate) fn eval_batch_expr(expr: &str, batch: i64) -> std::result::Result<i64, ExprProblem> {
    let toks = tokenize(expr)?;
    let mut p = Parser { toks: &toks, pos: 0, batch };
    let v = p.sum()?;
    if p.pos != toks.len() {
        return Err(ExprProblem::Unexpected { token: toks[p.pos].to_string() });
    }
    Ok(v)
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(i64),
    Batch,
    Op(&'static str),
    Open,
    Close,
}

impl std::fmt::Display for Tok {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tok::Num(n) => write!(f, "{n}"),
            Tok::Batch => f.write_str("batch_size"),
            Tok::Op(op) => write!(f, "'{op}'"),
            Tok::Open => f.write_str("'('"),
            Tok::Close => f.write_str("')'"),
        }
    }
}

fn tokenize(s: &str) -> std::result::Result<Vec<Tok>, ExprProblem> {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            b' ' | b'\t' => i += 1,
            b'0'..=b'9' => {
                let start = i;
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
                out.push(Tok::Num(s[start..i].parse().map_err(|_| ExprProblem::IntegerTooLarge)?));
            }
            b'(' => {
                out.push(Tok::Open);
                i += 1;
            }
            b')' => {
                out.push(Tok::Close);
                i += 1;
            }
            b'+' | b'-' | b'*' | b'%' => {
                out.push(Tok::Op(match c {
                    b'+' => "+",
                    b'-' => "-",
                    b'*' => "*",
                    _ => "%",
                }));
                i += 1;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                out.push(Tok::Op("//"));
                i += 2;
            }
            b'/' => return Err(ExprProblem::FloatDivision),
            _ if s[i..].starts_with("batch_size") => {
                out.push(Tok::Batch);
                i += "batch_size".len();
            }
            _ => return Err(ExprProblem::Unsupported { rest: s[i..].to_owned() }),
        }
    }
    Ok(out)
}

struct Parser<'a> {
    toks: &'a [Tok],
    pos: usize,
    batch: i64,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    fn sum(&mut self) -> std::result::Result<i64, ExprProblem> {
        let mut v = self.product()?;
        while let Some(Tok::Op(op @ ("+" | "-"))) = self.peek().cloned() {
            self.pos += 1;
            let r = self.product()?;
            v = if op == "+" { v.checked_add(r) } else { v.checked_sub(r) }.ok_or(ExprProblem::Overflow)?;
        }
        Ok(v)
    }

    fn product(&mut self) -> std::result::Result<i64, ExprProblem> {
        let mut v = self.unary()?;
        while let Some(Tok::Op(op @ ("*" | "//" | "%"))) = self.peek().cloned() {
            self.pos += 1;
            let r = self.unary()?;
            v = match op {
                "*" => v.checked_mul(r).ok_or(ExprProblem::Overflow)?,
                _ if r == 0 => return Err(ExprProblem::DivisionByZero),
                "//" => floor_div(v, r)?,
                _ => floor_mod(v, r),
            };
        }
        Ok(v)
    }

    fn unary(&mut self) -> std::result::Result<i64, ExprProblem> {
        match self.peek() {
            Some(Tok::Op("-")) => {
                self.pos += 1;
                self.unary()?.checked_neg().ok_or(ExprProblem::Overflow)
            }
            Some(Tok::Op("+")) => {
                self.pos += 1;
                self.unary()
            }
            _ => self.atom(),
        }
    }

    fn atom(&mut self) -> std::result::Result<i64, ExprProblem> {
        let t = self.peek().cloned().ok_or(ExprProblem::UnexpectedEnd)?;
        self.pos += 1;
        match t {
            Tok::Num(n) => Ok(n),
            Tok::Batch => Ok(self.batch),
            Tok::Open => {
                let v = self.sum()?;
                match self.peek() {
                    Some(Tok::Close) => {
                        self.pos += 1;
                        Ok(v)
                    }
                    _ => Err(ExprProblem::MissingClose),
                }
            }
            other => Err(ExprProblem::Unexpected { token: other.to_string() }),
        }
    }
}

/// Python's `v // r` (rounds toward minus infinity); `r` is not zero.
fn floor_div(v: i64, r: i64) -> std::result::Result<i64, ExprProblem> {
    let q = v.checked_div(r).ok_or(ExprProblem::Overflow)?;
    // the remainder exists: `checked_div` refused the one overflowing pair
    Ok(if v % r != 0 && ((v < 0) != (r < 0)) { q - 1 } else { q })
}

/// Python's `v % r` (the sign of `r`); `r` is not zero.
fn floor_mod(v: i64, r: i64) -> i64 {
    let m = v.wrapping_rem(r); // i64::MIN % -1 is 0, as in Python
    if m != 0 && ((m < 0) != (r < 0)) {
        m + r
    } else {
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_expressions_evaluate_as_python_does() {
        assert_eq!(eval_batch_expr("batch_size", 16), Ok(16));
        assert_eq!(eval_batch_expr("batch_size * 2", 16), Ok(32));
        assert_eq!(eval_batch_expr("batch_size*2+1", 3), Ok(7));
        assert_eq!(eval_batch_expr("(batch_size - 1) // 2", 8), Ok(3));
        assert_eq!(eval_batch_expr("-7 // 2", 0), Ok(-4));
        assert_eq!(eval_batch_expr("-7 % 2", 0), Ok(1));
        assert_eq!(eval_batch_expr("7 // -2", 0), Ok(-4));
        assert_eq!(eval_batch_expr("7 % -2", 0), Ok(-1));
        assert_eq!(eval_batch_expr("-7 % -2", 0), Ok(-1));
        assert_eq!(eval_batch_expr("6 % -3", 0), Ok(0));
        assert_eq!(eval_batch_expr("batch_size / 2", 4), Err(ExprProblem::FloatDivision));
        assert_eq!(eval_batch_expr("batch_size * foo", 4), Err(ExprProblem::Unsupported { rest: "foo".into() }));
        assert_eq!(eval_batch_expr("batch_size // 0", 4), Err(ExprProblem::DivisionByZero));
        assert_eq!(eval_batch_expr("(batch_size", 4), Err(ExprProblem::MissingClose));
        assert_eq!(eval_batch_expr("batch_size *", 4), Err(ExprProblem::UnexpectedEnd));
        assert_eq!(eval_batch_expr("batch_size 2", 4), Err(ExprProblem::Unexpected { token: "2".into() }));
        assert_eq!(eval_batch_expr("99999999999999999999", 4), Err(ExprProblem::IntegerTooLarge));
        // overflow is an error, never a panic or a wrapped size
        assert_eq!(eval_batch_expr("batch_size * 9223372036854775807", 2), Err(ExprProblem::Overflow));
        assert_eq!(eval_batch_expr("-(-9223372036854775807 - 1)", 0), Err(ExprProblem::Overflow));
        assert_eq!(eval_batch_expr("(-9223372036854775807 - 1) // -1", 0), Err(ExprProblem::Overflow));
        assert_eq!(eval_batch_expr("(-9223372036854775807 - 1) % -1", 0), Ok(0));
    }

    #[test]
    fn shapes_follow_torch() {
        let r =
            ModuleOp::Reshape(vec![ReshapeDim::Batch("batch_size".into()), ReshapeDim::Size(3), ReshapeDim::Size(-1)]);
        assert_eq!(r.out_shape(&[5, 12], 5), Ok(vec![5, 3, 4]));
        assert_eq!(r.out_shape(&[5, 13], 5), Err(OpProblem::ReshapeNumel { sizes: vec![5, 3, -1], numel: 65 }));
        assert_eq!(
            r.out_shape(&[5, 13], 5).unwrap_err().to_string(),
            "shape [5, 3, -1] is invalid for input of size 65" // torch's wording
        );
        assert_eq!(ModuleOp::Permute(vec![0, 2, 1]).out_shape(&[5, 3, 4], 5), Ok(vec![5, 4, 3]));
        assert_eq!(ModuleOp::Squeeze(1).out_shape(&[5, 1, 4], 5), Ok(vec![5, 4]));
        assert_eq!(ModuleOp::Squeeze(1).out_shape(&[5, 2, 4], 5), Ok(vec![5, 2, 4]));
        assert_eq!(ModuleOp::Unsqueeze(-1).out_shape(&[5, 4], 5), Ok(vec![5, 4, 1]));
        assert_eq!(ModuleOp::Expand(vec![-1, 2, -1]).out_shape(&[5, 1, 4], 5), Ok(vec![5, 2, 4]));
        assert_eq!(
            ModuleOp::Expand(vec![-1, 2, -1]).out_shape(&[5, 3, 4], 5),
            Err(OpProblem::ExpandSize { dim: 1, have: 3, to: 2 })
        );
        assert_eq!(
            ModuleOp::Expand(vec![-1, 4]).out_shape(&[5, 3, 4], 5),
            Err(OpProblem::ExpandRank { target: 2, rank: 3 })
        );
        assert_eq!(ModuleOp::Expand(vec![-1, -1, 4]).out_shape(&[5, 4], 5), Err(OpProblem::ExpandInferredNewDim));
        assert_eq!(
            ModuleOp::Permute(vec![0, 1]).out_shape(&[5, 3, 4], 5),
            Err(OpProblem::PermuteRank { given: 2, rank: 3 })
        );
        assert_eq!(
            ModuleOp::Permute(vec![0, 2, -1]).out_shape(&[5, 3, 4], 5),
            Err(OpProblem::PermuteRepeat { dim: 2 })
        );
        assert_eq!(ModuleOp::Squeeze(-3).out_shape(&[5, 4], 5), Err(OpProblem::DimOutOfRange { dim: -3, rank: 2 }));
        let two = ModuleOp::Reshape(vec![ReshapeDim::Size(-1), ReshapeDim::Size(-1)]);
        assert_eq!(two.out_shape(&[5, 4], 5), Err(OpProblem::ReshapeTwoInferred));
        let batch =
            ModuleOp::Reshape(vec![ReshapeDim::Batch("batch_size // (batch_size - 5)".into()), ReshapeDim::Size(-1)]);
        assert_eq!(
            batch.out_shape(&[5, 4], 5),
            Err(OpProblem::BatchExpr {
                expr: "batch_size // (batch_size - 5)".into(),
                problem: ExprProblem::DivisionByZero
            })
        );
    }
}
