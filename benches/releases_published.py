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

usage: python benches/releases_published.py [--v23 PATH] [--v30 PATH] [--v31 PATH]
           [--pmstate target/release/pmstate] [--json OUT]

Each PATH is a tree of github:NVlabs/ProtoMotions at that tag (blob by blob
where LFS objects are missing). Each release's recorder
(testdata/policy/record_v23.py, record_releases.py) writes into a temporary
folder with `--published-widths` (hidden widths as published; v3.0/v3.1's
observation widths are the recorder's own, as in the committed cases);
nothing is written into the repository. v3.0/v3.1's MaskedMimic recordings
have no float64 forward (its cells are "-").

With --protomotions PATH (today's ProtoMotions, commit 607ca7a0, and a
python with its dependencies), the three v3.1 trackers are also migrated
(`pmstate migrate --drop-unmatched-terms`) and checked with today's code
(testdata/migrate/record_migrate.py verify --case: today's agent.load of the
migrated files, with and without the training state, gives the recorded
outputs bit for bit).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# per recorder: the releases it records (its flag per release), the cases it
# writes, and the outputs compared (pmstate's name, the recording's name)
RECORDERS = {
    "testdata/policy/record_v23.py": {
        "releases": {"v2.3": "--v23"},
        "cases": {
            "v23_tracker": [("mean_action", "mean_action"), ("value", "value")],
            "v23_masked_mimic": [("mean_action", "mean_action"), ("latent_mu", "latent_mu"), ("latent_logvar", "latent_logvar")],
        },
    },
    "testdata/policy/record_releases.py": {
        "releases": {"v3.0": "--v30", "v3.1": "--v31"},
        "cases": {
            **{
                f"{tag}_{kind}": pairs
                for tag in ("v30", "v31")
                for kind, pairs in (
                    ("tracker", [("mean_action", "mean_action"), ("value", "value")]),
                    # with the recorded vae_noise (in obs.safetensors)
                    ("masked_mimic", [("mean_action", "action"), ("latent_mu", "latent_mu"), ("latent_logvar", "latent_logvar")]),
                )
            },
            # v3.1's G1 tracker (motion_tracker/g1-amass) and smpl on complex terrain
            "v31_g1_tracker": [("mean_action", "mean_action"), ("value", "value")],
            "v31_terrains_tracker": [("mean_action", "mean_action"), ("value", "value")],
        },
    },
}


def max_abs_diff(a, b):
    import numpy as np

    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0


# the cases `pmstate migrate` handles (v3.1's trackers)
MIGRATED = ("v31_tracker", "v31_g1_tracker", "v31_terrains_tracker")


def check_migrated(d, case, pmstate, protomotions):
    """record_migrate.py verify on this published-width case: 'bit identical' or why not."""
    run = subprocess.run(
        [sys.executable, os.path.join(ROOT, "testdata/migrate/record_migrate.py"), "verify", "--protomotions",
         protomotions, "--pmstate", pmstate, "--case", case, os.path.join(d, "last.ckpt"), d],
        capture_output=True, text=True)
    return "bit identical" if run.returncode == 0 else (run.stdout + run.stderr).strip().splitlines()[-1]


def check_recorder(recorder, spec, trees, pmstate, tmp, protomotions=None):
    from safetensors.numpy import load_file

    given = {r: trees[r] for r in spec["releases"] if trees.get(r)}
    if not given:
        return []
    out = os.path.join(tmp, os.path.basename(recorder))
    cmd = [sys.executable, os.path.join(ROOT, recorder), "--out", out, "--published-widths"]
    for release, tree in given.items():
        cmd += [spec["releases"][release], tree]
    if recorder.endswith("record_v23.py"):
        cmd += ["--reference-commit", "unknown (a tree without git metadata)"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = []
    for case, pairs in spec["cases"].items():
        d = os.path.join(out, case)
        if not os.path.isdir(d):
            continue
        release = next(r for r in spec["releases"] if case.startswith(r.replace(".", "")))
        got_path = os.path.join(d, "pmstate.safetensors")
        run = subprocess.run(
            [pmstate, "policy", "run", os.path.join(d, "last.ckpt"), "--obs", os.path.join(d, "obs.safetensors"), "--out", got_path],
            capture_output=True,
            text=True,
        )
        if run.returncode != 0:
            rows.append({"release": release, "case": case, "error": run.stderr.strip()})
            continue
        got, want = load_file(got_path), load_file(os.path.join(d, "expected.safetensors"))
        f64 = os.path.join(d, "expected_f64.safetensors")
        ref = load_file(f64) if os.path.exists(f64) else {}
        ckpt_mb = os.path.getsize(os.path.join(d, "last.ckpt")) / 2**20
        migrated = check_migrated(d, case, pmstate, protomotions) if protomotions and case in MIGRATED else None
        rows.append(
            {
                "migrated_with_todays_protomotions": migrated,
                "release": release,
                "case": case,
                "checkpoint_mib": round(ckpt_mb, 1),
                "pmstate_vs_torch": {o: max_abs_diff(got[o], want[t]) for o, t in pairs},
                "pmstate_vs_f64": {o: max_abs_diff(got[o], ref[t]) for o, t in pairs if t in ref},
                "torch_vs_f64": {o: max_abs_diff(want[t], ref[t]) for o, t in pairs if t in ref},
            }
        )
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--v23", help="a tree of ProtoMotions at tag v2.3")
    ap.add_argument("--v30", help="a tree of ProtoMotions at tag v3.0")
    ap.add_argument("--v31", help="a tree of ProtoMotions at tag v3.1")
    ap.add_argument("--pmstate", default=os.path.join(ROOT, "target/release/pmstate"))
    ap.add_argument("--json", help="write the rows as JSON here too")
    ap.add_argument("--protomotions", help="today's ProtoMotions checkout: also migrate and verify v3.1's trackers")
    args = ap.parse_args()
    trees = {"v2.3": args.v23, "v3.0": args.v30, "v3.1": args.v31}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for recorder, spec in RECORDERS.items():
            rows += check_recorder(recorder, spec, trees, args.pmstate, tmp, args.protomotions)
    print("| release | case | checkpoint | output | pmstate vs torch | pmstate vs float64 | torch vs float64 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['release']} | {r['case']} | - | - | FAILED: {r['error']} | | |")
            continue
        for k in r["pmstate_vs_torch"]:
            vals = [r[c].get(k) for c in ("pmstate_vs_torch", "pmstate_vs_f64", "torch_vs_f64")]
            cells = " | ".join("-" if v is None else f"{v:.1e}" for v in vals)
            print(f"| {r['release']} | {r['case']} | {r['checkpoint_mib']} MiB | {k} | {cells} |")
    for r in rows:
        if r.get("migrated_with_todays_protomotions"):
            print(f"{r['case']}: migrated, today's ProtoMotions: {r['migrated_with_todays_protomotions']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if any("error" in r or r.get("migrated_with_todays_protomotions") not in (None, "bit identical") for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
