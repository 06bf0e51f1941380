//! `MpiCollective` under a real `mpirun` (feature `mpi`; `harness = false`).
//!
//! Run without arguments (as `cargo test --features mpi --test mpi` does),
//! this binary launches itself under `mpirun --allow-run-as-root
//! --oversubscribe -np N` once per scenario and world size, and checks what
//! every rank printed and the exit code; a job still running after
//! `JOB_DEADLINE` is killed and fails (a hang guard, not a timing check;
//! the durations printed are for people). Launched with
//! `rank SCENARIO`, it is one rank of that scenario. Without `mpirun` on
//! PATH it skips with a printed reason.

use std::io::Read;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use pmstate_norm::{
    Collective, CollectiveProblem, InProcessGroup, MpiCollective, NormConfig, NormError, RunningMeanStd,
};

/// Timeout the failure scenarios use (seconds).
const SHORT: f64 = 2.0;
/// Timeout of the scenarios where mpirun kills the job first (seconds).
const LONG: f64 = 20.0;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() >= 3 && args[1] == "rank" {
        return match rank_main(&args[2]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                println!("rank FAILED: {e}");
                ExitCode::from(1)
            }
        };
    }
    if Command::new("mpirun").arg("--version").output().is_err() {
        println!("mpi: SKIPPED: no `mpirun` on PATH (install openmpi-bin)");
        return ExitCode::SUCCESS;
    }
    let mut failed = 0;
    for (scenario, check) in SCENARIOS {
        for np in [3usize, 4] {
            let out = mpirun(np, scenario);
            let secs = out.secs;
            match check(np, &out) {
                Ok(()) => println!("mpi {scenario} -np {np}: ok ({secs:.1} s)"),
                Err(e) => {
                    failed += 1;
                    println!("mpi {scenario} -np {np}: FAILED ({secs:.1} s): {e}\n--- output ---\n{}", out.text);
                }
            }
        }
    }
    if failed > 0 {
        println!("mpi: {failed} scenario runs failed");
        ExitCode::from(1)
    } else {
        println!("mpi: all scenarios passed");
        ExitCode::SUCCESS
    }
}

struct Run {
    /// The exit code, 128 + the signal that killed mpirun, or `None` when
    /// killed here (see `teardown_hang`).
    code: Option<i32>,
    /// Every rank had exited but mpirun did not: see [`mpirun`].
    teardown_hang: bool,
    /// Until mpirun exited or, with `teardown_hang`, until the last rank did.
    secs: f64,
    text: String,
}

/// Longest a job may take, ranks and mpirun together.
const JOB_DEADLINE: Duration = Duration::from_secs(120);
/// How long mpirun may outlive its last rank before it counts as stuck.
const TEARDOWN_GRACE: Duration = Duration::from_secs(5);

/// Runs one scenario under mpirun to its end. Open MPI 4.1.4's mpirun
/// (Debian 12's) sometimes hangs in its own teardown after a rank exited
/// without `MPI_Finalize`: every rank has exited and is left unreaped (a
/// zombie) while mpirun waits on a futex forever. What the scenarios check
/// is that the ranks end, so once every child of mpirun has exited and
/// mpirun is still there `TEARDOWN_GRACE` later, it is killed and the run
/// is marked `teardown_hang`. A rank still running at `JOB_DEADLINE` is a
/// real hang: everything is killed and `secs` says so.
fn mpirun(np: usize, scenario: &str) -> Run {
    let exe = std::env::current_exe().expect("own path");
    let t = Instant::now();
    let mut child = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", &np.to_string()])
        .arg(exe)
        .args(["rank", scenario])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning mpirun");
    let stdout = drain(child.stdout.take().expect("piped stdout"));
    let stderr = drain(child.stderr.take().expect("piped stderr"));
    let pid = child.id();
    let mut seen_ranks = false;
    let mut all_exited_at: Option<Instant> = None;
    let mut teardown_hang = false;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for mpirun") {
            break Some(status);
        }
        let (ranks, running) = children_of(pid);
        seen_ranks |= !ranks.is_empty();
        if seen_ranks && running.is_empty() {
            let at = *all_exited_at.get_or_insert_with(Instant::now);
            if at.elapsed() > TEARDOWN_GRACE {
                println!("note: every rank exited but mpirun hung in its teardown (Open MPI 4.1); killing it");
                teardown_hang = true;
                break None;
            }
        } else {
            all_exited_at = None;
        }
        if t.elapsed() > JOB_DEADLINE {
            for p in running {
                let _ = Command::new("kill").args(["-9", &p.to_string()]).status();
            }
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let end = if teardown_hang { all_exited_at.unwrap_or_else(Instant::now) } else { Instant::now() };
    let text = stdout.join().expect("stdout reader") + &stderr.join().expect("stderr reader");
    Run { code: status.map(shell_code), teardown_hang, secs: end.duration_since(t).as_secs_f64(), text }
}

/// The code a shell reports: the exit code, or 128 + the signal that
/// killed it (Open MPI's mpirun sometimes dies of SIGSEGV in its teardown).
fn shell_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(128)
}

/// Reads a pipe to its end on a thread of its own.
fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// The children of `pid` (from /proc): all of them, and those not yet
/// exited (state other than Z, zombie).
fn children_of(pid: u32) -> (Vec<u32>, Vec<u32>) {
    let (mut all, mut running) = (Vec::new(), Vec::new());
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { continue };
        let mut fields = rest.split_whitespace();
        let (Some(state), Some(ppid)) = (fields.next(), fields.next()) else { continue };
        if ppid.parse::<u32>().ok() == Some(pid) {
            all.push(p);
            if state != "Z" {
                running.push(p);
            }
        }
    }
    (all, running)
}

type Check = fn(usize, &Run) -> Result<(), String>;

const SCENARIOS: [(&str, Check); 8] = [
    ("ok", check_all_pass),
    ("normalizer", check_all_pass),
    ("shape", check_all_pass),
    ("op", check_all_pass),
    ("stall", check_timed_out),
    ("finalize", check_timed_out),
    ("exit", check_killed),
    ("exit0", check_killed),
];

/// Every rank printed `rank R PASS` and mpirun exited 0.
fn check_all_pass(np: usize, out: &Run) -> Result<(), String> {
    for r in 0..np {
        if !out.text.contains(&format!("rank {r} PASS")) {
            return Err(format!("rank {r} did not print PASS"));
        }
    }
    if out.code != Some(0) {
        return Err(format!("mpirun exit code {:?}", out.code));
    }
    Ok(())
}

/// The waiting ranks got the timeout error in time and exited with code 3;
/// mpirun then ended the job (killing a stalled rank) with that code. After
/// a rank has finalized early, Open MPI 4.1.4's mpirun sometimes crashes in
/// its own teardown (`PMIx_server_finalize`, SIGSEGV: exit 139) or reports
/// the finalized rank as killed (137) instead: any failure code is accepted
/// there, as long as every waiting rank reported and nothing hung. Its hang
/// in the teardown after every rank exited (`Run::teardown_hang`) is
/// accepted too.
fn check_timed_out(np: usize, out: &Run) -> Result<(), String> {
    for r in 0..np - 1 {
        if !out.text.contains(&format!("rank {r} PASS")) {
            return Err(format!("rank {r} did not report the timeout"));
        }
    }
    let finalized_early = out.text.contains("finalizing and leaving early");
    match out.code {
        Some(3) => {}
        None if out.teardown_hang => {}
        Some(c) if finalized_early && c != 0 => {}
        c => return Err(format!("mpirun exit code {c:?}, expected 3 (the waiting ranks' code)")),
    }
    Ok(())
}

/// A rank that exits without MPI_Finalize (code 5, or even 0): Open MPI's
/// runtime kills the whole job at once, before the others' timeout; nothing
/// hangs and mpirun's exit code is not 0.
fn check_killed(_np: usize, out: &Run) -> Result<(), String> {
    if out.code.is_none() && !out.teardown_hang {
        return Err("a rank hung (killed at the job deadline)".into());
    }
    if out.code == Some(0) {
        return Err("mpirun exit code 0, expected a failure code".into());
    }
    if out.text.contains("survived") {
        return Err("a rank survived its peer's exit".into());
    }
    Ok(())
}

// ---------------------------------------------------------------- the ranks

fn rank_main(scenario: &str) -> Result<(), String> {
    let timeout = match scenario {
        "stall" | "finalize" => SHORT,
        // Long enough that the kill by mpirun surely comes first.
        "exit" | "exit0" => LONG,
        _ => 60.0,
    };
    let c = MpiCollective::init(Duration::from_secs_f64(timeout)).map_err(|e| e.to_string())?;
    let (r, w) = (c.rank(), c.world_size());
    let e = |e: pmstate_norm::NormError| e.to_string();
    match scenario {
        "ok" => {
            for (dtype, dims) in
                [(DType::F32, vec![2, 3]), (DType::F64, vec![358]), (DType::I64, vec![]), (DType::U8, vec![5])]
            {
                let t = data(r, dtype, &dims);
                let g = c.all_gather(&t).map_err(e)?;
                for (q, got) in g.iter().enumerate() {
                    same(got, &data(q, dtype, &dims))?;
                }
                for src in [0, w - 1] {
                    same(&c.broadcast(&t, src).map_err(e)?, &data(src, dtype, &dims))?;
                }
            }
            // A non-contiguous input is sent in row-major order.
            let t = data(r, DType::F32, &[3, 2]).t().map_err(|e| e.to_string())?;
            let g = c.all_gather(&t).map_err(e)?;
            same(&g[w - 1], &data(w - 1, DType::F32, &[3, 2]).t().map_err(|e| e.to_string())?)?;
        }
        "normalizer" => {
            // The same updates over MPI and over an in-process group of the
            // same size: every rank's state equals, bit for bit, what the
            // in-process replica computes (which is tested against torch).
            let ours = updates(Arc::new(c), r)?;
            let replica = std::thread::scope(|s| {
                let hs: Vec<_> = InProcessGroup::new(w, Duration::from_secs(60))
                    .into_iter()
                    .enumerate()
                    .map(|(q, g)| s.spawn(move || updates(Arc::new(g), q)))
                    .collect();
                hs.into_iter().map(|h| h.join().expect("replica thread")).collect::<Result<Vec<_>, _>>()
            })?;
            if ours != replica[r] || ours != replica[0] {
                return Err("state differs from the in-process replica".into());
            }
        }
        "shape" => {
            // The last rank sends [4] where the others send [3]: every rank
            // gets the same error, and the communicator stays usable.
            let n = if r == w - 1 { 4 } else { 3 };
            let err = c.all_gather(&data(r, DType::F32, &[n])).err().ok_or("no error on a shape mismatch")?;
            let last = w - 1;
            if !matches!(&err, NormError::Collective { problem: CollectiveProblem::Disagree { rank, call, .. }, .. }
                if *rank == last && call.dims == [4])
            {
                return Err(format!("unexpected error: {err}"));
            }
            println!("rank {r}: {err}");
            let g = c.all_gather(&data(r, DType::F32, &[3])).map_err(e)?;
            same(&g[w - 1], &data(w - 1, DType::F32, &[3]))?;
            let err = c.all_gather(&data(r, if r == 1 { DType::F64 } else { DType::F32 }, &[3])).err();
            err.ok_or("no error on a dtype mismatch")?;
        }
        "op" => {
            let t = data(r, DType::F64, &[2]);
            let res = if r == 1 { c.broadcast(&t, 0).map(|t| vec![t]) } else { c.all_gather(&t) };
            let err = res.err().ok_or("no error on an operation mismatch")?;
            if !matches!(&err, NormError::Collective { problem: CollectiveProblem::Disagree { rank: 1, call, .. }, .. }
                if call.op == "broadcast from rank 0")
            {
                return Err(format!("unexpected error: {err}"));
            }
            println!("rank {r}: {err}");
            let res = if r == 2 { c.broadcast(&t, 1) } else { c.broadcast(&t, 0) };
            res.err().ok_or("no error on a root mismatch")?;
        }
        "stall" | "finalize" => {
            if r == w - 1 && scenario == "stall" {
                // Never arrives within the others' timeout; mpirun kills it
                // when they exit.
                std::thread::sleep(Duration::from_secs_f64(SHORT * 10.0));
                return Err("the stalled rank was not terminated".into());
            }
            if r == w - 1 {
                println!("rank {r}: finalizing and leaving early");
                drop(c);
                return Ok(());
            }
            let err = c.all_gather(&data(r, DType::F32, &[3])).err().ok_or("no error from a missing peer")?;
            let timed_out = CollectiveProblem::TimedOut { after: Duration::from_secs_f64(SHORT) };
            if !matches!(&err, NormError::Collective { problem, .. } if *problem == timed_out)
                || c.broken() != Some(timed_out.clone())
            {
                return Err(format!("unexpected error: {err}"));
            }
            // Later calls fail at once, naming the first failure.
            let later = c.broadcast(&data(r, DType::F32, &[3]), 0).err().ok_or("a broken communicator worked")?;
            if !matches!(&later, NormError::Collective { problem: CollectiveProblem::Broken(first), .. }
                if **first == timed_out)
            {
                return Err(format!("unexpected error after the timeout: {later}"));
            }
            println!("rank {r} PASS: {err}");
            // Let the other waiting ranks print, then leave the way a broken
            // rank should: a nonzero exit without MPI_Finalize (dropping a
            // broken MpiCollective skips it); mpirun then ends the job.
            std::thread::sleep(Duration::from_millis(500));
            drop(c);
            std::process::exit(3);
        }
        "exit" | "exit0" => {
            if r == w - 1 {
                println!("rank {r}: exiting without MPI_Finalize");
                std::process::exit(if scenario == "exit" { 5 } else { 0 });
            }
            let t0 = Instant::now();
            let res = c.all_gather(&data(r, DType::F32, &[3]));
            // Open MPI kills this process before it gets here.
            println!("rank {r}: survived the peer's exit: {:?} after {:.2} s", res.err(), t0.elapsed().as_secs_f64());
            drop(c);
            std::process::exit(4);
        }
        other => return Err(format!("unknown scenario {other:?}")),
    }
    println!("rank {r} PASS");
    Ok(())
}

/// Rank-specific data of a dtype and shape.
fn data(rank: usize, dtype: DType, dims: &[usize]) -> Tensor {
    let n: usize = dims.iter().product();
    let v: Vec<f64> = (0..n).map(|i| (rank * 1000 + i) as f64 * 0.37 - 11.0).collect();
    let t = Tensor::from_vec(v, dims, &Device::Cpu).expect("tensor");
    let t = if dtype == DType::U8 || dtype == DType::I64 { t.abs().expect("abs") } else { t };
    t.to_dtype(dtype).expect("cast")
}

fn same(a: &Tensor, b: &Tensor) -> Result<(), String> {
    let bits = |t: &Tensor| -> Vec<u64> {
        let t = t.flatten_all().and_then(|t| t.to_dtype(DType::F64)).expect("f64");
        t.to_vec1::<f64>().expect("vec").into_iter().map(f64::to_bits).collect()
    };
    if a.dtype() != b.dtype() || a.dims() != b.dims() || bits(a) != bits(b) {
        return Err(format!("tensors differ: {a} vs {b}"));
    }
    Ok(())
}

/// Ten Welford updates with rank-specific batch sizes and data; returns the
/// state after each as bits.
fn updates(c: Arc<dyn Collective>, rank: usize) -> Result<Vec<Vec<u64>>, String> {
    let e = |e: pmstate_norm::NormError| e.to_string();
    let mut m = RunningMeanStd::new(NormConfig::default(), Some(&[358]), &Device::Cpu).map_err(e)?.with_collective(c);
    let mut out = vec![];
    for step in 0..10 {
        let rows = 1 + (rank * 7 + step * 3) % 11;
        let x = (data(rank * 31 + step, DType::F32, &[rows, 358]) * 0.01).map_err(|e| e.to_string())?;
        m.record_moments(&x).map_err(e)?;
        let s = m.state().ok_or("no state")?;
        let mut bits: Vec<u64> = [&s.mean, &s.var]
            .iter()
            .flat_map(|t| t.to_vec1::<f64>().expect("f64 state").into_iter().map(f64::to_bits))
            .collect();
        bits.push(s.count as u64);
        out.push(bits);
    }
    Ok(out)
}
