//! Decoders for the operands of the protocol-0 text opcodes.

use crate::int;
use crate::Value;

/// CPython refuses to convert decimal strings longer than this
/// (`sys.int_info.default_max_str_digits`), so text `INT`/`LONG` longer
/// than this cannot come from a real pickler.
pub(super) const MAX_DECIMAL_DIGITS: usize = 4300;

/// `INT` operand: `00`/`01` are `False`/`True` (protocol 0 booleans), else a decimal of any size.
pub(super) fn int_operand(line: &[u8]) -> Result<Value, String> {
    match line {
        b"00" => return Ok(Value::Bool(false)),
        b"01" => return Ok(Value::Bool(true)),
        _ => {}
    }
    decimal(line)
}

/// `LONG` operand: a decimal with an optional trailing `L`.
pub(super) fn long_operand(line: &[u8]) -> Result<Value, String> {
    decimal(line.strip_suffix(b"L").unwrap_or(line))
}

/// A decimal integer with optional surrounding ASCII whitespace, as Python's `int()`.
fn decimal(text: &[u8]) -> Result<Value, String> {
    let text = std::str::from_utf8(text.trim_ascii()).map_err(|_| "integer literal is not ASCII".to_owned())?;
    match int::parse_decimal(text, MAX_DECIMAL_DIGITS) {
        Some(Ok(v)) => Ok(v),
        Some(Err(n)) => Err(format!("integer literal has {n} digits (more than Python's {MAX_DECIMAL_DIGITS})")),
        None => Err(format!("malformed integer literal {:?}", truncated(text))),
    }
}

/// A non-negative decimal memo key (`GET`/`PUT`).
pub(super) fn memo_key(line: &[u8]) -> Result<u64, String> {
    let text = std::str::from_utf8(line.trim_ascii()).map_err(|_| "memo key is not ASCII".to_owned())?;
    text.parse::<u64>().map_err(|_| format!("malformed memo key {:?}", truncated(text)))
}

/// `FLOAT` operand: Python's `float()` syntax (`inf`, `nan`, exponents).
pub(super) fn float_operand(line: &[u8]) -> Result<f64, String> {
    let text = std::str::from_utf8(line.trim_ascii()).map_err(|_| "float literal is not ASCII".to_owned())?;
    text.parse::<f64>().map_err(|_| format!("malformed float literal {:?}", truncated(text)))
}

/// `STRING` operand: a quoted Python 2 string literal, decoded like `codecs.escape_decode`.
pub(super) fn string_operand(line: &[u8]) -> Result<Vec<u8>, String> {
    let inner = match line {
        [q @ (b'\'' | b'"'), inner @ .., last] if last == q => inner,
        _ => return Err("the STRING opcode argument must be quoted".to_owned()),
    };
    escape_decode(inner)
}

/// CPython's `codecs.escape_decode` (`_PyBytes_DecodeEscape`).
fn escape_decode(s: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        i += 1;
        if c != b'\\' {
            out.push(c);
            continue;
        }
        let Some(&e) = s.get(i) else {
            return Err("trailing \\ in string".to_owned());
        };
        i += 1;
        match e {
            b'\n' => {}
            b'\\' | b'\'' | b'"' => out.push(e),
            b'b' => out.push(0x08),
            b'f' => out.push(0x0c),
            b't' => out.push(b'\t'),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b'v' => out.push(0x0b),
            b'a' => out.push(0x07),
            b'0'..=b'7' => {
                let mut v = u32::from(e - b'0');
                for _ in 0..2 {
                    match s.get(i) {
                        Some(&d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push((v & 0xff) as u8);
            }
            b'x' => match s.get(i..i + 2) {
                Some(&[hi, lo]) if hi.is_ascii_hexdigit() && lo.is_ascii_hexdigit() => {
                    out.push((hex_digit(hi) << 4) | hex_digit(lo));
                    i += 2;
                }
                _ => return Err(format!("invalid \\x escape at position {}", i - 2)),
            },
            other => {
                out.push(b'\\');
                out.push(other);
            }
        }
    }
    Ok(out)
}

/// `UNICODE` operand: CPython's `raw-unicode-escape` decoding (latin-1
/// bytes plus `\uXXXX` / `\UXXXXXXXX` escapes).
pub(super) fn raw_unicode_escape_decode(s: &[u8]) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        i += 1;
        if c != b'\\' || i == s.len() {
            out.push(char::from(c));
            continue;
        }
        let e = s[i];
        i += 1;
        let count = match e {
            b'u' => 4,
            b'U' => 8,
            _ => {
                out.push('\\');
                out.push(char::from(e));
                continue;
            }
        };
        let digits = s.get(i..i + count).ok_or_else(|| format!("truncated \\{} escape", char::from(e)))?;
        if !digits.iter().all(u8::is_ascii_hexdigit) {
            return Err(format!("malformed \\{} escape", char::from(e)));
        }
        i += count;
        let code = digits.iter().fold(0u32, |acc, &d| (acc << 4) | u32::from(hex_digit(d)));
        match char::from_u32(code) {
            Some(ch) => out.push(ch),
            None => return Err(format!("escape \\{}{:x} is a surrogate or out of range", char::from(e), code)),
        }
    }
    Ok(out)
}

/// The value of an ASCII hex digit (0 for anything else; callers check first).
fn hex_digit(d: u8) -> u8 {
    match d {
        b'0'..=b'9' => d - b'0',
        b'a'..=b'f' => d - b'a' + 10,
        b'A'..=b'F' => d - b'A' + 10,
        _ => 0,
    }
}

/// The first 40 characters of `s`, for error messages.
fn truncated(s: &str) -> &str {
    match s.char_indices().nth(40) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes() {
        assert_eq!(string_operand(br"'a\'b\\c\n\x41\101\0'").unwrap(), b"a'b\\c\nAA\0");
        assert_eq!(string_operand(b"\"x\"").unwrap(), b"x");
        assert_eq!(string_operand(br"'\q'").unwrap(), b"\\q");
        assert!(string_operand(b"'x").is_err());
        assert!(string_operand(b"'").is_err());
        assert!(string_operand(br"'\x4'").is_err());
        assert!(string_operand(br"'\x+1'").is_err());
        assert!(string_operand(b"'\\'").is_err());
    }

    #[test]
    fn raw_unicode() {
        assert_eq!(raw_unicode_escape_decode(b"a\\u005cb\\u000a\xe9\\U0001f389").unwrap(), "a\\b\n\u{e9}\u{1f389}");
        assert_eq!(raw_unicode_escape_decode(b"\\\\u0041").unwrap(), "\\\\u0041");
        assert_eq!(raw_unicode_escape_decode(b"x\\").unwrap(), "x\\");
        assert!(raw_unicode_escape_decode(b"\\u12").is_err());
        assert!(raw_unicode_escape_decode(b"\\ud800").is_err());
        assert!(raw_unicode_escape_decode(b"\\U00110000").is_err());
    }

    #[test]
    fn numbers() {
        assert_eq!(int_operand(b"01").unwrap(), Value::Bool(true));
        assert_eq!(int_operand(b"-5").unwrap(), Value::Int(-5));
        assert_eq!(long_operand(b"12L").unwrap(), Value::Int(12));
        assert!(long_operand(&[b'9'; 5000]).is_err());
        assert_eq!(float_operand(b"-0.0").unwrap().to_bits(), (-0.0f64).to_bits());
        assert!(float_operand(b"nan").unwrap().is_nan());
        assert_eq!(float_operand(b"-inf").unwrap(), f64::NEG_INFINITY);
        assert_eq!(memo_key(b"12").unwrap(), 12);
        assert!(memo_key(b"-1").is_err());
    }
}
