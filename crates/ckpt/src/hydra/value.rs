//! The values resolution works on, as Python holds them: Python's `str()`
//! and float `repr`, and the conversion to JSON.

use serde_json::{Map, Number, Value as Json};

use super::Problem;

/// A value during resolution: what Python would hold.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Val {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<Val>),
    Dict(Vec<(String, Val)>),
}

impl Val {
    pub(super) fn type_name(&self) -> &'static str {
        match self {
            Val::Null => "NoneType",
            Val::Bool(_) => "bool",
            Val::Int(_) => "int",
            Val::Float(_) => "float",
            Val::Str(_) => "str",
            Val::List(_) => "list",
            Val::Dict(_) => "dict",
        }
    }

    pub(super) fn truthy(&self) -> bool {
        match self {
            Val::Null => false,
            Val::Bool(b) => *b,
            Val::Int(i) => *i != 0,
            Val::Float(f) => *f != 0.0,
            Val::Str(s) => !s.is_empty(),
            Val::List(l) => !l.is_empty(),
            Val::Dict(d) => !d.is_empty(),
        }
    }
}

/// Python's `repr(float)`: the shortest digits that round-trip, fixed
/// notation for exponents -4..16, `1e+16` style beyond.
pub(super) fn py_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    let sci = format!("{:e}", f);
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (neg, mant) = match mant.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mant),
    };
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    let sign = if neg { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let body = if exp < 0 {
            format!("0.{}{}", "0".repeat((-exp - 1) as usize), digits)
        } else if n > exp + 1 {
            format!("{}.{}", &digits[..(exp + 1) as usize], &digits[(exp + 1) as usize..])
        } else {
            format!("{}{}.0", digits, "0".repeat((exp + 1 - n) as usize))
        };
        format!("{sign}{body}")
    } else {
        let rest = &digits[1..];
        let m = if rest.is_empty() { digits[..1].to_string() } else { format!("{}.{}", &digits[..1], rest) };
        format!("{sign}{m}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
    }
}

/// Python's `str()` of a scalar; containers are refused (OmegaConf would
/// print their Python repr into the string, which no config wants).
pub(super) fn py_str(v: &Val) -> Result<String, Problem> {
    Ok(match v {
        Val::Null => "None".into(),
        Val::Bool(b) => if *b { "True" } else { "False" }.into(),
        Val::Int(i) => i.to_string(),
        Val::Float(f) => py_float_repr(*f),
        Val::Str(s) => s.clone(),
        Val::List(_) | Val::Dict(_) => {
            return Err(Problem::Unrepresentable(format!("a {} interpolated into a string", v.type_name())))
        }
    })
}

pub(super) type Fail = (String, Problem);

fn to_json_at(v: &Val, key: &mut Vec<String>) -> Result<Json, Fail> {
    Ok(match v {
        Val::Null => Json::Null,
        Val::Bool(b) => Json::Bool(*b),
        Val::Int(i) => Json::Number((*i).into()),
        Val::Float(f) => match Number::from_f64(*f) {
            Some(n) => Json::Number(n),
            None => {
                return Err((
                    dotted(key),
                    Problem::Unrepresentable(format!("float {} has no JSON form", py_float_repr(*f))),
                ))
            }
        },
        Val::Str(s) => Json::String(s.clone()),
        Val::List(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                key.push(i.to_string());
                out.push(to_json_at(item, key)?);
                key.pop();
            }
            Json::Array(out)
        }
        Val::Dict(entries) => {
            let mut out = Map::new();
            for (k, item) in entries {
                key.push(k.clone());
                out.insert(k.clone(), to_json_at(item, key)?);
                key.pop();
            }
            Json::Object(out)
        }
    })
}

pub(super) fn to_json(v: &Val) -> Result<Json, Fail> {
    to_json_at(v, &mut Vec::new())
}

pub(super) fn dotted(path: &[String]) -> String {
    path.join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        for (f, s) in [
            (0.5, "0.5"),
            (3.0, "3.0"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (123456789012345.6, "123456789012345.6"),
            (-2.5, "-2.5"),
            (0.1 + 0.2, "0.30000000000000004"),
            (1e-3, "0.001"),
        ] {
            assert_eq!(py_float_repr(f), s);
        }
    }
}
