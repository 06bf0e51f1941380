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
//! seed and its index within the request (see `Worker::prior`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use candle_core::{Device, Tensor};
use pmstate_deploy::{DeployError, Pipeline};
use pmstate_policy::gpc::{LatentPrior, RowDraw};
use pmstate_policy::{MaskedMimic, Part, Policy, PolicyError};
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
    thread: std::sync::Mutex<Option<JoinHandle<()>>>,
    #[cfg(test)]
    fault: FaultSlot,
}

impl Batcher {
    /// Starts the worker; forwards run on `pool`.
    pub fn start(
        slot: Arc<ModelSlot>,
        batching: Batching,
        pool: rayon::ThreadPool,
        metrics: Arc<Metrics>,
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
        let thread = std::thread::Builder::new().name("pmstate-batcher".into()).spawn(move || w.run())?;
        Ok(Batcher {
            tx,
            queue: batching.queue,
            waiting,
            pause,
            thread: std::sync::Mutex::new(Some(thread)),
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
        let t = self.thread.lock().map(|mut g| g.take()).unwrap_or(None);
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}

struct Worker {
    rx: Receiver<Msg>,
    slot: Arc<ModelSlot>,
    batching: Batching,
    pool: rayon::ThreadPool,
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
                None => match self.rx.recv() {
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

    /// One forward per part for the group; each job's outputs in its order.
    fn run_group(&self, model: &LoadedModel, jobs: &[Job]) -> Vec<Result<Answer, RequestError>> {
        if let Some(p) = &model.pipeline {
            return match self.pipeline(p, jobs) {
                Ok(outs) => Self::answers(model, jobs, outs),
                Err(e) => jobs.iter().map(|_| Err(e.clone())).collect(),
            };
        }
        let mut outs: Vec<Outs> = vec![HashMap::new(); jobs.len()];
        let result = (|| -> Result<(), PolicyError> {
            if let Some(mm) = &model.masked_mimic {
                return self.masked_mimic(model, mm, jobs, &mut outs);
            }
            if let Some(p) = &model.prior {
                return self.prior(model, p, jobs, &mut outs);
            }
            let Some(policy) = &model.policy else { return Ok(()) };
            let ac: Vec<usize> = (0..jobs.len()).filter(|&i| jobs[i].req.actor_critic()).collect();
            if !ac.is_empty() {
                self.actor_critic(model, policy, jobs, &ac, &mut outs)?;
            }
            let disc: Vec<usize> = (0..jobs.len()).filter(|&i| jobs[i].req.discriminator()).collect();
            if !disc.is_empty() {
                self.discriminator(model, policy, jobs, &disc, &mut outs)?;
            }
            Ok(())
        })();
        if let Err(e) = result {
            let e = RequestError::Forward(Arc::new(e));
            return jobs.iter().map(|_| Err(e.clone())).collect();
        }
        Self::answers(model, jobs, outs)
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

    /// One pipeline forward over the merged rows of `jobs` (their inputs
    /// are in the pipeline's order, each `rows x row_len` values), on the
    /// pool; each job gets its rows of every output.
    fn pipeline(&self, p: &Pipeline, jobs: &[Job]) -> Result<Vec<Outs>, RequestError> {
        let failed = |e: DeployError| RequestError::PipelineForward(Arc::new(e));
        let rows: usize = jobs.iter().map(|j| j.req.rows).sum();
        let mut inputs = HashMap::new();
        for (pos, spec) in p.inputs().iter().enumerate() {
            let mut v = Vec::with_capacity(rows * spec.row_len());
            for j in jobs {
                if let Some((_, _, values)) = j.req.inputs.get(pos) {
                    v.extend_from_slice(values.f32s());
                }
            }
            let shape: Vec<usize> = std::iter::once(rows).chain(spec.row_shape.iter().copied()).collect();
            let t = Tensor::from_vec(v, shape, &Device::Cpu).map_err(|e| failed(e.into()))?;
            inputs.insert(spec.name.clone(), t);
        }
        #[cfg(test)]
        let fault = &self.fault;
        let start = Instant::now();
        let out = self.pool.install(|| {
            #[cfg(test)]
            injected(fault).map_err(|e| failed(e.into()))?;
            p.forward(&inputs).map_err(failed)
        })?;
        self.metrics.forward_seconds.observe(start.elapsed().as_secs_f64());
        self.metrics.batch_rows.observe(rows as f64);
        self.metrics.batch_requests.observe(jobs.len() as f64);
        let mut outs: Vec<Outs> = vec![HashMap::new(); jobs.len()];
        for (name, t) in out.named() {
            let v = host(t).map_err(|e| failed(e.into()))?;
            let w = v.len() / rows.max(1);
            let mut off = 0;
            for (j, o) in jobs.iter().zip(outs.iter_mut()) {
                let r = j.req.rows;
                o.insert(name, (vec![r, w], Values::F32(v[off * w..(off + r) * w].to_vec())));
                off += r;
            }
        }
        Ok(outs)
    }

    /// The merged observations of `idx` for the keys `part` reads.
    fn merged(
        model: &LoadedModel,
        jobs: &[Job],
        idx: &[usize],
        part: Part,
    ) -> candle_core::Result<(HashMap<String, Tensor>, usize)> {
        let rows: usize = idx.iter().map(|&i| jobs[i].req.rows).sum();
        let mut obs = HashMap::new();
        let first = &jobs[idx[0]].req;
        for (pos, (key, width, _)) in first.inputs.iter().enumerate() {
            let reads = model.interface.input(key).is_some_and(|s| match part {
                Part::ActorCritic => s.actor_critic,
                Part::Discriminator => s.discriminator,
            });
            if !reads {
                continue;
            }
            let t = match &first.inputs[pos].2 {
                Values::F32(_) => {
                    let mut v = Vec::with_capacity(rows * width);
                    for &i in idx {
                        v.extend_from_slice(jobs[i].req.inputs[pos].2.f32s());
                    }
                    Tensor::from_vec(v, (rows, *width), &Device::Cpu)?
                }
                Values::I64(_) => {
                    let mut v = Vec::with_capacity(rows * width);
                    for &i in idx {
                        if let Values::I64(x) = &jobs[i].req.inputs[pos].2 {
                            v.extend_from_slice(x);
                        }
                    }
                    Tensor::from_vec(v, (rows, *width), &Device::Cpu)?
                }
            };
            obs.insert(key.clone(), t);
        }
        Ok((obs, rows))
    }

    /// The rows of `idx` merged, one forward `f` on the pool, its time and
    /// size observed: what both parts share. Returns `f`'s result and the rows.
    fn forward<T: Send, M: Sync>(
        &self,
        model: &LoadedModel,
        net: &M,
        jobs: &[Job],
        idx: &[usize],
        part: Part,
        f: impl FnOnce(&M, &HashMap<String, Tensor>) -> Result<T, PolicyError> + Send,
    ) -> Result<(T, usize), PolicyError> {
        let (obs, rows) = Self::merged(model, jobs, idx, part)?;
        #[cfg(test)]
        let fault = &self.fault;
        let start = Instant::now();
        let out = self.pool.install(|| {
            #[cfg(test)]
            injected(fault)?;
            f(net, &obs)
        })?;
        self.metrics.forward_seconds.observe(start.elapsed().as_secs_f64());
        self.metrics.batch_rows.observe(rows as f64);
        self.metrics.batch_requests.observe(idx.len() as f64);
        Ok((out, rows))
    }

    /// One MaskedMimic forward over every job of the group (same inputs:
    /// all with `vae_noise` or none); each job gets its rows of each output.
    fn masked_mimic(
        &self,
        model: &LoadedModel,
        mm: &MaskedMimic,
        jobs: &[Job],
        outs: &mut [Outs],
    ) -> Result<(), PolicyError> {
        let idx: Vec<usize> = (0..jobs.len()).collect();
        let (o, rows) = self.forward(model, mm, jobs, &idx, Part::ActorCritic, |m, obs| m.forward(obs))?;
        for (name, t) in [
            ("mean_action", &o.mean_action),
            ("latent_mu", &o.latent_mu),
            ("latent_logvar", &o.latent_logvar),
            ("latent", &o.latent),
        ] {
            let v = host(t)?;
            let w = v.len() / rows.max(1);
            let mut off = 0;
            for (j, out) in jobs.iter().zip(outs.iter_mut()) {
                let r = j.req.rows;
                out.insert(name, (vec![r, w], Values::F32(v[off * w..(off + r) * w].to_vec())));
                off += r;
            }
        }
        Ok(())
    }

    /// One GPC prior forward over every job of the group: teacher forced
    /// when the group's requests carry tokens (requests merge only with the
    /// same inputs), else generation, each row drawing as its row of its own
    /// request under that request's seed ([`RowDraw`]): the tokens a request
    /// gets do not depend on what it was batched with.
    fn prior(&self, model: &LoadedModel, p: &LatentPrior, jobs: &[Job], outs: &mut [Outs]) -> Result<(), PolicyError> {
        let idx: Vec<usize> = (0..jobs.len()).collect();
        let teacher_forced = jobs[0].req.inputs.iter().any(|(k, _, _)| k == p.token_key());
        let draws: Vec<RowDraw> = jobs
            .iter()
            .flat_map(|j| {
                let seed = j.req.seed.unwrap_or(0);
                (0..j.req.rows as u64).map(move |row| RowDraw { seed, row })
            })
            .collect();
        let (o, rows) = self.forward(model, p, jobs, &idx, Part::ActorCritic, |p, obs| {
            if teacher_forced {
                p.teacher_forced(obs)
            } else {
                p.generate_rows(obs, p.sampling(0), &draws)
            }
        })?;
        let mut named = vec![
            ("logits", host(&o.logits)?, o.logits.dims()[1..].to_vec()),
            ("mean_action", host(&o.mean_action)?, o.mean_action.dims()[1..].to_vec()),
            ("latent_codes", host(&o.latent_codes)?, o.latent_codes.dims()[1..].to_vec()),
        ];
        for (name, v, row_shape) in named.drain(..) {
            let w = v.len() / rows.max(1);
            let mut off = 0;
            for (j, out) in jobs.iter().zip(outs.iter_mut()) {
                let r = j.req.rows;
                let shape = std::iter::once(r).chain(row_shape.iter().copied()).collect();
                out.insert(name, (shape, Values::F32(v[off * w..(off + r) * w].to_vec())));
                off += r;
            }
        }
        if !teacher_forced {
            let tokens = o.tokens.to_device(&Device::Cpu)?.flatten_all()?.to_vec1::<i64>()?;
            let w = tokens.len() / rows.max(1);
            let mut off = 0;
            for (j, out) in jobs.iter().zip(outs.iter_mut()) {
                let r = j.req.rows;
                let mine = Values::I64(tokens[off * w..(off + r) * w].to_vec());
                out.insert(crate::model::PRIOR_TOKENS_OUTPUT, (vec![r, w], mine));
                off += r;
            }
        }
        Ok(())
    }

    fn actor_critic(
        &self,
        model: &LoadedModel,
        p: &Policy,
        jobs: &[Job],
        idx: &[usize],
        outs: &mut [Outs],
    ) -> Result<(), PolicyError> {
        // the critic runs only when some request of the group asks for the
        // value: a deployment asks for actions, and the critic is 40 % of
        // the full-size tracker's work (each row's actor outputs are the
        // same bits either way)
        let wants_value = idx.iter().any(|&i| jobs[i].req.critic());
        let ((o, value), rows) = self.forward(model, p, jobs, idx, Part::ActorCritic, |p, obs| {
            if wants_value {
                let (actor, value) = p.forward(obs)?.into_actor_and_value();
                Ok((actor, Some(value)))
            } else {
                Ok((p.act(obs)?, None))
            }
        })?;
        let a = model.interface.action_size;
        let mean = host(&o.mean_action)?;
        let value = value.as_ref().map(host).transpose()?;
        let vw = value.as_ref().map_or(0, |v| v.len() / rows.max(1));
        let std = host(&o.std)?;
        let norm = match &o.norm_obs {
            Some(n) if n.dims().first() == Some(&rows) && n.rank() == 2 => Some((host(n)?, n.dims()[1])),
            _ => None,
        };
        let codes = match &o.latent_codes {
            Some(c) if c.dims().first() == Some(&rows) && c.rank() == 2 => Some((host(c)?, c.dims()[1])),
            _ => None,
        };
        let mut off = 0;
        for &i in idx {
            let r = jobs[i].req.rows;
            let o = &mut outs[i];
            let mean_rows = mean[off * a..(off + r) * a].to_vec();
            for w in &jobs[i].req.outputs {
                match w.name {
                    "value" => {
                        if let Some(v) = &value {
                            o.insert("value", (vec![r, vw], Values::F32(v[off * vw..(off + r) * vw].to_vec())));
                        }
                    }
                    "std" => {
                        o.insert("std", (vec![a], Values::F32(std.clone())));
                    }
                    "norm_obs" => {
                        if let Some((n, nw)) = &norm {
                            o.insert("norm_obs", (vec![r, *nw], Values::F32(n[off * nw..(off + r) * nw].to_vec())));
                        }
                    }
                    "latent_codes" => {
                        if let Some((c, cw)) = &codes {
                            o.insert("latent_codes", (vec![r, *cw], Values::F32(c[off * cw..(off + r) * cw].to_vec())));
                        }
                    }
                    _ => {}
                }
            }
            if let Some(seed) = jobs[i].req.seed {
                let m = Tensor::from_vec(mean_rows.clone(), (r, a), p.device())?;
                let action = p.actor().sample(&m, seed)?;
                let neglogp = p.neglogp(&m, &action)?;
                o.insert("action", (vec![r, a], Values::F32(host(&action)?)));
                o.insert("neglogp", (vec![r], Values::F32(host(&neglogp)?)));
            }
            o.insert("mean_action", (vec![r, a], Values::F32(mean_rows)));
            off += r;
        }
        Ok(())
    }

    fn discriminator(
        &self,
        model: &LoadedModel,
        p: &Policy,
        jobs: &[Job],
        idx: &[usize],
        outs: &mut [Outs],
    ) -> Result<(), PolicyError> {
        let (d, rows) = self.forward(model, p, jobs, idx, Part::Discriminator, |p, obs| p.discriminate(obs))?;
        for (name, t) in
            [("disc_logits", &d.disc_logits), ("disc_reward", &d.disc_reward), ("disc_value", &d.disc_value)]
        {
            let v = host(t)?;
            let w = v.len() / rows.max(1);
            let mut off = 0;
            for &i in idx {
                let r = jobs[i].req.rows;
                outs[i].insert(name, (vec![r, w], Values::F32(v[off * w..(off + r) * w].to_vec())));
                off += r;
            }
        }
        Ok(())
    }
}

/// The injected fault, if any (taken: it applies to one forward).
#[cfg(test)]
fn injected(fault: &FaultSlot) -> Result<(), PolicyError> {
    match fault.lock().unwrap_or_else(|e| e.into_inner()).take() {
        None => Ok(()),
        Some(Fault::Error) => Err(candle_core::Error::Msg("injected fault".into()).into()),
        Some(Fault::Panic) => panic!("injected fault"),
    }
}

/// A tensor's values on the host, row-major.
fn host(t: &Tensor) -> candle_core::Result<Vec<f32>> {
    t.to_device(&Device::Cpu)?.flatten_all()?.to_vec1::<f32>()
}
