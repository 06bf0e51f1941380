//! The element types torch saves, and their names in torch, safetensors and candle.

use std::fmt;

/// An element type of a saved tensor.
///
/// torch pickles the first twelve through a typed storage class
/// (`torch.FloatStorage`, ...) and `_rebuild_tensor_v2`; the others ("new"
/// dtypes) through `torch.storage.UntypedStorage` and `_rebuild_tensor_v3`
/// with the dtype as a global (`torch.float8_e4m3fn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// `torch.float64`
    F64,
    /// `torch.float32`
    F32,
    /// `torch.float16`
    F16,
    /// `torch.bfloat16`
    BF16,
    /// `torch.int64`
    I64,
    /// `torch.int32`
    I32,
    /// `torch.int16`
    I16,
    /// `torch.int8`
    I8,
    /// `torch.uint8`
    U8,
    /// `torch.bool`
    Bool,
    /// `torch.complex64`
    C64,
    /// `torch.complex128`
    C128,
    /// `torch.uint16` (v3)
    U16,
    /// `torch.uint32` (v3)
    U32,
    /// `torch.uint64` (v3)
    U64,
    /// `torch.float8_e4m3fn` (v3)
    F8E4M3,
    /// `torch.float8_e5m2` (v3)
    F8E5M2,
}

const ALL: [DType; 17] = [
    DType::F64,
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::I64,
    DType::I32,
    DType::I16,
    DType::I8,
    DType::U8,
    DType::Bool,
    DType::C64,
    DType::C128,
    DType::U16,
    DType::U32,
    DType::U64,
    DType::F8E4M3,
    DType::F8E5M2,
];

impl DType {
    /// Every dtype this crate carries.
    pub fn all() -> &'static [DType] {
        &ALL
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        use DType::*;
        match self {
            F64 | I64 | C64 | U64 => 8,
            F32 | I32 | U32 => 4,
            F16 | BF16 | I16 | U16 => 2,
            I8 | U8 | Bool | F8E4M3 | F8E5M2 => 1,
            C128 => 16,
        }
    }

    /// torch's name without the `torch.` prefix (`float32`).
    pub fn torch_name(self) -> &'static str {
        use DType::*;
        match self {
            F64 => "float64",
            F32 => "float32",
            F16 => "float16",
            BF16 => "bfloat16",
            I64 => "int64",
            I32 => "int32",
            I16 => "int16",
            I8 => "int8",
            U8 => "uint8",
            Bool => "bool",
            C64 => "complex64",
            C128 => "complex128",
            U16 => "uint16",
            U32 => "uint32",
            U64 => "uint64",
            F8E4M3 => "float8_e4m3fn",
            F8E5M2 => "float8_e5m2",
        }
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
        use DType::*;
        Some(match self {
            F64 => "DoubleStorage",
            F32 => "FloatStorage",
            F16 => "HalfStorage",
            BF16 => "BFloat16Storage",
            I64 => "LongStorage",
            I32 => "IntStorage",
            I16 => "ShortStorage",
            I8 => "CharStorage",
            U8 => "ByteStorage",
            Bool => "BoolStorage",
            C64 => "ComplexFloatStorage",
            C128 => "ComplexDoubleStorage",
            U16 | U32 | U64 | F8E4M3 | F8E5M2 => return None,
        })
    }

    /// The dtype of a typed storage class name.
    pub fn from_storage_class(name: &str) -> Option<DType> {
        ALL.iter().copied().find(|d| d.storage_class() == Some(name))
    }

    /// safetensors' name for it (`F32`); `None` where safetensors has none (complex128).
    pub fn safetensors(self) -> Option<safetensors::Dtype> {
        use safetensors::Dtype as S;
        use DType::*;
        Some(match self {
            F64 => S::F64,
            F32 => S::F32,
            F16 => S::F16,
            BF16 => S::BF16,
            I64 => S::I64,
            I32 => S::I32,
            I16 => S::I16,
            I8 => S::I8,
            U8 => S::U8,
            Bool => S::BOOL,
            C64 => S::C64,
            U16 => S::U16,
            U32 => S::U32,
            U64 => S::U64,
            F8E4M3 => S::F8_E4M3,
            F8E5M2 => S::F8_E5M2,
            C128 => return None,
        })
    }

    /// The dtype of a safetensors dtype, if this crate carries it.
    pub fn from_safetensors(d: safetensors::Dtype) -> Option<DType> {
        ALL.iter().copied().find(|x| x.safetensors() == Some(d))
    }

    /// candle's dtype, where candle has it.
    pub fn candle(self) -> Option<candle_core::DType> {
        use candle_core::DType as C;
        use DType::*;
        Some(match self {
            F64 => C::F64,
            F32 => C::F32,
            F16 => C::F16,
            BF16 => C::BF16,
            I64 => C::I64,
            I32 => C::I32,
            I16 => C::I16,
            U8 => C::U8,
            U32 => C::U32,
            F8E4M3 => C::F8E4M3,
            I8 | Bool | C64 | C128 | U16 | U64 | F8E5M2 => return None,
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.torch_name())
    }
}
