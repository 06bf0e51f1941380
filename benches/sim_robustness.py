#!/usr/bin/env python3
"""What each of `deploy sim`'s perturbations does to a tracker's tracking:
runs `pmstate deploy sim` on one checkpoint, clip and MJCF with no
perturbation, then with each of sensor noise, latency, dropped readings and
pushes at a few strengths (and the tilt guard on the worst push), several
seeds each, and prints a Markdown table (docs/deploy.md, "Sim-to-sim").

usage: python benches/sim_robustness.py [--pmstate target/release/pmstate]
           [--checkpoint CKPT] [--motion CLIP] [--mjcf ROBOT.xml] [--seeds 3]

Defaults: the bundled g1_amp_deploy tracker on the committed small robot and
its lifted clip (testdata/deploy/sim). Needs a pmstate built with
`--features mujoco` (and LD_LIBRARY_PATH from scripts/mujoco-lib.sh); no
Python packages.
"""
import argparse
import json
import os
import statistics
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CASES = [
    ("none", []),
    ("joint encoders, 0.01 rad", ["--noise-joint-pos", "0.01"]),
    ("joint encoders, 0.05 rad", ["--noise-joint-pos", "0.05"]),
    ("joint velocities, 0.5 rad/s", ["--noise-joint-vel", "0.5"]),
    ("gyroscope, 0.2 rad/s", ["--noise-gyro", "0.2"]),
    ("orientation, 0.05 rad", ["--noise-orientation", "0.05"]),
    ("latency, 1 period (20 ms)", ["--latency", "1"]),
    ("latency, 3 periods", ["--latency", "3"]),
    ("dropped readings, 10 %", ["--drop", "0.1"]),
    ("dropped readings, 50 %", ["--drop", "0.5"]),
    ("push 50 N, 0.1 s every 1 s", ["--push-force", "50"]),
    ("push 200 N, 0.1 s every 1 s", ["--push-force", "200"]),
    ("push 200 N + tilt guard 0.8 rad", ["--push-force", "200", "--max-tilt", "0.8"]),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pmstate", default=os.path.join(ROOT, "target/release/pmstate"))
    ap.add_argument("--checkpoint", default=os.path.join(ROOT, "testdata/policy/g1_amp_deploy/last.ckpt"))
    ap.add_argument("--motion", default=os.path.join(ROOT, "testdata/deploy/sim/clip.motion"))
    ap.add_argument("--mjcf", default=os.path.join(ROOT, "testdata/deploy/sim/robot.xml"))
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()

    def run(extra, seed):
        out = subprocess.run(
            [a.pmstate, "--json", "deploy", "sim", a.checkpoint, "--motion", a.motion, "--mjcf", a.mjcf,
             "--every", "0", "--seed", str(seed)] + extra,
            check=True, capture_output=True, text=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    print("| perturbation | joint error, mean (rad) | anchor error, mean (m) | first down (step) "
          "| readings lost | safe-mode steps |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, extra in CASES:
        runs = [run(extra, seed) for seed in range(a.seeds)]
        mean = lambda k: statistics.mean(r[k] for r in runs)
        falls = [r["first_fall"] for r in runs]
        fall = "-" if all(f is None for f in falls) else ", ".join("-" if f is None else str(f) for f in falls)
        print(f"| {name} | {mean('joint_error_mean'):.3f} | {mean('anchor_error_mean'):.3f} | {fall} "
              f"| {mean('dropped_readings'):.0f} | {statistics.mean(r['tracker']['safe_mode_steps'] for r in runs):.0f} |")


if __name__ == "__main__":
    main()
