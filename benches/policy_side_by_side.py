#!/usr/bin/env python3
"""Times the forward of the full-size smpl tracker policy in pmstate, torch
eager and onnxruntime, side by side, on the same weights and threads.

usage: python benches/policy_side_by_side.py [--threads 1] [--pmstate target/release/pmstate]
           [--min-time 1.0] [--rounds 3] [--batch 1 --batch 64 ...] [--json OUT]

`pmstate bench-policy --write-weights` writes its deterministic weights
(actor 6x1024, critic 4x1024, observations 358 + 576 + 69, 69 actions,
EMA normalizers with clamp 5) and times its own forward; this script loads
the same safetensors into torch modules that compute what ProtoMotions'
PPOModel computes in eval mode (per network: concat, `clamp((x - mean) /
sqrt(var + 1e-5), -5, 5)` in float32, Linear/ReLU stack; mean_action and
value), times them eagerly under `torch.inference_mode()` with
`torch.set_num_threads(N)`, then exports them with `torch.onnx.export`
as ProtoMotions' deployment/export_tracker_onnx.py does (opset 17,
TorchScript exporter, constant folding, dynamic batch axis) and times an
onnxruntime CPU session with intra_op_num_threads = N. The plain modules
leave out TensorDict bookkeeping, so the torch numbers are a lower bound of
ProtoMotions' own eager forward.

Statistic: per round and side, the fastest and the median call after 3
warm-up calls, at least 7 calls and --min-time seconds; the three sides
take turns, --rounds times, and the table shows the fastest call over all
rounds (the least disturbed one: a shared 2-core machine with builds
running beside it moves medians by 2x) and, for reference, the median of
the last round. Also CPU seconds per call of the whole process (every
thread; `time.process_time()` here, /proc/self/task/*/schedstat in
pmstate), minimum over rounds: at one thread it is the work itself, what
other processes take from the cores does not count. Prints Markdown
tables (docs/policy-speed.md).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from bench_timing import time_calls  # noqa: E402  (benches/, this script's folder)

KEYS = [("max_coords_obs", 358), ("mimic_target_poses", 576), ("previous_actions", 69)]
# the sizes a server's dynamic batching makes (1 to 64), then large batches;
# keep in step with crates/cli/src/cmd/bench_policy.rs (BENCH_BATCHES)
BATCHES = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 1024, 4096]


def read_safetensors(path):
    """A safetensors reader (no extra package): name -> torch tensor."""
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    dtypes = {"F32": np.float32, "F64": np.float64, "I64": np.int64}
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        arr = np.frombuffer(raw[base + a:base + b], dtype=dtypes[v["dtype"]]).reshape(v["shape"])
        out[k] = torch.from_numpy(arr.copy())
    return out


class Net(torch.nn.Module):
    """One MLPWithConcat with its normalizer (eval mode)."""

    def __init__(self, sd, prefix, layers):
        super().__init__()
        self.register_buffer("mean", sd[f"{prefix}.norm.running_obs_norm.mean"].float())
        var = sd[f"{prefix}.norm.running_obs_norm.var"].float()
        self.register_buffer("std", torch.sqrt(var + 1e-5))
        mods = []
        for i in range(layers + 1):
            w = sd[f"{prefix}.mlp.{2 * i}.weight"]
            lin = torch.nn.Linear(w.shape[1], w.shape[0])
            lin.weight.data.copy_(w)
            lin.bias.data.copy_(sd[f"{prefix}.mlp.{2 * i}.bias"])
            mods.append(lin)
            if i < layers:
                mods.append(torch.nn.ReLU())
        self.mlp = torch.nn.Sequential(*mods)

    def forward(self, x):
        z = torch.clamp((x - self.mean) / self.std, -5.0, 5.0)
        return self.mlp(z)


class Model(torch.nn.Module):
    def __init__(self, sd):
        super().__init__()
        self.actor = Net(sd, "_actor.mu", 6)
        self.critic = Net(sd, "_critic", 4)

    def forward(self, a, b, c):
        x = torch.cat([a, b, c], dim=-1)
        return self.actor(x), self.critic(x)


def obs(batch, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(batch, w, generator=g) * 6.0 - 3.0 for _, w in KEYS]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pmstate", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "pmstate"))
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, action="append", default=None)
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    args = ap.parse_args()
    batches = args.batch or BATCHES
    torch.set_num_threads(args.threads)
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        wpath = os.path.join(tmp, "weights.safetensors")
        cmd = [args.pmstate, "bench-policy", "--json", "--threads", str(args.threads), "--min-time",
               str(args.min_time), "--write-weights", wpath] + sum((["--batch", str(b)] for b in batches), [])

        def run_pmstate():
            return [json.loads(l) for l in subprocess.check_output(cmd, text=True).splitlines() if l.strip()]

        rust = run_pmstate()
        sd = read_safetensors(wpath)
        model = Model(sd).eval()

        onnx_path = os.path.join(tmp, "policy.onnx")
        names = [k for k, _ in KEYS]
        with torch.no_grad():
            torch.onnx.export(model, tuple(obs(2, 0)), onnx_path, input_names=names,
                              output_names=["mean_action", "value"], opset_version=17, do_constant_folding=True,
                              dynamic_axes={**{n: {0: "batch_size"} for n in names},
                                            "mean_action": {0: "batch_size"}, "value": {0: "batch_size"}},
                              dynamo=False)
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
        inputs = {b: obs(b, b) for b in batches}

        best = {}
        for rnd in range(args.rounds):
            if rnd > 0:
                rust = run_pmstate()
            def keep(key, med, mn, cpu):
                prev = best.get(key, (None, float("inf"), float("inf")))
                best[key] = (med, min(prev[1], mn), min(prev[2], cpu if cpu is not None else float("inf")))

            for r in rust:
                keep(("pmstate", r["op"], r["batch"]), r["seconds"], r["min_seconds"], r.get("cpu_seconds"))
            for b in batches:
                x = inputs[b]
                with torch.inference_mode():
                    keep(("torch", b), *time_calls(lambda: model(*x), args.min_time)[:3])
                feed = {n: t.numpy() for n, t in zip(names, x)}
                keep(("ort", b), *time_calls(lambda: sess.run(None, feed), args.min_time)[:3])

        stream = best[("pmstate", "stream", 0)]
        wbytes = rust[0]["weight_bytes"]
        rows = []
        for b in batches:
            pm, to, on = best[("pmstate", "forward", b)], best[("torch", b)], best[("ort", b)]
            rows.append({"batch": b, "threads": args.threads, "pmstate_s": pm[1], "torch_s": to[1], "ort_s": on[1],
                         "pmstate_median_s": pm[0], "torch_median_s": to[0], "ort_median_s": on[0],
                         "pmstate_cpu_s": pm[2], "torch_cpu_s": to[2], "ort_cpu_s": on[2],
                         "stream_s": stream[1], "weight_bytes": wbytes})

    print(f"threads {args.threads}, {args.rounds} rounds; weights {wbytes / 1e6:.1f} MB, read once in "
          f"{stream[1] * 1e3:.2f} ms ({wbytes / stream[1] / 1e9:.1f} GB/s)")
    print()
    print("| batch | pmstate | torch eager | onnxruntime | pmstate rows/s | torch / pmstate | onnxruntime / pmstate "
          "| medians (pmstate, torch, ort) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['pmstate_s'] * 1e3:.3f} ms | {r['torch_s'] * 1e3:.3f} ms | {r['ort_s'] * 1e3:.3f} ms "
              f"| {r['batch'] / r['pmstate_s']:.0f} | {r['torch_s'] / r['pmstate_s']:.2f}x "
              f"| {r['ort_s'] / r['pmstate_s']:.2f}x | {r['pmstate_median_s'] * 1e3:.2f}, "
              f"{r['torch_median_s'] * 1e3:.2f}, {r['ort_median_s'] * 1e3:.2f} ms |")
    print()
    print("CPU seconds per call (all threads of each process):")
    print()
    print("| batch | pmstate | torch eager | onnxruntime | torch / pmstate | onnxruntime / pmstate |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['batch']} | {r['pmstate_cpu_s'] * 1e3:.3f} ms | {r['torch_cpu_s'] * 1e3:.3f} ms "
              f"| {r['ort_cpu_s'] * 1e3:.3f} ms | {r['torch_cpu_s'] / r['pmstate_cpu_s']:.2f}x "
              f"| {r['ort_cpu_s'] / r['pmstate_cpu_s']:.2f}x |")
    b1 = next((r for r in rows if r["batch"] == 1), None)
    if b1:
        print()
        print(f"batch 1: {b1['pmstate_s'] / b1['stream_s']:.2f}x the time to read the weights once")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
