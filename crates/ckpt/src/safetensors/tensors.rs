//! Writing named candle tensors (what a forward produced) as a plain
//! safetensors file, through the same atomic writer as checkpoints: a
//! temporary file named so that `pmstate clean-tmp` recognizes it,
//! registered for removal on SIGINT/SIGTERM, synced and renamed into place.
//! candle's own `safetensors::save` writes straight to the target (a failed
//! or interrupted write leaves half a file) and unwraps inside its
//! `View::data`; this path returns every failure as an error naming the
//! file and the tensor.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

use candle_core::{CpuStorage, DType as CandleDType, Device, Storage, Tensor};

use super::write::{header_bytes, ExportReport, HeaderRow};
use crate::error::{CkptError, Result, ValueProblem};
use crate::io::atomic::write_atomically;
use crate::write_options::Durability;

/// Bytes converted to little-endian at a time while writing a tensor.
const CHUNK_BYTES: usize = 1 << 16;

/// Writes `tensors` under their names (in this order) as a safetensors file
/// at `path`, atomically: on any error `path` is untouched and no
/// temporary file is left. Tensors may live on any device and in any
/// layout (a tensor on another device or not contiguous is copied to a
/// contiguous CPU one first; a CPU tensor in row-major order is written
/// from its own storage, 64 KiB at a time, with no copy of the whole);
/// every dtype candle has that safetensors has too is written as itself.
pub fn save_tensors(
    path: impl AsRef<Path>,
    tensors: &[(String, Tensor)],
    durability: Durability,
) -> Result<ExportReport> {
    let path = path.as_ref();
    let output = || path.display().to_string();
    let mut seen = HashSet::new();
    let mut cpu = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        if !seen.insert(name.as_str()) {
            return Err(CkptError::Unwritable {
                output: output(),
                key: name.clone(),
                problem: ValueProblem::DuplicateKey(name.clone()),
            });
        }
        let dtype = st_dtype(t.dtype()).ok_or_else(|| CkptError::UnsupportedDtype {
            path: output(),
            key: Some(name.clone()),
            storage: None,
            dtype: format!("{} (safetensors has no such dtype)", t.dtype().as_str()),
        })?;
        let candle = |e| CkptError::Candle { key: Some(name.clone()), storage: None, source: Box::new(e) };
        // both are free for a CPU tensor already in row-major order
        let t = t.to_device(&Device::Cpu).and_then(|t| t.contiguous()).map_err(candle)?;
        let len = t.elem_count() * t.dtype().size_in_bytes();
        cpu.push((name.as_str(), dtype, t, len));
    }
    let rows: Vec<HeaderRow<'_>> =
        cpu.iter().map(|(name, dtype, t, len)| HeaderRow { name, dtype: *dtype, shape: t.dims(), len: *len }).collect();
    let header = header_bytes(&rows, &[], path)?;
    let report =
        ExportReport { tensors: rows.len(), bytes: rows.iter().map(|r| r.len as u64).sum(), skipped: Vec::new() };
    write_atomically(path, durability == Durability::Fsync, |w| {
        let ioerr = |e| CkptError::Io { path: output(), source: e };
        w.write_all(&header).map_err(ioerr)?;
        for (_, _, t, _) in &cpu {
            write_le(t, w).map_err(ioerr)?;
        }
        Ok(())
    })?;
    Ok(report)
}

/// The safetensors dtype of a candle dtype, where safetensors has it.
fn st_dtype(d: CandleDType) -> Option<safetensors::Dtype> {
    use safetensors::Dtype as S;
    Some(match d {
        CandleDType::F32 => S::F32,
        CandleDType::F64 => S::F64,
        CandleDType::F16 => S::F16,
        CandleDType::BF16 => S::BF16,
        CandleDType::I64 => S::I64,
        CandleDType::I32 => S::I32,
        CandleDType::I16 => S::I16,
        CandleDType::U32 => S::U32,
        CandleDType::U8 => S::U8,
        _ => return None,
    })
}

/// Writes a contiguous CPU tensor's elements in row-major order as
/// little-endian bytes.
fn write_le(t: &Tensor, w: &mut impl Write) -> std::io::Result<()> {
    let (storage, layout) = t.storage_and_layout();
    let not_ready = || std::io::Error::other("internal: a tensor to write is not a contiguous CPU tensor");
    let Storage::Cpu(cpu) = &*storage else { return Err(not_ready()) };
    let (start, end) = layout.contiguous_offsets().ok_or_else(not_ready)?;
    fn le<T: Copy, const N: usize>(v: &[T], bytes: fn(T) -> [u8; N], w: &mut impl Write) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(CHUNK_BYTES);
        for part in v.chunks(CHUNK_BYTES / N) {
            buf.clear();
            buf.extend(part.iter().flat_map(|&x| bytes(x)));
            w.write_all(&buf)?;
        }
        Ok(())
    }
    match cpu {
        CpuStorage::F32(v) => le(&v[start..end], f32::to_le_bytes, w),
        CpuStorage::F64(v) => le(&v[start..end], f64::to_le_bytes, w),
        CpuStorage::F16(v) => le(&v[start..end], half::f16::to_le_bytes, w),
        CpuStorage::BF16(v) => le(&v[start..end], half::bf16::to_le_bytes, w),
        CpuStorage::I64(v) => le(&v[start..end], i64::to_le_bytes, w),
        CpuStorage::I32(v) => le(&v[start..end], i32::to_le_bytes, w),
        CpuStorage::I16(v) => le(&v[start..end], i16::to_le_bytes, w),
        CpuStorage::U32(v) => le(&v[start..end], u32::to_le_bytes, w),
        CpuStorage::U8(v) => w.write_all(&v[start..end]),
        // refused by st_dtype before anything is written
        _ => Err(not_ready()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_read_back_with_their_names_dtypes_shapes_and_bits() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.safetensors");
        // a transposed (non-contiguous) view, a NaN's payload bits, integers past f64's 53 bits
        let a = Tensor::arange(0f32, 6.0, &Device::Cpu).unwrap().reshape((2, 3)).unwrap().t().unwrap();
        let nan = Tensor::new(&[f32::from_bits(0x7fc0_1234), -0.0], &Device::Cpu).unwrap();
        let ints = Tensor::new(&[i64::MAX, -3, (1i64 << 53) + 1], &Device::Cpu).unwrap();
        let bytes = Tensor::new(&[7u8, 255], &Device::Cpu).unwrap();
        // a row-major view that starts inside its storage, and one over several 64 KiB chunks
        let from = Tensor::arange(0f32, 12.0, &Device::Cpu).unwrap().reshape((4, 3)).unwrap().narrow(0, 1, 2).unwrap();
        let long = Tensor::arange(0i64, 20_001, &Device::Cpu).unwrap();
        let tensors = vec![
            ("a".to_owned(), a.clone()),
            ("nan".into(), nan),
            ("ints".into(), ints),
            ("u8".into(), bytes),
            ("from".into(), from),
            ("long".into(), long),
        ];
        let report = save_tensors(&out, &tensors, Durability::NoFsync).unwrap();
        assert_eq!((report.tensors, report.bytes), (6, 24 + 8 + 24 + 2 + 24 + 8 * 20_001));
        let back = candle_core::safetensors::load(&out, &Device::Cpu).unwrap();
        assert_eq!(back["a"].dims(), &[3, 2]);
        assert_eq!(back["a"].to_vec2::<f32>().unwrap(), a.to_vec2::<f32>().unwrap());
        let nan_bits: Vec<u32> = back["nan"].to_vec1::<f32>().unwrap().iter().map(|x| x.to_bits()).collect();
        assert_eq!(nan_bits, vec![0x7fc0_1234, 0x8000_0000]);
        assert_eq!(back["ints"].to_vec1::<i64>().unwrap(), vec![i64::MAX, -3, (1i64 << 53) + 1]);
        assert_eq!(back["u8"].to_vec1::<u8>().unwrap(), vec![7, 255]);
        assert_eq!(back["from"].to_vec2::<f32>().unwrap(), vec![vec![3.0, 4.0, 5.0], vec![6.0, 7.0, 8.0]]);
        assert_eq!(back["long"].to_vec1::<i64>().unwrap(), (0..20_001).collect::<Vec<i64>>());
        // nothing else in the folder: the temporary file was renamed
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_refused_write_names_the_tensor_and_leaves_the_target_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.safetensors");
        std::fs::write(&out, b"keep").unwrap();
        let t = Tensor::zeros(2, candle_core::DType::F32, &Device::Cpu).unwrap();
        let twice = vec![("x".to_owned(), t.clone()), ("x".to_owned(), t)];
        let e = save_tensors(&out, &twice, Durability::NoFsync).unwrap_err();
        assert!(matches!(&e, CkptError::Unwritable { key, .. } if key == "x"), "{e}");
        assert_eq!(std::fs::read(&out).unwrap(), b"keep");
        // a folder that does not exist: the error names the target, not a temporary file
        let missing = dir.path().join("no/such/folder/out.safetensors");
        let one = vec![("x".to_owned(), Tensor::zeros(1, candle_core::DType::F32, &Device::Cpu).unwrap())];
        let e = save_tensors(&missing, &one, Durability::NoFsync).unwrap_err();
        assert!(matches!(&e, CkptError::Io { path, .. } if path == &missing.display().to_string()), "{e}");
        assert!(!e.to_string().contains(".pmstate-"), "{e}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
