//! Borrowing a CPU tensor's elements without copying them.

use candle_core::{Storage, Tensor, WithDType};

use crate::error::{NormError, Result};

/// Runs `f` on the contiguous elements of a CPU tensor (copying only when
/// the layout is not contiguous).
pub(crate) fn with_cpu_slice<T: WithDType, R>(t: &Tensor, f: impl FnOnce(&[T]) -> R) -> Result<R> {
    let t = if t.is_contiguous() { t.clone() } else { t.contiguous()? };
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return Err(NormError::Candle(candle_core::Error::Msg("expected a CPU tensor".into())));
    };
    let all = cpu.as_slice::<T>()?;
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| NormError::Candle(candle_core::Error::Msg("layout not contiguous".into())))?;
    Ok(f(&all[start..end]))
}

/// A stable code per dtype, for wire headers (`None`: not sent over the wire).
#[cfg_attr(not(any(feature = "mpi", feature = "nccl")), allow(dead_code))]
pub(crate) fn dtype_code(d: candle_core::DType) -> Option<u64> {
    use candle_core::DType::*;
    Some(match d {
        U8 => 1,
        U32 => 2,
        I16 => 3,
        I32 => 4,
        I64 => 5,
        F32 => 6,
        F64 => 7,
        _ => return None,
    })
}

/// The dtype of a [`dtype_code`].
#[cfg_attr(not(any(feature = "mpi", feature = "nccl")), allow(dead_code))]
pub(crate) fn dtype_from_code(c: u64) -> Option<candle_core::DType> {
    use candle_core::DType::*;
    Some(match c {
        1 => U8,
        2 => U32,
        3 => I16,
        4 => I32,
        5 => I64,
        6 => F32,
        7 => F64,
        _ => return None,
    })
}

/// The tensor's elements in row-major order as native-endian bytes, copied
/// to the CPU first if needed (dtypes with a [`dtype_code`] only).
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn tensor_to_ne_bytes(t: &Tensor) -> Result<Vec<u8>> {
    use candle_core::DType;
    let t = t.to_device(&candle_core::Device::Cpu)?;
    macro_rules! bytes {
        ($ty:ty) => {
            with_cpu_slice::<$ty, _>(&t, |s| s.iter().flat_map(|v| v.to_ne_bytes()).collect())
        };
    }
    match t.dtype() {
        DType::U8 => bytes!(u8),
        DType::U32 => bytes!(u32),
        DType::I16 => bytes!(i16),
        DType::I32 => bytes!(i32),
        DType::I64 => bytes!(i64),
        DType::F32 => bytes!(f32),
        DType::F64 => bytes!(f64),
        d => Err(NormError::Candle(candle_core::Error::Msg(format!("no byte encoding for dtype {}", d.as_str())))),
    }
}
