//! Real-time options for the thread that runs the control loop: its memory
//! locked (no page faults mid-step), a real-time scheduling class (no
//! preemption by ordinary work), one CPU (no migrations), and a pacer that
//! wakes it at absolute deadlines of the control period.
//!
//! Written on libc's calls rather than a crate: the three calls and the
//! absolute-deadline sleep are a few lines each, and the crates that wrap
//! them (thread-priority, core_affinity, nix) each cover only part of this.
//! Linux only; elsewhere [`Realtime::apply`] says the platform lacks them.
#![allow(unsafe_code)]

use std::time::Duration;

/// What to ask of the operating system for the calling thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Realtime {
    /// Lock the process's memory, present and future (`mlockall`).
    pub memory: MemoryLock,
    /// Run the thread under `SCHED_FIFO` at this priority (1-99).
    pub fifo_priority: Option<u8>,
    /// Pin the thread to this CPU.
    pub cpu: Option<usize>,
}

/// Whether memory is locked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemoryLock {
    /// Pages may be swapped or faulted in lazily.
    #[default]
    Unlocked,
    /// `mlockall(MCL_CURRENT | MCL_FUTURE)`.
    Locked,
}

/// What the operating system refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RealtimeError {
    /// `mlockall` failed (EPERM: no CAP_IPC_LOCK; ENOMEM: RLIMIT_MEMLOCK too low).
    #[error("locking memory: {source} (needs CAP_IPC_LOCK or a memlock limit above the process's size)")]
    LockMemory {
        /// The OS error.
        source: std::io::Error,
    },
    /// The priority is outside 1-99.
    #[error("SCHED_FIFO priority {priority}: must be 1-99")]
    PriorityRange {
        /// The priority asked.
        priority: u8,
    },
    /// `sched_setscheduler` failed (EPERM: no CAP_SYS_NICE and no rtprio limit).
    #[error("SCHED_FIFO at priority {priority}: {source} (needs CAP_SYS_NICE or an rtprio limit)")]
    Priority {
        /// The priority asked.
        priority: u8,
        /// The OS error.
        source: std::io::Error,
    },
    /// The CPU does not exist or is not allowed to this process.
    #[error("pinning to CPU {cpu}: {source}")]
    Cpu {
        /// The CPU asked.
        cpu: usize,
        /// The OS error.
        source: std::io::Error,
    },
    /// This platform has none of these calls.
    #[error("real-time options are available on Linux only")]
    Unsupported,
}

impl Realtime {
    /// Whether anything is asked.
    pub fn any(&self) -> bool {
        self.memory == MemoryLock::Locked || self.fifo_priority.is_some() || self.cpu.is_some()
    }

    /// Applies the options to the calling thread (memory: the process),
    /// in the order affinity, memory, scheduling class; the first refusal is
    /// the error (what came before it stays applied).
    pub fn apply(&self) -> Result<(), RealtimeError> {
        if !self.any() {
            return Ok(());
        }
        if let Some(p) = self.fifo_priority {
            if !(1..=99).contains(&p) {
                return Err(RealtimeError::PriorityRange { priority: p });
            }
        }
        imp::apply(self)
    }
}

/// The thread's CPU affinity and scheduling class, as the OS reports them
/// (for tests and reports).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadState {
    /// CPUs the thread may run on.
    pub cpus: Vec<usize>,
    /// Whether it runs under SCHED_FIFO, and at which priority.
    pub fifo_priority: Option<i32>,
}

/// The calling thread's [`ThreadState`], where the platform tells.
pub fn thread_state() -> Option<ThreadState> {
    imp::thread_state()
}

/// Blocks SIGPIPE for the calling thread, so that a write into a pipe whose
/// reader went away fails with EPIPE instead of killing the process: the
/// flight recorder's writer thread runs inside C hosts that may keep
/// SIGPIPE's default action (Rust binaries ignore it; a robot's control
/// process need not).
pub(crate) fn block_sigpipe() {
    imp::block_sigpipe();
}

/// Wakes a loop at absolute deadlines `start + k * period` on the monotonic
/// clock, so that a late wake-up or a long step does not shift every later
/// period (a relative sleep would).
#[derive(Debug)]
pub struct Pacer {
    period: Duration,
    next: Duration,
    spin: Duration,
}

/// How a wake-up went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wake {
    /// How long after its deadline the thread woke (zero if the deadline had
    /// already passed when it asked to sleep: see `missed`).
    pub late: Duration,
    /// The deadline had passed before the wait began: the previous step
    /// overran its period.
    pub missed: bool,
}

impl Pacer {
    /// A pacer whose first deadline is one `period` from now.
    pub fn new(period: Duration) -> Self {
        let now = imp::monotonic();
        Pacer { period, next: now + period, spin: Duration::ZERO }
    }

    /// Sleeps until `spin` before each deadline, then polls the clock until
    /// it: the CPU stays awake (no idle state to leave, no virtual CPU
    /// handed back to a hypervisor) at the cost of that much busy time per
    /// period. Zero: sleep all the way (the default).
    pub fn with_spin(mut self, spin: Duration) -> Self {
        self.spin = spin.min(self.period);
        self
    }

    /// Sleeps until the next deadline; a missed deadline is skipped to the
    /// next one in the future (the loop does not try to catch up).
    pub fn wait(&mut self) -> Wake {
        let before = imp::monotonic();
        let missed = before >= self.next;
        if missed {
            // skip the periods already gone
            let behind = (before - self.next).as_nanos() / self.period.as_nanos().max(1) + 1;
            let skip = u32::try_from(behind).unwrap_or(u32::MAX);
            self.next += self.period.saturating_mul(skip);
        }
        imp::sleep_until(self.next.saturating_sub(self.spin));
        if !self.spin.is_zero() {
            while imp::monotonic() < self.next {
                std::hint::spin_loop();
            }
        }
        let after = imp::monotonic();
        let late = after.saturating_sub(self.next);
        self.next += self.period;
        Wake { late, missed }
    }
}

#[cfg(target_os = "linux")]
mod imp {
    use std::time::Duration;

    use super::{MemoryLock, Realtime, RealtimeError, ThreadState};

    pub(super) fn apply(r: &Realtime) -> Result<(), RealtimeError> {
        if let Some(cpu) = r.cpu {
            if cpu >= libc::CPU_SETSIZE as usize {
                return Err(RealtimeError::Cpu { cpu, source: std::io::Error::from_raw_os_error(libc::EINVAL) });
            }
            // SAFETY: cpu_set_t is plain data (all zeros is the empty set);
            // CPU_SET writes inside it (cpu < CPU_SETSIZE, checked above);
            // sched_setaffinity reads size_of::<cpu_set_t>() bytes of it.
            let rc = unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
            };
            if rc != 0 {
                return Err(RealtimeError::Cpu { cpu, source: std::io::Error::last_os_error() });
            }
        }
        if r.memory == MemoryLock::Locked {
            // SAFETY: mlockall takes flags only and touches no memory of ours.
            if unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) } != 0 {
                return Err(RealtimeError::LockMemory { source: std::io::Error::last_os_error() });
            }
        }
        if let Some(priority) = r.fifo_priority {
            let param = libc::sched_param { sched_priority: i32::from(priority) };
            // SAFETY: `param` is a valid sched_param that outlives the call;
            // pid 0 is the calling thread.
            if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
                return Err(RealtimeError::Priority { priority, source: std::io::Error::last_os_error() });
            }
        }
        Ok(())
    }

    pub(super) fn block_sigpipe() {
        // SAFETY: a zeroed sigset_t is filled by sigemptyset/sigaddset; the
        // mask change is the calling thread's only (pthread_sigmask).
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGPIPE);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        }
    }

    /// Whether SIGPIPE is blocked for the calling thread.
    #[cfg(test)]
    pub(super) fn sigpipe_blocked() -> bool {
        // SAFETY: the kernel fills `old`; sigismember reads it.
        unsafe {
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut old);
            libc::sigismember(&old, libc::SIGPIPE) == 1
        }
    }

    pub(super) fn thread_state() -> Option<ThreadState> {
        // SAFETY: as in `apply`: a zeroed cpu_set_t filled by the kernel,
        // read with CPU_ISSET below CPU_SETSIZE.
        let cpus = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                return None;
            }
            (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
        };
        // SAFETY: sched_getscheduler takes a pid only.
        let policy = unsafe { libc::sched_getscheduler(0) };
        let fifo_priority = if policy == libc::SCHED_FIFO {
            let mut param = libc::sched_param { sched_priority: 0 };
            // SAFETY: `param` is a valid sched_param the kernel writes.
            (unsafe { libc::sched_getparam(0, &mut param) } == 0).then_some(param.sched_priority)
        } else {
            None
        };
        Some(ThreadState { cpus, fifo_priority })
    }

    pub(super) fn monotonic() -> Duration {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid timespec the call writes.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        Duration::new(u64::try_from(ts.tv_sec).unwrap_or(0), u32::try_from(ts.tv_nsec).unwrap_or(0))
    }

    pub(super) fn sleep_until(t: Duration) {
        let ts = libc::timespec {
            tv_sec: libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: libc::c_long::from(i32::try_from(t.subsec_nanos()).unwrap_or(0)),
        };
        loop {
            // SAFETY: `ts` is a valid timespec; no remainder is asked for
            // (absolute time: a signal's interruption just sleeps again).
            let rc =
                unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) };
            if rc != libc::EINTR {
                break;
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::time::{Duration, Instant};

    use super::{Realtime, RealtimeError, ThreadState};

    pub(super) fn apply(_: &Realtime) -> Result<(), RealtimeError> {
        Err(RealtimeError::Unsupported)
    }

    pub(super) fn thread_state() -> Option<ThreadState> {
        None
    }

    pub(super) fn block_sigpipe() {}

    fn origin() -> Instant {
        static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *ORIGIN.get_or_init(Instant::now)
    }

    pub(super) fn monotonic() -> Duration {
        origin().elapsed()
    }

    pub(super) fn sleep_until(t: Duration) {
        let now = monotonic();
        if t > now {
            std::thread::sleep(t - now);
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Pinning moves the thread to the CPU asked (read back from the
    /// kernel); a CPU that does not exist is an error naming it. Runs in a
    /// thread of its own so the test harness's threads keep their affinity.
    #[test]
    fn pinning_is_applied_and_a_missing_cpu_is_refused() {
        std::thread::spawn(|| {
            let allowed = thread_state().expect("affinity").cpus;
            let cpu = *allowed.last().expect("a CPU");
            Realtime { cpu: Some(cpu), ..Realtime::default() }.apply().expect("pin");
            assert_eq!(thread_state().expect("affinity").cpus, vec![cpu]);
            let e = Realtime { cpu: Some(100_000), ..Realtime::default() }.apply().expect_err("no such CPU");
            assert!(e.to_string().contains("CPU 100000"), "{e}");
            let e = Realtime { fifo_priority: Some(0), ..Realtime::default() }.apply().expect_err("range");
            assert!(matches!(e, RealtimeError::PriorityRange { priority: 0 }), "{e}");
        })
        .join()
        .expect("thread");
    }

    /// SCHED_FIFO where the machine allows it (read back from the kernel),
    /// an error naming the priority and the capability where it does not.
    #[test]
    fn fifo_is_applied_or_refused_by_name() {
        std::thread::spawn(|| match (Realtime { fifo_priority: Some(10), ..Realtime::default() }).apply() {
            Ok(()) => assert_eq!(thread_state().expect("state").fifo_priority, Some(10)),
            Err(e) => {
                eprintln!("SCHED_FIFO not allowed here: {e}");
                assert!(e.to_string().contains("priority 10") && e.to_string().contains("CAP_SYS_NICE"), "{e}");
            }
        })
        .join()
        .expect("thread");
    }

    /// SIGPIPE is blocked for the thread that asks, and for it only.
    #[test]
    fn sigpipe_is_blocked_for_the_asking_thread_only() {
        std::thread::spawn(|| {
            assert!(!imp::sigpipe_blocked());
            block_sigpipe();
            assert!(imp::sigpipe_blocked());
            // threads it spawns inherit the mask, as POSIX says
            std::thread::spawn(|| assert!(imp::sigpipe_blocked())).join().expect("inherited");
        })
        .join()
        .expect("thread");
        assert!(!imp::sigpipe_blocked(), "the test's own thread is untouched");
    }

    /// Deadlines are absolute: a step that overruns is reported missed and
    /// the next deadlines stay on the period's grid.
    #[test]
    fn the_pacer_keeps_the_grid_and_reports_overruns() {
        let period = Duration::from_millis(5);
        let mut p = Pacer::new(period);
        let first = p.next;
        p.wait();
        std::thread::sleep(Duration::from_millis(12));
        let w = p.wait();
        assert!(w.missed, "a 12 ms step in a 5 ms period");
        // still on the grid: the next deadline is first + k * period
        let offset = (p.next - first).as_nanos() % period.as_nanos();
        assert_eq!(offset, 0);
        // spinning the last part of the period: never wakes before the deadline
        let mut p = Pacer::new(period).with_spin(Duration::from_millis(2));
        for _ in 0..3 {
            let deadline = p.next;
            p.wait();
            assert!(imp::monotonic() >= deadline);
        }
    }
}
