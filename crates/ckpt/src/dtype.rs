//! The element types torch saves, and their names in torch, safetensors and candle.

use std::fmt;

/// Everything this crate knows about a dtype, in one row per dtype.
struct Row {
    size: usize,
    torch: &'static str,
    storage_class: Option<&'static str>,
    safetensors: Option<safetensors::Dtype>,
    candle: Option<candle_core::DType>,
}

/// Defines [`DType`] and its table from one list: each dtype with its
/// element size, torch name, typed storage class, safetensors and candle
/// dtypes. Adding a dtype is adding one line.
macro_rules! dtypes {
    ($(
        $(#[doc = $doc:literal])*
        $name:ident => $size:literal, $torch:literal, $storage:expr, $st:expr, $candle:expr;
    )*) => {
        /// An element type of a saved tensor.
        ///
        /// torch pickles the first twelve through a typed storage class
        /// (`torch.FloatStorage`, ...) and `_rebuild_tensor_v2`; the others ("new"
        /// dtypes) through `torch.storage.UntypedStorage` and `_rebuild_tensor_v3`
        /// with the dtype as a global (`torch.float8_e4m3fn`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum DType {
            $($(#[doc = $doc])* $name,)*
        }

        /// Every dtype, in declaration order.
        const ALL: &[DType] = &[$(DType::$name,)*];

        /// The rows, in declaration order: `TABLE[d as usize]` is `d`'s.
        const TABLE: &[Row] = &[$(Row {
            size: $size,
            torch: $torch,
            storage_class: $storage,
            safetensors: $st,
            candle: $candle,
        },)*];
    };
}

use candle_core::DType as C;
use safetensors::Dtype as S;

dtypes! {
    /// `torch.float64`
    F64 => 8, "float64", Some("DoubleStorage"), Some(S::F64), Some(C::F64);
    /// `torch.float32`
    F32 => 4, "float32", Some("FloatStorage"), Some(S::F32), Some(C::F32);
    /// `torch.float16`
    F16 => 2, "float16", Some("HalfStorage"), Some(S::F16), Some(C::F16);
    /// `torch.bfloat16`
    BF16 => 2, "bfloat16", Some("BFloat16Storage"), Some(S::BF16), Some(C::BF16);
    /// `torch.int64`
    I64 => 8, "int64", Some("LongStorage"), Some(S::I64), Some(C::I64);
    /// `torch.int32`
    I32 => 4, "int32", Some("IntStorage"), Some(S::I32), Some(C::I32);
    /// `torch.int16`
    I16 => 2, "int16", Some("ShortStorage"), Some(S::I16), Some(C::I16);
    /// `torch.int8`
    I8 => 1, "int8", Some("CharStorage"), Some(S::I8), None;
    /// `torch.uint8`
    U8 => 1, "uint8", Some("ByteStorage"), Some(S::U8), Some(C::U8);
    /// `torch.bool`
    Bool => 1, "bool", Some("BoolStorage"), Some(S::BOOL), None;
    /// `torch.complex64`
    C64 => 8, "complex64", Some("ComplexFloatStorage"), Some(S::C64), None;
    /// `torch.complex128`
    C128 => 16, "complex128", Some("ComplexDoubleStorage"), None, None;
    /// `torch.uint16` (v3)
    U16 => 2, "uint16", None, Some(S::U16), None;
    /// `torch.uint32` (v3)
    U32 => 4, "uint32", None, Some(S::U32), Some(C::U32);
    /// `torch.uint64` (v3)
    U64 => 8, "uint64", None, Some(S::U64), None;
    /// `torch.float8_e4m3fn` (v3)
    F8E4M3 => 1, "float8_e4m3fn", None, Some(S::F8_E4M3), Some(C::F8E4M3);
    /// `torch.float8_e5m2` (v3)
    F8E5M2 => 1, "float8_e5m2", None, Some(S::F8_E5M2), None;
}

impl DType {
    fn row(self) -> &'static Row {
        &TABLE[self as usize]
    }

    /// Every dtype this crate carries.
    pub fn all() -> &'static [DType] {
        ALL
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        self.row().size
    }

    /// torch's name without the `torch.` prefix (`float32`).
    pub fn torch_name(self) -> &'static str {
        self.row().torch
    }

    /// The dtype of a torch name, also accepting torch's aliases (`float`, `long`, `half`, ...).
    pub fn from_torch_name(name: &str) -> Option<DType> {
        let canonical = match name {
            "float" => "float32",
            "double" => "float64",
            "half" => "float16",
            "long" => "int64",
            "int" => "int32",
            "short" => "int16",
            "cfloat" => "complex64",
            "cdouble" => "complex128",
            other => other,
        };
        ALL.iter().copied().find(|d| d.torch_name() == canonical)
    }

    /// The typed storage class torch pickles for this dtype (`FloatStorage`);
    /// `None` for the v3 dtypes, which go through `UntypedStorage`.
    pub fn storage_class(self) -> Option<&'static str> {
        self.row().storage_class
    }

    /// The dtype of a typed storage class name.
    pub fn from_storage_class(name: &str) -> Option<DType> {
        ALL.iter().copied().find(|d| d.storage_class() == Some(name))
    }

    /// safetensors' name for it (`F32`); `None` where safetensors has none (complex128).
    pub fn safetensors(self) -> Option<safetensors::Dtype> {
        self.row().safetensors
    }

    /// The dtype of a safetensors dtype, if this crate carries it.
    pub fn from_safetensors(d: safetensors::Dtype) -> Option<DType> {
        ALL.iter().copied().find(|x| x.safetensors() == Some(d))
    }

    /// candle's dtype, where candle has it.
    pub fn candle(self) -> Option<candle_core::DType> {
        self.row().candle
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.torch_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_agrees_with_the_names_and_sizes() {
        assert_eq!(ALL.len(), TABLE.len());
        for &d in DType::all() {
            assert_eq!(DType::from_torch_name(d.torch_name()), Some(d));
            if let Some(c) = d.storage_class() {
                assert_eq!(DType::from_storage_class(c), Some(d));
            }
            if let Some(st) = d.safetensors() {
                assert_eq!(DType::from_safetensors(st), Some(d));
                assert_eq!(st.bitsize(), d.size() * 8, "{d}");
            }
            if let Some(c) = d.candle() {
                assert_eq!(c.size_in_bytes(), d.size(), "{d}");
            }
        }
        assert_eq!(DType::from_torch_name("long"), Some(DType::I64));
        assert_eq!(DType::F8E4M3.candle(), Some(candle_core::DType::F8E4M3));
    }
}
