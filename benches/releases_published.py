#!/usr/bin/env python3
"""Each older ProtoMotions release's models at the PUBLISHED widths, checked
once: the release's own code builds the checkpoint from NVIDIA's published
config (the weights themselves are LFS objects, not in git), records its
eval-mode outputs (float32, and float64 as the reference), and
`pmstate policy run` must give the same numbers: its distance to the
float64 forward of the same order as torch's own float32 forward's.
The committed testdata holds the same cases at shrunk widths; this script
is the published-width check of issue 35 (its result is in
docs/checkpoints.md, "Older releases").

usage: python benches/releases_published.py --v23 PATH
           [--pmstate target/release/pmstate] [--json OUT]

PATH is a tree of github:NVlabs/ProtoMotions at tag v2.3 (e.g. made with
`git archive v2.3`, or blob by blob where LFS objects are missing). Each
release's recorder (testdata/policy/record_v23.py for v2.3) writes into a
temporary folder with `--published-widths`; nothing is written into the
repository.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# per release: its recorder, the cases it writes, and the outputs compared
RELEASES = {
    "v2.3": {
        "recorder": "testdata/policy/record_v23.py",
        "flag": "--v23",
        "cases": {
            "v23_tracker": ["mean_action", "value"],
            "v23_masked_mimic": ["mean_action", "latent_mu", "latent_logvar"],
        },
    },
}


def max_abs_diff(a, b):
    import numpy as np

    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0


def check_release(name, spec, tree, pmstate, tmp):
    from safetensors.numpy import load_file

    out = os.path.join(tmp, name)
    cmd = [sys.executable, os.path.join(ROOT, spec["recorder"]), spec["flag"], tree, "--out", out, "--published-widths"]
    commit = subprocess.run(["git", "-C", tree, "rev-parse", "HEAD"], capture_output=True, text=True)
    if commit.returncode != 0:
        cmd += ["--reference-commit", "unknown (not a git tree)"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = []
    for case, keys in spec["cases"].items():
        d = os.path.join(out, case)
        got_path = os.path.join(d, "pmstate.safetensors")
        run = subprocess.run(
            [pmstate, "policy", "run", os.path.join(d, "last.ckpt"), "--obs", os.path.join(d, "obs.safetensors"), "--out", got_path],
            capture_output=True,
            text=True,
        )
        if run.returncode != 0:
            rows.append({"release": name, "case": case, "error": run.stderr.strip()})
            continue
        got, want = load_file(got_path), load_file(os.path.join(d, "expected.safetensors"))
        ref = load_file(os.path.join(d, "expected_f64.safetensors"))
        ckpt_mb = os.path.getsize(os.path.join(d, "last.ckpt")) / 2**20
        rows.append(
            {
                "release": name,
                "case": case,
                "checkpoint_mib": round(ckpt_mb, 1),
                "pmstate_vs_torch": {k: max_abs_diff(got[k], want[k]) for k in keys},
                "pmstate_vs_f64": {k: max_abs_diff(got[k], ref[k]) for k in keys},
                "torch_vs_f64": {k: max_abs_diff(want[k], ref[k]) for k in keys},
            }
        )
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--v23", help="a tree of ProtoMotions at tag v2.3")
    ap.add_argument("--pmstate", default=os.path.join(ROOT, "target/release/pmstate"))
    ap.add_argument("--json", help="write the rows as JSON here too")
    args = ap.parse_args()
    trees = {"v2.3": args.v23}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec in RELEASES.items():
            if trees.get(name) is None:
                print(f"{name}: skipped (no tree given)")
                continue
            rows += check_release(name, spec, trees[name], args.pmstate, tmp)
    print("| release | case | checkpoint | output | pmstate vs torch | pmstate vs float64 | torch vs float64 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['release']} | {r['case']} | - | - | FAILED: {r['error']} | | |")
            continue
        for k in r["pmstate_vs_torch"]:
            vals = [r[c][k] for c in ("pmstate_vs_torch", "pmstate_vs_f64", "torch_vs_f64")]
            cells = " | ".join(f"{v:.1e}" for v in vals)
            print(f"| {r['release']} | {r['case']} | {r['checkpoint_mib']} MiB | {k} | {cells} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if any("error" in r for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
