//! Resolution of a loaded tree: references looked up (absolute and
//! relative), cycles detected, values cached, and the resolvers ProtoMotions
//! v2.3 registers called.

use std::collections::HashMap;
use std::fmt;

use super::eval::{arith, eval_expr, BinOp, Num};
use super::grammar::{grammar_primitive, Arg, Grammar, Interp, Piece};
use super::value::{dotted, py_float_repr, py_str, Fail, Val};
use super::yaml::{digits_underscored, strip_sign, Raw};
use super::{Problem, MAX_DEPTH, MAX_EVALUATIONS, MAX_EXPRESSION_CHARS};

pub(super) struct Resolver<'a> {
    root: &'a Raw,
    file: &'a str,
    memo: HashMap<Vec<String>, Val>,
    stack: Vec<Vec<String>>,
    evaluations: usize,
}

/// The key at which a problem shows, with the problem.
type R<T> = Result<T, Fail>;

impl<'a> Resolver<'a> {
    /// A resolver over the tree `root`, read from `file`.
    pub(super) fn new(root: &'a Raw, file: &'a str) -> Self {
        Resolver { root, file, memo: HashMap::new(), stack: Vec::new(), evaluations: 0 }
    }

    fn node(&self, path: &[String]) -> Option<&'a Raw> {
        let mut node = self.root;
        for key in path {
            node = match node {
                Raw::Map(entries) => &entries.iter().find(|(k, _)| k == key)?.1,
                Raw::List(items) => items.get(key.parse::<usize>().ok()?)?,
                Raw::Scalar(_) => return None,
            };
        }
        Some(node)
    }

    /// The resolved subtree at `path`, children resolved where they stand
    /// (so a relative interpolation inside a referenced subtree looks
    /// around its own place, as OmegaConf's node references do).
    pub(super) fn tree(&mut self, path: &[String], depth: usize) -> R<Val> {
        if depth > MAX_DEPTH {
            return Err((dotted(path), Problem::Limit(format!("subtrees referenced deeper than {MAX_DEPTH}"))));
        }
        let Some(node) = self.node(path) else {
            return Err((dotted(path), Problem::NotFound { target: dotted(path) }));
        };
        let mut child = path.to_vec();
        match node {
            Raw::Scalar(_) => self.leaf(path, depth),
            Raw::List(items) => {
                let mut out = Vec::with_capacity(items.len());
                for i in 0..items.len() {
                    child.push(i.to_string());
                    out.push(self.tree(&child, depth + 1)?);
                    child.pop();
                }
                Ok(Val::List(out))
            }
            Raw::Map(entries) => {
                let mut out = Vec::with_capacity(entries.len());
                for (k, _) in entries {
                    child.push(k.clone());
                    out.push((k.clone(), self.tree(&child, depth + 1)?));
                    child.pop();
                }
                Ok(Val::Dict(out))
            }
        }
    }

    /// A scalar's resolved value, cached.
    fn leaf(&mut self, path: &[String], depth: usize) -> R<Val> {
        if let Some(v) = self.memo.get(path) {
            return Ok(v.clone());
        }
        let Some(Raw::Scalar(raw)) = self.node(path) else {
            return self.tree(path, depth);
        };
        let text = match raw {
            Val::Str(s) if s.contains("${") => s.clone(),
            other => return Ok(other.clone()),
        };
        if let Some(at) = self.stack.iter().position(|p| p == path) {
            let mut keys: Vec<String> = self.stack[at..].iter().map(|p| dotted(p)).collect();
            keys.push(dotted(path));
            return Err((dotted(path), Problem::Cycle { keys }));
        }
        if self.stack.len() >= MAX_DEPTH {
            return Err((dotted(path), Problem::Limit(format!("interpolations chained deeper than {MAX_DEPTH}"))));
        }
        self.evaluations += 1;
        if self.evaluations > MAX_EVALUATIONS {
            return Err((dotted(path), Problem::Limit(format!("more than {MAX_EVALUATIONS} evaluations"))));
        }
        if text.chars().count() > MAX_EXPRESSION_CHARS {
            return Err((dotted(path), Problem::Limit(format!("a value longer than {MAX_EXPRESSION_CHARS} chars"))));
        }
        let pieces = Grammar::new(&text).top().map_err(|p| (dotted(path), p))?;
        self.stack.push(path.to_vec());
        let result = self.pieces(&pieces, path, depth);
        self.stack.pop();
        let v = result?;
        self.memo.insert(path.to_vec(), v.clone());
        Ok(v)
    }

    /// A whole value: one interpolation keeps its value's type, anything
    /// more is Python's string concatenation.
    fn pieces(&mut self, pieces: &[Piece], at: &[String], depth: usize) -> R<Val> {
        if let [Piece::Interp(i)] = pieces {
            return self.interp(i, at, depth);
        }
        self.concat(pieces, at, depth)
    }

    /// Text and interpolations joined as Python's `str()` of each value.
    fn concat(&mut self, pieces: &[Piece], at: &[String], depth: usize) -> R<Val> {
        let mut out = String::new();
        for piece in pieces {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Interp(i) => {
                    let v = self.interp(i, at, depth)?;
                    out.push_str(&py_str(&v).map_err(|p| (dotted(at), p))?);
                }
            }
        }
        Ok(Val::Str(out))
    }

    fn interp(&mut self, interp: &Interp, at: &[String], depth: usize) -> R<Val> {
        match interp {
            Interp::Node { dots, keys, text } => {
                let base_len = if *dots == 0 {
                    0
                } else {
                    at.len()
                        .checked_sub(*dots)
                        .ok_or_else(|| (dotted(at), Problem::NotFound { target: text.clone() }))?
                };
                let mut target: Vec<String> = at[..base_len].to_vec();
                target.extend(keys.iter().cloned());
                let not_found = || (dotted(at), Problem::NotFound { target: text.clone() });
                let node = self.node(&target).ok_or_else(not_found)?;
                if let Raw::Scalar(Val::Str(s)) = node {
                    if s == "???" {
                        return Err((dotted(at), Problem::MissingValue { target: dotted(&target) }));
                    }
                }
                let v = self.tree(&target, depth + 1)?;
                Ok(v)
            }
            Interp::Resolver { name, args } => {
                let mut values = Vec::with_capacity(args.len());
                for arg in args {
                    values.push(self.arg(arg, at, depth)?);
                }
                call_resolver(name, &values).map_err(|p| (dotted(at), p))
            }
        }
    }

    fn arg(&mut self, arg: &Arg, at: &[String], depth: usize) -> R<Val> {
        match arg {
            Arg::Quoted(pieces) => self.concat(pieces, at, depth),
            Arg::List(items) => {
                let mut out = Vec::with_capacity(items.len());
                for item in items {
                    out.push(self.arg(item, at, depth)?);
                }
                Ok(Val::List(out))
            }
            Arg::Unquoted { pieces, escaped } => {
                // Blanks around an argument are not part of it.
                let mut trimmed: Vec<Piece> = pieces.clone();
                if let Some(Piece::Text(t)) = trimmed.first_mut() {
                    *t = t.trim_start_matches([' ', '\t']).to_string();
                }
                if let Some(Piece::Text(t)) = trimmed.last_mut() {
                    *t = t.trim_end_matches([' ', '\t']).to_string();
                }
                trimmed.retain(|p| !matches!(p, Piece::Text(t) if t.is_empty()));
                match trimmed.as_slice() {
                    [] => Ok(Val::Str(String::new())),
                    [Piece::Text(t)] if !escaped => Ok(grammar_primitive(t)),
                    _ => self.pieces(&trimmed, at, depth),
                }
            }
        }
    }
}

impl fmt::Debug for Resolver<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resolver").field("file", &self.file).finish_non_exhaustive()
    }
}

// ----------------------------------------------------------- resolvers ----

fn resolver_err(name: &str, reason: impl Into<String>) -> Problem {
    Problem::Resolver { name: name.to_string(), reason: reason.into() }
}

fn arity(name: &str, args: &[Val], n: usize) -> Result<(), Problem> {
    if args.len() == n {
        Ok(())
    } else {
        Err(resolver_err(name, format!("takes {n} argument(s), got {}", args.len())))
    }
}

/// Python's `sum()` over a list of numbers (start 0).
fn py_sum(name: &str, v: &Val) -> Result<Val, Problem> {
    let Val::List(items) = v else {
        return Err(resolver_err(name, format!("'{}' object is not summable here", v.type_name())));
    };
    let mut acc = Num::Int(0);
    for item in items {
        let n = Num::from_val(item).ok_or_else(|| resolver_err(name, format!("cannot add a {}", item.type_name())))?;
        acc = arith(BinOp::Add, acc, n).map_err(|reason| resolver_err(name, reason))?;
    }
    Ok(acc.into_val())
}

/// Python's `float(x)` for a scalar.
fn py_float(name: &str, v: &Val) -> Result<f64, Problem> {
    match v {
        Val::Bool(b) => Ok(f64::from(u8::from(*b))),
        Val::Int(i) => Ok(*i as f64),
        Val::Float(f) => Ok(*f),
        Val::Str(s) => {
            let t: String = s.trim().chars().filter(|&c| c != '_').collect();
            t.parse::<f64>().map_err(|_| resolver_err(name, format!("could not convert string to float: '{s}'")))
        }
        other => Err(resolver_err(
            name,
            format!("float() argument must be a string or a real number, not '{}'", other.type_name()),
        )),
    }
}

fn call_resolver(name: &str, args: &[Val]) -> Result<Val, Problem> {
    match name {
        "eval" => {
            arity(name, args, 1)?;
            match &args[0] {
                Val::Str(expr) => eval_expr(expr),
                other => Err(resolver_err(name, format!("eval() arg 1 must be a string, not {}", other.type_name()))),
            }
        }
        "if" => {
            arity(name, args, 3)?;
            Ok(if args[0].truthy() { args[1].clone() } else { args[2].clone() })
        }
        "eq" => {
            arity(name, args, 2)?;
            match (&args[0], &args[1]) {
                (Val::Str(a), Val::Str(b)) => Ok(Val::Bool(a.to_lowercase() == b.to_lowercase())),
                (a, b) => {
                    let bad = if matches!(a, Val::Str(_)) { b } else { a };
                    Err(resolver_err(name, format!("'{}' object has no attribute 'lower'", bad.type_name())))
                }
            }
        }
        "sqrt" => {
            arity(name, args, 1)?;
            let x = py_float(name, &args[0])?;
            if x < 0.0 {
                return Err(resolver_err(name, "math domain error"));
            }
            Ok(Val::Float(x.sqrt()))
        }
        "sum" | "sum_list" => {
            arity(name, args, 1)?;
            py_sum(name, &args[0])
        }
        "ceil" => {
            arity(name, args, 1)?;
            match &args[0] {
                Val::Bool(b) => Ok(Val::Int(i64::from(*b))),
                Val::Int(i) => Ok(Val::Int(*i)),
                Val::Float(f) => float_to_int(f.ceil()).map_err(|r| resolver_err(name, r)),
                other => Err(resolver_err(name, format!("must be real number, not {}", other.type_name()))),
            }
        }
        "int" => {
            arity(name, args, 1)?;
            match &args[0] {
                Val::Bool(b) => Ok(Val::Int(i64::from(*b))),
                Val::Int(i) => Ok(Val::Int(*i)),
                Val::Float(f) => float_to_int(f.trunc()).map_err(|r| resolver_err(name, r)),
                Val::Str(s) => parse_py_int_str(s)
                    .ok_or_else(|| resolver_err(name, format!("invalid literal for int() with base 10: '{s}'")))
                    .map(Val::Int),
                other => Err(resolver_err(
                    name,
                    format!("int() argument must be a string or a real number, not '{}'", other.type_name()),
                )),
            }
        }
        "len" => {
            arity(name, args, 1)?;
            let n = match &args[0] {
                Val::Str(s) => s.chars().count(),
                Val::List(l) => l.len(),
                Val::Dict(d) => d.len(),
                other => {
                    return Err(resolver_err(name, format!("object of type '{}' has no len()", other.type_name())))
                }
            };
            Ok(Val::Int(i64::try_from(n).map_err(|_| resolver_err(name, "length beyond 64 bits"))?))
        }
        other => Err(Problem::UnknownResolver { name: other.to_string() }),
    }
}

/// `int("…")` in base 10: blanks around, a sign, digits with single
/// underscores between them.
fn parse_py_int_str(s: &str) -> Option<i64> {
    let t = s.trim();
    let (neg, u) = strip_sign(t);
    if !digits_underscored(u) {
        return None;
    }
    let cleaned: String = u.chars().filter(|&c| c != '_').collect();
    let v: i128 = cleaned.parse().ok()?;
    i64::try_from(if neg { -v } else { v }).ok()
}

fn float_to_int(f: f64) -> Result<Val, String> {
    if !f.is_finite() {
        return Err(format!("cannot convert float {} to integer", py_float_repr(f)));
    }
    // i64::MAX as f64 rounds up to 2^63, which does not fit.
    if !(-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&f) {
        return Err("integer beyond 64 bits".into());
    }
    Ok(Val::Int(f as i64))
}
