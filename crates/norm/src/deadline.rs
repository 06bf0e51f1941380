//! Waiting for a collective with a deadline, and the broken state a failed
//! wait leaves behind: one policy for the MPI and NCCL engines.
//!
//! A peer that exited or stalled never completes its half of a collective,
//! and MPI and NCCL would wait forever. Both engines start their operation
//! nonblocking and poll it here; at the deadline the communicator is
//! marked broken (MPI) or aborted (NCCL), and every later call fails at once.

use std::time::{Duration, Instant};

use crate::error::CollectiveProblem;

/// How a wait ended.
pub(crate) enum Wait<E> {
    /// The operation completed.
    Done,
    /// Polling it failed (the library's error).
    Failed(E),
    /// The deadline passed first.
    TimedOut,
}

/// Polls `poll` (true: done) until it completes, fails, or `deadline`
/// passes. Spins for the first 50 µs (a collective among ranks in step
/// completes in microseconds), then yields until 1 ms, then sleeps 50 µs
/// between polls (a rank waiting for a slow peer must not burn a core).
pub(crate) fn poll_until<E>(deadline: Instant, mut poll: impl FnMut() -> Result<bool, E>) -> Wait<E> {
    let start = Instant::now();
    loop {
        match poll() {
            Ok(true) => return Wait::Done,
            Ok(false) => {}
            Err(e) => return Wait::Failed(e),
        }
        let now = Instant::now();
        if now >= deadline {
            return Wait::TimedOut;
        }
        let waited = now - start;
        if waited < Duration::from_micros(50) {
            std::hint::spin_loop();
        } else if waited < Duration::from_millis(1) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// Whether a communicator is still usable: once a collective failed or
/// timed out, the ranks are out of step and every later call must fail at
/// once rather than pair with the wrong operation of a peer.
#[derive(Debug, Default)]
pub(crate) struct Broken(Option<CollectiveProblem>);

impl Broken {
    /// What broke it, if anything did.
    pub(crate) fn problem(&self) -> Option<&CollectiveProblem> {
        self.0.as_ref()
    }

    /// Errors ([`CollectiveProblem::Broken`] with the first failure) once broken.
    pub(crate) fn check(&self) -> Result<(), CollectiveProblem> {
        match &self.0 {
            Some(first) => Err(CollectiveProblem::Broken(Box::new(first.clone()))),
            None => Ok(()),
        }
    }

    /// Marks it broken (the first failure is kept).
    pub(crate) fn mark(&mut self, problem: &CollectiveProblem) {
        self.0.get_or_insert_with(|| problem.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_ends_done_failed_or_timed_out() {
        let far = Instant::now() + Duration::from_secs(60);
        let mut n = 0;
        assert!(matches!(
            poll_until(far, || {
                n += 1;
                Ok::<bool, ()>(n == 3)
            }),
            Wait::Done
        ));
        assert!(matches!(poll_until(far, || Err("boom")), Wait::Failed("boom")));
        assert!(matches!(poll_until::<()>(Instant::now(), || Ok(false)), Wait::TimedOut));
    }

    #[test]
    fn a_broken_communicator_stays_broken_with_its_first_reason() {
        let first = CollectiveProblem::SourceOutOfRange { src: 1 };
        let mut b = Broken::default();
        assert!(b.check().is_ok());
        b.mark(&first);
        b.mark(&CollectiveProblem::SourceOutOfRange { src: 2 });
        assert_eq!(b.problem(), Some(&first));
        assert_eq!(b.check(), Err(CollectiveProblem::Broken(Box::new(first))));
    }
}
