//! The real-time options of the commands that run a control loop
//! (`deploy sim`, `bench-deploy`): pmstate_deploy::realtime.

use pmstate_deploy::realtime::{MemoryLock, Realtime};

/// Real-time options for the control loop's thread (docs/deploy.md,
/// "Real time"); each is an error where the machine does not allow it.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct RealtimeArgs {
    /// Lock the process's memory (mlockall: no page faults mid-step).
    #[arg(long)]
    lock_memory: bool,
    /// Run the loop's thread under SCHED_FIFO at this priority (1-99).
    #[arg(long, value_name = "PRIORITY", value_parser = clap::value_parser!(u8).range(1..=99))]
    fifo_priority: Option<u8>,
    /// Pin the loop's thread to this CPU.
    #[arg(long, value_name = "CPU")]
    cpu: Option<usize>,
    /// With --real-time: poll the clock for the last this-many microseconds
    /// before each deadline instead of sleeping through them (the CPU stays
    /// awake; costs that much busy time a period).
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 0)]
    spin_us: u64,
}

impl RealtimeArgs {
    /// The pacer's busy-wait before each deadline.
    pub(crate) fn spin(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.spin_us)
    }

    /// The options asked.
    pub(crate) fn realtime(&self) -> Realtime {
        Realtime {
            memory: if self.lock_memory { MemoryLock::Locked } else { MemoryLock::Unlocked },
            fifo_priority: self.fifo_priority,
            cpu: self.cpu,
        }
    }
}
