//! MPI collectives (feature `mpi`): one rank per process, over rsmpi.
//!
//! Every collective first all-gathers a fixed 128-byte header (operation,
//! root, dtype, shape, and whether the rank could encode its tensor), so that
//! ranks that disagree all return the same [`NormError::Collective`] instead
//! of exchanging mismatched buffers; then the data moves as native-endian
//! bytes (a homogeneous cluster is assumed). Both exchanges are nonblocking
//! (`MPI_Iallgather`, `MPI_Ibcast`) and polled with `MPI_Test` until a
//! deadline, so a peer that never arrives is an error after the timeout,
//! never a hang. After a timeout the abandoned request may still complete
//! into its buffers, so they are kept alive and the communicator is marked
//! broken: every later call fails at once. See the README for what MPI can
//! and cannot detect.
// Unsafe code is allowed here (denied elsewhere): MPI is a C library: its calls are FFI, each block says why it is sound.
#![allow(unsafe_code)]

use std::os::raw::{c_char, c_int, c_void};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};

use crate::collective::Collective;
use crate::deadline::{poll_until, Broken, Wait};
use crate::error::{CollectiveProblem, NormError, Result, Unsendable};
use crate::tensor_io::{dtype_from_code, tensor_to_ne_bytes};
use crate::wire_header::{agree, check_encodable, Header, OpKind};

/// An abandoned request and the buffers MPI may still write into.
struct Stranded {
    _request: ffi::MPI_Request,
    _send: Vec<u8>,
    _recv: Vec<u8>,
}

struct Inner {
    /// `None` once finalized (or handed over to `abort`).
    universe: Option<mpi::environment::Universe>,
    world: SimpleCommunicator,
    broken: Broken,
    stranded: Vec<Stranded>,
}

/// One rank per process over MPI (`MPI_COMM_WORLD`), for processes started
/// by `mpirun`/`srun`; a process started alone is a world of size 1.
///
/// Tensors on any device are copied to CPU bytes for MPI and back to the
/// caller's device. Shape, dtype and operation agreement is checked across
/// ranks before any data moves. A peer that does not arrive within
/// `timeout` gives [`NormError::Collective`] on the others, and marks this
/// collective broken ([`MpiCollective::broken`]).
///
/// Dropping it calls `MPI_Finalize`, except when broken: finalizing may wait
/// for the missing peer forever, so a broken process should drop it and exit
/// with a nonzero code, without `MPI_Finalize`; Open MPI's `mpirun` then
/// terminates the remaining ranks (a stuck one too) and exits with that
/// code. (`MPI_Abort` is not used: with Open MPI 4.1.4, when a peer had
/// already entered `MPI_Finalize`, `mpirun` hung after the abort, observed.)
/// MPI can be initialized only once per process.
pub struct MpiCollective {
    inner: Mutex<Inner>,
    rank: usize,
    world_size: usize,
    timeout: Duration,
}

// SAFETY: the raw MPI handles inside (`SimpleCommunicator`, requests,
// `Universe`) are only touched while holding `inner`'s mutex, so MPI is never
// called concurrently from two threads, and `init` refuses an MPI library
// that does not provide at least MPI_THREAD_SERIALIZED, which is exactly the
// level that permits calls from any thread as long as they do not overlap.
// The plain fields are immutable after construction.
unsafe impl Send for MpiCollective {}
// SAFETY: as for `Send`: every use of an MPI handle is serialized by the mutex.
unsafe impl Sync for MpiCollective {}

impl std::fmt::Debug for MpiCollective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiCollective")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl MpiCollective {
    /// Initializes MPI (MPI_THREAD_SERIALIZED) and joins `MPI_COMM_WORLD`.
    /// `timeout` bounds every collective call. Fails if MPI was already
    /// initialized in this process or provides less than serialized threading.
    pub fn init(timeout: Duration) -> Result<MpiCollective> {
        let err = |problem| NormError::Collective { op: "mpi_init", rank: 0, world_size: 0, problem };
        let library = |call, message| err(CollectiveProblem::Library { call, message });
        let (universe, provided) = mpi::initialize_with_threading(mpi::Threading::Serialized)
            .ok_or_else(|| err(CollectiveProblem::AlreadyInitialized))?;
        match provided {
            mpi::Threading::Single => return Err(err(CollectiveProblem::Threading { provided: "single" })),
            mpi::Threading::Funneled => return Err(err(CollectiveProblem::Threading { provided: "funneled" })),
            _ => {}
        }
        let world = universe.world();
        // SAFETY: `world` is MPI_COMM_WORLD of an initialized MPI; setting its
        // error handler to MPI_ERRORS_RETURN makes failing calls return a code
        // (which every call below checks) instead of aborting the process.
        let rc = unsafe { ffi::MPI_Comm_set_errhandler(world.as_raw(), ffi::RSMPI_ERRORS_RETURN) };
        if rc != ffi::MPI_SUCCESS as c_int {
            return Err(library("MPI_Comm_set_errhandler", error_string(rc)));
        }
        let (rank, world_size) = (world.rank(), world.size());
        let (rank, world_size) = (
            usize::try_from(rank).map_err(|_| library("MPI_Comm_rank", format!("returned rank {rank}")))?,
            usize::try_from(world_size)
                .map_err(|_| library("MPI_Comm_size", format!("returned world size {world_size}")))?,
        );
        Ok(MpiCollective {
            inner: Mutex::new(Inner { universe: Some(universe), world, broken: Broken::default(), stranded: vec![] }),
            rank,
            world_size,
            timeout,
        })
    }

    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Changes the per-call timeout.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Why the communicator is unusable (a peer timed out or MPI failed), if it is.
    pub fn broken(&self) -> Option<CollectiveProblem> {
        self.lock().broken.problem().cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn err(&self, op: &'static str, problem: CollectiveProblem) -> NormError {
        NormError::Collective { op, rank: self.rank, world_size: self.world_size, problem }
    }

    /// One collective: header agreement, then the data. Returns the W
    /// tensors (all_gather) or the root's (broadcast, as a one-element vec).
    fn exchange(&self, kind: OpKind, t: &Tensor, root: usize) -> Result<Vec<Tensor>> {
        let op = kind.name();
        let deadline = Instant::now() + self.timeout;
        let mut g = self.lock();
        g.broken.check().map_err(|e| self.err(op, e))?;
        let local = encode(t);
        let header = Header::new(kind, root, t.dims(), local.as_ref().map(|(d, b)| (*d, b.len())).ok());
        let all = self.all_gather_bytes(&mut g, op, header.to_bytes(), deadline)?;
        agree(&all, self.rank, local.as_ref().err()).map_err(|e| self.err(op, e))?;
        let (dtype, bytes) = local.map_err(|e| self.err(op, CollectiveProblem::CannotSend(e)))?;
        let dtype = dtype_from_code(dtype).ok_or_else(|| self.err(op, CollectiveProblem::DTypeCode(dtype)))?;
        let device = t.device();
        match kind {
            OpKind::AllGather => {
                let n = bytes.len();
                let all = self.all_gather_bytes(&mut g, op, bytes, deadline)?;
                (0..self.world_size)
                    .map(|r| decode(&all[r * n..(r + 1) * n], dtype, t.dims(), device).map_err(|e| self.err(op, e)))
                    .collect()
            }
            OpKind::Broadcast => {
                let out = self.broadcast_bytes(&mut g, op, bytes, root, deadline)?;
                Ok(vec![decode(&out, dtype, t.dims(), device).map_err(|e| self.err(op, e))?])
            }
        }
    }

    fn all_gather_bytes(&self, g: &mut Inner, op: &'static str, send: Vec<u8>, deadline: Instant) -> Result<Vec<u8>> {
        let count =
            c_int::try_from(send.len()).map_err(|_| self.err(op, CollectiveProblem::TooLarge { bytes: send.len() }))?;
        let mut recv = vec![0u8; send.len() * self.world_size];
        let mut request = null_request();
        // SAFETY: `send` holds `count` bytes and `recv` W * `count` bytes,
        // both heap buffers whose addresses stay fixed until the request
        // completes: `wait` either returns them after MPI_Test reports
        // completion or keeps them alive forever in `stranded`. The world
        // communicator is valid while `g` (the lock) is held.
        let rc = unsafe {
            ffi::MPI_Iallgather(
                send.as_ptr() as *const c_void,
                count,
                ffi::RSMPI_UINT8_T,
                recv.as_mut_ptr() as *mut c_void,
                count,
                ffi::RSMPI_UINT8_T,
                g.world.as_raw(),
                &mut request,
            )
        };
        self.check(g, op, "MPI_Iallgather", rc)?;
        let (_, recv) = self.wait(g, op, request, send, recv, deadline)?;
        Ok(recv)
    }

    fn broadcast_bytes(
        &self,
        g: &mut Inner,
        op: &'static str,
        mut buf: Vec<u8>,
        root: usize,
        deadline: Instant,
    ) -> Result<Vec<u8>> {
        let count =
            c_int::try_from(buf.len()).map_err(|_| self.err(op, CollectiveProblem::TooLarge { bytes: buf.len() }))?;
        let root_c =
            c_int::try_from(root).map_err(|_| self.err(op, CollectiveProblem::SourceOutOfRange { src: root }))?;
        let mut request = null_request();
        // SAFETY: `buf` holds `count` bytes at an address that stays fixed
        // until completion (see `all_gather_bytes`); the root was checked
        // against the world size by the caller.
        let rc = unsafe {
            ffi::MPI_Ibcast(
                buf.as_mut_ptr() as *mut c_void,
                count,
                ffi::RSMPI_UINT8_T,
                root_c,
                g.world.as_raw(),
                &mut request,
            )
        };
        self.check(g, op, "MPI_Ibcast", rc)?;
        let (buf, _) = self.wait(g, op, request, buf, vec![], deadline)?;
        Ok(buf)
    }

    /// Polls `request` until it completes or `deadline` passes
    /// ([`poll_until`]); an abandoned request keeps its buffers forever.
    fn wait(
        &self,
        g: &mut Inner,
        op: &'static str,
        mut request: ffi::MPI_Request,
        send: Vec<u8>,
        recv: Vec<u8>,
        deadline: Instant,
    ) -> Result<(Vec<u8>, Vec<u8>)> {
        let outcome = poll_until(deadline, || {
            let mut flag: c_int = 0;
            // SAFETY: `request` is the active request returned by the
            // nonblocking call (or already completed and set to null by a
            // previous MPI_Test, which is then a no-op); status is ignored.
            let rc = unsafe { ffi::MPI_Test(&mut request, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            if rc == ffi::MPI_SUCCESS as c_int {
                Ok(flag != 0)
            } else {
                Err(CollectiveProblem::Library { call: "MPI_Test", message: error_string(rc) })
            }
        });
        let problem = match outcome {
            Wait::Done => return Ok((send, recv)),
            Wait::Failed(e) => e,
            Wait::TimedOut => CollectiveProblem::TimedOut { after: self.timeout },
        };
        g.stranded.push(Stranded { _request: request, _send: send, _recv: recv });
        Err(self.fail(g, op, problem))
    }

    fn check(&self, g: &mut Inner, op: &'static str, call: &'static str, rc: c_int) -> Result<()> {
        if rc == ffi::MPI_SUCCESS as c_int {
            Ok(())
        } else {
            Err(self.fail(g, op, CollectiveProblem::Library { call, message: error_string(rc) }))
        }
    }

    fn fail(&self, g: &mut Inner, op: &'static str, problem: CollectiveProblem) -> NormError {
        g.broken.mark(&problem);
        self.err(op, problem)
    }
}

impl Drop for MpiCollective {
    fn drop(&mut self) {
        let g = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        // Buffers of abandoned requests must outlive MPI: never free them.
        std::mem::forget(std::mem::take(&mut g.stranded));
        if g.broken.problem().is_some() {
            // MPI_Finalize may wait for the missing peer: leave without it
            // (mpirun then reports this process as not finalized).
            std::mem::forget(g.universe.take());
        }
        // Otherwise dropping the universe calls MPI_Finalize.
    }
}

impl Collective for MpiCollective {
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

/// The tensor's dtype code and bytes, or why it cannot be sent.
fn encode(t: &Tensor) -> std::result::Result<(u64, Vec<u8>), Unsendable> {
    let code = check_encodable(t)?;
    let bytes = tensor_to_ne_bytes(t).map_err(|e| Unsendable::Unreadable(e.to_string()))?;
    Ok((code, bytes))
}

fn decode(b: &[u8], dtype: DType, dims: &[usize], device: &Device) -> std::result::Result<Tensor, CollectiveProblem> {
    Tensor::from_raw_buffer(b, dtype, dims, &Device::Cpu)
        .and_then(|t| t.to_device(device))
        .map_err(|e| CollectiveProblem::Received(e.to_string()))
}

fn null_request() -> ffi::MPI_Request {
    // SAFETY: reading an immutable extern constant initialized by the MPI shim.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

/// MPI's text for an error code.
fn error_string(code: c_int) -> String {
    let mut buf = vec![0 as c_char; 1024];
    let mut len: c_int = 0;
    // SAFETY: MPI_Error_string writes at most MPI_MAX_ERROR_STRING (256 in
    // Open MPI and MPICH) characters into `buf`, which holds 1024, and
    // sets `len`; it may be called at any time.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr(), &mut len) };
    if rc != ffi::MPI_SUCCESS as c_int {
        return format!("MPI error code {code}");
    }
    let len = usize::try_from(len).unwrap_or(0).min(buf.len());
    let bytes: Vec<u8> = buf[..len].iter().map(|&c| c as u8).collect();
    format!("{} (MPI error code {code})", String::from_utf8_lossy(&bytes))
}
