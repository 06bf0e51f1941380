#!/usr/bin/env python3
"""Records ProtoMotions v2.3 checkpoints (a Hydra `config.yaml` beside
`last.ckpt`) and their eval-mode outputs, for pmstate's v2.3 tests.

usage: python testdata/policy/record_v23.py --v23 PATH [--out DIR]
           [--reference-commit SHA] [--only NAME ...]

PATH is a tree of github:NVlabs/ProtoMotions at tag v2.3 (its `protomotions`
package is imported from PATH at run time; nothing of it is copied here).
Needs torch, lightning, hydra-core, omegaconf (the versions in
testdata/policy/requirements-record.txt).

What each variant is built with (v2.3's own code throughout):
- configs: the published `data/pretrained_models/<model>/smpl/config.yaml`
  loaded by OmegaConf with v2.3's resolvers registered
  (`protomotions.utils.config_utils`), hidden widths shrunk by editing the
  literal nodes (interpolations are left as they are, so the written file
  still leans on `${...}` as the published one does); observation widths
  stay the published ones (SMPL: self_obs 358, ...) except the numbers of
  future/historical steps and terrain samples, shrunk for size; Written back with
  `OmegaConf.save` unresolved, as Hydra dumps it;
- agent: the class `agent._target_` names (`Mimic`, a PPO, for the tracker;
  `MaskedMimic` for masked_mimic), constructed with a Fabric on the CPU and
  a stand-in environment (the agents read `env.config.num_envs` and
  `env.motion_lib` at construction and nothing else), then `agent.setup()`
  (v2.3's `instantiate(config.model)` and `weight_init`);
- weights: `weight_init` leaves every bias at zero; a seeded perturbation of
  every parameter stands in for training, so that a bias read from the
  wrong key cannot go unnoticed;
- normalizers: train-mode forwards on seeded batches whose columns have
  non-trivial means and scales (v2.3's `RunningMeanStd.update`, float64);
- checkpoint: `fabric.save(path, agent.get_state_dict({}))`, the body of
  v2.3's `save()` without its logger directory handling;
- expected outputs: eval mode, `torch.no_grad`, on a batch whose rows
  include extreme values (the normalizer clamps are hit): the tracker's
  actor mean (`tanh` of the Transformer's output) and critic value;
  MaskedMimic's prior `mu`/`logvar` and `act()` with zero and with seeded
  `vae_noise`, masks boolean as v2.3's env makes them. With
  `--published-widths` also the same forward in float64
  (`expected_f64.safetensors`), the reference both float32 forwards are
  measured against.

v2.3 imports on Python 3.11 as far as its agents go (its simulator config,
which 3.11's dataclass rules reject, is never imported here).
"""

import argparse
import copy
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 2303
EVAL_SEED = 17
ROWS = 8


def accept_dataclass_instance_defaults():
    """v2.3 uses dataclass instances as field defaults (its simulator config's
    `plane: PlaneConfig = PlaneConfig()`), which Python 3.10 accepted and
    3.11 refuses (an unhashable default counts as mutable). 3.10's rule is
    restored for the import by giving the dataclasses this creates identity
    hashing (`object.__hash__`); nothing recorded hashes a config."""
    import dataclasses

    original = dataclasses.dataclass

    def dataclass(cls=None, /, **kw):
        def wrap(c):
            made = original(c, **kw)
            if made.__hash__ is None:
                made.__hash__ = object.__hash__
            return made

        return wrap if cls is None else wrap(cls)

    dataclasses.dataclass = dataclass


def import_v23(root):
    accept_dataclass_instance_defaults()
    # v2.3 installs isaac_utils and poselib as packages of their own
    # (`pip install -e isaac_utils -e poselib`): their folders go on the path
    for sub in ("poselib", "isaac_utils", "."):
        sys.path.insert(0, str(root / sub))
    import protomotions  # noqa: F401
    from protomotions.utils import config_utils  # noqa: F401  (registers the resolvers)

    return root


def shrink(cfg, edits):
    """Sets `key = value` on the (literal) nodes named by dotted keys."""
    from omegaconf import OmegaConf

    for key, value in edits.items():
        OmegaConf.update(cfg, key, value, merge=False)


TRACKER = {
    "config": "data/pretrained_models/motion_tracker/smpl/config.yaml",
    "edits": {
        # fewer tokens and terrain samples (observation widths, shrunk for size)
        "env.config.mimic_target_pose.num_future_steps": 3,
        "terrain.config.num_samples_per_axis": 5,
        # the positional table is [5000, latent_dim] in every checkpoint
        "agent.config.model.config.actor.config.mu_model.config.latent_dim": 16,
        "agent.config.model.config.actor.config.mu_model.config.ff_size": 48,
        "agent.config.model.config.actor.config.mu_model.config.num_layers": 2,
        "agent.config.model.config.actor.config.mu_model.config.num_heads": 4,
        "agent.config.model.config.actor.config.mu_model.config.input_models.obs_mlp.config.layers": [
            {"units": 24, "activation": "relu", "use_layer_norm": False},
            {"units": 20, "activation": "relu", "use_layer_norm": False},
        ],
        "agent.config.model.config.actor.config.mu_model.config.output_model.config.layers": [
            {"units": 40, "activation": "relu", "use_layer_norm": False},
            {"units": 36, "activation": "relu", "use_layer_norm": False},
        ],
        "agent.config.modules.transformer_mimic_target_pose_model.config.layers": [
            {"units": 28, "activation": "relu", "use_layer_norm": False},
        ],
        "agent.config.modules.transformer_terrain.config.layers": [
            {"units": 16, "activation": "relu", "use_layer_norm": False},
            {"units": 12, "activation": "relu", "use_layer_norm": False},
        ],
        "agent.config.model.config.critic.config.trunk.config.layers": [
            {"units": 6, "activation": "relu", "use_layer_norm": False},
            {"units": 10, "activation": "relu", "use_layer_norm": False},
        ],
    },
}

MASKED_MIMIC = {
    "config": "data/pretrained_models/masked_mimic/smpl/config.yaml",
    "edits": {
        # the published file leaves it mandatory (`???`); v2.3's eval is given one
        "motion_file": "synthetic.npy",
        "agent.config.expert_model_path": None,
    },
    "required": ("motion_file", "agent.config.expert_model_path"),
}


PUBLISHED = False  # --published-widths: the published files' widths, untouched


def load_cfg(root, spec):
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(root / spec["config"])
    shrink(cfg, {k: v for k, v in spec["edits"].items() if not PUBLISHED or k in spec.get("required", ())})
    return cfg


def mm_shrink(cfg):
    """MaskedMimic's published widths, shrunk at the literal nodes the
    published file derives the others from (`agent.config.modules.*`,
    `agent.config.vae.latent_dim`)."""
    small = lambda *u: [{"units": x, "activation": "relu", "use_layer_norm": False} for x in u]  # noqa: E731
    m = "agent.config.model.config"
    shrink(
        cfg,
        {
            "env.config.mimic_target_pose.num_future_steps": 3,
            "env.config.masked_mimic.masked_mimic_target_pose.num_future_steps": 4,
            "env.config.masked_mimic.historical_obs.num_historical_conditioned_steps": 3,
            "terrain.config.num_samples_per_axis": 5,
            "agent.config.modules.transformer_latent_dim": 16,
            "agent.config.modules.transformer_encoder_widths": 20,
            "agent.config.vae.latent_dim": 16,
            f"{m}.prior.config.trunk.config.ff_size": 40,
            f"{m}.prior.config.trunk.config.num_layers": 2,
            f"{m}.prior.config.trunk.config.num_heads": 4,
            "agent.config.modules.transformer_vae_output_head.config.layers": small(12, 10),
            # the encoder's trunk ends in 512 features its heads read (`num_in: 512`)
            f"{m}.encoder.config.trunk.config.trunk.num_out": 24,
            f"{m}.encoder.config.trunk.config.trunk.config.layers": small(6, 14),
            "agent.config.modules.mlp_vae_output_head.num_in": 24,
            "agent.config.modules.mlp_vae_output_head.config.layers": small(12, 10),
            f"{m}.trunk.config.trunk.config.layers": small(30, 22),
        },
    )


class StandInEnv:
    """What v2.3's agents read from an environment at construction."""

    class _Cfg:
        def __init__(self, num_envs):
            self.num_envs = num_envs

    def __init__(self, num_envs):
        self.config = self._Cfg(num_envs)
        self.motion_lib = None


def tracker_batch(g, rows, extreme, widths):
    import torch

    obs = {}
    for key, width in widths.items():
        scale = 0.5 + torch.rand(width, generator=g) * 3.0
        shift = torch.randn(width, generator=g) * 2.0
        x = torch.randn(rows, width, generator=g) * scale + shift
        if extreme:
            x[0] = 1e4
            x[1] = -1e4
            x[2, ::3] = 0.0
        obs[key] = x
    return obs


def perturb(model, g):
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            # the fixed log-std and the positional-encoding table are not trained
            if "logstd" in name or name.endswith("sequence_pos_encoder.pe"):
                continue
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


def make_agent(cfg, num_envs):
    from hydra.utils import instantiate  # noqa: F401
    from lightning.fabric import Fabric
    import importlib

    fabric = Fabric(accelerator="cpu", devices=1)
    mod, cls = cfg.agent._target_.rsplit(".", 1)
    agent_cls = getattr(importlib.import_module(mod), cls)
    agent = agent_cls(fabric=fabric, env=StandInEnv(num_envs), config=cfg.agent.config)
    agent.setup()
    return agent


def save(agent, path):
    # v2.3's save() does this, then symlinks into its logger's root_dir and
    # writes the environment's state: neither is part of the checkpoint
    agent.fabric.save(path, agent.get_state_dict({}))


def record_tracker(root, out):
    import torch
    from omegaconf import OmegaConf
    from safetensors.torch import save_file

    torch.manual_seed(SEED)
    cfg = load_cfg(root, TRACKER)
    agent = make_agent(cfg, ROWS)
    model = agent.model.module if hasattr(agent.model, "module") else agent.model
    g = torch.Generator().manual_seed(SEED)
    perturb(model, g)
    resolved = OmegaConf.to_container(cfg.agent.config.model, resolve=True)
    mu = resolved["config"]["actor"]["config"]["mu_model"]["config"]["input_models"]
    widths = {
        "self_obs": mu["obs_mlp"]["num_in"],
        "mimic_target_poses": resolved["config"]["critic"]["config"]["input_models"]["mimic_target_poses"]["num_in"],
        "terrain": mu["terrain"]["num_in"],
    }
    model.train()
    for _ in range(5):
        batch = tracker_batch(g, 64, False, widths)
        model._actor(batch)
        model._critic(batch)
    model.eval()
    obs = tracker_batch(torch.Generator().manual_seed(EVAL_SEED), ROWS, True, widths)
    with torch.no_grad():
        dist = model._actor(obs)
        value = model._critic(obs)
    out.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, out / "config.yaml")
    save(agent, out / "last.ckpt")
    save_file({k: v.contiguous() for k, v in obs.items()}, out / "obs.safetensors")
    save_file({"mean_action": dist.mean.contiguous(), "value": value.contiguous()}, out / "expected.safetensors")
    if PUBLISHED:
        m64 = copy.deepcopy(model).double()
        o64 = {k: v.double() for k, v in obs.items()}
        with torch.no_grad():
            ref = {"mean_action": m64._actor(o64).mean, "value": m64._critic(o64)}
        save_file({k: v.contiguous() for k, v in ref.items()}, out / "expected_f64.safetensors")
    return {"widths": widths, "action_size": int(dist.mean.shape[-1])}


def mm_batch(g, rows, extreme, resolved):
    import torch

    prior = resolved["config"]["prior"]["config"]["trunk"]["config"]["input_models"]
    enc = resolved["config"]["encoder"]["config"]["trunk"]["config"]["input_models"]
    trunk = resolved["config"]["trunk"]["config"]["input_models"]
    obs = {}
    widths = {}
    for models in (prior, enc, trunk):
        for name, m in models.items():
            key = m["config"]["obs_key"]
            if key == "vae_latent":
                continue
            tokens = 1
            for op in m["config"].get("operations") or []:
                if op["type"] == "reshape" and op["new_shape"][0] == "batch_size":
                    tokens = op["new_shape"][1]
            widths[key] = m["num_in"] * tokens if m["_target_"].endswith("MLP_WithNorm") else m["num_in"]
            mask = m["config"].get("mask_key")
            if mask:
                widths[mask] = ("mask", tokens)
    for key, w in widths.items():
        if isinstance(w, tuple):
            continue
        if "masks" in key:
            obs[key] = torch.rand(rows, w, generator=g) < 0.6
        else:
            obs.update(tracker_batch(g, rows, extreme, {key: w}))
    for key, w in widths.items():
        if isinstance(w, tuple):
            m = torch.rand(rows, w[1], generator=g) < 0.6
            if extreme:
                m[3] = False  # every masked token off
                m[4] = True
            obs[key] = m
    return obs, widths


def record_masked_mimic(root, out):
    import torch
    from omegaconf import OmegaConf
    from safetensors.torch import save_file

    torch.manual_seed(SEED)
    cfg = load_cfg(root, MASKED_MIMIC)
    if not PUBLISHED:
        mm_shrink(cfg)
    agent = make_agent(cfg, ROWS)
    model = agent.model.module if hasattr(agent.model, "module") else agent.model
    g = torch.Generator().manual_seed(SEED + 1)
    perturb(model, g)
    resolved = OmegaConf.to_container(cfg.agent.config.model, resolve=True)
    latent = resolved["config"]["vae_latent_dim"]
    model.train()
    for _ in range(5):
        batch, widths = mm_batch(g, 64, False, resolved)
        model.get_action_and_vae_outputs(dict(batch))
    model.eval()
    obs, widths = mm_batch(torch.Generator().manual_seed(EVAL_SEED), ROWS, True, resolved)
    noise = torch.randn(ROWS, latent, generator=torch.Generator().manual_seed(EVAL_SEED + 1))
    with torch.no_grad():
        prior = model._prior(dict(obs))
        zero = model.act({**obs, "vae_noise": torch.zeros(ROWS, latent)})
        noisy_in = {**obs, "vae_noise": noise}
        noisy = model.act(noisy_in)
        latent_z = noisy_in["vae_latent"]
    out.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, out / "config.yaml")
    save(agent, out / "last.ckpt")
    # masks stored as float32 (1.0 valid, 0.0 masked): the form the served
    # interface takes; torch above got them boolean, as v2.3's env makes them
    save_file({k: v.float().contiguous() for k, v in obs.items()}, out / "obs.safetensors")
    save_file(
        {
            "mean_action": zero.contiguous(),
            "latent_mu": prior["mu"].contiguous(),
            "latent_logvar": prior["logvar"].contiguous(),
            "vae_noise": noise.contiguous(),
            "noisy_action": noisy.contiguous(),
            "noisy_latent": latent_z.contiguous(),
        },
        out / "expected.safetensors",
    )
    if PUBLISHED:
        m64 = copy.deepcopy(model).double()
        o64 = {k: (v.double() if v.is_floating_point() else v) for k, v in obs.items()}
        with torch.no_grad():
            p64 = m64._prior(dict(o64))
            a64 = m64.act({**o64, "vae_noise": torch.zeros(ROWS, latent, dtype=torch.float64)})
        ref = {"mean_action": a64, "latent_mu": p64["mu"], "latent_logvar": p64["logvar"]}
        save_file({k: v.contiguous() for k, v in ref.items()}, out / "expected_f64.safetensors")
    return {"widths": {k: (v if not isinstance(v, tuple) else v[1]) for k, v in widths.items()}, "latent": latent}


VARIANTS = {"v23_tracker": record_tracker, "v23_masked_mimic": record_masked_mimic}


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--v23", required=True, type=Path, help="a tree of ProtoMotions at tag v2.3")
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--reference-commit", default=None, help="the tag's commit, where PATH is not a git tree")
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument(
        "--published-widths",
        action="store_true",
        help="keep the published files' widths (a check of its own, into --out; not for testdata)",
    )
    args = ap.parse_args()
    global PUBLISHED
    PUBLISHED = args.published_widths
    import torch

    commit = args.reference_commit
    if commit is None:
        commit = subprocess.run(
            ["git", "-C", str(args.v23), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    import_v23(args.v23)
    torch.set_num_threads(1)
    manifest_path = args.out / "v23_manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for name, fn in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        out = args.out / name
        info = fn(args.v23, out)
        manifest[name] = {
            "release": "v2.3",
            "reference_commit": commit,
            "torch": torch.__version__,
            **info,
            "files": {f.name: sha256(f) for f in sorted(out.iterdir()) if f.is_file()},
        }
        print(f"{name}: {', '.join(f'{f.name} {f.stat().st_size} B' for f in sorted(out.iterdir()))}")
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
