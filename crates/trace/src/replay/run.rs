//! Running one rank's steps on a live normalizer and keeping what it observed.

use std::sync::Arc;

use candle_core::Tensor;
use pmstate_norm::{combine_moments, Arithmetic, Collective, InProcessGroup, Moments, NormError, NormState};

use super::report::Mode;
use crate::live::Live;
use crate::model::*;

/// What a rank observed at a step.
#[derive(Debug, Clone)]
pub(crate) enum Obs {
    Failed(String),
    Skipped,
    Update { batch: Moments, combined: Option<Moments>, discounted: Option<Tensor>, state: NormState },
    Normalize { out: Tensor, std: Tensor, state: NormState },
    State(NormState),
    Combine(Moments),
}

impl Obs {
    /// The normalizer's state after the step, when the observation holds one.
    pub(crate) fn state(&self) -> Option<&NormState> {
        match self {
            Obs::Update { state, .. } | Obs::Normalize { state, .. } | Obs::State(state) => Some(state),
            _ => None,
        }
    }

    /// A short description for reports.
    pub(crate) fn describe(&self) -> String {
        match self {
            Obs::Failed(e) => format!("a failure ({e})"),
            Obs::Skipped => "nothing (skipped on this rank)".into(),
            Obs::Update { .. } => "an update".into(),
            Obs::Normalize { .. } => "a normalize result".into(),
            Obs::State(_) => "a state".into(),
            Obs::Combine(_) => "combined moments".into(),
        }
    }
}

fn state_of(m: &Live) -> Result<NormState, String> {
    m.norm_ref().state().ok_or_else(|| "the normalizer has no state after the step".to_string())
}

/// One rank's pass over the steps. A step that fails unexpectedly releases
/// peers waiting in a collective (`group`, in-process replay).
pub(crate) fn run_rank(
    trace: &Trace,
    mode: Mode,
    rank: usize,
    coll: Arc<dyn Collective>,
    group: Option<Arc<InProcessGroup>>,
) -> Vec<Obs> {
    let mut module = match Live::build(&trace.module, coll) {
        Ok(m) => m,
        Err(e) => return vec![Obs::Failed(format!("building the module: {e}")); trace.steps.len()],
    };
    let mut out = Vec::with_capacity(trace.steps.len());
    for step in &trace.steps {
        let obs = run_step(&mut module, step, mode, rank).unwrap_or_else(Obs::Failed);
        if let (Obs::Failed(e), Some(g), None) = (&obs, &group, &step.error) {
            if matches!(step.op, Op::RecordMoments { .. } | Op::RecordReward { .. }) {
                g.abort(e);
            }
        }
        out.push(obs);
    }
    out
}

/// The recorded moments of this rank when the mode pins them.
fn pinned(mode: Mode, result: Option<&UpdateResult>, rank: usize) -> Option<&Moments> {
    match (mode, result) {
        (Mode::Pinned, Some(u)) => u.batch.get(rank),
        _ => None,
    }
}

fn run_step(module: &mut Live, step: &Step, mode: Mode, rank: usize) -> Result<Obs, String> {
    let e = |e: NormError| e.to_string();
    match &step.op {
        Op::RecordMoments { x, result } => {
            let norm = module.norm();
            let update = match pinned(mode, result.as_ref(), rank) {
                Some(b) => norm.record_batch_moments(b.clone()),
                None => norm.record_moments(&x[rank]),
            }
            .map_err(e)?;
            let state = state_of(module)?;
            Ok(Obs::Update { batch: update.batch, combined: update.combined, discounted: None, state })
        }
        Op::RecordReward { reward, terminated, result } => {
            let m = module.reward().ok_or("record_reward on a RunningMeanStd")?;
            let (r, t) = (&reward[rank], &terminated[rank]);
            let step = match pinned(mode, result.as_ref().map(|(_, u)| u), rank) {
                Some(b) => m.record_reward_moments(r, t, b.clone()),
                None => m.record_reward(r, t),
            }
            .map_err(e)?;
            let state = state_of(module)?;
            let u = step.update;
            Ok(Obs::Update { batch: u.batch, combined: u.combined, discounted: Some(step.discounted), state })
        }
        Op::Normalize { .. } if rank != 0 => Ok(Obs::Skipped),
        Op::Normalize { x, direction, result } => {
            let norm = module.norm();
            norm.init_shape_from(x).map_err(e)?;
            let y = match (mode, result) {
                (Mode::Pinned, Some(r)) => norm.apply_with_std(x, &r.std, *direction),
                _ => norm.apply(x, *direction),
            }
            .map_err(e)?;
            let std = norm.std_f32().cloned().ok_or("no std after normalize")?;
            Ok(Obs::Normalize { out: y, std, state: state_of(module)? })
        }
        Op::LoadStateDict { state } => {
            module.norm().load_state(state.clone()).map_err(e)?;
            Ok(Obs::State(state_of(module)?))
        }
        Op::SetEmaDecay { ema_decay, .. } => {
            module.norm().set_ema_decay(*ema_decay).map_err(e)?;
            // A lazy normalizer has no buffers to report yet.
            Ok(module.norm_ref().state().map_or(Obs::Skipped, Obs::State))
        }
        Op::CombineMoments { .. } if rank != 0 => Ok(Obs::Skipped),
        Op::CombineMoments { means, vars, counts, .. } => {
            Ok(Obs::Combine(combine_moments(means, vars, counts, Arithmetic::Compat).map_err(e)?))
        }
    }
}
