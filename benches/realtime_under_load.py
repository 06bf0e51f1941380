#!/usr/bin/env python3
"""The control loop's timing at its real rate, idle and under a CPU load on
every core, with and without the real-time options (docs/deploy.md, "Real
time"): `pmstate bench-deploy --real-time` (one tracker step per control
period on absolute deadlines) in six runs, printed as a Markdown table.

usage: python benches/realtime_under_load.py CHECKPOINT [--pmstate target/release/pmstate]
           [--steps 1500] [--cpu N] [--priority 80] [--spin-us 2000]

CHECKPOINT: a tracker checkpoint (e.g. the full-size one
benches/deploy_side_by_side.py's build_checkpoint writes); the clip and the
sensor stream are the bundled ones. The load is `stress-ng --cpu 0` (one
busy worker per online CPU), started before the loaded runs and stopped
after them. Runs: no options; --lock-memory --fifo-priority P --cpu N;
the same with --spin-us S (the pacer polls the clock for the last S us of
each period). Each option is an error where the machine does not allow it:
the script then prints what was refused and goes on without that run.
"""
import argparse
import json
import os
import shutil
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--pmstate", default=os.path.join(ROOT, "target/release/pmstate"))
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--cpu", type=int, default=os.cpu_count() - 1)
    ap.add_argument("--priority", type=int, default=80)
    ap.add_argument("--spin-us", type=int, default=2000)
    a = ap.parse_args()
    if shutil.which("stress-ng") is None:
        raise SystemExit("stress-ng not found (apt-get install stress-ng)")
    data = os.path.join(ROOT, "testdata/deploy")
    base = [a.pmstate, "--json", "bench-deploy", a.checkpoint, "--motion", os.path.join(data, "synthetic.motion"),
            "--sensors", os.path.join(data, "g1_amp_deploy/sensors.safetensors"), "--steps", str(a.steps),
            "--real-time"]
    rt = ["--lock-memory", "--fifo-priority", str(a.priority), "--cpu", str(a.cpu)]
    configs = [("none", []), ("memory locked, SCHED_FIFO, pinned", rt),
               (f"the same + spin last {a.spin_us} us", rt + ["--spin-us", str(a.spin_us)])]
    rows = []
    for load in ("idle", "stress-ng on every core"):
        stress = None
        if load != "idle":
            stress = subprocess.Popen(["stress-ng", "--cpu", "0"], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
        try:
            for name, extra in configs:
                out = subprocess.run(base + extra, capture_output=True, text=True)
                if out.returncode != 0:
                    print(f"{load}, {name}: refused: {out.stderr.strip()}")
                    continue
                rows.append((load, name, json.loads(out.stdout.strip().splitlines()[-1])))
        finally:
            if stress is not None:
                stress.terminate()
                stress.wait()
    dt = rows[0][2]["control_dt"] if rows else 0.02
    print(f"| load | options | step p50 | step p99 | p99/p50 | step max | late p99 | late max "
          f"| missed periods ({a.steps} at {dt * 1e3:.0f} ms) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for load, name, r in rows:
        p = r["paced"]
        print(f"| {load} | {name} | {r['p50_seconds'] * 1e6:.0f} us | {r['p99_seconds'] * 1e6:.0f} us "
              f"| {r['p99_seconds'] / r['p50_seconds']:.2f} | {r['max_seconds'] * 1e6:.0f} us "
              f"| {p['late_p99_seconds'] * 1e6:.0f} us | {p['late_max_seconds'] * 1e6:.0f} us "
              f"| {p['missed_periods']} |")


if __name__ == "__main__":
    main()
