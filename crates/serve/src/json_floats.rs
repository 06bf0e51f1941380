//! Tensor data in JSON: reading it (nested or flat arrays of numbers, or
//! of integers for INT64 data,
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
//! [`read_data`] reads back as the values they name. Only literals that are
//! elements of an input's `data` are quoted: anywhere else (`{"id": NaN}`,
//! a key `Infinity`) they stay what RFC 8259 says they are, an error.

use serde::de::{DeserializeSeed, Deserializer, Error as _, SeqAccess, Visitor};

/// A tensor's elements, flattened in row-major order, as float32.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FloatData(pub Vec<f32>);

impl<'de> serde::Deserialize<'de> for FloatData {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut out = Vec::new();
        d.deserialize_any(Flatten { out: &mut out, depth: 0, cap: usize::MAX })?;
        Ok(FloatData(out))
    }
}

/// Why [`read_data`] refused a tensor's data.
#[derive(Debug)]
pub enum DataError {
    /// More than `cap` values.
    TooMany,
    /// Not an array of numbers (serde_json's error, with the column).
    Json(serde_json::Error),
}

/// Reads a tensor's JSON data (flat or nested), at most `cap` values: one
/// more is refused as it is read, so the values never take more than
/// `cap` floats, nor more than one float per two bytes of `raw`.
///
/// Each number is rounded once, to the float32 nearest the decimal sent
/// (see `read_elements`); what is not an array of numbers and
/// non-finite literals is refused with serde_json's message.
pub fn read_data(raw: &serde_json::value::RawValue, cap: usize) -> Result<Vec<f32>, DataError> {
    let text = raw.get();
    // every value takes at least two bytes of JSON (a digit and a separator)
    let mut out = Vec::with_capacity(cap.min(text.len() / 2 + 1));
    if read_elements(text, cap, &mut out) {
        return Ok(out);
    }
    // serde_json says what is wrong (and reads, through float64, anything
    // valid the scan did not take: nothing that is known)
    out.clear();
    read_data_serde(text, cap, out)
}

/// [`read_data`] through serde_json's number model (see [`Flatten`]).
fn read_data_serde(text: &str, cap: usize, mut out: Vec<f32>) -> Result<Vec<f32>, DataError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let r = Flatten { out: &mut out, depth: 0, cap }.deserialize(&mut de).and_then(|()| de.end());
    match r {
        Ok(()) => Ok(out),
        Err(_) if out.len() == cap && cap < usize::MAX => Err(DataError::TooMany),
        Err(e) => Err(DataError::Json(e)),
    }
}

/// Nesting deeper than this is refused (a tensor has at most a few dims).
const MAX_DEPTH: usize = 32;

/// Reads `text`, valid JSON, into `out` when it is a number, a non-finite
/// literal string, or arrays (nested at most [`MAX_DEPTH`] deep) of those,
/// at most `cap` values, each number within float64's range: true then.
/// False otherwise (another string, `true`, `null`, an object, a number
/// past float64's range, too many values, too deep), leaving `out` partly
/// filled; [`read_data`] then has serde_json name what is wrong.
///
/// Why by hand: serde_json hands a visitor every number as a float64, and
/// rounding that to float32 rounds twice. Shortest float32 digits (what
/// [`write_array`] and many clients write) then come back one ulp off for
/// two of the 2^32 float32s: `7.038531e-26` is 0x15ae43fd, but its nearest
/// float64 lies exactly halfway between 0x15ae43fd and 0x15ae43fe and rounds
/// to the even one. Here each number's text is rounded straight to float32
/// ([`number_f32`]), so every float32 written as its shortest float32 or
/// float64 digits reads back with its bits (tested for all of them,
/// `--ignored`), and any decimal becomes the float32 nearest it; at the
/// speed of serde_json's path (measured under JSON load).
fn read_elements(text: &str, cap: usize, out: &mut Vec<f32>) -> bool {
    let b = text.as_bytes();
    let (mut i, mut depth) = (0, 0usize);
    while i < b.len() {
        let value = match b[i] {
            b' ' | b'\t' | b'\n' | b'\r' | b',' => {
                i += 1;
                continue;
            }
            b'[' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return false;
                }
                i += 1;
                continue;
            }
            b']' => {
                let Some(d) = depth.checked_sub(1) else { return false };
                depth = d;
                i += 1;
                continue;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < b.len() && matches!(b[i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') {
                    i += 1;
                }
                // ASCII, so a slice at character boundaries
                match number_f32(&text[start..i]) {
                    Some(v) => v,
                    None => return false,
                }
            }
            b'"' => {
                let start = i;
                i += 1;
                let mut escaped = false;
                while i < b.len() && b[i] != b'"' {
                    // an escape takes the next byte with it (`\"` does not end the string)
                    escaped |= b[i] == b'\\';
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                if i >= b.len() {
                    return false;
                }
                i += 1;
                let literal = if escaped {
                    match serde_json::from_str::<String>(&text[start..i]) {
                        Ok(s) => non_finite_literal(&s),
                        Err(_) => None,
                    }
                } else {
                    non_finite_literal(&text[start + 1..i - 1])
                };
                match literal {
                    Some(v) => v,
                    None => return false,
                }
            }
            _ => return false,
        };
        if out.len() == cap {
            return false;
        }
        out.push(value);
    }
    depth == 0
}

/// A JSON number's float32, rounded once from its decimal value; None past
/// float64's range, which serde_json refuses (`1e39` is infinity, as a
/// float32 of any float64 that large is; `1e309` is an error).
fn number_f32(token: &str) -> Option<f32> {
    if let Some(v) = exact_case_f32(token) {
        return Some(v);
    }
    let v: f32 = token.parse().ok()?;
    if v.is_infinite() && !token.parse::<f64>().ok()?.is_finite() {
        return None;
    }
    Some(v)
}

/// [`number_f32`] for most numbers clients send, at a fraction of
/// `str::parse`'s cost: Clinger's exact case. A significand within 53 bits
/// and a power of ten within 10^22 are both float64s, so one division or
/// multiplication gives the float64 nearest the decimal; that rounds to the
/// float32 nearest the decimal too, unless it is exactly a float32 midpoint
/// (the decimal may then lie on either side of it: None, and `str::parse`
/// decides). None for anything else.
fn exact_case_f32(token: &str) -> Option<f32> {
    let b = token.as_bytes();
    let (negative, rest) = match b.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, b),
    };
    let (mut significand, mut fraction_digits, mut in_fraction, mut i) = (0u64, 0i32, false, 0);
    while i < rest.len() {
        match rest[i] {
            d @ b'0'..=b'9' => {
                significand = significand.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
                fraction_digits += i32::from(in_fraction);
            }
            b'.' => in_fraction = true,
            _ => break,
        }
        i += 1;
    }
    let exponent = match &rest[i..] {
        [] => 0,
        [b'e' | b'E', e @ ..] => {
            let (sign, digits) = match e {
                [b'-', d @ ..] => (-1, d),
                [b'+', d @ ..] => (1, d),
                d => (1, d),
            };
            if digits.is_empty() || digits.len() > 3 {
                return None;
            }
            sign * digits.iter().try_fold(0i32, |a, &d| d.is_ascii_digit().then(|| a * 10 + i32::from(d - b'0')))?
        }
        _ => return None,
    };
    let e = exponent - fraction_digits;
    if significand > 1 << 53 || !(-22..=22).contains(&e) {
        return None;
    }
    let m = significand as f64;
    let y = if e < 0 { m / POWERS_OF_TEN[e.unsigned_abs() as usize] } else { m * POWERS_OF_TEN[e as usize] };
    // y is within float32's normal range (1e-22 to 9e37 or zero): no overflow, no subnormal
    let x = y as f32;
    let xd = f64::from(x);
    if xd != y {
        let other = if xd < y { x.next_up() } else { x.next_down() };
        if (xd + f64::from(other)) * 0.5 == y {
            return None;
        }
    }
    Some(if negative { -x } else { x })
}

/// 10^0 to 10^22, every one exactly a float64.
const POWERS_OF_TEN: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20,
    1e21, 1e22,
];

/// Appends every number of a (nested) array to `out`.
struct Flatten<'a> {
    out: &'a mut Vec<f32>,
    depth: usize,
    /// Most values.
    cap: usize,
}

impl Flatten<'_> {
    fn push<E: serde::de::Error>(self, v: f32) -> Result<(), E> {
        if self.out.len() == self.cap {
            return Err(E::custom(format_args!("more than {} values", self.cap)));
        }
        self.out.push(v);
        Ok(())
    }
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
        self.push(v as f32)
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<(), E> {
        self.push(v as f32)
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<(), E> {
        self.push(v as f32)
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
        match non_finite_literal(v) {
            Some(x) => self.push(x),
            None => Err(E::custom(format_args!("the string {} is not a number", crate::error::clip_json(v)))),
        }
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<(), E> {
        Err(E::custom(format!("{v} is not a number (FP32 data)")))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if self.depth >= MAX_DEPTH {
            return Err(A::Error::custom(format!("data nested deeper than {MAX_DEPTH} levels")));
        }
        while seq.next_element_seed(Flatten { out: &mut *self.out, depth: self.depth + 1, cap: self.cap })?.is_some() {}
        Ok(())
    }
}

/// What is wrong with one element of INT64 JSON data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntProblem {
    /// A fraction, an exponent, a string, a bool or null: not an integer
    /// (as Triton's reader, which takes only JSON integers for INT64).
    NotInteger,
    /// An integer outside `[-2^63, 2^63)`.
    OutOfRange,
}

impl std::fmt::Display for IntProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IntProblem::NotInteger => "is not an integer",
            IntProblem::OutOfRange => "is outside the int64 range",
        })
    }
}

/// What is wrong with one element of BOOL JSON data: it is not `true` or `false`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotBool;

impl std::fmt::Display for NotBool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("is not true or false")
    }
}

/// Why [`read_ints`] or [`read_bools`] refused a tensor's data.
#[derive(Debug)]
pub enum ElementsError<P> {
    /// More than `cap` values.
    TooMany,
    /// Element `index` (row-major) is not one of the datatype's: its JSON text, clipped, and why.
    Element {
        /// Its row-major position.
        index: usize,
        /// What was sent.
        value: String,
        /// What is wrong with it.
        problem: P,
    },
    /// Not an array (serde_json's error, with the column).
    Json(serde_json::Error),
}

/// [`read_ints`]' refusal.
pub type IntDataError = ElementsError<IntProblem>;
/// [`read_bools`]' refusal.
pub type BoolDataError = ElementsError<NotBool>;

/// Reads INT64 tensor data (flat or nested arrays of JSON integers), at
/// most `cap` values, as [`read_data`] reads FP32 data: a value that is
/// not a JSON integer in the int64 range is refused with its position.
pub fn read_ints(raw: &serde_json::value::RawValue, cap: usize) -> Result<Vec<i64>, IntDataError> {
    // every value takes at least two bytes of JSON (a digit and a separator)
    read_typed::<Int64>(raw, cap, 2)
}

/// Reads BOOL tensor data (flat or nested arrays of JSON `true` and
/// `false`, as Triton takes BOOL data), at most `cap` values, as float32
/// 1.0 and 0.0; any other element is refused with its position.
pub fn read_bools(raw: &serde_json::value::RawValue, cap: usize) -> Result<Vec<f32>, BoolDataError> {
    // every value takes at least five bytes of JSON (`true,`)
    read_typed::<Bool>(raw, cap, 5)
}

/// One JSON scalar of tensor data, as serde hands it over.
#[derive(Clone, Copy)]
enum Scalar<'s> {
    I64(i64),
    U64(u64),
    F64(f64),
    Str(&'s str),
    Bool(bool),
    Null,
}

impl Scalar<'_> {
    /// Its JSON text (clipped for a string), for a refusal.
    fn text(self) -> String {
        match self {
            Scalar::I64(v) => v.to_string(),
            Scalar::U64(v) => v.to_string(),
            Scalar::F64(v) => ryu::Buffer::new().format(v).to_owned(),
            Scalar::Str(v) => crate::error::clip_json(v),
            Scalar::Bool(v) => v.to_string(),
            Scalar::Null => "null".into(),
        }
    }
}

/// A datatype whose JSON data [`read_typed`] reads: what each scalar
/// becomes, or why it is refused.
trait Element {
    /// The value stored.
    type Out;
    /// Why a scalar is refused.
    type Problem: std::fmt::Display + Copy;
    /// The value of one scalar, or why it is refused.
    fn take(s: Scalar<'_>) -> Result<Self::Out, Self::Problem>;
}

/// INT64: JSON integers in range.
struct Int64;

impl Element for Int64 {
    type Out = i64;
    type Problem = IntProblem;
    fn take(s: Scalar<'_>) -> Result<i64, IntProblem> {
        match s {
            Scalar::I64(v) => Ok(v),
            Scalar::U64(v) => i64::try_from(v).map_err(|_| IntProblem::OutOfRange),
            // serde_json reads integers past the u64 / i64 range as floats
            Scalar::F64(v) if v.fract() == 0.0 && v.abs() >= 2f64.powi(63) => Err(IntProblem::OutOfRange),
            _ => Err(IntProblem::NotInteger),
        }
    }
}

/// BOOL: JSON `true` and `false`, as float32 1.0 and 0.0.
struct Bool;

impl Element for Bool {
    type Out = f32;
    type Problem = NotBool;
    fn take(s: Scalar<'_>) -> Result<f32, NotBool> {
        match s {
            Scalar::Bool(v) => Ok(if v { 1.0 } else { 0.0 }),
            _ => Err(NotBool),
        }
    }
}

/// The elements of `raw` (flat or nested arrays), at most `cap`, each at
/// least `min_bytes` of JSON (sizing the first allocation).
fn read_typed<E: Element>(
    raw: &serde_json::value::RawValue,
    cap: usize,
    min_bytes: usize,
) -> Result<Vec<E::Out>, ElementsError<E::Problem>> {
    let text = raw.get();
    let mut out = Vec::with_capacity(cap.min(text.len() / min_bytes + 1));
    let mut bad = None;
    let mut de = serde_json::Deserializer::from_str(text);
    let r = Elements::<E> { out: &mut out, bad: &mut bad, depth: 0, cap }.deserialize(&mut de).and_then(|()| de.end());
    match (r, bad) {
        (Ok(()), _) => Ok(out),
        (Err(_), Some((index, value, problem))) => Err(ElementsError::Element { index, value, problem }),
        (Err(_), None) if out.len() == cap && cap < usize::MAX => Err(ElementsError::TooMany),
        (Err(e), None) => Err(ElementsError::Json(e)),
    }
}

/// Appends every element of a (nested) array to `out`; the first scalar
/// refused is kept in `bad` (index, text, problem).
struct Elements<'a, E: Element> {
    out: &'a mut Vec<E::Out>,
    bad: &'a mut Option<(usize, String, E::Problem)>,
    depth: usize,
    cap: usize,
}

impl<E: Element> Elements<'_, E> {
    fn scalar<Er: serde::de::Error>(self, s: Scalar<'_>) -> Result<(), Er> {
        match E::take(s) {
            Ok(_) if self.out.len() == self.cap => Err(Er::custom(format_args!("more than {} values", self.cap))),
            Ok(v) => {
                self.out.push(v);
                Ok(())
            }
            Err(problem) => {
                let (index, value) = (self.out.len(), s.text());
                let e = Er::custom(format_args!("element {index} ({value}) {problem}"));
                *self.bad = Some((index, value, problem));
                Err(e)
            }
        }
    }
}

impl<'de, E: Element> DeserializeSeed<'de> for Elements<'_, E> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, E: Element> Visitor<'de> for Elements<'_, E> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array of the datatype's values (flat or nested, row-major)")
    }

    fn visit_i64<Er: serde::de::Error>(self, v: i64) -> Result<(), Er> {
        self.scalar(Scalar::I64(v))
    }

    fn visit_u64<Er: serde::de::Error>(self, v: u64) -> Result<(), Er> {
        self.scalar(Scalar::U64(v))
    }

    fn visit_f64<Er: serde::de::Error>(self, v: f64) -> Result<(), Er> {
        self.scalar(Scalar::F64(v))
    }

    fn visit_str<Er: serde::de::Error>(self, v: &str) -> Result<(), Er> {
        self.scalar(Scalar::Str(v))
    }

    fn visit_bool<Er: serde::de::Error>(self, v: bool) -> Result<(), Er> {
        self.scalar(Scalar::Bool(v))
    }

    fn visit_unit<Er: serde::de::Error>(self) -> Result<(), Er> {
        self.scalar(Scalar::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if self.depth >= MAX_DEPTH {
            return Err(A::Error::custom(format!("data nested deeper than {MAX_DEPTH} levels")));
        }
        while seq
            .next_element_seed(Elements::<E> {
                out: &mut *self.out,
                bad: &mut *self.bad,
                depth: self.depth + 1,
                cap: self.cap,
            })?
            .is_some()
        {}
        Ok(())
    }
}

/// Appends `data` as a JSON array of integers.
pub fn write_int_array(out: &mut Vec<u8>, data: &[i64]) {
    let mut buf = itoa::Buffer::new();
    out.push(b'[');
    for (i, &v) in data.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(buf.format(v).as_bytes());
    }
    out.push(b']');
}

/// Deepest nesting [`quote_non_finite`] follows; past it the request is
/// left as it is (serde_json refuses nesting past 128 levels anyway).
const MAX_SCAN_DEPTH: usize = 64;

/// What encloses the byte being scanned.
#[derive(Clone, Copy)]
enum Frame {
    /// An object; `key` is the range of the current key's text (between
    /// its quotes), `at_key` whether a key comes next.
    Object { key: (usize, usize), at_key: bool },
    /// An array.
    Array,
}

/// Whether the frames are those of an element of an input's `data`:
/// the request object at key `inputs`, its array, an input object at key
/// `data`, then arrays only (the innermost one holding the element).
fn in_data(text: &[u8], stack: &[Frame]) -> bool {
    let key_is = |f: &Frame, k: &[u8]| matches!(f, Frame::Object { key: (a, b), at_key: false } if &text[*a..*b] == k);
    match stack {
        [top, Frame::Array, input, rest @ ..] => {
            key_is(top, b"inputs")
                && key_is(input, b"data")
                && !rest.is_empty()
                && rest.iter().all(|f| matches!(f, Frame::Array))
        }
        _ => false,
    }
}

/// `text` with every `NaN`, `Infinity`, `-Infinity`, `Inf`, `-Inf` that
/// is an element of an input's `data` array (`inputs[i].data`, nested or
/// flat) quoted (`"NaN"`), or `None` when there is none. A literal
/// anywhere else is left alone, and so refused by the JSON parser. The
/// scan follows strings (and their escapes), objects' keys and nesting,
/// nothing more: on JSON it cannot follow it changes nothing, and the
/// parser refuses the request.
pub fn quote_non_finite(text: &[u8]) -> Option<Vec<u8>> {
    const WORDS: [&[u8]; 3] = [b"NaN", b"Infinity", b"Inf"];
    let mut out: Option<Vec<u8>> = None;
    let mut copied = 0; // text[..copied] is in `out` (once there is one)
    let mut stack: Vec<Frame> = Vec::new();
    let mut i = 0;
    while i < text.len() {
        let c = text[i];
        match c {
            b'"' => {
                let start = i + 1;
                let mut j = start;
                while j < text.len() && text[j] != b'"' {
                    j += if text[j] == b'\\' { 2 } else { 1 };
                }
                let end = j.min(text.len());
                if let Some(Frame::Object { key, at_key: true }) = stack.last_mut() {
                    *key = (start, end);
                }
                i = end + 1;
                continue;
            }
            b'{' | b'[' => {
                if stack.len() == MAX_SCAN_DEPTH {
                    return None;
                }
                stack.push(if c == b'{' { Frame::Object { key: (0, 0), at_key: true } } else { Frame::Array });
            }
            b'}' | b']' => {
                stack.pop();
            }
            b':' => {
                if let Some(Frame::Object { at_key, .. }) = stack.last_mut() {
                    *at_key = false;
                }
            }
            b',' => {
                if let Some(Frame::Object { at_key, .. }) = stack.last_mut() {
                    *at_key = true;
                }
            }
            b'N' | b'I' | b'-' => {
                let start = if c == b'-' { i + 1 } else { i };
                let word = WORDS.iter().find(|w| text.get(start..).is_some_and(|t| t.starts_with(w)));
                if let Some(w) = word {
                    let end = start + w.len();
                    if in_data(text, &stack) {
                        let o = out.get_or_insert_with(|| Vec::with_capacity(text.len() + 64));
                        o.extend_from_slice(&text[copied..i]);
                        o.push(b'"');
                        o.extend_from_slice(&text[i..end]);
                        o.push(b'"');
                        copied = end;
                    }
                    i = end;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    let mut o = out?;
    o.extend_from_slice(&text[copied..]);
    Some(o)
}

/// The float32 whose shortest digits, read as a float64 and then rounded
/// to float32 (Python's `json` then `numpy.float32`, serde_json), come back
/// one ulp off: `7.038531e-26` (and its negative). The only one of all
/// 2^32 (checked, `--ignored`).
const TWICE_ROUNDED: u32 = 0x15ae_43fd;

/// What [`write_array`] writes for [`TWICE_ROUNDED`]: one digit more, well
/// inside its rounding interval (not near a float32 midpoint), so that both
/// kinds of reader get its bits; 14 characters with the sign, within the 15
/// [`crate::encode::answer_bound`] counts for a JSON float.
const TWICE_ROUNDED_TEXT: &str = "7.0385307e-26";

/// Appends `data` as a JSON array: shortest digits that read back to the
/// same float32 (ryu), non-finite values as `NaN`, `Infinity`, `-Infinity`.
/// The one float32 whose shortest digits a reader going through float64
/// gets wrong (`TWICE_ROUNDED`) is written with a digit more
/// (`TWICE_ROUNDED_TEXT`), so that such readers, too, get every value's bits.
pub fn write_array(out: &mut Vec<u8>, data: &[f32]) {
    let mut buf = ryu::Buffer::new();
    out.push(b'[');
    for (i, &v) in data.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        if v.abs().to_bits() == TWICE_ROUNDED {
            if v < 0.0 {
                out.push(b'-');
            }
            out.extend_from_slice(TWICE_ROUNDED_TEXT.as_bytes());
        } else if v.is_finite() {
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
    use proptest::prelude::*;

    fn raw(text: &str) -> Box<serde_json::value::RawValue> {
        serde_json::value::RawValue::from_string(text.to_owned()).unwrap()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn numbers_round_once_to_the_nearest_float32() {
        // the float32 whose shortest digits round twice through float64
        let x = f32::from_bits(0x15ae_43fd);
        let back = read_data(&raw("[7.038531e-26,-7.038531e-26]"), 2).unwrap();
        assert_eq!(bits(&back), [0x15ae_43fd, 0x95ae_43fd]);
        // through float64 it is one ulp off (what reading it as serde_json's number did)
        assert_eq!((7.038531e-26f64 as f32).to_bits(), 0x15ae_43fe);
        // so the server writes it with a digit more, which readers going through float64 get right too
        let mut text = Vec::new();
        write_array(&mut text, &[x, -x, 1.5]);
        let text = String::from_utf8(text).unwrap();
        assert_eq!(text, "[7.0385307e-26,-7.0385307e-26,1.5]");
        let through_f64: Vec<f64> = serde_json::from_str(&text).unwrap();
        assert_eq!(bits(&through_f64.iter().map(|&v| v as f32).collect::<Vec<_>>()), bits(&[x, -x, 1.5]));
        assert_eq!(bits(&read_data(&raw(&text), 3).unwrap()), bits(&[x, -x, 1.5]));
        // its float64 digits (what a client holding float64s writes) read back too
        let text = format!("[{}]", f64::from(x));
        assert_eq!(bits(&read_data(&raw(&text), 1).unwrap()), [0x15ae_43fd]);
        // integers of every size (16777217 and 16777219 are float32 midpoints:
        // ties to even), -0, the ends of float32's range, underflow
        let cases: [(&str, f32); 13] = [
            ("16777219", 16_777_220.0),
            ("33554434", 33_554_432.0),
            ("16777217", 16_777_216.0),
            ("-16777219", -16_777_220.0),
            ("-0", -0.0),
            ("123456789012345678901234567890", 1.234_567_9e29),
            ("3.4028235e38", f32::MAX),
            // float32's largest and the midpoint past it (3.40282357e38), where overflow starts
            ("3.40282356e38", f32::MAX),
            ("3.4028236e38", f32::INFINITY),
            ("1e39", f32::INFINITY),
            ("-1e39", f32::NEG_INFINITY),
            ("1e-46", 0.0),
            ("1.4e-45", f32::from_bits(1)),
        ];
        for (t, want) in cases {
            assert_eq!(bits(&read_data(&raw(&format!("[{t}]")), 1).unwrap()), [want.to_bits()], "{t}");
        }
    }

    #[test]
    fn data_of_every_shape_reads_and_the_rest_is_refused_as_before() {
        let read = |t: &str, cap: usize| read_data(&raw(t), cap).map(|v| bits(&v));
        let want = bits(&[1.0, 2.5, -300.0, 4.0]);
        for t in ["[[1, 2.5], [-3e2, 4]]", "[1,2.5,-300,4]", " [ [ [1] ] ,\n[2.5,[-3E+2]],4 ] ", "[[1],2.5,[-300,[4]]]"]
        {
            assert_eq!(read(t, 4).unwrap(), want, "{t}");
        }
        assert_eq!(read("7", 1).unwrap(), [7.0f32.to_bits()]);
        assert_eq!(read("[]", 0).unwrap(), Vec::<u32>::new());
        // non-finite literals as quote_non_finite leaves them, escaped or not
        let v = read_data(&raw(r#"["NaN", "-Infinity", "Inf", "N\u0061N", -1]"#), 5).unwrap();
        assert!(v[0].is_nan() && v[3].is_nan());
        assert_eq!(bits(&v[1..3]), bits(&[f32::NEG_INFINITY, f32::INFINITY]));
        assert_eq!(v[4], -1.0);
        // refused with serde_json's messages: strings, literals, objects, out of range, too deep, too many
        let message = |t: &str, cap: usize| match read_data(&raw(t), cap) {
            Err(DataError::Json(e)) => e.to_string(),
            other => panic!("{t}: {other:?}"),
        };
        assert!(message(r#"[1, "x"]"#, 9).contains("the string \"x\" is not a number"));
        assert!(message(r#"[1, "a\"b"]"#, 9).contains("is not a number"));
        assert!(message("[true]", 9).contains("true is not a number"));
        assert!(message("[null]", 9).contains("null"));
        assert!(message("[{}]", 9).contains("map"));
        assert!(message("[1e309]", 9).contains("number out of range"));
        let deep = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        assert_eq!(read(&deep(MAX_DEPTH), 1).unwrap(), [1.0f32.to_bits()]);
        assert!(message(&deep(MAX_DEPTH + 1), 9).contains("deeper"));
        assert!(matches!(read_data(&raw("[1, 2, 3]"), 2), Err(DataError::TooMany)));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

        /// Any float32, written as its shortest float32 digits or as its
        /// float64's, reads back with its bits.
        #[test]
        fn written_float32s_read_back_with_their_bits(b in any::<u32>()) {
            let x = f32::from_bits(b);
            prop_assume!(x.is_finite());
            let mut text = Vec::new();
            write_array(&mut text, &[x]);
            let text = String::from_utf8(text).unwrap();
            prop_assert_eq!(bits(&read_data(&raw(&text), 1).unwrap()), [b], "{}", text);
            let text = format!("[{}]", f64::from(x));
            prop_assert_eq!(bits(&read_data(&raw(&text), 1).unwrap()), [b], "{}", text);
        }

        /// Integers between 2^24 and 2^53, where every other odd one is a
        /// float32 midpoint (the exact case's float64 is then exact and on
        /// the midpoint), and decimals of up to 16 digits with an exponent,
        /// read as std's correctly rounded parse reads them.
        #[test]
        fn midpoints_and_short_decimals_read_as_the_nearest_float32(
            n in (1u64 << 24)..(1u64 << 53),
            m in 0u64..10_000_000_000_000_000,
            e in -30i32..30,
            negative in any::<bool>(),
        ) {
            let sign = if negative { "-" } else { "" };
            // a float32 midpoint's 15 and 16 significant digits: the nearest
            // float64 is often the midpoint itself, with the decimal on either side
            let x = f32::from_bits(0x3580_0000 + (m % 0x1400_0000) as u32);
            let midpoint = (f64::from(x) + f64::from(x.next_up())) / 2.0;
            for text in [
                format!("{sign}{n}"),
                format!("{sign}{m}e{e}"),
                format!("{sign}0.{m:016}"),
                format!("{sign}{midpoint:.14e}"),
                format!("{sign}{midpoint:.15e}"),
            ] {
                let want: f32 = text.parse().unwrap();
                prop_assert_eq!(bits(&read_data(&raw(&format!("[{text}]")), 1).unwrap()), [want.to_bits()], "{}", text);
            }
        }

        /// Any decimal reads as the float32 nearest it (std's correctly
        /// rounded parse), or is refused past float64's range.
        #[test]
        fn decimals_read_as_the_nearest_float32(
            text in "-?(0|[1-9][0-9]{0,30})(\\.[0-9]{1,30})?([eE][-+]?[0-9]{1,3})?",
        ) {
            let want: f32 = text.parse().unwrap();
            match read_data(&raw(&format!("[{text}]")), 1) {
                Ok(v) => prop_assert_eq!(bits(&v), [want.to_bits()], "{}", text),
                Err(_) => prop_assert!(!text.parse::<f64>().unwrap().is_finite(), "{} refused", text),
            }
        }
    }

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
    fn non_finite_literals_are_quoted_in_input_data_only() {
        let text = br#"{"id": "NaN Infinity \" NaN", "inputs": [{"name": "o", "data": [[NaN, -Infinity], [Infinity, 1, -Inf, Inf]]}]}"#;
        let q = quote_non_finite(text).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&q).unwrap();
        assert_eq!(v["id"], "NaN Infinity \" NaN");
        let d: FloatData = serde_json::from_value(v["inputs"][0]["data"].clone()).unwrap();
        assert!(d.0[0].is_nan());
        assert_eq!(&d.0[1..], [f32::NEG_INFINITY, f32::INFINITY, 1.0, f32::NEG_INFINITY, f32::INFINITY]);
        assert_eq!(quote_non_finite(br#"{"a": [1, 2], "b": "NaN"}"#), None);
        // anywhere else the literals stay as they are: not JSON
        for other in [
            &br#"{"id": NaN, "inputs": []}"#[..],
            br#"{"inputs": [{"name": "o", "shape": [NaN], "data": [1]}]}"#,
            br#"{"inputs": [{"name": "o", "data": NaN}]}"#,
            br#"{"inputs": [{"name": "o", "data": [{"x": NaN}]}]}"#,
            br#"{"data": [NaN], "inputs": []}"#,
            br#"{"inputs": [{"name": "o", "data": [1], Infinity: 2}]}"#,
            br#"{"parameters": {"p": [NaN]}, "inputs": []}"#,
        ] {
            assert_eq!(quote_non_finite(other), None, "{}", String::from_utf8_lossy(other));
        }
    }

    #[test]
    fn data_is_read_up_to_its_cap() {
        let raw: Box<serde_json::value::RawValue> = serde_json::from_str("[[1, 2], [3, \"NaN\"]]").unwrap();
        let v = read_data(&raw, 4).unwrap();
        assert_eq!(v[..3], [1.0, 2.0, 3.0]);
        assert!(v[3].is_nan());
        assert!(matches!(read_data(&raw, 3), Err(DataError::TooMany)));
        let raw: Box<serde_json::value::RawValue> = serde_json::from_str("[1, true]").unwrap();
        assert!(
            matches!(read_data(&raw, 9), Err(DataError::Json(e)) if e.to_string().contains("true is not a number"))
        );
    }

    #[test]
    fn int_data_takes_json_integers_only_and_names_the_element() {
        let read = |t: &str, cap| {
            let raw: Box<serde_json::value::RawValue> = serde_json::from_str(t).unwrap();
            read_ints(&raw, cap)
        };
        assert_eq!(
            read("[[0, -3], [9223372036854775807, -9223372036854775808]]", 4).unwrap(),
            [0, -3, i64::MAX, i64::MIN]
        );
        let element = |t: &str| match read(t, 9) {
            Err(IntDataError::Element { index, value, problem }) => (index, value, problem),
            other => panic!("{t}: {other:?}"),
        };
        assert_eq!(element("[1, 2.5]"), (1, "2.5".into(), IntProblem::NotInteger));
        assert_eq!(element("[[1], [2, 3.0]]"), (2, "3.0".into(), IntProblem::NotInteger));
        assert_eq!(element("[1e2]"), (0, "100.0".into(), IntProblem::NotInteger));
        assert_eq!(element("[\"7\"]"), (0, "\"7\"".into(), IntProblem::NotInteger));
        assert_eq!(element("[0, true]"), (1, "true".into(), IntProblem::NotInteger));
        assert_eq!(element("[0, null]"), (1, "null".into(), IntProblem::NotInteger));
        assert_eq!(element("[9223372036854775808]"), (0, "9223372036854775808".into(), IntProblem::OutOfRange));
        assert_eq!(element("[-9223372036854775809]").2, IntProblem::OutOfRange);
        assert!(matches!(read("[1, 2, 3]", 2), Err(IntDataError::TooMany)));
        assert!(matches!(read("{}", 2), Err(IntDataError::Json(_))));
        let mut out = Vec::new();
        write_int_array(&mut out, &[0, -5, i64::MAX, i64::MIN]);
        assert_eq!(serde_json::from_slice::<Vec<i64>>(&out).unwrap(), [0, -5, i64::MAX, i64::MIN]);
    }

    #[test]
    fn bool_data_takes_true_and_false_only_and_names_the_element() {
        let read =
            |s: &str, cap| read_bools(&serde_json::from_str::<Box<serde_json::value::RawValue>>(s).unwrap(), cap);
        assert_eq!(read("[true, false, [true]]", 8).unwrap(), [1.0, 0.0, 1.0]);
        let element = |s: &str| match read(s, 8) {
            Err(BoolDataError::Element { index, value, problem: NotBool }) => (index, value),
            other => panic!("{s}: {other:?}"),
        };
        assert_eq!(element("[true, 1]"), (1, "1".into()));
        assert_eq!(element("[[false], [0.0]]"), (1, "0.0".into()));
        assert_eq!(element("[\"true\"]"), (0, "\"true\"".into()));
        assert_eq!(element("[null]"), (0, "null".into()));
        assert!(matches!(read("[true, true, true]", 2), Err(BoolDataError::TooMany)));
        assert!(matches!(read("true", 2), Ok(v) if v == [1.0]));
        assert!(matches!(read("{}", 2), Err(BoolDataError::Json(_))));
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

    /// Every finite float32, written as JSON by [`write_array`] (the
    /// server's answers; clients writing shortest digits write the same),
    /// comes back with its own bits when read by [`read_data`] (the
    /// server's requests) and when read as a float64 and then rounded
    /// (Python's `json` and `numpy.float32`): which also shows that
    /// [`TWICE_ROUNDED`] is the only float32 whose shortest digits need
    /// more. About 4.3 billion values: minutes on a few cores, so not part
    /// of the default run; `cargo test --release -p pmstate-serve --lib
    /// every_finite_float32 -- --ignored` checks it.
    #[test]
    #[ignore = "exhaustive over all 2^32 bit patterns: minutes; run with --ignored"]
    fn every_finite_float32_written_as_json_reads_back_with_its_bits() {
        const CHUNK: u64 = 1 << 16;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        let chunks = (1u64 << 32) / CHUNK;
        let failures: Vec<u32> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|t| {
                    scope.spawn(move || {
                        let mut bad = Vec::new();
                        let mut text = Vec::new();
                        let mut values = Vec::with_capacity(CHUNK as usize);
                        for c in (t..chunks).step_by(threads as usize) {
                            values.clear();
                            values.extend(
                                (c * CHUNK..(c + 1) * CHUNK)
                                    .map(|b| f32::from_bits(b as u32))
                                    .filter(|v| v.is_finite()),
                            );
                            text.clear();
                            write_array(&mut text, &values);
                            let raw =
                                serde_json::value::RawValue::from_string(String::from_utf8(text.clone()).unwrap())
                                    .unwrap();
                            let back = read_data(&raw, values.len()).unwrap();
                            // and what a reader going through float64 gets
                            let via_f64: Vec<f64> = serde_json::from_str(raw.get()).unwrap();
                            for ((v, w), d) in values.iter().zip(&back).zip(&via_f64) {
                                let (b, via) = (v.to_bits(), (*d as f32).to_bits());
                                if (w.to_bits() != b || via != b) && bad.len() < 16 {
                                    bad.push(b);
                                }
                            }
                        }
                        bad
                    })
                })
                .collect();
            workers.into_iter().flat_map(|w| w.join().unwrap()).collect()
        });
        assert!(failures.is_empty(), "float32s that do not read back: {:08x?}", failures);
    }
}
