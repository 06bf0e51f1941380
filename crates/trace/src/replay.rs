//! The replay engine: runs a trace's steps on our normalizers, with W real
//! participants of an in-process collective, and compares every result.

use std::sync::Arc;
use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use pmstate_norm::{
    combine_moments, Arithmetic, Collective, InProcessGroup, Moments, NormConfig, NormState, RewardRunningMeanStd,
    RunningMeanStd,
};
use serde::Serialize;

use crate::compare::{compare, FieldReport};
use crate::error::{Result, TraceError};
use crate::model::*;
use crate::tolerance::{self, MomentTol};

/// How batch moments and std are obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Recorded batch moments (per rank) feed every update and the recorded
    /// std every normalize: everything else is elementwise IEEE arithmetic,
    /// so every result must match bit for bit.
    Pinned,
    /// We compute batch moments and std; results must lie within the bounds
    /// of [`tolerance`](crate::tolerance).
    Free,
}

/// Replay settings.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// Pinned or free.
    pub mode: Mode,
    /// How long a rank waits for its peers before the collective fails.
    pub timeout: Duration,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self { mode: Mode::Pinned, timeout: Duration::from_secs(60) }
    }
}

/// The outcome of replaying one trace.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Pinned or free.
    pub mode: Mode,
    /// Number of ranks (W).
    pub world_size: usize,
    /// The steps, in order.
    pub steps: usize,
    /// Whether every compared field matched.
    pub pass: bool,
    /// One report per compared field.
    pub fields: Vec<FieldReport>,
}

impl Report {
    /// The first failing field, else the one with the largest ulp distance.
    pub fn worst(&self) -> Option<&FieldReport> {
        self.fields.iter().find(|f| !f.pass).or_else(|| self.fields.iter().max_by_key(|f| f.max_ulps))
    }
}

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

enum Module {
    Obs(RunningMeanStd),
    Reward(RewardRunningMeanStd),
}

impl Module {
    fn state(&self) -> Option<NormState> {
        match self {
            Module::Obs(m) => m.state(),
            Module::Reward(m) => m.state(),
        }
    }
    fn std(&self) -> Option<Tensor> {
        match self {
            Module::Obs(m) => m.std_f32().cloned(),
            Module::Reward(m) => m.running().std_f32().cloned(),
        }
    }
}

fn config(m: &ModuleSpec) -> NormConfig {
    NormConfig { epsilon: m.epsilon, clamp_value: m.clamp_value, ema_decay: m.ema_decay, ..NormConfig::default() }
}

fn moments(r: &RecordedMoments) -> Moments {
    Moments { mean: r.mean.clone(), var: r.var.clone(), count: r.count }
}

fn state_of(m: &Module) -> std::result::Result<NormState, String> {
    m.state().ok_or_else(|| "the normalizer has no state after the step".to_string())
}

/// One rank's pass over the steps.
fn run_rank(
    trace: &Trace,
    mode: Mode,
    rank: usize,
    coll: Arc<dyn Collective>,
    group: Option<Arc<InProcessGroup>>,
) -> Vec<Obs> {
    let spec = &trace.module;
    let built = match spec.class {
        ModuleClass::RunningMeanStd => RunningMeanStd::new(config(spec), spec.shape.as_deref(), &Device::Cpu)
            .map(|m| Module::Obs(m.with_collective(coll))),
        ModuleClass::RewardRunningMeanStd => {
            RewardRunningMeanStd::new(config(spec), spec.gamma.unwrap_or(1.0), spec.shape.as_deref(), &Device::Cpu)
                .map(|m| Module::Reward(m.with_collective(coll)))
        }
    };
    let mut module = match built {
        Ok(m) => m,
        Err(e) => return vec![Obs::Failed(format!("building the module: {e}")); trace.steps.len()],
    };
    let mut out = Vec::with_capacity(trace.steps.len());
    for step in &trace.steps {
        let obs = run_step(&mut module, step, mode, rank).unwrap_or_else(Obs::Failed);
        if let (Obs::Failed(e), Some(g), None) = (&obs, &group, &step.error) {
            // Unexpected failure: release peers stuck in a collective.
            if matches!(step.op, Op::RecordMoments { .. } | Op::RecordReward { .. }) {
                g.abort(e);
            }
        }
        out.push(obs);
    }
    out
}

fn run_step(module: &mut Module, step: &Step, mode: Mode, rank: usize) -> std::result::Result<Obs, String> {
    let e = |e: pmstate_norm::NormError| e.to_string();
    match (&step.op, module) {
        (Op::RecordMoments { x, result }, module) => {
            let x = &x[rank];
            let (batch, combined, discounted) = match (mode, result, &mut *module) {
                (Mode::Pinned, Some(u), Module::Obs(m)) => {
                    let b = moments(&u.batch[rank]);
                    (b.clone(), m.record_batch_moments(b).map_err(e)?, None)
                }
                (Mode::Pinned, Some(u), Module::Reward(m)) => {
                    let b = moments(&u.batch[rank]);
                    (b.clone(), m.record_batch_moments(b).map_err(e)?, None)
                }
                (_, _, Module::Obs(m)) => {
                    let (b, c) = m.record_moments_traced(x).map_err(e)?;
                    (b, c, None)
                }
                (_, _, Module::Reward(m)) => {
                    let (b, c) = m.record_moments_traced(x).map_err(e)?;
                    (b, c, None)
                }
            };
            Ok(Obs::Update { batch, combined, discounted, state: state_of(module)? })
        }
        (Op::RecordReward { reward, terminated, result }, Module::Reward(m)) => {
            let (r, t) = (&reward[rank], &terminated[rank]);
            let (g, batch, combined) = match (mode, result) {
                (Mode::Pinned, Some((_, u))) => {
                    let b = moments(&u.batch[rank]);
                    let (g, c) = m.record_reward_with_moments(r, t, b.clone()).map_err(e)?;
                    (g, b, c)
                }
                _ => m.record_reward_traced(r, t).map_err(e)?,
            };
            let state = m.state().ok_or("no state after record_reward")?;
            Ok(Obs::Update { batch, combined, discounted: Some(g), state })
        }
        (Op::RecordReward { .. }, Module::Obs(_)) => Err("record_reward on a RunningMeanStd".into()),
        (Op::Normalize { .. }, _) if rank != 0 => Ok(Obs::Skipped),
        (Op::Normalize { x, un_norm, result }, module) => {
            let pinned_std = match (mode, result) {
                (Mode::Pinned, Some(r)) => Some(&r.std),
                _ => None,
            };
            let y = match (module as &mut Module, pinned_std) {
                (Module::Obs(m), Some(s)) => m.normalize_with_std(x, s, *un_norm),
                (Module::Obs(m), None) if *un_norm => m.un_norm(x),
                (Module::Obs(m), None) => m.normalize(x),
                (Module::Reward(m), Some(s)) => m.normalize_with_std(x, s, *un_norm),
                (Module::Reward(m), None) if *un_norm => m.un_norm(x),
                (Module::Reward(m), None) => m.normalize(x),
            }
            .map_err(e)?;
            let std = module.std().ok_or("no std after normalize")?;
            Ok(Obs::Normalize { out: y, std, state: state_of(module)? })
        }
        (Op::LoadStateDict { state }, module) => {
            let s = NormState { mean: state.mean.clone(), var: state.var.clone(), count: state.count };
            match module {
                Module::Obs(m) => m.load_state(s),
                Module::Reward(m) => m.load_state(s),
            }
            .map_err(e)?;
            Ok(Obs::State(state_of(module)?))
        }
        (Op::SetEmaDecay { ema_decay, .. }, module) => {
            match module {
                Module::Obs(m) => m.set_ema_decay(*ema_decay),
                Module::Reward(m) => m.set_ema_decay(*ema_decay),
            }
            .map_err(e)?;
            // A lazy normalizer has no buffers to report yet.
            Ok(module.state().map_or(Obs::Skipped, Obs::State))
        }
        (Op::CombineMoments { .. }, _) if rank != 0 => Ok(Obs::Skipped),
        (Op::CombineMoments { means, vars, counts, .. }, _) => {
            Ok(Obs::Combine(combine_moments(means, vars, counts, Arithmetic::Compat).map_err(e)?))
        }
    }
}

/// Replays `trace` and compares every recorded result.
///
/// ```no_run
/// use pmstate_trace::{read_file, replay, ReplayOptions};
/// let trace = read_file("testdata/traces/lazy_welford.pmtrace.safetensors".as_ref())?;
/// let report = replay(&trace, &ReplayOptions::default())?;
/// assert!(report.pass);
/// # Ok::<(), pmstate_trace::TraceError>(())
/// ```
pub fn replay(trace: &Trace, opts: &ReplayOptions) -> Result<Report> {
    let w = trace.world_size;
    let observed: Vec<Vec<Obs>> = if w == 1 {
        vec![run_rank(trace, opts.mode, 0, Arc::new(pmstate_norm::SingleProcess), None)]
    } else {
        let groups: Vec<Arc<InProcessGroup>> = InProcessGroup::new(w, opts.timeout).into_iter().map(Arc::new).collect();
        std::thread::scope(|s| {
            let handles: Vec<_> = groups
                .iter()
                .enumerate()
                .map(|(r, g)| {
                    let g = g.clone();
                    s.spawn(move || run_rank(trace, opts.mode, r, g.clone() as Arc<dyn Collective>, Some(g)))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().map_err(|_| TraceError::Replay("a rank's thread panicked".into())))
                .collect::<Result<Vec<_>>>()
        })?
    };
    Ok(judge(trace, opts.mode, &observed))
}

/// Replays one rank of `trace` in this process over `coll` (one rank per
/// process, e.g. [`MpiCollective`](pmstate_norm::MpiCollective) with the
/// `mpi` feature), then hands every rank's observations to rank 0, which
/// judges them as [`replay`] does (every rank must end each step with rank
/// 0's state). Returns the report on rank 0 and `None` on the others.
///
/// Every rank must call this with the same trace and options. A collective
/// whose world size differs from the trace's is an error on every rank
/// (before any communication). If gathering the observations fails (a peer
/// failed or timed out), every rank that notices returns an error naming
/// its own first failed step.
///
/// ```
/// use std::sync::Arc;
/// use pmstate_norm::SingleProcess;
/// use pmstate_trace::{read_file, replay_rank, ReplayOptions};
/// let trace = read_file("../../testdata/traces/lazy_welford.pmtrace.safetensors".as_ref())?;
/// let report = replay_rank(&trace, &ReplayOptions::default(), Arc::new(SingleProcess))?;
/// assert!(report.expect("rank 0 gets the report").pass);
/// # Ok::<(), pmstate_trace::TraceError>(())
/// ```
pub fn replay_rank(trace: &Trace, opts: &ReplayOptions, coll: Arc<dyn Collective>) -> Result<Option<Report>> {
    let (rank, w) = (coll.rank(), coll.world_size());
    if w != trace.world_size {
        return Err(TraceError::Replay(format!(
            "the trace was recorded with world size {}, but this collective has {w} ranks",
            trace.world_size
        )));
    }
    let mine = run_rank(trace, opts.mode, rank, coll.clone(), None);
    let first_failure = || {
        mine.iter().enumerate().find_map(|(i, o)| match o {
            Obs::Failed(e) if trace.steps[i].error.is_none() => {
                Some(format!("; this rank first failed at step {i}: {e}"))
            }
            _ => None,
        })
    };
    let gathered = if w == 1 { Ok(vec![]) } else { gather_bytes(coll.as_ref(), &crate::wire::encode(&mine)?) };
    let gathered = gathered.map_err(|e| {
        TraceError::Replay(format!("gathering the ranks' observations: {e}{}", first_failure().unwrap_or_default()))
    })?;
    if rank != 0 {
        return Ok(None);
    }
    let mut observed = vec![mine];
    for (r, bytes) in gathered.iter().enumerate().skip(1) {
        observed.push(
            crate::wire::decode(bytes, trace.steps.len())
                .map_err(|e| TraceError::Replay(format!("rank {r}'s observations: {e}")))?,
        );
    }
    Ok(Some(judge(trace, opts.mode, &observed)))
}

/// Every rank's byte string, index = rank (lengths first, then the strings
/// padded to the longest).
fn gather_bytes(coll: &dyn Collective, bytes: &[u8]) -> pmstate_norm::Result<Vec<Vec<u8>>> {
    let len = Tensor::new(&[bytes.len() as i64], &Device::Cpu)?;
    let lens = coll
        .all_gather(&len)?
        .iter()
        .map(|t| Ok(usize::try_from(t.to_vec1::<i64>()?[0]).unwrap_or(0)))
        .collect::<pmstate_norm::Result<Vec<usize>>>()?;
    let max = lens.iter().copied().max().unwrap_or(0);
    let mut padded = bytes.to_vec();
    padded.resize(max, 0);
    let all = coll.all_gather(&Tensor::from_vec(padded, max, &Device::Cpu)?)?;
    all.iter()
        .zip(&lens)
        .map(|(t, &n)| {
            let mut v = t.to_vec1::<u8>()?;
            v.truncate(n);
            Ok(v)
        })
        .collect()
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.flatten_all().and_then(|t| t.to_dtype(DType::F64)).and_then(|t| t.to_vec1::<f64>()).unwrap_or_default()
}

fn count_tensor(c: i64) -> Tensor {
    Tensor::new(c, &Device::Cpu).expect("a CPU scalar")
}

struct Judge<'a> {
    mode: Mode,
    fields: Vec<FieldReport>,
    trace: &'a Trace,
}

impl Judge<'_> {
    fn cmp(&mut self, step: usize, op: &'static str, field: &str, got: &Tensor, want: &Tensor, tol: Option<&[f64]>) {
        let tol = if self.mode == Mode::Pinned { None } else { tol };
        self.fields.push(compare(step, op, field, got, want, tol));
    }

    fn exact(&mut self, step: usize, op: &'static str, field: &str, got: &Tensor, want: &Tensor) {
        self.fields.push(compare(step, op, field, got, want, None));
    }

    fn state(&mut self, step: usize, op: &'static str, got: &NormState, want: &State, tol: &MomentTol) {
        self.cmp(step, op, "state.mean", &got.mean, &want.mean, Some(&tol.mean));
        self.cmp(step, op, "state.var", &got.var, &want.var, Some(&tol.var));
        self.exact(step, op, "state.count", &count_tensor(got.count), &count_tensor(want.count));
    }
}

/// Compares what the ranks observed with the trace, step by step.
fn judge(trace: &Trace, mode: Mode, obs: &[Vec<Obs>]) -> Report {
    let mut j = Judge { mode, fields: vec![], trace };
    let mut tol = MomentTol::default();
    // Our state before each step (for the free-mode bounds).
    let mut before: Option<NormState> = None;
    let mut ema = trace.module.ema_decay;
    for (i, step) in j.trace.steps.iter().enumerate() {
        let op = step.op.name();
        let o0 = &obs[0][i];
        if let Some(reference_err) = &step.error {
            let (pass, note) = match o0 {
                Obs::Failed(ours) => (true, format!("both raised: reference {reference_err:?}; replay {ours:?}")),
                _ => (false, format!("the reference raised {reference_err:?}, the replay did not")),
            };
            j.fields.push(FieldReport::note(i, op, "error", pass, note));
            continue;
        }
        if let Some((r, Obs::Failed(e))) =
            obs.iter().enumerate().map(|(r, o)| (r, &o[i])).find(|(_, o)| matches!(o, Obs::Failed(_)))
        {
            j.fields.push(FieldReport::note(i, op, "error", false, format!("rank {r} raised: {e}")));
            break;
        }
        match (&step.op, o0) {
            (Op::RecordMoments { result: Some(u), x }, Obs::Update { .. }) => {
                judge_update(&mut j, i, op, u, obs, x, &mut tol, before.as_ref(), ema);
            }
            (Op::RecordReward { result: Some((disc, u)), .. }, Obs::Update { .. }) => {
                for (r, d) in disc.iter().enumerate() {
                    if let Obs::Update { discounted: Some(g), .. } = &obs[r][i] {
                        j.exact(i, op, &format!("discounted_reward[{r}]"), g, d);
                    }
                }
                judge_update(&mut j, i, op, u, obs, disc, &mut tol, before.as_ref(), ema);
            }
            (Op::Normalize { x, un_norm, result: Some(r) }, Obs::Normalize { out, std, state }) => {
                let mean = f64s(&state.mean);
                let var = f64s(&state.var);
                let s = f64s(std);
                let nt = tolerance::normalize_terms(&tol, &mean, &var, &s);
                let reward = j.trace.module.class == ModuleClass::RewardRunningMeanStd;
                let mean32: Vec<f64> = mean.iter().map(|&m| m as f32 as f64).collect();
                let y = tolerance::normalize_output(
                    &nt,
                    &f64s(x),
                    &f64s(&r.out),
                    (!reward).then_some(mean32.as_slice()),
                    &s,
                    j.trace.module.clamp_value,
                    *un_norm,
                    tolerance::unit_roundoff(r.out.dtype()),
                );
                j.cmp(i, op, "out", out, &r.out, Some(&y));
                if mode == Mode::Free {
                    j.cmp(i, op, "std", std, &r.std, Some(&nt.std));
                }
                j.state(i, op, state, &r.state, &tol);
            }
            (Op::LoadStateDict { state: want }, Obs::State(got)) => {
                tol = MomentTol::default();
                j.exact(i, op, "state.mean", &got.mean, &want.mean);
                j.exact(i, op, "state.var", &got.var, &want.var);
                j.exact(i, op, "state.count", &count_tensor(got.count), &count_tensor(want.count));
            }
            (Op::SetEmaDecay { ema_decay, state: Some(want) }, Obs::State(got)) => {
                ema = *ema_decay;
                j.state(i, op, got, want, &tol.clone());
            }
            (Op::SetEmaDecay { ema_decay, state: None }, Obs::Skipped) => {
                ema = *ema_decay;
            }
            (Op::CombineMoments { result: Some(want), .. }, Obs::Combine(got)) => {
                j.exact(i, op, "mean", &got.mean, &want.mean);
                j.exact(i, op, "var", &got.var, &want.var);
                j.exact(i, op, "count", &count_tensor(got.count), &count_tensor(want.count));
            }
            (_, o) => {
                j.fields.push(FieldReport::note(
                    i,
                    op,
                    "result",
                    false,
                    format!("the trace has no result for this step, or the replay observed {o:?}"),
                ));
            }
        }
        // Every rank ends each step with rank 0's state.
        for (r, ro) in obs.iter().enumerate().skip(1) {
            if let (Some(a), Some(b)) = (obs_state(o0), obs_state(&ro[i])) {
                j.exact(i, op, &format!("state.mean[rank {r}]"), &b.mean, &a.mean);
                j.exact(i, op, &format!("state.var[rank {r}]"), &b.var, &a.var);
                j.exact(i, op, &format!("state.count[rank {r}]"), &count_tensor(b.count), &count_tensor(a.count));
            }
        }
        if let Some(s) = obs_state(o0) {
            before = Some(s.clone());
        }
    }
    let pass = j.fields.iter().all(|f| f.pass);
    Report { mode, world_size: trace.world_size, steps: trace.steps.len(), pass, fields: j.fields }
}

fn obs_state(o: &Obs) -> Option<&NormState> {
    match o {
        Obs::Update { state, .. } | Obs::Normalize { state, .. } | Obs::State(state) => Some(state),
        _ => None,
    }
}

#[allow(clippy::too_many_arguments)]
fn judge_update(
    j: &mut Judge<'_>,
    i: usize,
    op: &'static str,
    u: &UpdateResult,
    obs: &[Vec<Obs>],
    inputs: &[Tensor],
    tol: &mut MomentTol,
    before: Option<&NormState>,
    ema: Option<f64>,
) {
    let w = obs.len();
    let mut btols = vec![];
    let mut parts = vec![];
    for r in 0..w {
        let Obs::Update { batch, .. } = &obs[r][i] else { continue };
        let bt = tolerance::batch(&inputs[r]);
        if j.mode == Mode::Free {
            let want = &u.batch[r];
            j.cmp(i, op, &format!("batch_mean[{r}]"), &batch.mean, &want.mean, Some(&bt.mean));
            j.cmp(i, op, &format!("batch_var[{r}]"), &batch.var, &want.var, Some(&bt.var));
            j.exact(i, op, &format!("batch_count[{r}]"), &count_tensor(batch.count), &count_tensor(want.count));
        }
        parts.push((f64s(&batch.mean), f64s(&batch.var), batch.count));
        btols.push(bt);
    }
    let Obs::Update { batch, combined, state, .. } = &obs[0][i] else { return };
    // The moments that fed rank 0's update, and their bounds.
    let (fed, fed_tol, u_fed) = match (&u.combined, combined) {
        (Some(want), Some(got)) => {
            let u_c = tolerance::unit_roundoff(got.mean.dtype());
            let ct = tolerance::combined(&parts, &btols, &f64s(&got.mean), u_c);
            j.cmp(i, op, "combined_mean", &got.mean, &want.mean, Some(&ct.mean));
            j.cmp(i, op, "combined_var", &got.var, &want.var, Some(&ct.var));
            j.exact(i, op, "combined_count", &count_tensor(got.count), &count_tensor(want.count));
            (got.clone(), ct, u_c)
        }
        (None, None) => {
            (batch.clone(), btols.first().cloned().unwrap_or_default(), tolerance::unit_roundoff(batch.mean.dtype()))
        }
        (want, got) => {
            j.fields.push(FieldReport::note(
                i,
                op,
                "combined",
                false,
                format!("recorded combined moments: {}, replayed: {}", want.is_some(), got.is_some()),
            ));
            return;
        }
    };
    if j.mode == Mode::Free {
        // A lazy normalizer's first update starts from the fresh buffers (mean 0, count 1).
        let (mean_before, count_before) = match before {
            Some(s) => (f64s(&s.mean), s.count),
            None => (vec![0.0; state.mean.elem_count()], 1),
        };
        let terms = tolerance::UpdateTerms {
            ema_decay: ema,
            exact: false,
            count_before,
            batch_count: fed.count,
            mean_before: &mean_before,
            batch_mean: &f64s(&fed.mean),
            batch_var: &f64s(&fed.var),
            mean_after: &f64s(&state.mean),
            var_after: &f64s(&state.var),
            u_batch: u_fed,
        };
        *tol = tolerance::update(tol, &fed_tol, &terms);
    }
    j.state(i, op, state, &u.state, &tol.clone());
}
