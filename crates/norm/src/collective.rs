//! Cross-process aggregation: the two collectives the reference uses.

use candle_core::Tensor;

use crate::error::{Call, CollectiveProblem, Result};

/// The collectives ProtoMotions' normalizers call through Lightning Fabric.
///
/// Every rank of a group calls the same sequence of operations with tensors
/// of the same shape and dtype. `all_gather` returns the W tensors ordered by
/// rank; `broadcast` returns `src`'s tensor on every rank. Implementations
/// report a failed or stuck peer as [`NormError::Collective`](crate::NormError::Collective).
pub trait Collective: Send + Sync {
    /// This participant's rank in `0..world_size()`.
    fn rank(&self) -> usize;
    /// The number of participants.
    fn world_size(&self) -> usize;
    /// Every rank's `t`, index = rank.
    fn all_gather(&self, t: &Tensor) -> Result<Vec<Tensor>>;
    /// Rank `src`'s `t`, on every rank.
    fn broadcast(&self, t: &Tensor, src: usize) -> Result<Tensor>;
}

/// One process, no peers: world size 1. `all_gather` returns the tensor
/// itself, `broadcast` returns its argument.
///
/// ```
/// use pmstate_norm::{Collective, SingleProcess};
/// let c = SingleProcess;
/// assert_eq!((c.rank(), c.world_size()), (0, 1));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SingleProcess;

impl Collective for SingleProcess {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_gather(&self, t: &Tensor) -> Result<Vec<Tensor>> {
        Ok(vec![t.clone()])
    }
    fn broadcast(&self, t: &Tensor, _src: usize) -> Result<Tensor> {
        Ok(t.clone())
    }
}

/// W participants in one process (threads, e.g. one per GPU): a real
/// rendezvous per collective, so every rank blocks until all have arrived.
///
/// A peer that never arrives (it failed, or it called another collective)
/// turns into [`NormError::Collective`](crate::NormError::Collective) on the
/// others after `timeout`, never a hang; so does a peer whose tensor's
/// shape or dtype differs.
///
/// ```
/// use candle_core::{Device, Tensor};
/// use pmstate_norm::{Collective, InProcessGroup};
/// let ranks = InProcessGroup::new(2, std::time::Duration::from_secs(10));
/// let handles: Vec<_> = ranks.into_iter().map(|c| std::thread::spawn(move || {
///     let t = Tensor::new(&[c.rank() as f32], &Device::Cpu).unwrap();
///     c.all_gather(&t).unwrap().len()
/// })).collect();
/// for h in handles { assert_eq!(h.join().unwrap(), 2); }
/// ```
pub struct InProcessGroup {
    rank: usize,
    shared: std::sync::Arc<GroupState>,
    timeout: std::time::Duration,
}

struct GroupState {
    world_size: usize,
    inner: std::sync::Mutex<Round>,
    cv: std::sync::Condvar,
}

/// One collective in flight: what each rank contributed, and how many have
/// taken the result. A round number keeps consecutive collectives apart.
struct Round {
    generation: u64,
    op: Option<&'static str>,
    slots: Vec<Option<Tensor>>,
    taken: usize,
    result: Option<Vec<Tensor>>,
    poisoned: Option<CollectiveProblem>,
}

impl InProcessGroup {
    /// The W handles of a new group, index = rank. Move each into its thread.
    pub fn new(world_size: usize, timeout: std::time::Duration) -> Vec<InProcessGroup> {
        let shared = std::sync::Arc::new(GroupState {
            world_size,
            inner: std::sync::Mutex::new(Round {
                generation: 0,
                op: None,
                slots: vec![None; world_size],
                taken: 0,
                result: None,
                poisoned: None,
            }),
            cv: std::sync::Condvar::new(),
        });
        (0..world_size).map(|rank| InProcessGroup { rank, shared: shared.clone(), timeout }).collect()
    }

    fn err(&self, op: &'static str, problem: CollectiveProblem) -> crate::NormError {
        crate::NormError::Collective { op, rank: self.rank, world_size: self.shared.world_size, problem }
    }

    /// Marks the group broken: every waiting and later call fails. A rank
    /// that gives up calls this so that its peers fail fast.
    pub fn abort(&self, reason: &str) {
        let mut g = self.shared.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.poisoned.get_or_insert_with(|| CollectiveProblem::Aborted { rank: self.rank, reason: reason.to_owned() });
        self.shared.cv.notify_all();
    }

    /// Contributes `t` and returns every rank's contribution.
    fn exchange(&self, op: &'static str, t: &Tensor) -> Result<Vec<Tensor>> {
        let deadline = std::time::Instant::now() + self.timeout;
        let w = self.shared.world_size;
        let mut g = self.shared.inner.lock().unwrap_or_else(|p| p.into_inner());
        // Wait until the previous round has been fully taken.
        while g.result.is_some() && g.poisoned.is_none() {
            g = self.wait(g, deadline, op)?;
        }
        if let Some(p) = &g.poisoned {
            return Err(self.err(op, p.clone()));
        }
        if let Some(other) = g.op {
            if other != op {
                let problem = CollectiveProblem::OpMismatch { here: op, peer: other };
                g.poisoned = Some(problem.clone());
                self.shared.cv.notify_all();
                return Err(self.err(op, problem));
            }
        }
        if let Some((peer, first)) = g.slots.iter().enumerate().find_map(|(r, s)| Some((r, s.as_ref()?))) {
            if first.dims() != t.dims() || first.dtype() != t.dtype() {
                let call = |t: &Tensor| Call {
                    op: op.to_owned(),
                    dtype: t.dtype().as_str().to_owned(),
                    dims: t.dims().to_vec(),
                };
                let problem = CollectiveProblem::Disagree {
                    first_rank: self.rank,
                    first: Box::new(call(t)),
                    rank: peer,
                    call: Box::new(call(first)),
                };
                g.poisoned = Some(problem.clone());
                self.shared.cv.notify_all();
                return Err(self.err(op, problem));
            }
        }
        g.op = Some(op);
        g.slots[self.rank] = Some(t.clone());
        let generation = g.generation;
        if g.slots.iter().all(Option::is_some) {
            g.result = Some(g.slots.iter_mut().map(|s| s.take().expect("all slots filled")).collect());
            self.shared.cv.notify_all();
        }
        while g.generation == generation && g.result.is_none() && g.poisoned.is_none() {
            g = self.wait(g, deadline, op)?;
        }
        if let Some(p) = &g.poisoned {
            return Err(self.err(op, p.clone()));
        }
        let out = g.result.clone().expect("result present in this generation");
        g.taken += 1;
        if g.taken == w {
            g.generation += 1;
            g.taken = 0;
            g.op = None;
            g.result = None;
            self.shared.cv.notify_all();
        }
        Ok(out)
    }

    fn wait<'a>(
        &self,
        g: std::sync::MutexGuard<'a, Round>,
        deadline: std::time::Instant,
        op: &'static str,
    ) -> Result<std::sync::MutexGuard<'a, Round>> {
        let now = std::time::Instant::now();
        if now >= deadline {
            let mut g = g;
            let problem = CollectiveProblem::TimedOut { after: self.timeout };
            g.poisoned.get_or_insert_with(|| problem.clone());
            self.shared.cv.notify_all();
            return Err(self.err(op, problem));
        }
        let (g, _) = self.shared.cv.wait_timeout(g, deadline - now).unwrap_or_else(|p| p.into_inner());
        Ok(g)
    }
}

impl Collective for InProcessGroup {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.shared.world_size
    }
    fn all_gather(&self, t: &Tensor) -> Result<Vec<Tensor>> {
        self.exchange("all_gather", t)
    }
    fn broadcast(&self, t: &Tensor, src: usize) -> Result<Tensor> {
        if src >= self.shared.world_size {
            return Err(self.err("broadcast", CollectiveProblem::SourceOutOfRange { src }));
        }
        Ok(self.exchange("broadcast", t)?.swap_remove(src))
    }
}
