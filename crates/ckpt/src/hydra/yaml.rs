//! Loading YAML into the raw tree OmegaConf holds before resolution, and
//! typing its plain scalars as YAML 1.1 (PyYAML's SafeLoader) with
//! OmegaConf's extra float forms.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, EventReceiver, Parser};
use yaml_rust2::scanner::TScalarStyle;

use super::value::{py_str, Val};
use super::{HydraError, MAX_DEPTH};

/// A YAML node as OmegaConf holds it before resolution.
#[derive(Debug, Clone)]
pub(super) enum Raw {
    Scalar(Val),
    List(Vec<Raw>),
    Map(Vec<(String, Raw)>),
}

enum Frame {
    List(Vec<Raw>, usize),
    Map(Vec<(String, Raw)>, Option<String>, usize),
}

#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    anchors: HashMap<usize, Raw>,
    root: Option<Raw>,
    documents: usize,
    error: Option<String>,
}

impl Builder {
    fn push_value(&mut self, value: Raw, anchor: usize) {
        if anchor > 0 {
            self.anchors.insert(anchor, value.clone());
        }
        match self.stack.last_mut() {
            None => {
                if self.root.is_some() {
                    self.fail("more than one document".into());
                }
                self.root = Some(value);
            }
            Some(Frame::List(items, _)) => items.push(value),
            Some(Frame::Map(entries, pending, _)) => match pending.take() {
                Some(key) => entries.push((key, value)),
                None => match value {
                    Raw::Scalar(v) => {
                        let key = key_string(&v);
                        if entries.iter().any(|(k, _)| *k == key) {
                            self.fail(format!("duplicate key `{key}`"));
                        } else if key == "<<" {
                            self.fail("YAML merge keys (<<) are not supported".into());
                        } else if let Some(Frame::Map(_, pending, _)) = self.stack.last_mut() {
                            *pending = Some(key);
                        }
                    }
                    _ => self.fail("a mapping key that is not a scalar".into()),
                },
            },
        }
    }

    fn fail(&mut self, message: String) {
        if self.error.is_none() {
            self.error = Some(message);
        }
    }
}

impl EventReceiver for Builder {
    fn on_event(&mut self, ev: Event) {
        if self.error.is_some() {
            return;
        }
        match ev {
            Event::DocumentStart => {
                self.documents += 1;
                if self.documents > 1 {
                    self.fail("more than one document".into());
                }
            }
            Event::Alias(id) => match self.anchors.get(&id).cloned() {
                Some(v) => self.push_value(v, 0),
                None => self.fail(format!("alias to unknown anchor {id}")),
            },
            Event::Scalar(text, style, anchor, tag) => {
                if let Some(tag) = tag {
                    self.fail(format!("explicit tag `{}{}` is not supported", tag.handle, tag.suffix));
                    return;
                }
                let value = if style == TScalarStyle::Plain { plain_scalar(&text) } else { Ok(Val::Str(text)) };
                match value {
                    Ok(v) => self.push_value(Raw::Scalar(v), anchor),
                    Err(e) => self.fail(e),
                }
            }
            Event::SequenceStart(_, Some(_)) | Event::MappingStart(_, Some(_)) => {
                self.fail("explicit tags on containers are not supported".into());
            }
            Event::SequenceStart(anchor, _) => {
                if self.stack.len() >= MAX_DEPTH {
                    self.fail(format!("containers nested deeper than {MAX_DEPTH}"));
                } else {
                    self.stack.push(Frame::List(Vec::new(), anchor));
                }
            }
            Event::MappingStart(anchor, _) => {
                if self.stack.len() >= MAX_DEPTH {
                    self.fail(format!("containers nested deeper than {MAX_DEPTH}"));
                } else {
                    self.stack.push(Frame::Map(Vec::new(), None, anchor));
                }
            }
            Event::SequenceEnd | Event::MappingEnd => match self.stack.pop() {
                Some(Frame::List(items, anchor)) => self.push_value(Raw::List(items), anchor),
                Some(Frame::Map(entries, _, anchor)) => self.push_value(Raw::Map(entries), anchor),
                None => self.fail("unbalanced container end".into()),
            },
            _ => {}
        }
    }
}

pub(super) fn load_yaml(text: &str, file: &str) -> Result<Raw, HydraError> {
    let yaml_error = |message: String| HydraError::Yaml { file: file.to_string(), message };
    let mut builder = Builder::default();
    let mut parser = Parser::new_from_str(text);
    parser.load(&mut builder, true).map_err(|e| yaml_error(e.to_string()))?;
    if let Some(message) = builder.error {
        return Err(yaml_error(message));
    }
    // An empty file is an empty config, as OmegaConf.load makes it.
    Ok(builder.root.unwrap_or(Raw::Map(Vec::new())))
}

/// A mapping key as `json.dumps` writes the key Python read.
fn key_string(v: &Val) -> String {
    match v {
        Val::Null => "null".into(),
        Val::Bool(b) => if *b { "true" } else { "false" }.into(),
        other => py_str(other).unwrap_or_default(),
    }
}

/// Types a plain (unquoted) scalar as PyYAML's SafeLoader with OmegaConf's
/// loader tweaks does: YAML 1.1 nulls and bools (`yes`, `off`), ints in
/// 1.1's bases (`0o` is not one: `017` is octal) and sexagesimal, floats by
/// PyYAML's pattern or OmegaConf's added one (`1e-3`, `1_000.5`), no
/// timestamps.
fn plain_scalar(s: &str) -> Result<Val, String> {
    match s {
        "" | "~" | "null" | "Null" | "NULL" => return Ok(Val::Null),
        "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => return Ok(Val::Bool(true)),
        "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => return Ok(Val::Bool(false)),
        _ => {}
    }
    if is_yaml_int(s) {
        return yaml_int(s).map(Val::Int).ok_or_else(|| format!("integer `{s}` beyond 64 bits"));
    }
    if is_yaml_float(s) {
        return yaml_float(s).map(Val::Float).ok_or_else(|| format!("cannot read float `{s}`"));
    }
    Ok(Val::Str(s.to_string()))
}

pub(super) fn strip_sign(s: &str) -> (bool, &str) {
    match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    }
}

pub(super) fn all(s: &str, f: impl Fn(char) -> bool) -> bool {
    !s.is_empty() && s.chars().all(f)
}

/// `[0-5]?[0-9]` sexagesimal parts after the first.
fn sexagesimal_tail(parts: &[&str]) -> bool {
    !parts.is_empty()
        && parts.iter().all(|p| {
            let b = p.as_bytes();
            match b.len() {
                1 => b[0].is_ascii_digit(),
                2 => (b'0'..=b'5').contains(&b[0]) && b[1].is_ascii_digit(),
                _ => false,
            }
        })
}

/// PyYAML's int pattern.
fn is_yaml_int(s: &str) -> bool {
    let (_, u) = strip_sign(s);
    if let Some(b) = u.strip_prefix("0b") {
        return all(b, |c| c == '0' || c == '1' || c == '_');
    }
    if let Some(h) = u.strip_prefix("0x") {
        return all(h, |c| c.is_ascii_hexdigit() || c == '_');
    }
    if u == "0" {
        return true;
    }
    if let Some(o) = u.strip_prefix('0') {
        return all(o, |c| ('0'..='7').contains(&c) || c == '_');
    }
    let parts: Vec<&str> = u.split(':').collect();
    let head = parts[0];
    let head_ok = head.starts_with(|c: char| ('1'..='9').contains(&c)) && all(head, |c| c.is_ascii_digit() || c == '_');
    head_ok && (parts.len() == 1 || sexagesimal_tail(&parts[1..]))
}

fn yaml_int(s: &str) -> Option<i64> {
    let cleaned: String = s.chars().filter(|&c| c != '_').collect();
    let (neg, u) = strip_sign(&cleaned);
    let magnitude: i128 = if u == "0" {
        0
    } else if let Some(b) = u.strip_prefix("0b") {
        i128::from_str_radix(b, 2).ok()?
    } else if let Some(h) = u.strip_prefix("0x") {
        i128::from_str_radix(h, 16).ok()?
    } else if let Some(o) = u.strip_prefix('0') {
        i128::from_str_radix(o, 8).ok()?
    } else if u.contains(':') {
        let mut v: i128 = 0;
        for part in u.split(':') {
            v = v.checked_mul(60)?.checked_add(part.parse::<i128>().ok()?)?;
        }
        v
    } else {
        u.parse::<i128>().ok()?
    };
    i64::try_from(if neg { -magnitude } else { magnitude }).ok()
}

/// `[0-9]+(?:_[0-9]+)*`: OmegaConf's integer part.
pub(super) fn digits_underscored(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('_')
        && !s.ends_with('_')
        && !s.contains("__")
        && all(s, |c| c.is_ascii_digit() || c == '_')
}

/// `[eE][-+]?[0-9]+`, with the sign required when `signed`.
fn exponent(s: &str, signed: bool) -> bool {
    let Some(rest) = s.strip_prefix(['e', 'E']) else { return false };
    let (had_sign, digits) = match rest.as_bytes().first() {
        Some(b'-' | b'+') => (true, &rest[1..]),
        _ => (false, rest),
    };
    (had_sign || !signed) && all(digits, |c| c.is_ascii_digit())
}

/// The union of PyYAML's float pattern and the one OmegaConf's loader adds
/// (both are tried; ints were tried before either could claim a string).
fn is_yaml_float(s: &str) -> bool {
    if matches!(s, ".nan" | ".NaN" | ".NAN") {
        return true;
    }
    let (_, u) = strip_sign(s);
    if matches!(u, ".inf" | ".Inf" | ".INF") {
        return true;
    }
    let split_exp = |t: &str| match t.find(['e', 'E']) {
        Some(i) => (t[..i].to_string(), Some(t[i..].to_string())),
        None => (t.to_string(), None),
    };
    // Unsigned-start forms: `\.[0-9_]+(e[-+]N)?` (PyYAML) and
    // `\.[0-9]+(_[0-9]+)*(e[-+]N)?` (OmegaConf), both without a sign.
    if let Some(frac) = s.strip_prefix('.') {
        let (mant, exp) = split_exp(frac);
        let exp_ok = exp.as_deref().is_none_or(|e| exponent(e, true));
        return all(&mant, |c| c.is_ascii_digit() || c == '_') && exp_ok;
    }
    // Sexagesimal: `[0-9][0-9_]*(:[0-5]?[0-9])+\.[0-9_]*`.
    if u.contains(':') {
        let Some((sexa, frac)) = u.split_once('.') else { return false };
        let parts: Vec<&str> = sexa.split(':').collect();
        return parts[0].starts_with(|c: char| c.is_ascii_digit())
            && all(parts[0], |c| c.is_ascii_digit() || c == '_')
            && sexagesimal_tail(&parts[1..])
            && frac.chars().all(|c| c.is_ascii_digit() || c == '_');
    }
    let (mant, exp) = split_exp(u);
    match mant.split_once('.') {
        Some((int, frac)) => {
            let frac_ok = frac.chars().all(|c| c.is_ascii_digit() || c == '_');
            // PyYAML: `[0-9][0-9_]*\.[0-9_]*([eE][-+][0-9]+)?`
            let pyyaml = int.starts_with(|c: char| c.is_ascii_digit())
                && all(int, |c| c.is_ascii_digit() || c == '_')
                && frac_ok
                && exp.as_deref().is_none_or(|e| exponent(e, true));
            // OmegaConf: `[0-9]+(_[0-9]+)*\.[0-9_]*([eE][-+]?[0-9]+)?`
            let omegaconf = digits_underscored(int) && frac_ok && exp.as_deref().is_none_or(|e| exponent(e, false));
            pyyaml || omegaconf
        }
        // OmegaConf: `[0-9]+(_[0-9]+)*[eE][-+]?[0-9]+`
        None => digits_underscored(&mant) && exp.as_deref().is_some_and(|e| exponent(e, false)),
    }
}

/// PyYAML's float constructor.
fn yaml_float(s: &str) -> Option<f64> {
    let cleaned: String = s.chars().filter(|&c| c != '_').collect::<String>().to_lowercase();
    let (neg, u) = strip_sign(&cleaned);
    let sign = if neg { -1.0 } else { 1.0 };
    if u == ".inf" {
        return Some(sign * f64::INFINITY);
    }
    if u == ".nan" {
        return Some(f64::NAN);
    }
    if u.contains(':') {
        let mut v = 0.0f64;
        for part in u.split(':') {
            v = v * 60.0 + part.parse::<f64>().ok()?;
        }
        return Some(sign * v);
    }
    u.parse::<f64>().ok().map(|v| sign * v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_scalars_typed_as_pyyaml_with_omegaconf_floats() {
        let t = |s: &str| plain_scalar(s).unwrap();
        assert_eq!(t("5"), Val::Int(5));
        assert_eq!(t("5.0"), Val::Float(5.0));
        assert_eq!(t("1e-3"), Val::Float(1e-3));
        assert_eq!(t("1.0e5"), Val::Float(1e5));
        assert_eq!(t("0x1f"), Val::Int(31));
        assert_eq!(t("017"), Val::Int(15));
        assert_eq!(t("1:30"), Val::Int(90));
        assert_eq!(t("1_000"), Val::Int(1000));
        assert_eq!(t("yes"), Val::Bool(true));
        assert_eq!(t("Off"), Val::Bool(false));
        assert_eq!(t("~"), Val::Null);
        assert_eq!(t("0o17"), Val::Str("0o17".into()));
        assert_eq!(t("1e"), Val::Str("1e".into()));
        assert!(matches!(t(".inf"), Val::Float(f) if f.is_infinite()));
    }
}
