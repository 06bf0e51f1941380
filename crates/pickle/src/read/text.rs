//! Decoders for the operands of the protocol-0 text opcodes.

use crate::int;
use crate::{Operand, ReadProblem, Value};

/// CPython refuses to convert decimal strings longer than this
/// (`sys.int_info.default_max_str_digits`), so text `INT`/`LONG` longer
/// than this cannot come from a real pickler.
pub(super) const MAX_DECIMAL_DIGITS: usize = 4300;

/// `INT` operand: `00`/`01` are `False`/`True` (protocol 0 booleans), else a decimal of any size.
pub(super) fn int_operand(line: &[u8]) -> Result<Value, ReadProblem> {
    match line {
        b"00" => return Ok(Value::Bool(false)),
        b"01" => return Ok(Value::Bool(true)),
        _ => {}
    }
    decimal(line)
}

/// `LONG` operand: a decimal with an optional trailing `L`.
pub(super) fn long_operand(line: &[u8]) -> Result<Value, ReadProblem> {
    decimal(line.strip_suffix(b"L").unwrap_or(line))
}

/// A decimal integer with optional surrounding ASCII whitespace, as Python's `int()`.
fn decimal(text: &[u8]) -> Result<Value, ReadProblem> {
    let text = std::str::from_utf8(text.trim_ascii()).map_err(|_| ReadProblem::NotAscii(Operand::IntegerLiteral))?;
    match int::parse_decimal(text, MAX_DECIMAL_DIGITS) {
        Some(Ok(v)) => Ok(v),
        Some(Err(digits)) => Err(ReadProblem::TooManyDigits { digits, max: MAX_DECIMAL_DIGITS }),
        None => Err(malformed(Operand::IntegerLiteral, text)),
    }
}

/// A non-negative decimal memo key (`GET`/`PUT`).
pub(super) fn memo_key(line: &[u8]) -> Result<u64, ReadProblem> {
    let text = std::str::from_utf8(line.trim_ascii()).map_err(|_| ReadProblem::NotAscii(Operand::MemoKey))?;
    text.parse::<u64>().map_err(|_| malformed(Operand::MemoKey, text))
}

/// `FLOAT` operand: Python's `float()` syntax (`inf`, `nan`, exponents).
pub(super) fn float_operand(line: &[u8]) -> Result<f64, ReadProblem> {
    let text = std::str::from_utf8(line.trim_ascii()).map_err(|_| ReadProblem::NotAscii(Operand::FloatLiteral))?;
    text.parse::<f64>().map_err(|_| malformed(Operand::FloatLiteral, text))
}

/// `STRING` operand: a quoted Python 2 string literal, decoded like `codecs.escape_decode`.
pub(super) fn string_operand(line: &[u8]) -> Result<Vec<u8>, ReadProblem> {
    let inner = match line {
        [q @ (b'\'' | b'"'), inner @ .., last] if last == q => inner,
        _ => return Err(ReadProblem::UnquotedString),
    };
    escape_decode(inner)
}

/// CPython's `codecs.escape_decode` (`_PyBytes_DecodeEscape`).
fn escape_decode(s: &[u8]) -> Result<Vec<u8>, ReadProblem> {
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
            return Err(ReadProblem::TrailingBackslash);
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
                _ => return Err(ReadProblem::HexEscape(i - 2)),
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
pub(super) fn raw_unicode_escape_decode(s: &[u8]) -> Result<String, ReadProblem> {
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
        let digits = s.get(i..i + count).ok_or(ReadProblem::TruncatedEscape(char::from(e)))?;
        if !digits.iter().all(u8::is_ascii_hexdigit) {
            return Err(ReadProblem::MalformedEscape(char::from(e)));
        }
        i += count;
        let code = digits.iter().fold(0u32, |acc, &d| (acc << 4) | u32::from(hex_digit(d)));
        match char::from_u32(code) {
            Some(ch) => out.push(ch),
            None => return Err(ReadProblem::NotAChar { escape: char::from(e), code }),
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

/// A [`ReadProblem::MalformedLiteral`] quoting the first 40 characters of
/// `text` (a hostile line may be as long as the literal limit allows).
fn malformed(what: Operand, text: &str) -> ReadProblem {
    let text = match text.char_indices().nth(40) {
        Some((i, _)) => &text[..i],
        None => text,
    };
    ReadProblem::MalformedLiteral { what, text: text.into() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes() {
        assert_eq!(string_operand(br"'a\'b\\c\n\x41\101\0'").unwrap(), b"a'b\\c\nAA\0");
        assert_eq!(string_operand(b"\"x\"").unwrap(), b"x");
        assert_eq!(string_operand(br"'\q'").unwrap(), b"\\q");
        assert_eq!(string_operand(b"'x"), Err(ReadProblem::UnquotedString));
        assert_eq!(string_operand(b"'"), Err(ReadProblem::UnquotedString));
        assert_eq!(string_operand(br"'\x4'"), Err(ReadProblem::HexEscape(0)));
        assert_eq!(string_operand(br"'ab\x+1'"), Err(ReadProblem::HexEscape(2)));
        assert_eq!(string_operand(b"'\\'"), Err(ReadProblem::TrailingBackslash));
    }

    #[test]
    fn raw_unicode() {
        assert_eq!(raw_unicode_escape_decode(b"a\\u005cb\\u000a\xe9\\U0001f389").unwrap(), "a\\b\n\u{e9}\u{1f389}");
        assert_eq!(raw_unicode_escape_decode(b"\\\\u0041").unwrap(), "\\\\u0041");
        assert_eq!(raw_unicode_escape_decode(b"x\\").unwrap(), "x\\");
        assert_eq!(raw_unicode_escape_decode(b"\\u12"), Err(ReadProblem::TruncatedEscape('u')));
        assert_eq!(raw_unicode_escape_decode(b"\\u12g4"), Err(ReadProblem::MalformedEscape('u')));
        assert_eq!(raw_unicode_escape_decode(b"\\ud800"), Err(ReadProblem::NotAChar { escape: 'u', code: 0xd800 }));
        let past = raw_unicode_escape_decode(b"\\U00110000");
        assert_eq!(past, Err(ReadProblem::NotAChar { escape: 'U', code: 0x110000 }));
    }

    #[test]
    fn numbers() {
        assert_eq!(int_operand(b"01").unwrap(), Value::Bool(true));
        assert_eq!(int_operand(b"-5").unwrap(), Value::Int(-5));
        assert_eq!(long_operand(b"12L").unwrap(), Value::Int(12));
        assert_eq!(
            long_operand(&[b'9'; 5000]),
            Err(ReadProblem::TooManyDigits { digits: 5000, max: MAX_DECIMAL_DIGITS })
        );
        let long_junk = [b'x'; 100];
        assert_eq!(
            int_operand(&long_junk),
            Err(ReadProblem::MalformedLiteral { what: Operand::IntegerLiteral, text: "x".repeat(40).into() }),
            "quotes the first 40 characters"
        );
        assert_eq!(int_operand(b"\xff"), Err(ReadProblem::NotAscii(Operand::IntegerLiteral)));
        assert_eq!(float_operand(b"-0.0").unwrap().to_bits(), (-0.0f64).to_bits());
        assert!(float_operand(b"nan").unwrap().is_nan());
        assert_eq!(float_operand(b"-inf").unwrap(), f64::NEG_INFINITY);
        assert_eq!(memo_key(b"12").unwrap(), 12);
        assert_eq!(memo_key(b"-1"), Err(ReadProblem::MalformedLiteral { what: Operand::MemoKey, text: "-1".into() }));
        assert_eq!(
            float_operand(b"1.5x"),
            Err(ReadProblem::MalformedLiteral { what: Operand::FloatLiteral, text: "1.5x".into() })
        );
    }
}
