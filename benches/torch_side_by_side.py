#!/usr/bin/env python3
"""Times ProtoMotions' normalizers on torch and `pmstate bench` side by side.

usage: python benches/torch_side_by_side.py --protomotions PATH [--threads 1]
           [--pmstate target/release/pmstate] [--min-time 0.5] [--isa auto] [--json OUT]

PATH is a checkout of github:NVlabs/ProtoMotions; its normalization.py is
loaded by path. Both sides use the same shapes, f32 data of the same kind,
the same config (clamp 5; EMA 0.999), the same thread count and the same
statistic (median seconds per call after 2 warm-up calls, at least 7 calls
and --min-time seconds). `copy` is `x.clone()` on torch and, for pmstate, a
parallel copy through the same allocation path as its normalize. `--isa`
picks pmstate's CPU instruction set (`pmstate bench --isa`). Prints a
Markdown table for the README, with the instruction set pmstate ran with.
"""
import argparse
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata"))
from pm_reference import Fabric1, load_reference  # noqa: E402
from bench_timing import time_calls  # noqa: E402  (benches/, this script's folder)

SHAPES = [(4096, 358), (16384, 512), (65536, 64)]


def torch_rows(ref, threads, min_time):
    torch.set_num_threads(threads)
    out = []
    for rows, cols in SHAPES:
        g = torch.Generator().manual_seed(0)
        x = (torch.rand(rows, cols, generator=g) - 0.5) * 3 + torch.arange(cols) * 0.01
        welford = ref.RunningMeanStd(Fabric1(), shape=(cols,), device="cpu", clamp_value=5.0)
        ema = ref.RunningMeanStd(Fabric1(), shape=(cols,), device="cpu", clamp_value=5.0, ema_decay=0.999)
        welford.record_moments(x)
        with torch.no_grad():
            ops = {
                "normalize": lambda: welford.normalize(x),
                "record_moments": lambda: welford.record_moments(x),
                "record_moments_ema": lambda: ema.record_moments(x),
                "copy": lambda: x.clone(),
            }
            for op, fn in ops.items():
                out.append({"op": op, "rows": rows, "cols": cols, "threads": threads,
                            "seconds": time_calls(fn, min_time, warmups=2, max_calls=10000)[0]})
    return out


def pmstate_rows(binary, threads, min_time, isa):
    cmd = [binary, "bench", "--json", "--threads", str(threads), "--min-time", str(min_time), "--isa", isa]
    res = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--protomotions", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pmstate", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "pmstate"))
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--isa", default="auto", choices=["auto", "avx512", "avx2", "scalar"])
    ap.add_argument("--json", help="also write both sides' rows to this file")
    a = ap.parse_args()
    ref = load_reference(a.protomotions)
    t_rows = torch_rows(ref, a.threads, a.min_time)
    p_rows = pmstate_rows(a.pmstate, a.threads, a.min_time, a.isa)
    key = lambda r: (r["op"], r["rows"], r["cols"])
    p = {key(r): r for r in p_rows}
    copies = {(r["rows"], r["cols"]): r["seconds"] for r in p_rows if r["op"] == "copy"}
    print(f"torch {torch.__version__}, {a.threads} thread(s); median µs per call\n")
    print("| op | shape | isa | torch | pmstate | speedup | pmstate / pmstate copy |")
    print("|---|---|---|---:|---:|---:|---:|")
    for r in t_rows:
        q = p[key(r)]
        ratio = q["seconds"] / copies[(r["rows"], r["cols"])]
        print(f"| {r['op']} | {r['rows']}x{r['cols']} | {q.get('isa') or '-'} | {r['seconds'] * 1e6:.0f} "
              f"| {q['seconds'] * 1e6:.0f} "
              f"| {r['seconds'] / q['seconds']:.1f}x | {ratio:.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"torch": t_rows, "pmstate": p_rows, "torch_version": torch.__version__}, f, indent=1)


if __name__ == "__main__":
    main()
