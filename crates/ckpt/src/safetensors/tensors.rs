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

use candle_core::{DType as CandleDType, Device, Tensor};

use super::write::{header_bytes, Data, Entry, ExportReport};
use crate::error::{CkptError, Result, ValueProblem};
use crate::io::atomic::write_atomically;
use crate::write_options::Durability;

/// Writes `tensors` under their names (in this order) as a safetensors file
/// at `path`, atomically: on any error `path` is untouched and no
/// temporary file is left. Tensors may live on any device and in any
/// layout (they are copied to the CPU, contiguous); every dtype candle has
/// that safetensors has too is written as itself.
pub fn save_tensors(
    path: impl AsRef<Path>,
    tensors: &[(String, Tensor)],
    durability: Durability,
) -> Result<ExportReport> {
    let path = path.as_ref();
    let output = || path.display().to_string();
    let mut seen = HashSet::new();
    let mut entries = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        if !seen.insert(name.as_str()) {
            return Err(CkptError::Unwritable {
                output: output(),
                key: name.clone(),
                problem: ValueProblem::DuplicateKey(name.clone()),
            });
        }
        let (dtype, bytes) = le_bytes(t).map_err(|problem| match problem {
            Problem::Candle(e) => CkptError::Candle { key: Some(name.clone()), storage: None, source: Box::new(e) },
            Problem::Dtype(d) => CkptError::UnsupportedDtype {
                path: output(),
                key: Some(name.clone()),
                storage: None,
                dtype: format!("{} (safetensors has no such dtype)", d.as_str()),
            },
        })?;
        entries.push(Entry { name: name.clone(), dtype, shape: t.dims().to_vec(), data: Data::Owned(bytes) });
    }
    let header = header_bytes(&entries, &[], path)?;
    let report = ExportReport {
        tensors: entries.len(),
        bytes: entries.iter().map(|e| e.data.len() as u64).sum(),
        skipped: Vec::new(),
    };
    write_atomically(path, durability == Durability::Fsync, |w| {
        let ioerr = |e| CkptError::Io { path: output(), source: e };
        w.write_all(&header).map_err(ioerr)?;
        for e in &entries {
            if let Data::Owned(v) = &e.data {
                w.write_all(v).map_err(ioerr)?;
            }
        }
        Ok(())
    })?;
    Ok(report)
}

/// Why a tensor's bytes could not be had.
enum Problem {
    Candle(candle_core::Error),
    Dtype(CandleDType),
}

impl From<candle_core::Error> for Problem {
    fn from(e: candle_core::Error) -> Self {
        Problem::Candle(e)
    }
}

/// The tensor's elements in row-major order as little-endian bytes, and
/// its safetensors dtype.
fn le_bytes(t: &Tensor) -> std::result::Result<(safetensors::Dtype, Vec<u8>), Problem> {
    use safetensors::Dtype as S;
    let flat = t.to_device(&Device::Cpu)?.flatten_all()?;
    fn bytes<T: candle_core::WithDType, const N: usize>(
        flat: &Tensor,
        le: impl Fn(T) -> [u8; N],
    ) -> std::result::Result<Vec<u8>, Problem> {
        Ok(flat.to_vec1::<T>()?.into_iter().flat_map(le).collect())
    }
    Ok(match t.dtype() {
        CandleDType::F32 => (S::F32, bytes::<f32, 4>(&flat, f32::to_le_bytes)?),
        CandleDType::F64 => (S::F64, bytes::<f64, 8>(&flat, f64::to_le_bytes)?),
        CandleDType::F16 => (S::F16, bytes::<half::f16, 2>(&flat, half::f16::to_le_bytes)?),
        CandleDType::BF16 => (S::BF16, bytes::<half::bf16, 2>(&flat, half::bf16::to_le_bytes)?),
        CandleDType::I64 => (S::I64, bytes::<i64, 8>(&flat, i64::to_le_bytes)?),
        CandleDType::U32 => (S::U32, bytes::<u32, 4>(&flat, u32::to_le_bytes)?),
        CandleDType::U8 => (S::U8, bytes::<u8, 1>(&flat, u8::to_le_bytes)?),
        other => return Err(Problem::Dtype(other)),
    })
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
        let tensors =
            vec![("a".to_owned(), a.clone()), ("nan".into(), nan), ("ints".into(), ints), ("u8".into(), bytes)];
        let report = save_tensors(&out, &tensors, Durability::NoFsync).unwrap();
        assert_eq!((report.tensors, report.bytes), (4, 24 + 8 + 24 + 2));
        let back = candle_core::safetensors::load(&out, &Device::Cpu).unwrap();
        assert_eq!(back["a"].dims(), &[3, 2]);
        assert_eq!(back["a"].to_vec2::<f32>().unwrap(), a.to_vec2::<f32>().unwrap());
        let nan_bits: Vec<u32> = back["nan"].to_vec1::<f32>().unwrap().iter().map(|x| x.to_bits()).collect();
        assert_eq!(nan_bits, vec![0x7fc0_1234, 0x8000_0000]);
        assert_eq!(back["ints"].to_vec1::<i64>().unwrap(), vec![i64::MAX, -3, (1i64 << 53) + 1]);
        assert_eq!(back["u8"].to_vec1::<u8>().unwrap(), vec![7, 255]);
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
