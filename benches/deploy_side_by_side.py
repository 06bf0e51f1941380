#!/usr/bin/env python3
"""Times one control step of the full-size g1 tracker in pmstate (the whole
Tracker::step: references, alignment, observations, actor, action function,
filters) against onnxruntime running ProtoMotions' exported unified pipeline
of the same checkpoint (observations, actor, action function only: the
Python around it is not timed), at batch 1, on the same threads.

usage: python benches/deploy_side_by_side.py --protomotions PATH
           [--threads 1] [--steps 10000] [--pmstate target/release/pmstate] [--json OUT]

PATH is a checkout of github:NVlabs/ProtoMotions (its classes build the
checkpoint, its exporter exports the graph; nothing of it is copied here).
The checkpoint: testdata/policy/g1_amp_deploy's resolved configs with the
actor's hidden layers at the published width (6 x 1024), the AMP model
built by ProtoMotions' own class (LazyLinear materialised on the recorded
observation widths, its own weight init), normalizer statistics set to
non-trivial values, saved as `{"model": state_dict}` with the configs next
to it. pmstate: `pmstate --json bench-deploy` over the recorded sensor stream
(testdata/deploy/g1_amp_deploy/sensors.safetensors) and the synthetic clip.
onnxruntime: `deployment/export_bm_tracker_onnx.py`'s `export_tracker` on
the same files, one InferenceSession (CPU provider, intra_op_num_threads =
--threads), fed the recorded per-step inputs (replay.safetensors), every call
timed. Both: 100 untimed steps, then --steps timed ones; p50, p99, max.
Prints a Markdown table (docs/deploy.md).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def percentiles(samples):
    s = sorted(samples)
    pick = lambda q: s[round((len(s) - 1) * q)]
    return {"p50_seconds": pick(0.5), "p99_seconds": pick(0.99), "max_seconds": s[-1],
            "mean_seconds": sum(s) / len(s)}


def build_checkpoint(pm, out_dir, torch):
    sys.path.insert(0, pm)
    from tensordict import TensorDict
    from protomotions.utils.hydra_replacement import get_class
    from safetensors.torch import load_file

    cfg_path = os.path.join(ROOT, "testdata/policy/g1_amp_deploy/resolved_configs_inference.pt")
    resolved = torch.load(cfg_path, map_location="cpu", weights_only=False)
    model_cfg = resolved["agent"].model
    for layer in model_cfg.actor.mu_model.layers:
        layer.units = 1024
    model = get_class(model_cfg._target_)(model_cfg)
    obs = load_file(os.path.join(ROOT, "testdata/policy/g1_amp_deploy/obs.safetensors"))
    td = TensorDict({k: torch.zeros(2, v.shape[1]) for k, v in obs.items()}, batch_size=[2])
    model.eval()
    with torch.no_grad():
        model(td)
    g = torch.Generator().manual_seed(7)
    state = model.state_dict()
    for k, v in state.items():
        if k.endswith("running_obs_norm.mean"):
            v.copy_(torch.randn(v.shape, generator=g, dtype=v.dtype) * 0.5)
        elif k.endswith("running_obs_norm.var"):
            v.copy_(torch.rand(v.shape, generator=g, dtype=v.dtype) + 0.5)
    torch.save({"model": state}, os.path.join(out_dir, "last.ckpt"))
    torch.save(resolved, os.path.join(out_dir, "resolved_configs_inference.pt"))
    return os.path.join(out_dir, "last.ckpt")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--protomotions", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--pmstate", default=os.path.join(ROOT, "target/release/pmstate"))
    ap.add_argument("--json")
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    import numpy as np
    import torch
    import onnxruntime as ort
    from safetensors.numpy import load_file as load_np
    torch.set_num_threads(a.threads)

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = build_checkpoint(a.protomotions, tmp, torch)
        data = os.path.join(ROOT, "testdata/deploy")
        out = subprocess.run(
            [a.pmstate, "--json", "bench-deploy", ckpt, "--motion", os.path.join(data, "synthetic.motion"),
             "--sensors", os.path.join(data, "g1_amp_deploy/sensors.safetensors"),
             "--steps", str(a.steps), "--threads", str(a.threads)],
            check=True, capture_output=True, text=True)
        ours = json.loads(out.stdout.strip().splitlines()[-1])

        sys.path.insert(0, os.path.join(a.protomotions, "deployment"))
        import export_bm_tracker_onnx as exporter
        onnx_path = exporter.export_tracker(checkpoint=ckpt, output_dir=os.path.join(tmp, "onnx"), validate=False)
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        so.inter_op_num_threads = 1
        session = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        rec = load_np(os.path.join(data, "g1_amp_deploy/replay.safetensors"))
        steps = rec[f"inputs.{names[0]}"].shape[0]
        feeds = [{n: rec[f"inputs.{n}"][k][None].astype(np.float32) for n in names} for k in range(steps)]
        samples = []
        for i in range(a.steps + 100):
            f = feeds[i % steps]
            t = time.perf_counter()
            session.run(None, f)
            e = time.perf_counter() - t
            if i >= 100:
                samples.append(e)
        theirs = percentiles(samples)

    dt = ours["control_dt"]
    rows = [("pmstate Tracker::step (whole step)", ours), ("onnxruntime, exported pipeline (graph only)", theirs)]
    print(f"| batch 1, {a.threads} thread(s), {a.steps} steps | p50 | p99 | p99/p50 | max | p50 / {dt * 1e3:.0f} ms period |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in rows:
        print(f"| {name} | {r['p50_seconds'] * 1e6:.1f} µs | {r['p99_seconds'] * 1e6:.1f} µs | "
              f"{r['p99_seconds'] / r['p50_seconds']:.2f} | {r['max_seconds'] * 1e6:.1f} µs | "
              f"{100 * r['p50_seconds'] / dt:.2f} % |")
    print(f"\npmstate p50 / onnxruntime p50: {ours['p50_seconds'] / theirs['p50_seconds']:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"threads": a.threads, "steps": a.steps, "pmstate": ours, "onnxruntime": theirs,
                       "torch": torch.__version__, "onnxruntime_version": ort.__version__}, f, indent=1)


if __name__ == "__main__":
    main()
