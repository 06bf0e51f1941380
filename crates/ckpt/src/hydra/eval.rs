//! The `eval` resolver: a safe evaluator of arithmetic over literals with
//! Python's numeric semantics, which refuses names, calls and attributes.

use super::value::Val;
use super::yaml::digits_underscored;
use super::{Problem, MAX_DEPTH, MAX_EVAL_TOKENS, MAX_EXPRESSION_CHARS};

/// A number as Python's arithmetic sees it (bools are ints there).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Num {
    Bool(bool),
    Int(i64),
    Float(f64),
    None,
}

impl Num {
    pub(super) fn from_val(v: &Val) -> Option<Num> {
        match v {
            Val::Bool(b) => Some(Num::Bool(*b)),
            Val::Int(i) => Some(Num::Int(*i)),
            Val::Float(f) => Some(Num::Float(*f)),
            _ => None,
        }
    }

    pub(super) fn into_val(self) -> Val {
        match self {
            Num::Bool(b) => Val::Bool(b),
            Num::Int(i) => Val::Int(i),
            Num::Float(f) => Val::Float(f),
            Num::None => Val::Null,
        }
    }

    fn type_name(self) -> &'static str {
        match self {
            Num::Bool(_) => "bool",
            Num::Int(_) => "int",
            Num::Float(_) => "float",
            Num::None => "NoneType",
        }
    }

    fn truthy(self) -> bool {
        match self {
            Num::Bool(b) => b,
            Num::Int(i) => i != 0,
            Num::Float(f) => f != 0.0,
            Num::None => false,
        }
    }

    /// An int operand (bools widen), or None for a float.
    fn as_int(self) -> Option<i64> {
        match self {
            Num::Bool(b) => Some(i64::from(b)),
            Num::Int(i) => Some(i),
            _ => None,
        }
    }

    fn as_float(self) -> Option<f64> {
        match self {
            Num::Float(f) => Some(f),
            Num::None => None,
            other => other.as_int().map(|i| i as f64),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    FloorDiv,
    Mod,
    Pow,
}

impl BinOp {
    fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::FloorDiv => "//",
            BinOp::Mod => "%",
            BinOp::Pow => "**",
        }
    }
}

const TOO_BIG: &str = "integer beyond 64 bits";

/// Python's `divmod` for floats (`Objects/floatobject.c`): the remainder
/// takes the divisor's sign, the quotient is floored.
fn float_divmod(vx: f64, wx: f64) -> (f64, f64) {
    let mut m = vx % wx;
    let mut div = (vx - m) / wx;
    if m != 0.0 {
        if (wx < 0.0) != (m < 0.0) {
            m += wx;
            div -= 1.0;
        }
    } else {
        m = 0.0f64.copysign(wx);
    }
    let floordiv = if div != 0.0 {
        let mut f = div.floor();
        if div - f > 0.5 {
            f += 1.0;
        }
        f
    } else {
        0.0f64.copysign(vx / wx)
    };
    (floordiv, m)
}

pub(super) fn arith(op: BinOp, a: Num, b: Num) -> Result<Num, String> {
    let unsupported =
        || format!("unsupported operand type(s) for {}: '{}' and '{}'", op.symbol(), a.type_name(), b.type_name());
    if let (Some(x), Some(y)) = (a.as_int(), b.as_int()) {
        return Ok(match op {
            BinOp::Add => Num::Int(x.checked_add(y).ok_or(TOO_BIG)?),
            BinOp::Sub => Num::Int(x.checked_sub(y).ok_or(TOO_BIG)?),
            BinOp::Mul => Num::Int(x.checked_mul(y).ok_or(TOO_BIG)?),
            BinOp::Div => {
                if y == 0 {
                    return Err("division by zero".into());
                }
                // Python divides ints exactly then rounds once; through f64
                // that holds for operands below 2^53.
                if x.unsigned_abs() > 1 << 53 || y.unsigned_abs() > 1 << 53 {
                    return Err("true division of integers beyond 2^53 is not evaluated".into());
                }
                Num::Float(x as f64 / y as f64)
            }
            BinOp::FloorDiv | BinOp::Mod => {
                if y == 0 {
                    return Err("integer division or modulo by zero".into());
                }
                let q = x.checked_div_euclid(y).ok_or(TOO_BIG)?;
                let r = x.checked_rem_euclid(y).ok_or(TOO_BIG)?;
                // Euclid's remainder is never negative; Python's takes the
                // divisor's sign.
                let (q, r) = if r != 0 && y < 0 { (q.checked_sub(1).ok_or(TOO_BIG)?, r + y) } else { (q, r) };
                Num::Int(if op == BinOp::FloorDiv { q } else { r })
            }
            BinOp::Pow => {
                if y < 0 {
                    if x == 0 {
                        return Err("0.0 cannot be raised to a negative power".into());
                    }
                    return arith(op, Num::Float(x as f64), Num::Float(y as f64));
                }
                let e = u32::try_from(y).map_err(|_| TOO_BIG)?;
                Num::Int(x.checked_pow(e).ok_or(TOO_BIG)?)
            }
        });
    }
    let (Some(x), Some(y)) = (a.as_float(), b.as_float()) else {
        return Err(unsupported());
    };
    let out = match op {
        BinOp::Add => x + y,
        BinOp::Sub => x - y,
        BinOp::Mul => x * y,
        BinOp::Div => {
            if y == 0.0 {
                return Err("float division by zero".into());
            }
            x / y
        }
        BinOp::FloorDiv | BinOp::Mod => {
            if y == 0.0 {
                return Err(if op == BinOp::Mod { "float modulo" } else { "float floor division by zero" }.into());
            }
            let (q, r) = float_divmod(x, y);
            if op == BinOp::FloorDiv {
                q
            } else {
                r
            }
        }
        BinOp::Pow => {
            if x == 0.0 && y < 0.0 {
                return Err("0.0 cannot be raised to a negative power".into());
            }
            if x < 0.0 && y.fract() != 0.0 && y.is_finite() {
                return Err("a negative number to a fractional power is complex".into());
            }
            let p = x.powf(y);
            if p.is_infinite() && x.is_finite() && y.is_finite() {
                return Err("(34, 'Numerical result out of range')".into());
            }
            p
        }
    };
    // Python's float arithmetic overflows to inf as here; JSON cannot
    // carry it, which `to_json` reports with the key.
    Ok(Num::Float(out))
}

fn compare(op: &str, a: Num, b: Num) -> Result<bool, String> {
    if let (Some(x), Some(y)) = (a.as_int(), b.as_int()) {
        return Ok(match op {
            "==" => x == y,
            "!=" => x != y,
            "<" => x < y,
            "<=" => x <= y,
            ">" => x > y,
            _ => x >= y,
        });
    }
    match (a.as_float(), b.as_float()) {
        (Some(x), Some(y)) => Ok(match op {
            "==" => x == y,
            "!=" => x != y,
            "<" => x < y,
            "<=" => x <= y,
            ">" => x > y,
            _ => x >= y,
        }),
        _ if op == "==" => Ok(a == b),
        _ if op == "!=" => Ok(a != b),
        _ => Err(format!("'{op}' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name())),
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(Num),
    Op(&'static str),
    Word(&'static str),
}

const OPS: [&str; 16] = ["**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "(", ")", "<", ">", "~"];

fn tokenize(expr: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == ' ' || c == '\t' {
            i += 1;
            continue;
        }
        if toks.len() >= MAX_EVAL_TOKENS {
            return Err(format!("more than {MAX_EVAL_TOKENS} tokens"));
        }
        if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit())) {
            let start = i;
            while i < chars.len() {
                let d = chars[i];
                let prev = chars[i.saturating_sub(1)];
                // An exponent's sign belongs to the literal (`1e-3`), but
                // not after a hex literal's `e` digit (`0xe-1`).
                let exponent_sign = (d == '+' || d == '-')
                    && i > start
                    && (prev == 'e' || prev == 'E')
                    && !chars[start..i].iter().any(|c| *c == 'x' || *c == 'X');
                if d.is_ascii_alphanumeric() || d == '_' || d == '.' || exponent_sign {
                    i += 1;
                } else {
                    break;
                }
            }
            let text: String = chars[start..i].iter().collect();
            toks.push(Tok::Num(py_number(&text).ok_or_else(|| format!("`{text}` is not a number Python reads"))?));
            continue;
        }
        if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            toks.push(match word.as_str() {
                "True" => Tok::Num(Num::Bool(true)),
                "False" => Tok::Num(Num::Bool(false)),
                "None" => Tok::Num(Num::None),
                "and" => Tok::Word("and"),
                "or" => Tok::Word("or"),
                "not" => Tok::Word("not"),
                _ => return Err(format!("name `{word}` (only literals and arithmetic are evaluated)")),
            });
            continue;
        }
        match OPS.iter().find(|op| chars[i..].iter().take(op.len()).copied().eq(op.chars())) {
            Some(op) => {
                toks.push(Tok::Op(op));
                i += op.len();
            }
            None => return Err(format!("`{c}` (only literals and arithmetic are evaluated)")),
        }
    }
    Ok(toks)
}

/// A Python numeric literal: decimal ints (no leading zeros), `0x`/`0o`/`0b`,
/// underscores between digits, floats; `j` (complex) is refused.
fn py_number(text: &str) -> Option<Num> {
    let lower = text.to_ascii_lowercase();
    for (prefix, radix) in [("0x", 16), ("0o", 8), ("0b", 2)] {
        if let Some(d) = lower.strip_prefix(prefix) {
            let d = d.strip_prefix('_').unwrap_or(d);
            if d.is_empty() || d.ends_with('_') || d.contains("__") {
                return None;
            }
            let cleaned: String = d.chars().filter(|&c| c != '_').collect();
            return i64::from_str_radix(&cleaned, radix).ok().map(Num::Int);
        }
    }
    let mant_end = lower.find('e').unwrap_or(lower.len());
    let (mant, exp) = lower.split_at(mant_end);
    let underscores_ok = |s: &str| s.is_empty() || digits_underscored(s);
    let (int, frac) = match mant.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (mant, None),
    };
    if !underscores_ok(int) || !frac.is_none_or(underscores_ok) || (int.is_empty() && frac.is_none_or(str::is_empty)) {
        return None;
    }
    if !exp.is_empty() {
        let e = exp[1..].trim_start_matches(['+', '-']);
        if !digits_underscored(e) || exp.len() - 1 - e.len() > 1 {
            return None;
        }
    }
    let cleaned: String = lower.chars().filter(|&c| c != '_').collect();
    if frac.is_none() && exp.is_empty() {
        // `012` is a syntax error in Python 3; `00` is zero.
        if cleaned.len() > 1 && cleaned.starts_with('0') && cleaned.chars().any(|c| c != '0') {
            return None;
        }
        // Beyond 64 bits: Python would give a big int.
        return cleaned.parse::<i64>().ok().map(Num::Int);
    }
    cleaned.parse::<f64>().ok().map(Num::Float)
}

struct ExprParser {
    toks: Vec<Tok>,
    pos: usize,
    depth: usize,
}

type E<T> = Result<T, (bool, String)>;

/// A refusal (outside what is evaluated) rather than a Python failure.
fn refused<T>(reason: impl Into<String>) -> E<T> {
    Err((true, reason.into()))
}

fn failed(reason: impl Into<String>) -> (bool, String) {
    (false, reason.into())
}

impl ExprParser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    fn eat_op(&mut self, op: &str) -> bool {
        if matches!(self.peek(), Some(Tok::Op(o)) if *o == op) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn eat_word(&mut self, w: &str) -> bool {
        if matches!(self.peek(), Some(Tok::Word(o)) if *o == w) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn enter(&mut self) -> E<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return refused(format!("nested deeper than {MAX_DEPTH}"));
        }
        Ok(())
    }

    // Python's precedence, lowest first: or, and, not, comparisons,
    // + -, * / // %, unary + - ~, **. Both sides are always evaluated
    // (no short-circuit side effects exist here), the result is Python's.
    fn or(&mut self) -> E<Num> {
        let mut v = self.and()?;
        while self.eat_word("or") {
            let r = self.and()?;
            if !v.truthy() {
                v = r;
            }
        }
        Ok(v)
    }

    fn and(&mut self) -> E<Num> {
        let mut v = self.not()?;
        while self.eat_word("and") {
            let r = self.not()?;
            if v.truthy() {
                v = r;
            }
        }
        Ok(v)
    }

    fn not(&mut self) -> E<Num> {
        if self.eat_word("not") {
            self.enter()?;
            let v = self.not()?;
            self.depth -= 1;
            return Ok(Num::Bool(!v.truthy()));
        }
        self.comparison()
    }

    fn comparison(&mut self) -> E<Num> {
        let mut left = self.sum()?;
        let mut result: Option<bool> = None;
        loop {
            let op = match self.peek() {
                Some(Tok::Op(o)) if matches!(*o, "==" | "!=" | "<" | "<=" | ">" | ">=") => *o,
                _ => break,
            };
            self.pos += 1;
            let right = self.sum()?;
            let ok = compare(op, left, right).map_err(failed)?;
            result = Some(result.unwrap_or(true) && ok);
            left = right;
        }
        Ok(match result {
            Some(b) => Num::Bool(b),
            None => left,
        })
    }

    fn sum(&mut self) -> E<Num> {
        let mut v = self.term()?;
        loop {
            let op = if self.eat_op("+") {
                BinOp::Add
            } else if self.eat_op("-") {
                BinOp::Sub
            } else {
                return Ok(v);
            };
            let r = self.term()?;
            v = arith(op, v, r).map_err(failed)?;
        }
    }

    fn term(&mut self) -> E<Num> {
        let mut v = self.unary()?;
        loop {
            let op = if self.eat_op("*") {
                BinOp::Mul
            } else if self.eat_op("//") {
                BinOp::FloorDiv
            } else if self.eat_op("/") {
                BinOp::Div
            } else if self.eat_op("%") {
                BinOp::Mod
            } else {
                return Ok(v);
            };
            let r = self.unary()?;
            v = arith(op, v, r).map_err(failed)?;
        }
    }

    fn unary(&mut self) -> E<Num> {
        for op in ["-", "+", "~"] {
            if self.eat_op(op) {
                self.enter()?;
                let v = self.unary()?;
                self.depth -= 1;
                let bad = || failed(format!("bad operand type for unary {op}: '{}'", v.type_name()));
                return match (op, v) {
                    ("-", Num::Float(f)) => Ok(Num::Float(-f)),
                    ("+", Num::Float(f)) => Ok(Num::Float(f)),
                    (_, Num::Float(_) | Num::None) => Err(bad()),
                    ("-", n) => Ok(Num::Int(n.as_int().unwrap_or(0).checked_neg().ok_or_else(|| failed(TOO_BIG))?)),
                    ("+", n) => Ok(Num::Int(n.as_int().unwrap_or(0))),
                    (_, n) => Ok(Num::Int(!n.as_int().unwrap_or(0))),
                };
            }
        }
        self.power()
    }

    fn power(&mut self) -> E<Num> {
        let base = self.atom()?;
        if self.eat_op("**") {
            // Right-associative, and binds tighter than a unary minus on
            // its left but not on its right: -2**2 == -4, 2**-1 == 0.5.
            self.enter()?;
            let exp = self.unary()?;
            self.depth -= 1;
            return arith(BinOp::Pow, base, exp).map_err(failed);
        }
        Ok(base)
    }

    fn atom(&mut self) -> E<Num> {
        match self.peek().cloned() {
            Some(Tok::Num(n)) => {
                self.pos += 1;
                if matches!(self.peek(), Some(Tok::Num(_)) | Some(Tok::Op("("))) {
                    return refused("a call or two literals in a row");
                }
                Ok(n)
            }
            Some(Tok::Op("(")) => {
                self.pos += 1;
                self.enter()?;
                let v = self.or()?;
                self.depth -= 1;
                if !self.eat_op(")") {
                    return refused("expected `)`");
                }
                Ok(v)
            }
            Some(t) => refused(format!("unexpected {t:?}")),
            None => refused("unexpected end of expression"),
        }
    }
}

/// `eval` of arithmetic over literals, with Python's results and errors.
pub(super) fn eval_expr(expr: &str) -> Result<Val, Problem> {
    let refuse = |reason: String| Problem::EvalRefused { expr: expr.to_string(), reason };
    if expr.chars().count() > MAX_EXPRESSION_CHARS {
        return Err(Problem::Limit(format!("an eval expression longer than {MAX_EXPRESSION_CHARS} chars")));
    }
    // Python's eval strips leading blanks and trailing whitespace.
    let toks = tokenize(expr.trim()).map_err(refuse)?;
    let mut p = ExprParser { toks, pos: 0, depth: 0 };
    let v = p.or().map_err(|(is_refusal, reason)| {
        if is_refusal {
            Problem::EvalRefused { expr: expr.to_string(), reason }
        } else {
            Problem::EvalFailed { expr: expr.to_string(), reason }
        }
    })?;
    if p.pos != p.toks.len() {
        return Err(refuse(format!("unexpected {:?}", p.toks[p.pos])));
    }
    Ok(v.into_val())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eval_python_semantics() {
        let ev = |s: &str| eval_expr(s).unwrap();
        assert_eq!(ev("-7//2"), Val::Int(-4));
        assert_eq!(ev("7//-2"), Val::Int(-4));
        assert_eq!(ev("-7%2"), Val::Int(1));
        assert_eq!(ev("7%-2"), Val::Int(-1));
        assert_eq!(ev("-7.5//2"), Val::Float(-4.0));
        assert_eq!(ev("-7.5%2"), Val::Float(0.5));
        assert_eq!(ev("2**-1"), Val::Float(0.5));
        assert_eq!(ev("-2**2"), Val::Int(-4));
        assert_eq!(ev("2**3**2"), Val::Int(512));
        assert_eq!(ev("10/4"), Val::Float(2.5));
        assert_eq!(ev("4/2"), Val::Float(2.0));
        assert_eq!(ev("1*True"), Val::Int(1));
        assert_eq!(ev("True+True"), Val::Int(2));
        assert_eq!(ev("not 1"), Val::Bool(false));
        assert_eq!(ev("1<2<3"), Val::Bool(true));
        assert_eq!(ev("0 or 5"), Val::Int(5));
        assert!(matches!(eval_expr("2**64"), Err(Problem::EvalFailed { .. })));
        assert!(matches!(eval_expr("1//0"), Err(Problem::EvalFailed { .. })));
        assert!(matches!(eval_expr("__import__('os')"), Err(Problem::EvalRefused { .. })));
        assert!(matches!(eval_expr("(1).real"), Err(Problem::EvalRefused { .. })));
        assert!(matches!(eval_expr("012"), Err(Problem::EvalRefused { .. })));
    }
}
