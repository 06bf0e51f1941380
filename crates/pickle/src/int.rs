//! Integers of any width as little-endian two's-complement bytes (the `LONG1` / `LONG4` payload).

use crate::Value;

/// `bytes` without its redundant high bytes: the shortest two's-complement
/// encoding of the same number (empty for zero, as Python's `encode_long`).
pub(crate) fn minimal(bytes: &[u8]) -> &[u8] {
    let mut len = bytes.len();
    while len > 0 {
        let top = bytes[len - 1];
        let below_negative = len >= 2 && bytes[len - 2] & 0x80 != 0;
        let redundant = match top {
            0x00 => len == 1 || !below_negative,
            0xff => len >= 2 && below_negative,
            _ => false,
        };
        if !redundant {
            break;
        }
        len -= 1;
    }
    &bytes[..len]
}

/// The integer encoded by `bytes` (any length, sign-extended): [`Value::Int`]
/// when it fits an `i64`, else [`Value::BigInt`] with its minimal encoding.
pub(crate) fn from_le(bytes: &[u8]) -> Value {
    let bytes = minimal(bytes);
    if bytes.len() <= 8 {
        let fill = if bytes.last().is_some_and(|b| b & 0x80 != 0) { 0xff } else { 0x00 };
        let mut buf = [fill; 8];
        buf[..bytes.len()].copy_from_slice(bytes);
        Value::Int(i64::from_le_bytes(buf))
    } else {
        Value::BigInt(bytes.to_vec())
    }
}

/// The minimal two's-complement encoding of `v` (empty for zero).
pub(crate) fn i64_to_le(v: i64) -> Vec<u8> {
    minimal(&v.to_le_bytes()).to_vec()
}

/// Parses an optionally signed decimal integer (ASCII digits, `_` not
/// allowed) of at most `max_digits` digits. `None` when malformed; `Err`
/// with the digit count when too long.
pub(crate) fn parse_decimal(text: &str, max_digits: usize) -> Option<Result<Value, usize>> {
    let (negative, digits) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if digits.len() > max_digits {
        return Some(Err(digits.len()));
    }
    if let Ok(v) = text.parse::<i64>() {
        return Some(Ok(Value::Int(v)));
    }
    // Magnitude in base 2^32 limbs, little-endian, built 9 digits at a time.
    let mut limbs: Vec<u32> = Vec::new();
    for chunk in digits.as_bytes().chunks(9) {
        let mut chunk_value = 0u64;
        for &d in chunk {
            chunk_value = chunk_value * 10 + u64::from(d - b'0');
        }
        let mut carry = chunk_value;
        let scale = 10u64.pow(chunk.len() as u32);
        for limb in &mut limbs {
            let x = u64::from(*limb) * scale + carry;
            *limb = x as u32;
            carry = x >> 32;
        }
        while carry != 0 {
            limbs.push(carry as u32);
            carry >>= 32;
        }
    }
    let mut bytes: Vec<u8> = limbs.iter().flat_map(|l| l.to_le_bytes()).collect();
    bytes.push(0); // room for the sign bit
    if negative {
        negate(&mut bytes);
    }
    Some(Ok(from_le(&bytes)))
}

/// Two's-complement negation in place (wrapping at the current width).
fn negate(bytes: &mut [u8]) {
    let mut carry = true;
    for b in bytes {
        let (v, c) = (!*b).overflowing_add(u8::from(carry));
        *b = v;
        carry = c;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_strips_only_redundant_bytes() {
        assert_eq!(minimal(&[]), &[] as &[u8]);
        assert_eq!(minimal(&[0]), &[] as &[u8]);
        assert_eq!(minimal(&[0xff]), &[0xff]);
        assert_eq!(minimal(&[0xff, 0xff]), &[0xff]);
        assert_eq!(minimal(&[0x80, 0x00]), &[0x80, 0x00]);
        assert_eq!(minimal(&[0x7f, 0xff]), &[0x7f, 0xff]);
        assert_eq!(minimal(&[0x80, 0xff, 0xff]), &[0x80]);
        assert_eq!(minimal(&[1, 0, 0, 0]), &[1]);
    }

    #[test]
    fn from_le_sign_extends() {
        assert_eq!(from_le(&[]), Value::Int(0));
        assert_eq!(from_le(&[0xff]), Value::Int(-1));
        assert_eq!(from_le(&[0xff, 0x00]), Value::Int(255));
        // -2**40 in 6 bytes
        assert_eq!(from_le(&[0, 0, 0, 0, 0, 0xff]), Value::Int(-(1 << 40)));
        assert_eq!(from_le(&(-(1i64 << 40)).to_le_bytes()), Value::Int(-(1 << 40)));
        // 2**64
        assert_eq!(from_le(&[0, 0, 0, 0, 0, 0, 0, 0, 1]), Value::BigInt(vec![0, 0, 0, 0, 0, 0, 0, 0, 1]));
        assert_eq!(from_le(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0xff, 0xff]), Value::Int(i64::MIN));
    }

    #[test]
    fn i64_round_trip() {
        for v in [0, 1, -1, 127, 128, -128, -129, 255, 256, i64::MAX, i64::MIN, 1 << 40, -(1 << 40)] {
            assert_eq!(from_le(&i64_to_le(v)), Value::Int(v), "{v}");
        }
        assert_eq!(i64_to_le(128), vec![0x80, 0]);
        assert_eq!(i64_to_le(-128), vec![0x80]);
    }

    #[test]
    fn decimal() {
        assert_eq!(parse_decimal("0", 10), Some(Ok(Value::Int(0))));
        assert_eq!(parse_decimal("-17", 10), Some(Ok(Value::Int(-17))));
        assert_eq!(parse_decimal("+5", 10), Some(Ok(Value::Int(5))));
        assert_eq!(parse_decimal("", 10), None);
        assert_eq!(parse_decimal("-", 10), None);
        assert_eq!(parse_decimal("1x", 10), None);
        assert_eq!(parse_decimal("12345", 3), Some(Err(5)));
        assert_eq!(
            parse_decimal("18446744073709551616", 100),
            Some(Ok(Value::BigInt(vec![0, 0, 0, 0, 0, 0, 0, 0, 1])))
        );
        assert_eq!(
            parse_decimal("-18446744073709551616", 100),
            Some(Ok(Value::BigInt(vec![0, 0, 0, 0, 0, 0, 0, 0, 0xff])))
        );
        assert_eq!(parse_decimal("-9223372036854775808", 100), Some(Ok(Value::Int(i64::MIN))));
        assert_eq!(
            parse_decimal("9223372036854775808", 100),
            Some(Ok(Value::BigInt(vec![0, 0, 0, 0, 0, 0, 0, 0x80, 0])))
        );
    }
}
