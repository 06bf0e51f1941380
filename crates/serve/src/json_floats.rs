//! Tensor data in JSON: reading it (nested or flat arrays of numbers,
//! including the non-standard `NaN` / `Infinity` literals Triton accepts)
//! and writing it (shortest round-trip digits; non-finite values as those
//! literals).
//!
//! Why this is written here: serde_json follows RFC 8259 strictly, so it
//! rejects `NaN` and writes non-finite floats as `null`, which would
//! silently turn a NaN output into "no value". Triton parses and writes
//! them with rapidjson's NaN/Inf flags, and `tritonclient` (python-rapidjson)
//! sends `NaN` for a NaN input in JSON mode. No maintained serde-compatible
//! Rust parser accepts them without losing the value (json-forensics maps
//! them to 0), so a request that fails to parse is retried once after
//! [`quote_non_finite`] has turned those literals into strings, which
//! [`FloatData`] reads back as the values they name.

use serde::de::{DeserializeSeed, Deserializer, Error as _, SeqAccess, Visitor};

/// A tensor's elements, flattened in row-major order, as float32.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FloatData(pub Vec<f32>);

impl<'de> serde::Deserialize<'de> for FloatData {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut out = Vec::new();
        d.deserialize_any(Flatten { out: &mut out, depth: 0 })?;
        Ok(FloatData(out))
    }
}

/// Nesting deeper than this is refused (a tensor has at most a few dims).
const MAX_DEPTH: usize = 32;

/// Appends every number of a (nested) array to `out`.
struct Flatten<'a> {
    out: &'a mut Vec<f32>,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for Flatten<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

/// The value a non-finite literal names (`NaN`, `Inf`, `Infinity`, `-Inf`, `-Infinity`).
pub fn non_finite_literal(s: &str) -> Option<f32> {
    match s {
        "NaN" => Some(f32::NAN),
        "Inf" | "Infinity" => Some(f32::INFINITY),
        "-Inf" | "-Infinity" => Some(f32::NEG_INFINITY),
        _ => None,
    }
}

impl<'de> Visitor<'de> for Flatten<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array of numbers (flat or nested, row-major)")
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<(), E> {
        self.out.push(v as f32);
        Ok(())
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<(), E> {
        self.out.push(v as f32);
        Ok(())
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<(), E> {
        self.out.push(v as f32);
        Ok(())
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
        match non_finite_literal(v) {
            Some(x) => {
                self.out.push(x);
                Ok(())
            }
            None => Err(E::custom(format!("the string {} is not a number", serde_json::Value::from(v)))),
        }
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<(), E> {
        Err(E::custom(format!("{v} is not a number (FP32 data)")))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if self.depth >= MAX_DEPTH {
            return Err(A::Error::custom(format!("data nested deeper than {MAX_DEPTH} levels")));
        }
        if let Some(n) = seq.size_hint() {
            self.out.reserve(n);
        }
        while seq.next_element_seed(Flatten { out: &mut *self.out, depth: self.depth + 1 })?.is_some() {}
        Ok(())
    }
}

/// `text` with every `NaN`, `Infinity`, `-Infinity`, `Inf`, `-Inf` outside
/// strings quoted (`"NaN"`), or `None` when there is none. Outside strings
/// no other JSON token starts with `N` or `I`, so the scan needs no grammar:
/// it tracks string boundaries (and backslash escapes) only.
pub fn quote_non_finite(text: &[u8]) -> Option<Vec<u8>> {
    const WORDS: [&[u8]; 3] = [b"NaN", b"Infinity", b"Inf"];
    let mut out = Vec::with_capacity(text.len() + 64);
    let (mut i, mut in_string, mut changed) = (0, false, false);
    while i < text.len() {
        let c = text[i];
        if in_string {
            out.push(c);
            match c {
                b'\\' if i + 1 < text.len() => {
                    out.push(text[i + 1]);
                    i += 1;
                }
                b'"' => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        if c == b'"' {
            in_string = true;
            out.push(c);
            i += 1;
            continue;
        }
        let neg = c == b'-' && matches!(text.get(i + 1), Some(b'I'));
        let start = if neg { i + 1 } else { i };
        if let Some(w) = WORDS.iter().find(|w| text[start..].starts_with(w)) {
            out.push(b'"');
            out.extend_from_slice(&text[i..start + w.len()]);
            out.push(b'"');
            i = start + w.len();
            changed = true;
            continue;
        }
        out.push(c);
        i += 1;
    }
    changed.then_some(out)
}

/// Appends `data` as a JSON array: shortest digits that read back to the
/// same float32 (ryu), non-finite values as `NaN`, `Infinity`, `-Infinity`.
pub fn write_array(out: &mut Vec<u8>, data: &[f32]) {
    let mut buf = ryu::Buffer::new();
    out.push(b'[');
    for (i, &v) in data.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        if v.is_finite() {
            out.extend_from_slice(buf.format_finite(v).as_bytes());
        } else if v.is_nan() {
            out.extend_from_slice(b"NaN");
        } else if v > 0.0 {
            out.extend_from_slice(b"Infinity");
        } else {
            out.extend_from_slice(b"-Infinity");
        }
    }
    out.push(b']');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_and_flat_arrays_flatten_row_major() {
        let a: FloatData = serde_json::from_str("[[1, 2.5], [-3e2, 4]]").unwrap();
        assert_eq!(a.0, [1.0, 2.5, -300.0, 4.0]);
        let b: FloatData = serde_json::from_str("[1, 2.5, -300, 4]").unwrap();
        assert_eq!(a, b);
        assert!(serde_json::from_str::<FloatData>("[true]").is_err());
        assert!(serde_json::from_str::<FloatData>("[\"x\"]").is_err());
        let deep = format!("{}1{}", "[".repeat(40), "]".repeat(40));
        assert!(serde_json::from_str::<FloatData>(&deep).unwrap_err().to_string().contains("deeper"));
    }

    #[test]
    fn non_finite_literals_are_quoted_outside_strings_only() {
        let text = br#"{"id": "NaN Infinity \" NaN", "data": [NaN, -Infinity, Infinity, 1, -Inf, Inf]}"#;
        let q = quote_non_finite(text).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&q).unwrap();
        assert_eq!(v["id"], "NaN Infinity \" NaN");
        let d: FloatData = serde_json::from_value(v["data"].clone()).unwrap();
        assert!(d.0[0].is_nan());
        assert_eq!(&d.0[1..], [f32::NEG_INFINITY, f32::INFINITY, 1.0, f32::NEG_INFINITY, f32::INFINITY]);
        assert_eq!(quote_non_finite(br#"{"a": [1, 2], "b": "NaN"}"#), None);
    }

    #[test]
    fn written_floats_read_back_exactly() {
        let xs = [0.1f32, 1.0, -2.5e-8, 3.4028235e38, f32::MIN_POSITIVE, 1.0e-45, 123456.79];
        let mut out = Vec::new();
        write_array(&mut out, &xs);
        let back: Vec<f32> = serde_json::from_slice(&out).unwrap();
        assert_eq!(back.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), xs.map(f32::to_bits));
        let mut out = Vec::new();
        write_array(&mut out, &[f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
        assert_eq!(out, b"[NaN,Infinity,-Infinity]");
    }
}
