//! Judging what the ranks observed against what the trace recorded.

use candle_core::{DType, Device, Tensor};
use pmstate_norm::NormState;

use super::report::{Mode, Report};
use super::run::Obs;
use crate::compare::{compare, FieldReport, Verdict};
use crate::model::*;
use crate::tolerance::{self, MomentTol};

fn f64s(t: &Tensor) -> Vec<f64> {
    t.flatten_all().and_then(|t| t.to_dtype(DType::F64)).and_then(|t| t.to_vec1::<f64>()).unwrap_or_default()
}

/// Moments for a message, or `none`.
fn or_none(m: Option<&Moments>) -> String {
    m.map_or_else(|| "none".to_owned(), Moments::to_string)
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

    fn state(&mut self, step: usize, op: &'static str, got: &NormState, want: &NormState, tol: &MomentTol) {
        self.cmp(step, op, "state.mean", &got.mean, &want.mean, Some(&tol.mean));
        self.cmp(step, op, "state.var", &got.var, &want.var, Some(&tol.var));
        self.exact(step, op, "state.count", &count_tensor(got.count), &count_tensor(want.count));
    }
}

/// Compares what the ranks observed with the trace, step by step.
pub(crate) fn judge(trace: &Trace, mode: Mode, obs: &[Vec<Obs>]) -> Report {
    let mut j = Judge { mode, fields: vec![], trace };
    let mut carried = Carried { tol: MomentTol::default(), before: None, ema: trace.module.ema_decay };
    for (i, step) in j.trace.steps.iter().enumerate() {
        let op = step.op.name();
        let o0 = &obs[0][i];
        if let Some(reference_err) = &step.error {
            let (verdict, note) = match o0 {
                Obs::Failed(ours) => {
                    (Verdict::Pass, format!("both raised: reference '{reference_err}'; replay '{ours}'"))
                }
                _ => (Verdict::Fail, format!("the reference raised '{reference_err}', the replay did not")),
            };
            j.fields.push(FieldReport::note(i, op, "error", verdict, note));
            continue;
        }
        if let Some((r, Obs::Failed(e))) =
            obs.iter().enumerate().map(|(r, o)| (r, &o[i])).find(|(_, o)| matches!(o, Obs::Failed(_)))
        {
            j.fields.push(FieldReport::note(i, op, "error", Verdict::Fail, format!("rank {r} raised: {e}")));
            break;
        }
        match (&step.op, o0) {
            (Op::RecordMoments { result: Some(u), x }, Obs::Update { .. }) => {
                judge_update(&mut j, &UpdateStep { i, op, recorded: u, inputs: x }, obs, &mut carried);
            }
            (Op::RecordReward { result: Some((disc, u)), .. }, Obs::Update { .. }) => {
                for (r, d) in disc.iter().enumerate() {
                    if let Obs::Update { discounted: Some(g), .. } = &obs[r][i] {
                        j.exact(i, op, &format!("discounted_reward[{r}]"), g, d);
                    }
                }
                judge_update(&mut j, &UpdateStep { i, op, recorded: u, inputs: disc }, obs, &mut carried);
            }
            (Op::Normalize { x, direction, result: Some(r) }, Obs::Normalize { out, std, state }) => {
                let mean = f64s(&state.mean);
                let var = f64s(&state.var);
                let s = f64s(std);
                let nt = tolerance::normalize_terms(&carried.tol, &mean, &var, &s);
                let reward = j.trace.module.class == ModuleClass::RewardRunningMeanStd;
                let mean32: Vec<f64> = mean.iter().map(|&m| m as f32 as f64).collect();
                let values = tolerance::NormalizeValues {
                    x: &f64s(x),
                    y: &f64s(&r.out),
                    mean32: (!reward).then_some(mean32.as_slice()),
                    std: &s,
                    clamp: j.trace.module.clamp_value,
                    u_out: tolerance::unit_roundoff(r.out.dtype()),
                };
                let y = tolerance::normalize_output(&nt, &values, *direction);
                j.cmp(i, op, "out", out, &r.out, Some(&y));
                if mode == Mode::Free {
                    j.cmp(i, op, "std", std, &r.std, Some(&nt.std));
                }
                j.state(i, op, state, &r.state, &carried.tol);
            }
            (Op::LoadStateDict { state: want }, Obs::State(got)) => {
                carried.tol = MomentTol::default();
                j.exact(i, op, "state.mean", &got.mean, &want.mean);
                j.exact(i, op, "state.var", &got.var, &want.var);
                j.exact(i, op, "state.count", &count_tensor(got.count), &count_tensor(want.count));
            }
            (Op::SetEmaDecay { ema_decay, state: Some(want) }, Obs::State(got)) => {
                carried.ema = *ema_decay;
                j.state(i, op, got, want, &carried.tol);
            }
            (Op::SetEmaDecay { ema_decay, state: None }, Obs::Skipped) => {
                carried.ema = *ema_decay;
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
                    Verdict::Fail,
                    format!("the trace has no result for this step, or the replay observed {}", o.describe()),
                ));
            }
        }
        // Every rank ends each step with rank 0's state.
        for (r, ro) in obs.iter().enumerate().skip(1) {
            if let (Some(a), Some(b)) = (o0.state(), ro[i].state()) {
                j.exact(i, op, &format!("state.mean[rank {r}]"), &b.mean, &a.mean);
                j.exact(i, op, &format!("state.var[rank {r}]"), &b.var, &a.var);
                j.exact(i, op, &format!("state.count[rank {r}]"), &count_tensor(b.count), &count_tensor(a.count));
            }
        }
        if let Some(s) = o0.state() {
            carried.before = Some(s.clone());
        }
    }
    let pass = j.fields.iter().all(|f| f.pass);
    Report { mode, world_size: trace.world_size, steps: trace.steps.len(), pass, fields: j.fields }
}

/// An update step being judged: its index and op, what the trace recorded,
/// and the per-rank inputs whose moments fed it.
struct UpdateStep<'a> {
    i: usize,
    op: &'static str,
    recorded: &'a UpdateResult,
    inputs: &'a [Tensor],
}

/// What the judge carries from step to step (free mode's bounds).
struct Carried {
    tol: MomentTol,
    /// Our state before the step.
    before: Option<NormState>,
    ema: Option<f64>,
}

fn judge_update(j: &mut Judge<'_>, step: &UpdateStep<'_>, obs: &[Vec<Obs>], carried: &mut Carried) {
    let UpdateStep { i, op, recorded: u, inputs } = *step;
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
                Verdict::Fail,
                format!("recorded combined moments: {}; replayed: {}", or_none(want.as_ref()), or_none(got.as_ref())),
            ));
            return;
        }
    };
    if j.mode == Mode::Free {
        // A lazy normalizer's first update starts from the fresh buffers (mean 0, count 1).
        let (mean_before, count_before) = match &carried.before {
            Some(s) => (f64s(&s.mean), s.count),
            None => (vec![0.0; state.mean.elem_count()], 1),
        };
        let terms = tolerance::UpdateTerms {
            ema_decay: carried.ema,
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
        carried.tol = tolerance::update(&carried.tol, &fed_tol, &terms);
    }
    j.state(i, op, state, &u.state, &carried.tol);
}
