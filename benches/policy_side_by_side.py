#!/usr/bin/env python3
"""Times the forward of the full-size smpl tracker policy in pmstate, torch
eager and onnxruntime, side by side, on the same weights and threads.

usage: python benches/policy_side_by_side.py [--threads 1] [--pmstate target/release/pmstate]
           [--min-time 1.0] [--batch 1 --batch 64 ...] [--json OUT]

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
ProtoMotions' own eager forward. Statistic everywhere: median seconds per
call after 3 warm-up calls, at least 7 calls and --min-time seconds.
Prints a Markdown table (docs/policy-speed.md).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

KEYS = [("max_coords_obs", 358), ("mimic_target_poses", 576), ("previous_actions", 69)]
BATCHES = [1, 64, 1024, 4096]


def median_seconds(fn, min_time):
    for _ in range(3):
        fn()
    samples = []
    start = time.perf_counter()
    while len(samples) < 7 or (time.perf_counter() - start < min_time and len(samples) < 100000):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


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
        rust = [json.loads(l) for l in subprocess.check_output(cmd, text=True).splitlines() if l.strip()]
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

        rows = []
        stream = next(r for r in rust if r["op"] == "stream")
        for b in batches:
            x = obs(b, b)
            with torch.inference_mode():
                t_torch = median_seconds(lambda: model(*x), args.min_time)
            feed = {n: t.numpy() for n, t in zip(names, x)}
            t_ort = median_seconds(lambda: sess.run(None, feed), args.min_time)
            t_pm = next(r["seconds"] for r in rust if r["op"] == "forward" and r["batch"] == b)
            rows.append({"batch": b, "threads": args.threads, "pmstate_s": t_pm, "torch_s": t_torch, "ort_s": t_ort,
                         "stream_s": stream["seconds"], "weight_bytes": stream["weight_bytes"]})

    print(f"threads {args.threads}; weights {rows[0]['weight_bytes'] / 1e6:.1f} MB, read once in "
          f"{rows[0]['stream_s'] * 1e3:.2f} ms ({rows[0]['weight_bytes'] / rows[0]['stream_s'] / 1e9:.1f} GB/s)")
    print()
    print("| batch | pmstate | torch eager | onnxruntime | pmstate rows/s | vs torch | vs onnxruntime |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['batch']} | {r['pmstate_s'] * 1e3:.3f} ms | {r['torch_s'] * 1e3:.3f} ms | {r['ort_s'] * 1e3:.3f} ms "
              f"| {r['batch'] / r['pmstate_s']:.0f} | {r['torch_s'] / r['pmstate_s']:.2f}x "
              f"| {r['ort_s'] / r['pmstate_s']:.2f}x |")
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
