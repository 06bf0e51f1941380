//! NCCL collectives for CUDA tensors (feature `nccl`), through cudarc as
//! candle-core re-exports it.
//!
//! The data never leaves the GPU: `all_gather` and `broadcast` run on the
//! device's candle stream, and the results are candle tensors wrapping the
//! receive buffers. As with MPI, every call first all-gathers a fixed header
//! (on the device too) so that ranks that disagree on operation, root,
//! dtype or shape all return [`NormError::Collective`] instead of handing
//! NCCL mismatched counts (which hangs or corrupts). Completion is polled
//! with a CUDA event until a deadline: a peer that does not arrive within
//! the timeout makes this rank abort its communicator (`ncclCommAbort`,
//! which also ends the stuck kernel on the stream) and return an error; the
//! collective is then broken and every later call fails at once.
//!
//! What NCCL cannot detect: `ncclCommInitRank` blocks until every rank has
//! joined (no timeout here: cudarc's safe API has no nonblocking init), and
//! a peer process that dies mid-collective is noticed only through the
//! timeout (NCCL itself may report a remote error later, or never).
// Unsafe code is allowed here (denied elsewhere): the engine is shared across threads by a Send/Sync impl argued below.
#![allow(unsafe_code)]

use std::os::raw::c_char;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use candle_core::cuda_backend::cudarc::driver::{CudaStream, DeviceRepr, ValidAsZeroBits};
use candle_core::cuda_backend::cudarc::nccl::{Comm, Id, NcclType};
use candle_core::cuda_backend::CudaDType;
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, DType, Device, Storage, Tensor};

use crate::collective::Collective;
use crate::deadline::{poll_until, Broken, Wait};
use crate::error::{CollectiveProblem, NormError, Result, Unsendable};
use crate::wire_header::{agree_words, check_encodable, Header, OpKind};

/// A communicator's unique id (128 bytes): made by one rank with
/// [`NcclId::new`], handed to the others out of band (e.g. over MPI), then
/// given to [`NcclCollective::new`] on every rank.
#[derive(Clone, Copy)]
pub struct NcclId(Id);

impl NcclId {
    /// A fresh id (`ncclGetUniqueId`; needs no GPU).
    pub fn new() -> Result<NcclId> {
        Id::new().map(NcclId).map_err(|e| nccl_err("nccl_id", 0, 0, library("ncclGetUniqueId", format!("{e:?}"))))
    }

    /// The id's bytes, to send to the other ranks.
    pub fn to_bytes(&self) -> [u8; 128] {
        self.0.internal().map(|c| c as u8)
    }

    /// An id received from the rank that made it.
    pub fn from_bytes(b: [u8; 128]) -> NcclId {
        NcclId(Id::uninit(b.map(|c| c as c_char)))
    }
}

impl std::fmt::Debug for NcclId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NcclId(..)")
    }
}

struct Inner {
    /// `None` once aborted.
    comm: Option<Comm>,
    broken: Broken,
}

/// One rank of an NCCL communicator, on one CUDA device; tensors passed to
/// it must live on that device. See the module docs for failure semantics.
pub struct NcclCollective {
    inner: Mutex<Inner>,
    device: CudaDevice,
    stream: Arc<CudaStream>,
    rank: usize,
    world_size: usize,
    timeout: Duration,
}

// SAFETY: the raw `ncclComm_t` inside `Comm` is only used while holding
// `inner`'s mutex, so it is never used by two threads at once; NCCL allows a
// communicator to be used from any thread, one at a time. The CUDA stream
// and device handles are Send + Sync in cudarc.
unsafe impl Send for NcclCollective {}
// SAFETY: see `Send`: all use of the communicator is serialized by the mutex.
unsafe impl Sync for NcclCollective {}

impl std::fmt::Debug for NcclCollective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclCollective")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("timeout", &self.timeout)
            .finish()
    }
}

fn nccl_err(op: &'static str, rank: usize, world_size: usize, problem: CollectiveProblem) -> NormError {
    NormError::Collective { op, rank, world_size, problem }
}

/// A failed NCCL or CUDA call, with the library's message.
fn library(call: &'static str, message: String) -> CollectiveProblem {
    CollectiveProblem::Library { call, message }
}

fn cuda_device(device: &Device, op: &'static str) -> Result<CudaDevice> {
    match device {
        Device::Cuda(d) => Ok(d.clone()),
        other => {
            let found = crate::error::location(&other.location());
            Err(nccl_err(op, 0, 0, CollectiveProblem::Device { found }))
        }
    }
}

impl NcclCollective {
    /// Rank `rank` of `world_size` (one process or thread per GPU), joining
    /// the communicator `id` on `device`'s stream. Blocks until every rank
    /// has joined (`ncclCommInitRank`).
    pub fn new(device: &Device, rank: usize, world_size: usize, id: NcclId, timeout: Duration) -> Result<Self> {
        let dev = cuda_device(device, "nccl_init")?;
        let stream = dev.cuda_stream();
        let comm = Comm::from_rank(stream.clone(), rank, world_size, id.0)
            .map_err(|e| nccl_err("nccl_init", rank, world_size, library("ncclCommInitRank", format!("{e:?}"))))?;
        Ok(Self::wrap(comm, dev, stream, rank, world_size, timeout))
    }

    /// One rank per device, all in this process (`ncclCommInitAll`): move
    /// each into its own thread. Needs distinct GPUs.
    pub fn group(devices: &[Device], timeout: Duration) -> Result<Vec<Self>> {
        let devs = devices.iter().map(|d| cuda_device(d, "nccl_init")).collect::<Result<Vec<_>>>()?;
        let streams: Vec<Arc<CudaStream>> = devs.iter().map(CudaDevice::cuda_stream).collect();
        let comms = Comm::from_devices(streams.clone())
            .map_err(|e| nccl_err("nccl_init", 0, devs.len(), library("ncclCommInitAll", format!("{e:?}"))))?;
        let w = comms.len();
        Ok(comms
            .into_iter()
            .zip(devs)
            .zip(streams)
            .enumerate()
            .map(|(r, ((c, d), s))| Self::wrap(c, d, s, r, w, timeout))
            .collect())
    }

    fn wrap(comm: Comm, device: CudaDevice, stream: Arc<CudaStream>, rank: usize, w: usize, timeout: Duration) -> Self {
        let inner = Mutex::new(Inner { comm: Some(comm), broken: Broken::default() });
        NcclCollective { inner, device, stream, rank, world_size: w, timeout }
    }

    /// Why the communicator is unusable (a peer timed out, NCCL failed), if it is.
    pub fn broken(&self) -> Option<CollectiveProblem> {
        self.lock().broken.problem().cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn err(&self, op: &'static str, problem: CollectiveProblem) -> NormError {
        nccl_err(op, self.rank, self.world_size, problem)
    }

    /// Marks the communicator broken and aborts it (dropping a cudarc
    /// `Comm` calls `ncclCommAbort`).
    fn fail(&self, g: &mut Inner, op: &'static str, problem: CollectiveProblem) -> NormError {
        g.broken.mark(&problem);
        drop(g.comm.take());
        self.err(op, problem)
    }

    /// The error of a call after the communicator was aborted: the failure that aborted it.
    fn aborted(&self, g: &Inner, op: &'static str) -> NormError {
        let problem = g.broken.check().err().unwrap_or_else(|| library("ncclCommAbort", "aborted earlier".into()));
        self.err(op, problem)
    }

    /// Waits for the work queued on the stream so far, until `deadline`; at
    /// the deadline the communicator is aborted.
    fn wait(&self, g: &mut Inner, op: &'static str, deadline: Instant) -> Result<()> {
        let event = match self.stream.record_event(None) {
            Ok(e) => e,
            Err(e) => return Err(self.fail(g, op, library("cuEventRecord", e.to_string()))),
        };
        let outcome =
            poll_until(deadline, || event.try_is_complete().map_err(|e| library("cuEventQuery", e.to_string())));
        match outcome {
            Wait::Done => Ok(()),
            Wait::Failed(e) => Err(self.fail(g, op, e)),
            Wait::TimedOut => Err(self.fail(g, op, CollectiveProblem::TimedOut { after: self.timeout })),
        }
    }

    fn exchange(&self, kind: OpKind, t: &Tensor, root: usize) -> Result<Vec<Tensor>> {
        let op = kind.name();
        let deadline = Instant::now() + self.timeout;
        let mut g = self.lock();
        g.broken.check().map_err(|e| self.err(op, e))?;
        let local = if t.device().same_device(&Device::Cuda(self.device.clone())) {
            check_encodable(t)
        } else {
            Err(Unsendable::WrongDevice { found: crate::error::location(&t.device().location()) })
        };
        let bytes = t.elem_count() * t.dtype().size_in_bytes();
        let header = Header::new(kind, root, t.dims(), local.as_ref().ok().map(|&c| (c, bytes)));
        let words = self.gather_typed::<u64>(&mut g, op, &header.words(), deadline)?;
        agree_words(&words, self.rank, local.as_ref().err()).map_err(|e| self.err(op, e))?;
        let t = t.contiguous()?;
        match t.dtype() {
            DType::U8 => self.data::<u8>(&mut g, kind, &t, root, deadline),
            DType::U32 => self.data::<u32>(&mut g, kind, &t, root, deadline),
            DType::I32 => self.data::<i32>(&mut g, kind, &t, root, deadline),
            DType::I64 => self.data::<i64>(&mut g, kind, &t, root, deadline),
            DType::F32 => self.data::<f32>(&mut g, kind, &t, root, deadline),
            DType::F64 => self.data::<f64>(&mut g, kind, &t, root, deadline),
            d => Err(self.err(op, CollectiveProblem::CannotSend(Unsendable::DType(d)))),
        }
    }

    /// All-gathers a small host array through the device (for headers).
    fn gather_typed<T: NcclType + DeviceRepr + ValidAsZeroBits + Default + Clone>(
        &self,
        g: &mut Inner,
        op: &'static str,
        host: &[T],
        deadline: Instant,
    ) -> Result<Vec<T>> {
        let cuda =
            |e: candle_core::cuda_backend::cudarc::driver::DriverError| self.err(op, library("CUDA", e.to_string()));
        let send = self.stream.clone_htod(host).map_err(cuda)?;
        let mut recv = self.stream.alloc_zeros::<T>(host.len() * self.world_size).map_err(cuda)?;
        let Some(comm) = g.comm.as_ref() else {
            return Err(self.aborted(g, op));
        };
        if let Err(e) = comm.all_gather(&send, &mut recv) {
            return Err(self.fail(g, op, library("ncclAllGather", format!("{e:?}"))));
        }
        self.wait(g, op, deadline)?;
        self.stream.clone_dtoh(&recv).map_err(cuda)
    }

    /// The data exchange on the tensor's own device buffer.
    fn data<T: NcclType + CudaDType + DeviceRepr + ValidAsZeroBits + candle_core::WithDType>(
        &self,
        g: &mut Inner,
        kind: OpKind,
        t: &Tensor,
        root: usize,
        deadline: Instant,
    ) -> Result<Vec<Tensor>> {
        let op = kind.name();
        let n = t.elem_count();
        let w = self.world_size;
        let cuda =
            |e: candle_core::cuda_backend::cudarc::driver::DriverError| self.err(op, library("CUDA", e.to_string()));
        let out_len = if kind == OpKind::AllGather { n * w } else { n };
        let mut out = self.stream.alloc_zeros::<T>(out_len).map_err(cuda)?;
        {
            let (storage, layout) = t.storage_and_layout();
            let Storage::Cuda(cs) = &*storage else {
                let found = crate::error::location(&t.device().location());
                return Err(self.err(op, CollectiveProblem::CannotSend(Unsendable::WrongDevice { found })));
            };
            let (start, end) = layout.contiguous_offsets().ok_or_else(|| {
                self.err(op, CollectiveProblem::CannotSend(Unsendable::Unreadable("not contiguous".into())))
            })?;
            let src = T::as_cuda_slice(cs)?.slice(start..end);
            let Some(comm) = g.comm.as_ref() else {
                return Err(self.aborted(g, op));
            };
            let (call, res) = match kind {
                OpKind::AllGather => ("ncclAllGather", comm.all_gather(&src, &mut out)),
                OpKind::Broadcast => {
                    let root = i32::try_from(root)
                        .map_err(|_| self.err(op, CollectiveProblem::SourceOutOfRange { src: root }))?;
                    ("ncclBroadcast", comm.broadcast(Some(&src), &mut out, root))
                }
            };
            if let Err(e) = res {
                return Err(self.fail(g, op, library(call, format!("{e:?}"))));
            }
        }
        self.wait(g, op, deadline)?;
        let storage = Storage::Cuda(T::wrap_cuda_slice(out, self.device.clone()));
        let all = Tensor::from_storage(storage, out_len, BackpropOp::none(), false);
        match kind {
            OpKind::AllGather => {
                let mut dims = vec![w];
                dims.extend_from_slice(t.dims());
                let all = all.reshape(dims)?;
                (0..w).map(|r| Ok(all.get(r)?)).collect()
            }
            OpKind::Broadcast => Ok(vec![all.reshape(t.dims())?]),
        }
    }
}

impl Collective for NcclCollective {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world_size
    }
    fn all_gather(&self, t: &Tensor) -> Result<Vec<Tensor>> {
        self.exchange(OpKind::AllGather, t, 0)
    }
    fn broadcast(&self, t: &Tensor, src: usize) -> Result<Tensor> {
        if src >= self.world_size {
            return Err(self.err("broadcast", CollectiveProblem::SourceOutOfRange { src }));
        }
        Ok(self.exchange(OpKind::Broadcast, t, src)?.swap_remove(0))
    }
}
