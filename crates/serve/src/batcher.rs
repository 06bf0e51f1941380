//! Dynamic batching, as Triton's dynamic batcher does it: requests wait in
//! a bounded queue; one worker thread takes what is queued (up to
//! `max_batch` rows, waiting at most `max_wait` after the oldest request's
//! arrival for more), runs one forward on the merged rows, and hands each
//! caller exactly its own rows back.
//!
//! Each caller gets bitwise what serving its request alone gives: the CPU
//! forward is row-independent (pmstate-policy's kernels accumulate every
//! output element in one fixed order whatever the batch, see its
//! `tests/row_independence.rs`; the normalizer and activations are
//! elementwise), and actions are drawn per request with its own seed from
//! its own mean rows, exactly as `Policy::sample` on its rows would. A
//! pipeline's forward is row-independent too: each observation is computed
//! row by row from that row's inputs, the actor is the policy's, and the
//! action function maps each action row alone. A GPC prior's transformer
//! is row-independent too (attention mixes positions of one row, never
//! rows), and its generation draws each row's tokens from its request's
//! seed and its index within the request. The worker knows no family: it
//! hands the merged rows to [`pmstate_policy::Model::run`], one
//! [`Segment`] per request, and each family keeps these guarantees in its
//! own `run`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvError, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use candle_core::{Device, Tensor};
use pmstate_policy::served::Wanted as Asked;
use pmstate_policy::{Batch, RunError, Segment};
use tokio::sync::oneshot;

use crate::decode::{Decoded, Values, Wanted};
use crate::error::RequestError;
use crate::metrics::Metrics;
use crate::model::LoadedModel;
use crate::options::Batching;
use crate::slot::ModelSlot;

/// The outputs computed for one job so far: name -> (shape, values).
type Outs = HashMap<&'static str, (Vec<usize>, Values)>;

/// One output of an answer: what was asked, its shape, its values.
pub type OutTensor = (Wanted, Vec<usize>, Values);

/// What a request gets back.
#[derive(Debug)]
pub struct Answer {
    /// The version of the model that ran it.
    pub version: u64,
    /// Outputs in the order asked.
    pub tensors: Vec<OutTensor>,
}

/// A queued request.
pub struct Job {
    /// The checked request.
    pub req: Decoded,
    /// When it was queued.
    pub enqueued: Instant,
    /// Where its answer goes (closed when the client went away).
    pub reply: oneshot::Sender<Result<Answer, RequestError>>,
}

enum Msg {
    Job(Box<Job>),
    Stop,
}

/// Where a batcher's loop runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// On a thread of its own (`pmstate-batcher`), each forward handed to
    /// the pool: for models that share one pool (a repository), where a
    /// loop holding a pool thread would take it from the others.
    OwnThread,
    /// On a thread of the forward pool, which it then holds: each forward
    /// starts on the thread that found its requests, and no thread is woken
    /// to take it or to hand it back. For a pool that serves one model. On
    /// 2 vCPUs this took a lone stream client's served forward from about
    /// 190 to 150 µs (docs/serve.md, Speed: gRPC).
    ForwardPool,
}

/// The running loop, to wait for when stopping.
enum Running {
    Thread(JoinHandle<()>),
    /// Sends (or drops its sender) once the loop has returned.
    Pool(std::sync::mpsc::Receiver<()>),
}

/// Requests queued and not yet running: what `--queue` bounds. Counted
/// apart from the channel, so that a request the worker has taken into a
/// batch still forming (waiting for `max_wait`, or for a pause to end)
/// still counts, and the bound holds whatever the worker is doing.
struct Waiting {
    count: AtomicUsize,
    metrics: Arc<Metrics>,
}

impl Waiting {
    fn enter(&self, cap: usize) -> bool {
        let ok = self.count.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < cap).then_some(n + 1)).is_ok();
        if ok {
            self.metrics.queue_depth.inc();
        }
        ok
    }

    fn leave(&self, n: usize) {
        self.count.fetch_sub(n, Ordering::AcqRel);
        self.metrics.queue_depth.dec_by(n as i64);
    }
}

/// Holds forwards back while set (see [`Batcher::pause`]).
#[derive(Default)]
struct PauseFlag {
    paused: Mutex<bool>,
    changed: Condvar,
}

impl PauseFlag {
    fn set(&self, v: bool) {
        *self.paused.lock().unwrap_or_else(|e| e.into_inner()) = v;
        self.changed.notify_all();
    }

    fn wait_while_paused(&self) {
        let g = self.paused.lock().unwrap_or_else(|e| e.into_inner());
        let _g = self.changed.wait_while(g, |p| *p).unwrap_or_else(|e| e.into_inner());
    }
}

/// A failure to inject into the next forward, for the crate's unit tests
/// of the 500 path: decoding refuses everything a policy's forward would,
/// so no request makes a real checkpoint's forward fail.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The forward returns an error.
    Error,
    /// The forward panics (on the forward pool).
    Panic,
}

#[cfg(test)]
type FaultSlot = Arc<Mutex<Option<Fault>>>;

/// Forwards are held back until this is dropped (see [`Batcher::pause`]).
pub struct Paused {
    flag: Arc<PauseFlag>,
}

impl Paused {
    /// A guard that holds nothing back (no model to pause).
    pub(crate) fn none() -> Paused {
        Paused { flag: Arc::new(PauseFlag::default()) }
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        self.flag.set(false);
    }
}

/// The queue and its worker thread.
pub struct Batcher {
    tx: SyncSender<Msg>,
    queue: usize,
    waiting: Arc<Waiting>,
    pause: Arc<PauseFlag>,
    running: std::sync::Mutex<Option<Running>>,
    #[cfg(test)]
    fault: FaultSlot,
}

impl Batcher {
    /// Starts the worker where `placement` says; forwards run on `pool`.
    pub fn start(
        slot: Arc<ModelSlot>,
        batching: Batching,
        pool: Arc<rayon::ThreadPool>,
        metrics: Arc<Metrics>,
        placement: Placement,
    ) -> std::io::Result<Batcher> {
        // room for every waiting job and the stop message: sends never block
        let (tx, rx) = sync_channel(batching.queue.saturating_add(1));
        let waiting = Arc::new(Waiting { count: AtomicUsize::new(0), metrics: metrics.clone() });
        let pause = Arc::new(PauseFlag::default());
        #[cfg(test)]
        let fault = FaultSlot::default();
        let w = Worker {
            rx,
            slot,
            batching,
            pool,
            metrics,
            waiting: waiting.clone(),
            pause: pause.clone(),
            #[cfg(test)]
            fault: fault.clone(),
        };
        let running = match placement {
            Placement::OwnThread => {
                Running::Thread(std::thread::Builder::new().name("pmstate-batcher".into()).spawn(move || w.run())?)
            }
            Placement::ForwardPool => {
                let (done, finished) = std::sync::mpsc::channel();
                let pool = w.pool.clone();
                pool.spawn(move || {
                    // a panic escaping a rayon job aborts the process: the
                    // loop ends instead, as a thread of its own would
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.run()));
                    let _ = done.send(());
                });
                Running::Pool(finished)
            }
        };
        Ok(Batcher {
            tx,
            queue: batching.queue,
            waiting,
            pause,
            running: std::sync::Mutex::new(Some(running)),
            #[cfg(test)]
            fault,
        })
    }

    /// Makes the next forward fail with `fault` (unit tests only).
    #[cfg(test)]
    pub(crate) fn inject(&self, fault: Fault) {
        *self.fault.lock().unwrap_or_else(|e| e.into_inner()) = Some(fault);
    }

    /// Queues a job, or refuses it when `queue` requests already wait.
    pub fn submit(&self, job: Job) -> Result<(), RequestError> {
        if !self.waiting.enter(self.queue) {
            return Err(RequestError::QueueFull { queue: self.queue });
        }
        match self.tx.try_send(Msg::Job(Box::new(job))) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                self.waiting.leave(1);
                Err(RequestError::QueueFull { queue: self.queue })
            }
            Err(TrySendError::Disconnected(_)) => {
                self.waiting.leave(1);
                Err(RequestError::ShuttingDown)
            }
        }
    }

    /// Holds every forward back until the guard is dropped; requests keep
    /// queueing (and are refused once the queue is full). For maintenance
    /// windows and for tests that need a full queue without racing a
    /// forward.
    pub fn pause(&self) -> Paused {
        self.pause.set(true);
        Paused { flag: self.pause.clone() }
    }

    /// Runs what is queued, then stops the worker.
    pub fn stop(&self) {
        let _ = self.tx.send(Msg::Stop);
        let running = self.running.lock().map(|mut g| g.take()).unwrap_or(None);
        match running {
            Some(Running::Thread(t)) => {
                let _ = t.join();
            }
            // Err: the loop is gone (its sender dropped), as Ok says
            Some(Running::Pool(finished)) => {
                let _ = finished.recv();
            }
            None => {}
        }
    }
}

struct Worker {
    rx: Receiver<Msg>,
    slot: Arc<ModelSlot>,
    batching: Batching,
    pool: Arc<rayon::ThreadPool>,
    metrics: Arc<Metrics>,
    waiting: Arc<Waiting>,
    pause: Arc<PauseFlag>,
    #[cfg(test)]
    fault: FaultSlot,
}

impl Worker {
    fn take(&self, msg: Msg) -> Option<Box<Job>> {
        match msg {
            Msg::Job(j) => Some(j),
            Msg::Stop => None,
        }
    }

    fn run(self) {
        let mut carry: Option<Box<Job>> = None;
        let mut stopping = false;
        loop {
            let first = match carry.take() {
                Some(j) => j,
                None if stopping => match self.rx.try_recv() {
                    Ok(m) => match self.take(m) {
                        Some(j) => j,
                        None => continue,
                    },
                    Err(_) => return,
                },
                None => match self.next_message() {
                    Ok(m) => match self.take(m) {
                        Some(j) => j,
                        None => {
                            stopping = true;
                            continue;
                        }
                    },
                    Err(_) => return,
                },
            };
            let deadline = first.enqueued + self.batching.max_wait;
            // a GPC prior's logits bound its forward below max_batch (interfaces
            // are the same across reloads, so the served model's bound holds)
            let max_rows = self.slot.current().interface.max_rows(self.batching.max_batch);
            let mut rows = first.req.rows;
            let mut batch = vec![*first];
            while rows < max_rows {
                let msg = match self.rx.try_recv() {
                    Ok(m) => m,
                    Err(TryRecvError::Disconnected) => break,
                    Err(TryRecvError::Empty) => {
                        let now = Instant::now();
                        if stopping || now >= deadline {
                            break;
                        }
                        match self.rx.recv_timeout(deadline - now) {
                            Ok(m) => m,
                            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
                        }
                    }
                };
                match self.take(msg) {
                    None => stopping = true,
                    Some(j) if rows + j.req.rows > max_rows => {
                        carry = Some(j);
                        break;
                    }
                    Some(j) => {
                        rows += j.req.rows;
                        batch.push(*j);
                    }
                }
            }
            self.run_batch(batch);
        }
    }

    /// The next message once the queue is empty: polled for
    /// [`Batching::spin`], then slept for. A closed-loop client's next
    /// request comes one transport round trip after its answer: polling
    /// meanwhile takes it without this thread being woken (tens of
    /// microseconds where an idle vCPU halts). Under
    /// [`Placement::ForwardPool`] the polling thread is a forward thread,
    /// and the forward starts where the request was found.
    fn next_message(&self) -> Result<Msg, RecvError> {
        if !self.batching.spin.is_zero() {
            // a spin past what an Instant can hold polls until a message comes
            let end = Instant::now().checked_add(self.batching.spin);
            loop {
                match self.rx.try_recv() {
                    Ok(m) => return Ok(m),
                    Err(TryRecvError::Disconnected) => return Err(RecvError),
                    Err(TryRecvError::Empty) if end.is_some_and(|e| Instant::now() >= e) => break,
                    Err(TryRecvError::Empty) => std::hint::spin_loop(),
                }
            }
        }
        self.rx.recv()
    }

    fn run_batch(&self, jobs: Vec<Job>) {
        self.pause.wait_while_paused();
        self.waiting.leave(jobs.len());
        // one model per batch: a reload swaps between batches, never inside one
        let model = self.slot.current();
        let mut live = Vec::with_capacity(jobs.len());
        for j in jobs {
            if j.reply.is_closed() {
                self.metrics.cancelled.inc();
            } else {
                live.push(j);
            }
        }
        // requests merge only with inputs of the same keys and widths
        let mut groups: Vec<Vec<Job>> = Vec::new();
        for j in live {
            match groups.iter_mut().find(|g| g[0].req.signature().eq(j.req.signature())) {
                Some(g) => g.push(j),
                None => groups.push(vec![j]),
            }
        }
        for g in groups {
            // a bug in a forward must not take the worker (and every later
            // request) down with it: its callers get a 500 and batching goes on
            let answers = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run_group(&model, &g)))
                .unwrap_or_else(|_| g.iter().map(|_| Err(RequestError::Panicked)).collect());
            for (j, a) in g.into_iter().zip(answers) {
                // the client may have gone meanwhile: nothing to do then
                let _ = j.reply.send(a);
            }
        }
    }

    /// One run of the model over the group's merged rows; each job's
    /// outputs in its order.
    fn run_group(&self, model: &LoadedModel, jobs: &[Job]) -> Vec<Result<Answer, RequestError>> {
        match self.forward(model, jobs) {
            Ok(outs) => Self::answers(model, jobs, outs),
            Err(e) => jobs.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    /// Each job's outputs, in the order it asked for them.
    fn answers(model: &LoadedModel, jobs: &[Job], outs: Vec<Outs>) -> Vec<Result<Answer, RequestError>> {
        jobs.iter()
            .zip(outs)
            .map(|(j, mut o)| {
                let tensors = j
                    .req
                    .outputs
                    .iter()
                    .map(|w| {
                        let (shape, data) = o.remove(w.name).ok_or(RequestError::NotComputed { output: w.name })?;
                        Ok((*w, shape, data))
                    })
                    .collect::<Result<Vec<_>, RequestError>>()?;
                Ok(Answer { version: model.version, tensors })
            })
            .collect()
    }

    /// The group's inputs merged (requests merge only with inputs of the
    /// same keys and widths, so each key's rows follow one another), one
    /// [`pmstate_policy::Model::run`] on the pool with one segment per job
    /// (its rows, its seed, the outputs it asked for), its time and size
    /// observed; each job gets its own outputs on the host.
    fn forward(&self, model: &LoadedModel, jobs: &[Job]) -> Result<Vec<Outs>, RequestError> {
        let failed = |e: RunError| RequestError::Forward(Arc::new(e));
        let rows: usize = jobs.iter().map(|j| j.req.rows).sum();
        let inputs = Self::merged(model, jobs, rows).map_err(|e| failed(e.into()))?;
        let names: Vec<Vec<&str>> = jobs.iter().map(|j| j.req.outputs.iter().map(|w| w.name).collect()).collect();
        let segments: Vec<Segment<'_>> = jobs
            .iter()
            .zip(&names)
            .map(|(j, n)| Segment { rows: j.req.rows, seed: j.req.seed, wanted: Asked::Names(n) })
            .collect();
        // the batch is already bounded by max_batch (and a prior's logits): one forward
        let batch = Batch { inputs: &inputs, segments: &segments, chunk_rows: usize::MAX };
        #[cfg(test)]
        let fault = &self.fault;
        let start = Instant::now();
        let out = self.pool.install(|| {
            #[cfg(test)]
            injected(fault)?;
            model.model.run(&batch)
        });
        let out = out.map_err(failed)?;
        self.metrics.forward_seconds.observe(start.elapsed().as_secs_f64());
        self.metrics.batch_rows.observe(rows as f64);
        self.metrics.batch_requests.observe(jobs.len() as f64);
        out.into_iter()
            .map(|named| {
                named
                    .into_iter()
                    .map(|(name, t)| Ok((name, (t.dims().to_vec(), host(&t)?))))
                    .collect::<candle_core::Result<Outs>>()
                    .map_err(|e| failed(e.into()))
            })
            .collect()
    }

    /// Every input of the group, its jobs' rows one after another: `[rows,
    /// width]`, or `[rows, ...row shape]` where the model fixes a row's
    /// whole shape (a pipeline's `[4, 29]`).
    fn merged(model: &LoadedModel, jobs: &[Job], rows: usize) -> candle_core::Result<HashMap<String, Tensor>> {
        let mut inputs = HashMap::new();
        let first = &jobs[0].req;
        for (pos, (key, width, values)) in first.inputs.iter().enumerate() {
            let shape: Vec<usize> = match model.interface.input(key).and_then(|s| s.row_shape.as_ref()) {
                Some(row) => std::iter::once(rows).chain(row.iter().copied()).collect(),
                None => vec![rows, *width],
            };
            let t = match values {
                Values::F32(_) => {
                    let mut v = Vec::with_capacity(rows * width);
                    for j in jobs {
                        v.extend_from_slice(j.req.inputs[pos].2.f32s());
                    }
                    Tensor::from_vec(v, shape, &Device::Cpu)?
                }
                Values::I64(_) => {
                    let mut v = Vec::with_capacity(rows * width);
                    for j in jobs {
                        if let Values::I64(x) = &j.req.inputs[pos].2 {
                            v.extend_from_slice(x);
                        }
                    }
                    Tensor::from_vec(v, shape, &Device::Cpu)?
                }
            };
            inputs.insert(key.clone(), t);
        }
        Ok(inputs)
    }
}

/// The injected fault, if any (taken: it applies to one forward).
#[cfg(test)]
fn injected(fault: &FaultSlot) -> Result<(), RunError> {
    match fault.lock().unwrap_or_else(|e| e.into_inner()).take() {
        None => Ok(()),
        Some(Fault::Error) => Err(candle_core::Error::Msg("injected fault".into()).into()),
        Some(Fault::Panic) => panic!("injected fault"),
    }
}

/// A tensor's values on the host, row-major, in its element type.
fn host(t: &Tensor) -> candle_core::Result<Values> {
    let flat = t.to_device(&Device::Cpu)?.flatten_all()?;
    Ok(match flat.dtype() {
        candle_core::DType::I64 => Values::I64(flat.to_vec1::<i64>()?),
        _ => Values::F32(flat.to_vec1::<f32>()?),
    })
}
