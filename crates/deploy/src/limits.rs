//! The domains and bounds the deploy path holds its inputs to: every number
//! a config or a clip gives is checked once, at load, and every allocation
//! whose size comes from input is checked against a bound stated here
//! before it is made (docs/deploy.md lists them). Nothing an input decides
//! may abort the process: through the C ABI that process is a robot's
//! control loop.

use crate::error::{ConfigProblem, DeployError, Result};

/// The most future reference steps a mimic control may list.
pub const MAX_FUTURE_STEPS: usize = 256;

/// The furthest future reference step, in control steps (ten minutes at 50 Hz).
pub const MAX_FUTURE_OFFSET: usize = 30_000;

/// The most past steps a history observation may read.
pub const MAX_HISTORY_STEPS: usize = 1_024;

/// The most bytes a motion player may hold (its clip resampled to the
/// control rate): 1 GiB, over three hours of a 33-body robot at 50 Hz.
pub const MAX_PLAYER_BYTES: usize = 1 << 30;

/// The highest frame rate of a clip, and of the physics (`simulation_params.mujoco.fps`).
pub const MAX_FPS: f64 = 100_000.0;

/// The longest control period accepted, in seconds.
pub const MAX_CONTROL_DT: f64 = 1.0;

/// The largest decimation (physics steps per control step).
pub const MAX_DECIMATION: usize = 10_000;

/// How far from 1 a quaternion's norm may be, in a clip or a sensor reading.
pub const QUAT_NORM_TOLERANCE: f32 = 1e-2;

/// Refuses a value outside its domain, naming the config key.
pub(crate) fn domain(file: &str, key: &str, value: f64, ok: bool, domain: &'static str) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(DeployError::Config {
            file: file.to_owned(),
            key: key.to_owned(),
            problem: ConfigProblem::OutOfDomain { value: value.to_string(), domain },
        })
    }
}

/// Every value of `values` finite and, with `non_negative`, at least 0.
pub(crate) fn check_vector(file: &str, key: &str, values: &[f32], non_negative: bool) -> Result<()> {
    for (i, &v) in values.iter().enumerate() {
        let ok = v.is_finite() && (!non_negative || v >= 0.0);
        let what = if non_negative { "a finite number >= 0" } else { "a finite number" };
        domain(file, &format!("{key}[{i}]"), f64::from(v), ok, what)?;
    }
    Ok(())
}

/// A zeroed `Vec` of `len` values, or an error naming `what` when the
/// allocation fails (never an abort).
pub(crate) fn zeroed<T: Clone + Default>(len: usize, what: &'static str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| DeployError::Allocation { what, bytes: len.saturating_mul(std::mem::size_of::<T>()) })?;
    v.resize(len, T::default());
    Ok(v)
}

/// An empty `Vec` with room for `len` values, or an error naming `what`.
pub(crate) fn with_capacity<T>(len: usize, what: &'static str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| DeployError::Allocation { what, bytes: len.saturating_mul(std::mem::size_of::<T>()) })?;
    Ok(v)
}
