//! `replay_rank`: one rank per caller (as under MPI), observations handed to
//! rank 0 as bytes. Driven here by threads over an `InProcessGroup`, so it
//! runs without MPI; `pmstate replay --collective mpi` uses the same path.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pmstate_norm::{Collective, InProcessGroup, SingleProcess};
use pmstate_trace::{read_file, replay, replay_rank, Mode, ReplayFailure, ReplayOptions, Report, Trace, TraceError};

fn trace(name: &str) -> Trace {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/traces").join(name);
    read_file(&p).unwrap()
}

/// Each rank on its own thread; returns what each rank's call returned.
fn per_rank(t: &Trace, w: usize, opts: &ReplayOptions) -> Vec<Result<Option<Report>, TraceError>> {
    let groups = InProcessGroup::new(w, Duration::from_secs(30));
    std::thread::scope(|s| {
        let hs: Vec<_> = groups
            .into_iter()
            .map(|g| s.spawn(move || replay_rank(t, opts, Arc::new(g) as Arc<dyn Collective>)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn every_multi_rank_trace_passes_with_one_rank_per_caller_in_both_modes() {
    for name in [
        "dist_w2_reward.pmtrace.safetensors",
        "dist_w2_welford.pmtrace.safetensors",
        "dist_w3_ema.pmtrace.safetensors",
        "dist_w3_welford.pmtrace.safetensors",
        "dist_w4_welford.pmtrace.safetensors",
    ] {
        let t = trace(name);
        for mode in [Mode::Pinned, Mode::Free] {
            let opts = ReplayOptions { mode, ..Default::default() };
            let out = per_rank(&t, t.world_size, &opts);
            let report = out[0].as_ref().unwrap().as_ref().expect("rank 0 has the report");
            assert!(report.pass, "{name} {mode:?}: {:?}", report.worst());
            for r in &out[1..] {
                assert!(r.as_ref().unwrap().is_none());
            }
            // The same fields as the all-in-one replay, with the same results.
            let whole = replay(&t, &opts).unwrap();
            assert_eq!(report.fields.len(), whole.fields.len(), "{name}");
            for (a, b) in report.fields.iter().zip(&whole.fields) {
                assert_eq!((&a.field, a.max_ulps, a.pass), (&b.field, b.max_ulps, b.pass), "{name}");
            }
            // Per-rank agreement is part of what was judged.
            assert!(report.fields.iter().any(|f| f.field.contains("[rank 1]")), "{name}");
        }
    }
}

#[test]
fn a_world_size_that_differs_from_the_trace_is_an_error_on_every_rank() {
    let t = trace("dist_w3_welford.pmtrace.safetensors");
    for r in per_rank(&t, 2, &ReplayOptions::default()) {
        let e = r.unwrap_err();
        assert!(matches!(e, TraceError::Replay(ReplayFailure::WorldSize { trace: 3, collective: 2 })), "{e}");
    }
    let e = replay_rank(&t, &ReplayOptions::default(), Arc::new(SingleProcess)).unwrap_err();
    assert!(matches!(e, TraceError::Replay(ReplayFailure::WorldSize { trace: 3, collective: 1 })), "{e}");
    // The one wording check of a replay failure: both world sizes, in words.
    assert!(e.to_string().contains("recorded with world size 3, but this collective has 1 ranks"), "{e}");
}

#[test]
fn single_rank_traces_replay_on_a_single_process() {
    let t = trace("reward_welford.pmtrace.safetensors");
    let r = replay_rank(&t, &ReplayOptions::default(), Arc::new(SingleProcess)).unwrap().unwrap();
    assert!(r.pass);
}
