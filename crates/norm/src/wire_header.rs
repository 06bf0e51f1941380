//! The header every rank of an MPI or NCCL collective announces before any
//! data moves: operation, root, dtype, byte count, shape, and whether the
//! rank could produce its tensor at all. All ranks gather all headers and
//! reach the same verdict, so a disagreement is an error everywhere instead
//! of mismatched buffers (or a hang, for NCCL).

use candle_core::Tensor;

use crate::error::{Call, CollectiveProblem, Unsendable};
use crate::tensor_io::{dtype_code, dtype_from_code};

/// Dimensions a header can describe.
pub(crate) const MAX_DIMS: usize = 9;
/// Header words: magic, status, op, root, dtype, bytes, ndims, dims.
pub(crate) const HEADER_WORDS: usize = 7 + MAX_DIMS;
/// Bytes per header.
pub(crate) const HEADER_BYTES: usize = HEADER_WORDS * 8;
const MAGIC: u64 = 0x504d_5354_0001; // "PMST", version 1

/// The two collectives.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpKind {
    AllGather = 1,
    Broadcast = 2,
}

impl OpKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            OpKind::AllGather => "all_gather",
            OpKind::Broadcast => "broadcast",
        }
    }
}

/// What a rank announces before a collective.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Header {
    ok: bool,
    op: u64,
    root: u64,
    dtype: u64,
    bytes: u64,
    dims: Vec<u64>,
}

impl Header {
    /// `payload`: the dtype code and byte count, or `None` if this rank
    /// cannot send its tensor.
    pub(crate) fn new(kind: OpKind, root: usize, dims: &[usize], payload: Option<(u64, usize)>) -> Header {
        match payload {
            Some((dtype, bytes)) if dims.len() <= MAX_DIMS => Header {
                ok: true,
                op: kind as u64,
                root: root as u64,
                dtype,
                bytes: bytes as u64,
                dims: dims.iter().map(|&d| d as u64).collect(),
            },
            _ => Header { ok: false, op: kind as u64, root: root as u64, dtype: 0, bytes: 0, dims: vec![] },
        }
    }

    pub(crate) fn words(&self) -> [u64; HEADER_WORDS] {
        let mut w = [0u64; HEADER_WORDS];
        w[0] = MAGIC;
        w[1] = u64::from(!self.ok);
        w[2] = self.op;
        w[3] = self.root;
        w[4] = self.dtype;
        w[5] = self.bytes;
        w[6] = self.dims.len() as u64;
        for (slot, d) in w[7..].iter_mut().zip(&self.dims) {
            *slot = *d;
        }
        w
    }

    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        self.words().iter().flat_map(|v| v.to_ne_bytes()).collect()
    }

    fn from_words(w: &[u64]) -> Option<Header> {
        if w.len() != HEADER_WORDS || w[0] != MAGIC {
            return None;
        }
        let ndims = usize::try_from(w[6]).ok().filter(|&n| n <= MAX_DIMS)?;
        Some(Header { ok: w[1] == 0, op: w[2], root: w[3], dtype: w[4], bytes: w[5], dims: w[7..7 + ndims].to_vec() })
    }

    /// The call this header announces, for messages.
    fn call(&self) -> Call {
        let dtype =
            dtype_from_code(self.dtype).map_or_else(|| format!("dtype#{}", self.dtype), |d| d.as_str().to_owned());
        let op = match self.op {
            1 => "all_gather".to_string(),
            2 => format!("broadcast from rank {}", self.root),
            o => format!("op#{o}"),
        };
        Call { op, dtype, dims: self.dims.iter().map(|&d| usize::try_from(d).unwrap_or(usize::MAX)).collect() }
    }
}

/// The dtype code of a tensor that can go over the wire, or why not.
pub(crate) fn check_encodable(t: &Tensor) -> Result<u64, Unsendable> {
    if t.rank() > MAX_DIMS {
        return Err(Unsendable::TooManyDims { dims: t.rank(), max: MAX_DIMS });
    }
    dtype_code(t.dtype()).ok_or(Unsendable::DType(t.dtype()))
}

/// The verdict on every rank's header (`all`: W headers as native-endian
/// bytes, index = rank): `Ok` when all ranks can send and agree. `local`:
/// this rank's own reason if it cannot send.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn agree(all: &[u8], rank: usize, local: Option<&Unsendable>) -> Result<(), CollectiveProblem> {
    if all.is_empty() || !all.len().is_multiple_of(HEADER_BYTES) {
        return Err(CollectiveProblem::BadHeaders { bytes: all.len(), per_header: HEADER_BYTES });
    }
    let words: Vec<u64> =
        all.chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().expect("chunks of 8 bytes"))).collect();
    agree_words(&words, rank, local)
}

/// As [`agree`], on the headers as words.
pub(crate) fn agree_words(words: &[u64], rank: usize, local: Option<&Unsendable>) -> Result<(), CollectiveProblem> {
    let headers: Vec<Option<Header>> = words.chunks_exact(HEADER_WORDS).map(Header::from_words).collect();
    if let Some(r) = headers.iter().position(|h| !h.as_ref().is_some_and(|h| h.ok)) {
        return Err(match (local, r == rank) {
            (Some(e), true) => CollectiveProblem::CannotSend(e.clone()),
            _ => CollectiveProblem::PeerCannotSend { rank: r },
        });
    }
    let headers: Vec<Header> = headers.into_iter().flatten().collect();
    match headers.iter().position(|h| *h != headers[0]) {
        Some(r) => Err(CollectiveProblem::Disagree {
            first_rank: 0,
            first: Box::new(headers[0].call()),
            rank: r,
            call: Box::new(headers[r].call()),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(hs: &[Header]) -> Vec<u8> {
        hs.iter().flat_map(Header::to_bytes).collect()
    }

    #[test]
    fn agreeing_headers_pass_and_any_difference_is_named() {
        let a = Header::new(OpKind::AllGather, 0, &[3], Some((6, 12)));
        assert!(agree(&bytes(&[a.clone(), a.clone()]), 0, None).is_ok());
        let b = Header::new(OpKind::AllGather, 0, &[4], Some((6, 16)));
        let e = agree(&bytes(&[a.clone(), b]), 1, None).unwrap_err();
        let call = |op: &str, dims: Vec<usize>| Box::new(Call { op: op.into(), dtype: "f32".into(), dims });
        assert_eq!(
            e,
            CollectiveProblem::Disagree {
                first_rank: 0,
                first: call("all_gather", vec![3]),
                rank: 1,
                call: call("all_gather", vec![4])
            }
        );
        // The one wording check: both calls, in words.
        assert_eq!(
            e.to_string(),
            "ranks disagree: rank 0 calls all_gather of f32 [3], rank 1 calls all_gather of f32 [4]"
        );
        let c = Header::new(OpKind::Broadcast, 1, &[3], Some((6, 12)));
        let e = agree(&bytes(&[a.clone(), c]), 0, None).unwrap_err();
        assert!(
            matches!(&e, CollectiveProblem::Disagree { rank: 1, call, .. } if call.op == "broadcast from rank 1"),
            "{e}"
        );
        let bad = Header::new(OpKind::AllGather, 0, &[3], None);
        let mine = Unsendable::DType(candle_core::DType::BF16);
        assert_eq!(
            agree(&bytes(&[a.clone(), bad.clone()]), 1, Some(&mine)).unwrap_err(),
            CollectiveProblem::CannotSend(mine)
        );
        assert_eq!(agree(&bytes(&[a, bad]), 0, None).unwrap_err(), CollectiveProblem::PeerCannotSend { rank: 1 });
        // Garbage (a peer speaking another protocol) is a refusal, not a panic.
        assert!(agree(&[7u8; HEADER_BYTES * 2], 0, None).is_err());
    }

    #[test]
    fn too_many_dims_cannot_be_sent() {
        let h = Header::new(OpKind::AllGather, 0, &[1; MAX_DIMS + 1], Some((6, 4)));
        assert!(agree(&bytes(&[h.clone(), h]), 0, None).is_err());
    }
}
