#!/usr/bin/env python3
"""Times the GPC prior at its published size in pmstate and in torch eager
(ProtoMotions' own DiscreteAutoregressiveLatentPriorModel), one thread.

usage: python benches/gpc_side_by_side.py --protomotions PATH
           [--pmstate target/release/pmstate] [--threads 1] [--batch 1 --batch 256] [--min-time 0]

The torch side is built with ProtoMotions' own classes from the shipped
experiment configs: the FSQ tracker's actor (soma_bones_fsq, published
widths: encoder and decoder 1024-1024-1024-512-256, 9 levels x 40 scalars)
embedded as the latent decoder's module_config (as an inference config
holds it), and the gpc_prior/soma_bones prior (d_model 1024, 4 heads, 6
layers, ff 4096, 5 scalars per token: 8 tokens of 59049). Weights are its
random init (timing does not depend on them). It times `model(td)` in eval
mode under torch.no_grad(): with `target_latent` in the TensorDict that is
the teacher-forced path (logits and the decoded action), without it the
generation path (8 top-p sampling steps, then the decoder). pmstate's side
is `pmstate bench-policy --family gpc-prior` (the same structure, its own
deterministic weights). Statistic: per op and batch, the fastest and the
median of at least 3 calls after one warm-up (and --min-time seconds),
and the process's CPU time per call.
"""
import argparse
import json
import os
import subprocess
import sys

from bench_timing import time_calls

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def torch_model(root):
    sys.path.insert(0, os.path.join(REPO, "testdata", "policy"))
    import record_policy as rp  # noqa: E402  (its config builders; nothing recorded)
    rp.import_reference(root)
    tracker, _, _ = rp.build_configs(
        root, "data/pretrained_models/motion_tracker/soma_bones_fsq/experiment_config.py", "soma23", "bench_fsq")
    mod = rp.load_experiment(root, "data/pretrained_models/gpc_prior/soma_bones/experiment_config.py")
    args = rp.experiment_args("soma23", "bench_gpc")
    # only read for the env's future steps: the recorded small tracker's configs give them
    args.tracker_checkpoint = os.path.join(REPO, "testdata", "policy", "soma_fsq_tracker", "last.ckpt")
    cfgs = rp.PM.build_standard_configs(
        args=args, terrain_config_fn=mod.terrain_config, scene_lib_config_fn=mod.scene_lib_config,
        motion_lib_config_fn=mod.motion_lib_config, env_config_fn=mod.env_config,
        configure_robot_and_simulator_fn=getattr(mod, "configure_robot_and_simulator", None),
        agent_config_fn=mod.agent_config)
    mcfg = cfgs["agent"].model
    mcfg.latent_decoder.module_config = tracker["agent"].model.actor.mu_model
    mcfg.latent_decoder.checkpoint_path = ""
    model = rp.PM.get_class(mcfg._target_)(config=mcfg)
    model.eval()
    return model, rp.torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--protomotions", required=True)
    ap.add_argument("--pmstate", default=os.path.join(REPO, "target", "release", "pmstate"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, action="append", default=None)
    ap.add_argument("--min-time", type=float, default=0.0)
    ap.add_argument("--skip-pmstate", action="store_true")
    a = ap.parse_args()
    batches = a.batch or [1, 256]
    model, torch = torch_model(os.path.abspath(a.protomotions))
    torch.set_num_threads(a.threads)
    from tensordict import TensorDict
    tok = model.latent_tokenization
    rows = []
    for b in batches:
        g = torch.Generator().manual_seed(b)
        obs = torch.randn(b, 343, generator=g) * 3.0
        tokens = torch.randint(0, tok.prior_token_vocab_size, (b, tok.num_prior_tokens), generator=g)

        def tf():
            with torch.no_grad():
                model(TensorDict({"max_coords_obs": obs, "target_latent": tokens}, batch_size=b))

        def gen():
            with torch.no_grad():
                model(TensorDict({"max_coords_obs": obs}, batch_size=b))
        for op, fn in [("teacher_forced", tf), ("generate", gen)]:
            med, mn, cpu, n = time_calls(fn, a.min_time, warmups=1, min_calls=3, max_calls=10000)
            rows.append({"side": "torch eager", "op": op, "batch": b, "seconds": med, "min_seconds": mn,
                         "cpu_seconds": cpu, "calls": n})
            print(json.dumps(rows[-1]), flush=True)
    if not a.skip_pmstate:
        cmd = [a.pmstate, "--json", "bench-policy", "--family", "gpc-prior", "--threads", str(a.threads),
               "--min-time", str(a.min_time)] + sum((["--batch", str(b)] for b in batches), [])
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        for line in out.splitlines():
            r = json.loads(line)
            rows.append({"side": "pmstate", "op": r["op"], "batch": r["batch"], "seconds": r["seconds"],
                         "min_seconds": r["min_seconds"], "cpu_seconds": r.get("cpu_seconds"), "calls": r["calls"]})
            print(json.dumps(rows[-1]), flush=True)
    print("\n| op | batch | pmstate (fastest) | torch eager (fastest) |\n|---|---:|---:|---:|")
    for b in batches:
        for op in ["teacher_forced", "generate"]:
            get = lambda side: next((r["min_seconds"] for r in rows  # noqa: E731
                                     if r["side"] == side and r["op"] == op and r["batch"] == b), float("nan"))
            print(f"| {op} | {b} | {get('pmstate') * 1e3:.1f} ms | {get('torch eager') * 1e3:.1f} ms |")


if __name__ == "__main__":
    main()
