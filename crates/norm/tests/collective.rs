//! The in-process group: real rendezvous, rank-0 semantics, failures as errors.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use candle_core::{Device, Tensor};
use pmstate_norm::{Collective, CollectiveProblem, InProcessGroup, NormConfig, NormError, RunningMeanStd};

fn run<T: Send + 'static>(
    w: usize,
    timeout: Duration,
    f: impl Fn(InProcessGroup) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let f = Arc::new(f);
    let hs: Vec<_> = InProcessGroup::new(w, timeout)
        .into_iter()
        .map(|c| {
            let f = f.clone();
            thread::spawn(move || f(c))
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn gathers_in_rank_order_and_broadcasts_from_the_source_many_times() {
    let out = run(4, Duration::from_secs(30), |c| {
        let mut seen = vec![];
        for round in 0..50 {
            let t = Tensor::new(&[(c.rank() * 100 + round) as f32], &Device::Cpu).unwrap();
            let g = c.all_gather(&t).unwrap();
            seen.push(g.iter().map(|t| t.to_vec1::<f32>().unwrap()[0]).collect::<Vec<_>>());
            let b = c.broadcast(&t, round % 4).unwrap();
            seen.push(vec![b.to_vec1::<f32>().unwrap()[0]]);
        }
        seen
    });
    for seen in &out {
        for round in 0..50 {
            let want: Vec<f32> = (0..4).map(|r| (r * 100 + round) as f32).collect();
            assert_eq!(seen[2 * round], want);
            assert_eq!(seen[2 * round + 1], vec![((round % 4) * 100 + round) as f32]);
        }
    }
}

#[test]
fn every_rank_ends_with_rank_zeros_state() {
    let states = run(3, Duration::from_secs(30), |c| {
        let rank = c.rank();
        let mut rms =
            RunningMeanStd::new(NormConfig::default(), None, &Device::Cpu).unwrap().with_collective(Arc::new(c));
        for step in 0..5 {
            let n = 1 + (rank + step) % 4;
            let x: Vec<f32> = (0..n * 2).map(|i| (i + rank * 7 + step) as f32 * 0.3).collect();
            rms.record_moments(&Tensor::from_vec(x, (n, 2), &Device::Cpu).unwrap()).unwrap();
        }
        let s = rms.state().unwrap();
        (s.mean.to_vec1::<f64>().unwrap(), s.var.to_vec1::<f64>().unwrap(), s.count)
    });
    assert!(states.windows(2).all(|w| w[0] == w[1]));
    // 1 prior + every row of every rank.
    let rows: i64 = (0..3).flat_map(|r| (0..5).map(move |s| (1 + (r + s) % 4) as i64)).sum();
    assert_eq!(states[0].2, 1 + rows);
}

#[test]
fn disagreeing_shapes_are_errors_on_every_rank() {
    let out = run(2, Duration::from_secs(30), |c| {
        let t = Tensor::zeros(1 + c.rank(), candle_core::DType::F32, &Device::Cpu).unwrap();
        c.all_gather(&t).map(|_| ())
    });
    assert!(out.iter().all(|r| matches!(r, Err(NormError::Collective { .. }))), "{out:?}");
}

#[test]
fn a_missing_peer_times_out_instead_of_hanging() {
    let out = run(3, Duration::from_millis(300), |c| {
        if c.rank() == 2 {
            return Ok(()); // never arrives
        }
        c.all_gather(&Tensor::new(&[1f32], &Device::Cpu).unwrap()).map(|_| ())
    });
    for r in &out[..2] {
        let e = r.as_ref().unwrap_err();
        assert!(matches!(e, NormError::Collective { problem: CollectiveProblem::TimedOut { .. }, .. }), "{e}");
    }
}

#[test]
fn ranks_calling_different_collectives_fail_instead_of_mixing_results() {
    let out = run(2, Duration::from_secs(30), |c| {
        let t = Tensor::new(&[c.rank() as f32], &Device::Cpu).unwrap();
        if c.rank() == 0 {
            c.all_gather(&t).map(|_| ())
        } else {
            // Let rank 0 arrive first, then call the other collective.
            thread::sleep(Duration::from_millis(50));
            c.broadcast(&t, 0).map(|_| ())
        }
    });
    for r in &out {
        let e = r.as_ref().unwrap_err();
        let mismatch = CollectiveProblem::OpMismatch { here: "all_gather", peer: "broadcast" };
        let swapped = CollectiveProblem::OpMismatch { here: "broadcast", peer: "all_gather" };
        assert!(
            matches!(e, NormError::Collective { problem, .. } if *problem == mismatch || *problem == swapped),
            "{e}"
        );
    }
}

#[test]
fn an_aborting_rank_releases_its_peers_at_once() {
    let out = run(2, Duration::from_secs(30), |c| {
        if c.rank() == 1 {
            thread::sleep(Duration::from_millis(50));
            c.abort("failed before the collective");
            return Ok(());
        }
        c.all_gather(&Tensor::new(&[1f32], &Device::Cpu).unwrap()).map(|_| ())
    });
    let e = out[0].as_ref().unwrap_err();
    assert!(matches!(e, NormError::Collective { problem: CollectiveProblem::Aborted { rank: 1, .. }, .. }), "{e}");
    // The one wording check of a collective error: it names the rank and its reason.
    assert!(e.to_string().contains("rank 1 aborted: failed before the collective"), "{e}");
}
