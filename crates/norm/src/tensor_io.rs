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
