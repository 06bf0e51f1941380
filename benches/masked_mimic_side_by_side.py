#!/usr/bin/env python3
"""Times MaskedMimic's inference forward in pmstate and in torch eager
(ProtoMotions' own MaskedMimicModel), side by side, on the same weights and
threads, at the published smpl model's sizes (tokens 512, 4 transformer
layers, 4 heads, ff 1024; token MLPs 256 x 2; heads 256/128 -> 64; trunk
1024 x 3 -> 69).

usage: python benches/masked_mimic_side_by_side.py --protomotions PATH
           [--threads 1] [--pmstate target/release/pmstate] [--min-time 1.0]
           [--rounds 3] [--batch 1 --batch 256]

`pmstate bench-policy --family masked-mimic --write-weights W` writes its
deterministic weights under ProtoMotions' state-dict names and times
`MaskedMimic::forward` (with a vae_noise). This script builds
MaskedMimicModel from the shipped examples/experiments/masked_mimic/
transformer.py config (ProtoMotions' own classes, imported from PATH), runs
one train-mode forward at pmstate's observation widths to materialize its
lazy layers and normalizers, loads W (strict shapes; only the training-only
encoder is left out) and times `forward_inference` under
`torch.inference_mode()` with `torch.set_num_threads(N)` (the transformer
then takes torch's fast path, as ProtoMotions' inference does). Fastest call
over the rounds, and CPU seconds per call. Prints a Markdown table.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from bench_timing import time_calls  # noqa: E402  (benches/, this script's folder)

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 5
# keep in step with crates/cli/src/cmd/bench_masked_mimic.rs (KEYS)
KEYS = [("max_coords_obs", 358), ("masked_mimic_target_poses", STEPS * 168),
        ("masked_mimic_target_masks", STEPS * 25), ("masked_mimic_target_times", STEPS),
        ("masked_mimic_target_poses_masks", STEPS), ("historical_pose_obs", STEPS * 217),
        ("previous_actions", 69)]
# the training-only encoder reads these too (any widths: it is not timed)
ENCODER_ONLY = [("mimic_target_poses", 64), ("masked_mimic_target_bodies_masks", STEPS * 24)]


def check_outputs(args, torch, model, cfgs, o, tmp):
    """The same model in both: `pmstate policy run` on a checkpoint of the
    torch model's state dict and its resolved configs, against torch's
    forward_inference in float32 and float64. Returns (|pmstate - f64|,
    |torch - f64|, scale) on mean_action."""
    import copy
    from tensordict import TensorDict
    from safetensors.torch import save_file, load_file
    torch.save({"model": model.state_dict()}, os.path.join(tmp, "last.ckpt"))
    torch.save({k: cfgs[k] for k in ("robot", "simulator", "terrain", "scene_lib", "motion_lib", "env", "agent")},
               os.path.join(tmp, "resolved_configs.pt"))
    save_file({k: v.contiguous() for k, v in o.items()}, os.path.join(tmp, "obs.safetensors"))
    subprocess.run([args.pmstate, "policy", "run", os.path.join(tmp, "last.ckpt"), "--obs",
                    os.path.join(tmp, "obs.safetensors"), "--out", os.path.join(tmp, "out.safetensors")],
                   check=True, capture_output=True)
    ours = load_file(os.path.join(tmp, "out.safetensors"))["mean_action"].double()
    with torch.inference_mode():
        t32 = model.forward_inference(TensorDict(dict(o), batch_size=[8]))["action"].double()
        m64 = copy.deepcopy(model).double()
        t64 = m64.forward_inference(TensorDict({k: v.double() for k, v in o.items()}, batch_size=[8]))["action"]
    return float((ours - t64).abs().max()), float((t32 - t64).abs().max()), float(t64.abs().max())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--protomotions", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pmstate", default=os.path.join(HERE, "..", "target", "release", "pmstate"))
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, action="append")
    args = ap.parse_args()
    # the sweep of batch sizes a server makes (1 to 64), then a large batch
    batches = args.batch or [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 256]

    sys.path.insert(0, os.path.join(HERE, "..", "testdata", "policy"))
    sys.path.insert(0, os.path.join(HERE, "..", "testdata"))
    import record_policy as R  # noqa: E402 (ProtoMotions' configs, as the recordings build them)
    R.import_reference(os.path.abspath(args.protomotions))
    torch = R.torch
    from tensordict import TensorDict
    from safetensors.torch import load_file
    torch.use_deterministic_algorithms(False)
    torch.set_num_threads(args.threads)

    cfgs, _, _ = R.build_configs(os.path.abspath(args.protomotions), "examples/experiments/masked_mimic/transformer.py",
                                 "smpl", "masked_mimic_bench")
    mcfg = cfgs["agent"].model
    model = R.PM.get_class(mcfg._target_)(config=mcfg)
    g = torch.Generator().manual_seed(0)

    def obs(n, encoder=False):
        o = {}
        for k, w in KEYS + (ENCODER_ONLY if encoder else []):
            if k.endswith("_masks"):
                o[k] = (torch.rand(n, w, generator=g) < 0.5).float()
                o[k][:, 0] = 1.0
            else:
                o[k] = torch.randn(n, w, generator=g) * 3.0
        o["vae_noise"] = torch.randn(n, mcfg.vae.vae_latent_dim, generator=g)
        return o

    model.train()
    with torch.no_grad():
        model(TensorDict(obs(4, encoder=True), batch_size=[4]))
    model.eval()

    records = {}
    with tempfile.TemporaryDirectory() as tmp:
        w_path = os.path.join(tmp, "w.safetensors")
        for rnd in range(args.rounds):
            cmd = [args.pmstate, "bench-policy", "--family", "masked-mimic", "--json", "--threads", str(args.threads),
                   "--min-time", str(args.min_time), "--write-weights", w_path]
            for b in batches:
                cmd += ["--batch", str(b)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            for line in out.splitlines():
                r = json.loads(line)
                best = records.setdefault(("pmstate", r["batch"]), [float("inf"), float("inf")])
                best[0] = min(best[0], r["min_seconds"])
                best[1] = min(best[1], r["cpu_seconds"] or float("inf"))
            if rnd == 0:
                sd = load_file(w_path)
                missing, unexpected = model.load_state_dict(sd, strict=False)
                assert not unexpected, unexpected
                assert all(k.startswith("_encoder.") for k in missing), [k for k in missing if not k.startswith("_encoder.")]
                parity = check_outputs(args, torch, model, cfgs, obs(8), tmp)
            for b in batches:
                td_obs = obs(b)

                def fwd():
                    with torch.inference_mode():
                        model.forward_inference(TensorDict(dict(td_obs), batch_size=[b]))
                _, mn, cpu, _ = time_calls(fwd, args.min_time)
                best = records.setdefault(("torch", b), [float("inf"), float("inf")])
                best[0] = min(best[0], mn)
                best[1] = min(best[1], cpu)
    print(f"same model: |pmstate - torch float64| = {parity[0]:.3g}, |torch float32 - torch float64| = "
          f"{parity[1]:.3g} on mean_action (largest |value| {parity[2]:.3g}), 8 rows\n")
    print(f"MaskedMimic forward_inference, published smpl sizes, {args.threads} thread(s), fastest call of "
          f"{args.rounds} rounds (CPU s per call in parentheses)\n")
    print("| batch | pmstate | torch eager | torch / pmstate |")
    print("|---:|---:|---:|---:|")
    for b in batches:
        p, t = records[("pmstate", b)], records[("torch", b)]
        print(f"| {b} | {p[0] * 1e3:.2f} ms ({p[1] * 1e3:.2f}) | {t[0] * 1e3:.2f} ms ({t[1] * 1e3:.2f}) | "
              f"{t[0] / p[0]:.2f}x |")


if __name__ == "__main__":
    main()
