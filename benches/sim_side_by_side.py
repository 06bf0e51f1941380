#!/usr/bin/env python3
"""The simulated closed loop's speed: `pmstate deploy sim` against
ProtoMotions' own MuJoCo loop (deployment/test_tracker_mujoco.py's per-step
body: its state reading, tracker_inputs, onnxruntime on the exported
pipeline, its post-processing, mj_step), on the same checkpoint, clip, MJCF
and MuJoCo version, one thread each, in one run.

usage: python benches/sim_side_by_side.py --protomotions PATH
           [--pmstate target/release/pmstate] [--full-size] [--repeats 5] [--json OUT]

PATH is a checkout of github:NVlabs/ProtoMotions (its exporter and its
deployment package are imported from it; nothing of it is copied here).
`--pmstate` must be built with the simulator:
    eval "$(scripts/mujoco-lib.sh)" && cargo build --release -p pmstate-cli --features mujoco
The Python loop is testdata/deploy/record_sim.py's run_loop (the loop that
recording checks `deploy sim` against), without the recording's
perturbed rerun; it needs mujoco 3.17.0, onnxruntime, torch.

The case: the committed small robot and clip (testdata/deploy/sim), the
g1_amp_deploy checkpoint (shrunk widths), or with --full-size the same
configs with the actor at the published 6 x 1024 (benches/
deploy_side_by_side.py's build_checkpoint). Per-step time of each loop:
pmstate: the loop's own wall time (`deploy sim --json`'s wall_seconds, the
initial pose included) over its steps; Python: (time of a full run - time of
a one-step run) / (steps - 1), so that model loading and the player's set-up
are left out. The fastest of --repeats runs each. The real-time factor is
the control period over the per-step time.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIM = os.path.join(ROOT, "testdata/deploy/sim")


def module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--protomotions", required=True)
    ap.add_argument("--pmstate", default=os.path.join(ROOT, "target/release/pmstate"))
    ap.add_argument("--full-size", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.chdir(ROOT)
    import numpy as np
    import torch
    import mujoco
    import onnxruntime as ort
    import yaml
    torch.set_num_threads(1)

    record_sim = module(os.path.join(ROOT, "testdata/deploy/record_sim.py"), "record_sim")
    record_deploy = record_sim.load_record_deploy()
    exporter = record_deploy.import_exporter(os.path.abspath(a.protomotions))
    from deployment import test_tracker_mujoco as ttm
    from deployment import tracker_inputs as ti
    from deployment.motion_utils import MotionPlayer
    from deployment.state_utils import quat_rotate_np
    pm = (ttm, MotionPlayer, ti, quat_rotate_np)
    mjcf = os.path.join(SIM, "robot.xml")
    clip = os.path.join(SIM, "clip.motion")

    with tempfile.TemporaryDirectory() as tmp:
        if a.full_size:
            dss = module(os.path.join(ROOT, "benches/deploy_side_by_side.py"), "deploy_side_by_side")
            ckpt = dss.build_checkpoint(a.protomotions, tmp, torch)
        else:
            ckpt = record_deploy.VARIANTS[record_sim.VARIANT]
        onnx_path = str(record_deploy.export_pipeline(exporter, ckpt, os.path.join(tmp, "onnx")))
        with open(onnx_path.replace(".onnx", ".yaml")) as f:
            meta = yaml.safe_load(f)
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        session = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])

        def python_run(steps):
            t = time.perf_counter()
            out, _ = record_sim.run_loop(pm, np, mujoco, session, meta, mjcf, clip, steps)
            return time.perf_counter() - t, out["qpos"].shape[0]

        python_run(None)  # warm-up
        full = min(python_run(None)[0] for _ in range(a.repeats))
        one = min(python_run(1)[0] for _ in range(a.repeats))
        steps = python_run(None)[1]
        python_step = (full - one) / (steps - 1)

        def pmstate_run():
            out = subprocess.run(
                [a.pmstate, "--json", "deploy", "sim", str(ckpt), "--motion", clip, "--mjcf", mjcf,
                 "--every", "0", "--envelope", "off"],
                check=True, capture_output=True, text=True)
            return json.loads(out.stdout.strip().splitlines()[-1])

        pmstate_run()  # warm-up
        runs = [pmstate_run() for _ in range(a.repeats)]
        best = min(runs, key=lambda r: r["wall_seconds"])
        pmstate_step = best["wall_seconds"] / best["steps"]
        # the control step proper (reading + tracker) of that run; the rest
        # of a step is MuJoCo's physics, the same library for both loops
        control = best["control_step"]["p50_seconds"]
        physics = pmstate_step - control

    dt = meta["timing"]["control_dt"]
    size = "6 x 1024 actor" if a.full_size else "test widths"
    print(f"| closed loop, {steps} steps, {meta['timing']['decimation']} physics steps each, one thread, {size} "
          f"| per control step | real-time factor |")
    print("|---|---:|---:|")
    print(f"| pmstate deploy sim | {pmstate_step * 1e6:.1f} µs | {dt / pmstate_step:.1f}x |")
    print(f"| ProtoMotions' loop (Python, onnxruntime) | {python_step * 1e6:.1f} µs | {dt / python_step:.1f}x |")
    print(f"\npmstate is {python_step / pmstate_step:.2f}x faster (mujoco {mujoco.__version__}, "
          f"onnxruntime {ort.__version__}); MuJoCo's {meta['timing']['decimation']} physics steps take about "
          f"{physics * 1e6:.0f} us of each control step in both loops; outside them pmstate takes "
          f"{control * 1e6:.1f} us, the Python loop about {(python_step - physics) * 1e6:.0f} us "
          f"({(python_step - physics) / control:.0f}x)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"steps": steps, "full_size": a.full_size, "pmstate_step_seconds": pmstate_step,
                       "python_step_seconds": python_step, "physics_step_seconds": physics,
                       "pmstate_control_step_seconds": control, "control_dt": dt, "mujoco": mujoco.__version__,
                       "onnxruntime": ort.__version__}, f, indent=1)


if __name__ == "__main__":
    main()
