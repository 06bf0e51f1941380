#!/usr/bin/env python3
"""Records MaskedMimic checkpoints of older ProtoMotions releases (v3.0 and
v3.1, whose MaskedMimic is `protomotions.agents.masked_mimic.model.MaskedMimicModel`)
and their PPO motion trackers, with eval-mode outputs, for pmstate's
release-layout tests (crates/policy/tests/releases_masked_mimic.rs,
releases_trackers.rs, crates/cli/tests/releases_masked_mimic_cli.rs).

usage: python testdata/policy/record_releases.py [--v30 PATH] [--v31 PATH]
           [--v30-commit SHA] [--v31-commit SHA] [--out DIR]

Each PATH is a checkout (or an extracted archive) of github:NVlabs/ProtoMotions
at that release's tag (v3.0: 56e49e7f4443fb06085fae9a2eed825f0d3e85b7, v3.1:
494e54d318228e16b4438d83f5e5a8c4e1167827; an archive has no git metadata, so
the tag commits are the defaults of --v30-commit/--v31-commit). Its
`protomotions` package is imported from PATH at run time, one release per
process (the script re-executes itself for each); nothing of it is copied
here.

What each recording is built with (all that release's own code):
- configs: the release's published resolved configs,
  data/pretrained_models/masked_mimic/smpl/resolved_configs.pt, unpickled with
  that release's dataclasses; in `agent.model` the hidden widths are shrunk
  (units 1024/256/128 -> 16/12/8, tokens 512 -> 16, ff 1024 -> 32, 4 -> 2
  transformer layers, 4 heads kept, latent 64 -> 8); `expert_model_path` is
  cleared (no expert: the labels are synthetic) and `num_envs` is 16;
- agent and model: the release's `MaskedMimic` agent (`agent._target_`)
  constructed with a lightning Fabric (the release's FabricConfig: DDP, gloo,
  one process) and a stand-in environment (no simulator), then the real
  `agent.setup()` (lazy modules materialised, optimizer through fabric.setup);
- training: N_ITERS train-mode forwards of the whole model (prior, trunk and
  the privileged encoder, as the release's `forward` runs them) on seeded
  observations with non-trivial per-column moments (this records the
  normalizer moments), each followed by one step of the agent's optimizer on
  a synthetic loss (both actions towards a fixed function of the state, plus
  the release's KL term);
- checkpoint: the release's own `agent.save("last.ckpt")`;
- resolved configs: `torch.save` of the dict {robot, simulator, terrain,
  scene_lib, motion_lib, env, agent} of the same config objects (what the
  release's train_agent.py save_configs writes), as resolved_configs.pt;
- expected outputs: the model in eval mode under torch.no_grad on a batch
  whose rows include extreme values (normalizer clamps hit) and mask patterns
  (all valid, all masked, alternating, half): the release's inference path
  (v3.1: `forward_inference`; v3.0 has none: `forward`, whose `action` is the
  prior path's) with `vae_noise` drawn by torch.randn after
  torch.manual_seed(EVAL_SEED) (`action`, `latent_mu`, `latent_logvar`,
  `latent`), again with zero noise (`zero_noise.*`), and again with the masks
  as torch.bool (`bool_masks.action`: the env's masks are bool).

The trackers (v30_tracker, v31_tracker) the same way from the release's
published data/pretrained_models/motion_tracker/smpl/resolved_configs.pt
(hidden units 1024 -> 16; its PPO agent; both optimizers stepped on a
synthetic loss of mean_action and value): `mean_action`, `value`, and the
`action` drawn after torch.manual_seed(EVAL_SEED) with its `neglogp`. And
v3.1's G1 motion tracker (v31_g1_tracker) likewise from its published
data/pretrained_models/motion_tracker/g1-amass/resolved_configs.pt (hidden
units 1024 -> 16; 29 actions; actor and critic read different keys): the
actor's reduced-coords observations at the G1's real widths (64 per step,
3 history steps, 3 x 29 previous actions), the critic's max-coords ones
shrunk (24, 40, 3 x 24; G1_TRACKER_WIDTHS). And v3.1's smpl tracker
trained on complex terrain (v31_terrains_tracker) from its published
motion_tracker/smpl-terrains/resolved_configs.pt, as the smpl one, with the
terrain height map (`terrain`, its 256 points) as a fourth input.

Written under DIR (default: this directory)/v30_masked_mimic and
v31_masked_mimic: last.ckpt, resolved_configs.pt, obs.safetensors (the
inference inputs: float32, masks as 0/1, and vae_noise), expected.safetensors
(likewise v30_tracker, v31_tracker, v31_g1_tracker);
and the `release_variants` entries of DIR/manifest.json (the other keys of
that file, written by record_policy.py, are kept). Deterministic: one CPU
thread, fixed seeds, PYTHONHASHSEED=0.
"""
import argparse
import dataclasses
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from pm_reference import reexec_deterministic, write_safetensors  # noqa: E402

TAG_COMMITS = {"v3.0": "56e49e7f4443fb06085fae9a2eed825f0d3e85b7", "v3.1": "494e54d318228e16b4438d83f5e5a8c4e1167827"}
EVAL_SEED = 1234
N_ITERS = 60
BATCH = 16
UNITS = {1024: 16, 256: 12, 128: 8}
LATENT = 8
TOKEN = 16
# --published-widths: hidden widths left as published (a check of its own,
# benches/releases_published.py, into a scratch folder; never testdata)
PUBLISHED = False
PUBLISHED_LATENT = 64

# observation widths chosen here (the published configs fix the step counts
# through their reshapes: 5 future poses, 5 (v3.1) or 15 (v3.0) historical
# steps; the values per step are fewer than the robot's)
WIDTHS = {
    "v3.1": {
        "max_coords_obs": 24, "masked_mimic_target_poses": 5 * 10, "masked_mimic_target_masks": 5 * 3,
        "masked_mimic_target_times": 5, "masked_mimic_target_poses_masks": 5, "historical_pose_obs": 5 * 6,
        "previous_actions": 69, "mimic_target_poses": 40, "masked_mimic_target_bodies_masks": 5 * 3,
    },
    "v3.0": {
        "max_coords_obs": 24, "masked_mimic_target_poses": 5 * 6, "masked_mimic_target_poses_masks": 5,
        "historical_pose_obs": 15 * 4, "historical_previous_actions": 2 * 10, "mimic_target_poses": 40,
        "masked_mimic_target_bodies_masks": 5 * 3,
    },
}
# the motion trackers' observations (widths chosen here; 69 actions as published)
TRACKER_WIDTHS = {
    "v3.1": {"max_coords_obs": 24, "mimic_target_poses": 40, "previous_actions": 69},
    "v3.0": {"max_coords_obs": 24, "mimic_target_poses": 40, "historical_previous_actions": 2 * 10},
}
# the v3.1 G1 motion tracker (data/pretrained_models/motion_tracker/g1-amass):
# its actor's inputs at the G1's real widths (29 dofs; 29 actions): reduced
# coords 29 + 29 + 3 + 3 = 64, one future target pose 6 + 29 + 29 = 64, 3
# history steps (num_state_history_steps) of each and of the actions; the
# critic's max-coords inputs chosen here (the 33 bodies' real widths, 493,
# 792 and 3 x 493, would make the checkpoint megabytes), 3 history steps of
# max_coords_obs
G1_TRACKER_WIDTHS = {
    "noisy_reduced_coords_obs": 29 + 29 + 3 + 3, "noisy_mimic_reduced_coords_target_poses": 6 + 29 + 29,
    "noisy_historical_reduced_coords_obs": 3 * (29 + 29 + 3 + 3), "historical_previous_actions": 3 * 29,
    "max_coords_obs": 24, "mimic_max_coords_target_poses": 40, "historical_max_coords_obs": 3 * 24,
}
TRACKER_UNITS = {1024: 16}
MASK_KEYS = ["masked_mimic_target_masks", "masked_mimic_target_poses_masks", "masked_mimic_target_bodies_masks"]
# the keys the privileged encoder alone reads: fed to the release's forward,
# not inputs of the inference path (so not in obs.safetensors)
ENCODER_ONLY = ["mimic_target_poses", "masked_mimic_target_bodies_masks"]
EVAL_ROWS = [
    "typical 0, all masks valid",
    "typical 1, all masks invalid",
    "typical 2, masks alternating",
    "typical 3, first half of each mask invalid",
    "mean + 10*scale (per column), random masks",
    "mean - 10*scale (per column), random masks",
    "all zeros, random masks",
    "alternating +1000 / -1000 (every normalized column clamps), random masks",
]

torch = None


# ------------------------------------------------------------------ configs

def children(cfg):
    """Sub-module configs of a container of either release's layout."""
    out = []
    for field in ("models", "input_models", "output_models"):
        out.extend(getattr(cfg, field, None) or [])
    return out


def shrink(cfg):
    """Hidden widths of one module config tree, in place (nothing with
    --published-widths)."""
    if PUBLISHED:
        return
    name = type(cfg).__name__
    if hasattr(cfg, "layers") and cfg.layers:
        for layer in cfg.layers:
            layer.units = UNITS.get(layer.units, layer.units)
    if getattr(cfg, "num_out", None) == 512:
        cfg.num_out = TOKEN
    if getattr(cfg, "num_out", None) == 64:
        cfg.num_out = LATENT
    if name == "TransformerConfig":
        cfg.transformer_token_size = TOKEN
        cfg.latent_dim = TOKEN
        cfg.ff_size = 32
        cfg.num_layers = 2
    for sub in children(cfg):
        shrink(sub)


def leaves(cfg):
    if not children(cfg):
        return [cfg]
    return [x for sub in children(cfg) for x in leaves(sub)]


# ------------------------------------------------------------------ data

class Source:
    """Seeded observations with per-column means and scales; 0/1 masks."""

    def __init__(self, widths, seed):
        self.widths = dict(widths)
        g = torch.Generator().manual_seed(1000 + seed)
        self.mean, self.scale = {}, {}
        for k, w in self.widths.items():
            self.mean[k] = torch.rand(w, generator=g, dtype=torch.float64) * 6.0 - 3.0
            self.scale[k] = torch.exp(torch.rand(w, generator=g, dtype=torch.float64)
                                      * (math.log(5.0) - math.log(0.05)) + math.log(0.05))
        self.g = torch.Generator().manual_seed(2000 + seed)

    def sample(self, n):
        out = {}
        for k, w in self.widths.items():
            if k in MASK_KEYS:
                out[k] = (torch.rand(n, w, generator=self.g) < 0.6).float()
            else:
                out[k] = (self.mean[k] + self.scale[k] * torch.randn(n, w, generator=self.g,
                                                                     dtype=torch.float64)).float()
        return out

    def eval_batch(self):
        g = torch.Generator().manual_seed(3000)
        out = {}
        for k, w in self.widths.items():
            if k in MASK_KEYS:
                m = (torch.rand(8, w, generator=g) < 0.6).float()
                m[0] = 1.0
                m[1] = 0.0
                m[2] = torch.tensor([float(i % 2 == 0) for i in range(w)])
                m[3] = 1.0
                m[3, : w // 2] = 0.0
                out[k] = m
                continue
            mean, s = self.mean[k], self.scale[k]
            rows = [mean + s * torch.randn(w, generator=g, dtype=torch.float64) for _ in range(4)]
            rows.append(mean + 10.0 * s)
            rows.append(mean - 10.0 * s)
            rows.append(torch.zeros(w, dtype=torch.float64))
            rows.append(torch.tensor([1000.0 if i % 2 == 0 else -1000.0 for i in range(w)], dtype=torch.float64))
            out[k] = torch.stack(rows).float()
        return out


class StandInEnv:
    """What the release's BaseAgent and MaskedMimic read from an env."""

    def __init__(self, cfgs, source, num_envs):
        self.num_envs = num_envs
        self.robot_config = cfgs["robot"]
        self.config = cfgs["env"]
        self.dt = 1.0 / 30.0
        self.motion_lib = SimpleNamespace(config=SimpleNamespace(), motion_file_shard_cycle=0)
        self.motion_manager = None
        self.source = source

    def get_obs(self):
        return self.source.sample(self.num_envs)

    def get_task_id(self):
        return 0

    def get_state_dict(self):
        return {}


# ------------------------------------------------------------------ one release

def import_release(root):
    global torch
    sys.path.insert(0, root)
    import torch as _torch

    torch = _torch
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    torch.use_deterministic_algorithms(True)
    import logging

    logging.disable(logging.WARNING)
    from lightning.fabric import Fabric
    from tensordict import TensorDict
    from protomotions.utils.fabric_config import FabricConfig
    from protomotions.utils.hydra_replacement import get_class

    # as the release's train_agent.py builds it: Fabric(**asdict(FabricConfig(...)))
    fabric = Fabric(**dataclasses.asdict(FabricConfig(accelerator="cpu", devices=1, num_nodes=1, loggers=[],
                                                      callbacks=[])))
    fabric.launch()
    return SimpleNamespace(fabric=fabric, TensorDict=TensorDict, get_class=get_class)


def save_agent(agent, release):
    """The release's own `agent.save("last.ckpt")`; returns a note when v3.0's
    known bug fired after the file was written."""
    if release != "v3.0":
        agent.save("last.ckpt")
        return None
    # v3.0's BaseAgent.save iterates fabric.all_gather(new_high_score)
    # AFTER writing last.ckpt; where one process gets a 0-d tensor back
    # (a single-device strategy) that raises: that release's bug, not
    # ours, and the checkpoint it wrote is complete (it is checked
    # against the model before anything is recorded). With the DDP strategy
    # built here the gather is [1] and it does not fire; save_note says
    # whether it did.
    try:
        agent.save("last.ckpt")
    except TypeError as e:
        if "iteration over a 0-d tensor" not in str(e):
            raise
        return f"agent.save raised TypeError({e}) after writing last.ckpt (v3.0, one process)"
    return None


def copy_saved(scratch, vdir, cfgs, model):
    """last.ckpt (checked against `model`) and the resolved configs into
    `vdir`; returns the loaded checkpoint."""
    os.makedirs(vdir, exist_ok=True)
    for fn in os.listdir(vdir):
        os.remove(os.path.join(vdir, fn))
    shutil.copy(os.path.join(scratch, "last.ckpt"), os.path.join(vdir, "last.ckpt"))
    torch.save({k: cfgs[k] for k in ("robot", "simulator", "terrain", "scene_lib", "motion_lib", "env", "agent")},
               os.path.join(vdir, "resolved_configs.pt"))
    shutil.rmtree(scratch)
    ckpt = torch.load(os.path.join(vdir, "last.ckpt"), weights_only=False)
    # the saved weights are the ones the outputs are recorded from
    saved = model.state_dict()
    for k, v in ckpt["model"].items():
        if not torch.equal(v, saved[k]):
            raise SystemExit(f"{vdir}: {k} in last.ckpt differs from the model recorded")
    return ckpt


def files_of(vdir):
    files = {}
    for fn in sorted(os.listdir(vdir)):
        p = os.path.join(vdir, fn)
        with open(p, "rb") as f:
            files[fn] = {"bytes": os.path.getsize(p), "sha256": hashlib.sha256(f.read()).hexdigest()}
    return files


def record_masked_mimic(release, root, out_dir, R):
    fabric, TensorDict, get_class = R.fabric, R.TensorDict, R.get_class
    tag = release.replace(".", "")
    name = f"{tag}_masked_mimic"
    vdir = os.path.join(out_dir, name)
    published = os.path.join(root, "data", "pretrained_models", "masked_mimic", "smpl", "resolved_configs.pt")
    cfgs = torch.load(published, weights_only=False)
    agent_cfg = cfgs["agent"]
    m = agent_cfg.model
    for part in (m.encoder, m.prior, m.trunk):
        shrink(part)
    m.vae.vae_latent_dim = LATENT
    m.optimizer.lr = 1e-3  # the published 2e-5 is for thousands of epochs
    agent_cfg.expert_model_path = None
    cfgs["simulator"].num_envs = BATCH
    widths = WIDTHS[release]
    source = Source(widths, seed=41 if release == "v3.1" else 43)

    # as the release's train_agent.py builds it: Fabric(**asdict(FabricConfig(...)))
    scratch = tempfile.mkdtemp(prefix=f"record_{tag}_")
    torch.manual_seed(7)
    env = StandInEnv(cfgs, source, num_envs=BATCH)
    agent = get_class(agent_cfg._target_)(fabric, env, agent_cfg, root_dir=Path(scratch))
    agent.setup()
    model = agent.model
    opt = agent.maskedmimic_optimizer
    action_size = next(c.num_out for c in leaves(m.trunk) if hasattr(c, "num_out"))
    g = torch.Generator().manual_seed(99)
    proj = {k: torch.randn(w, action_size, generator=g) * 0.1 for k, w in widths.items()}

    def target(obs):
        y = sum(obs[k] @ proj[k] for k in widths if k not in MASK_KEYS)
        return torch.tanh(y)

    for _ in range(N_ITERS):
        model.train()
        obs = source.sample(BATCH)
        obs["vae_noise"] = torch.randn(BATCH, LATENT)
        td = TensorDict(obs, batch_size=BATCH)
        out = model(td)
        want = target(obs)
        kl = model.kl_loss(out).mean() if hasattr(model, "kl_loss") else model.module.kl_loss(out).mean()
        loss = (out["action"] - want).pow(2).mean() + (out["privileged_action"] - want).pow(2).mean() + 1e-3 * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    agent.current_epoch = N_ITERS
    agent.step_count = N_ITERS * BATCH
    agent.fit_start_time = 1767225600.0
    agent.eval()
    save_note = save_agent(agent, release)
    inner = model.module if hasattr(model, "module") else model
    ckpt = copy_saved(scratch, vdir, cfgs, inner)

    # -------------------------------------------------------------- eval
    inner.eval()
    obs = source.eval_batch()
    torch.manual_seed(EVAL_SEED)
    noise = torch.randn(8, LATENT)

    def run(o, vae_noise):
        td = TensorDict({**{k: v.clone() for k, v in o.items()}, "vae_noise": vae_noise.clone()}, batch_size=8)
        # the latent the trunk reads on its first call (the prior path's):
        # v3.0's forward overwrites td["vae_latent"] with the privileged one
        # before it returns
        seen = []
        hook = inner._trunk.register_forward_pre_hook(
            lambda _mod, args: seen.append(args[0]["vae_latent"].clone()) if not seen else None)
        with torch.no_grad():
            if hasattr(inner, "forward_inference"):
                td = inner.forward_inference(td)
            else:
                td = inner(td)
        hook.remove()
        td["vae_latent"] = seen[0]
        return td

    td = run(obs, noise)
    expected = {
        "action": td["action"],
        "latent_mu": td[inner._prior.out_keys[0]],
        "latent_logvar": td[inner._prior.out_keys[1]],
        "latent": td["vae_latent"],
        "transformer_out": td["transformer_out"],
    }
    zero = run(obs, torch.zeros_like(noise))
    expected["zero_noise.action"] = zero["action"]
    expected["zero_noise.latent"] = zero["vae_latent"]
    bool_obs = {k: (v.bool() if k in MASK_KEYS else v) for k, v in obs.items()}
    expected["bool_masks.action"] = run(bool_obs, noise)["action"]
    if not torch.equal(expected["bool_masks.action"], expected["action"]):
        print(f"   {name}: bool masks change the action (max {(expected['bool_masks.action'] - expected['action']).abs().max()})")

    inference_keys = sorted(k for k in obs if k not in ENCODER_ONLY)
    obs_out = {k: obs[k] for k in inference_keys}
    obs_out["vae_noise"] = noise
    write_safetensors(torch, os.path.join(vdir, "obs.safetensors"), obs_out)
    write_safetensors(torch, os.path.join(vdir, "expected.safetensors"), {k: v.contiguous() for k, v in expected.items()})

    files = files_of(vdir)
    norms = sorted(k[: -len(".mean")] for k in ckpt["model"] if k.endswith("running_obs_norm.mean"))
    return {
        "name": name,
        "release": release,
        "reference": {"repository": "github:NVlabs/ProtoMotions", "tag": release, "commit": None},
        "model_target": m._target_,
        "layout": {"v3.0": "SequentialModule, MultiOutputModule, Flatten", "v3.1": "ObsProcessor, ModuleContainer"}[release],
        "source": "data/pretrained_models/masked_mimic/smpl/resolved_configs.pt",
        "shrunk": "units 1024/256/128 -> 16/12/8, tokens 512 -> 16, ff 1024 -> 32, 4 -> 2 layers (4 heads), latent 64 -> 8",
        "action_size": action_size,
        "latent_dim": LATENT,
        "obs_widths": {k: widths[k] for k in inference_keys},
        "encoder_only_widths": {k: widths[k] for k in ENCODER_ONLY},
        "train_iters": N_ITERS,
        "save_note": save_note,
        "normalizers": {n: int(ckpt["model"][n + ".count"]) for n in norms},
        "checkpoint_top_level_keys": list(ckpt.keys()),
        "eval": {"mode": "model.eval(), torch.no_grad()", "rows": EVAL_ROWS, "vae_noise": f"torch.randn(8, {LATENT}) after torch.manual_seed({EVAL_SEED})",
                 "path": "forward_inference" if hasattr(inner, "forward_inference") else "forward (prior path's action)"},
        "expected": {k: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape)} for k, v in sorted(expected.items())},
        "files": files,
        "torch": torch.__version__,
    }


def record_tracker(release, root, out_dir, R, robot="smpl", name=None, widths=None, seed=None):
    """The release's PPO motion tracker from its published
    motion_tracker/<robot> resolved configs, hidden units 1024 -> 16
    (default: the smpl one, `<tag>_tracker`, TRACKER_WIDTHS)."""
    fabric, TensorDict, get_class = R.fabric, R.TensorDict, R.get_class
    tag = release.replace(".", "")
    name = name or f"{tag}_tracker"
    vdir = os.path.join(out_dir, name)
    source_path = f"data/pretrained_models/motion_tracker/{robot}/resolved_configs.pt"
    published = os.path.join(root, *source_path.split("/"))
    cfgs = torch.load(published, weights_only=False)
    agent_cfg = cfgs["agent"]
    m = agent_cfg.model
    for mlp in (m.actor.mu_model, m.critic):
        for layer in mlp.layers:
            layer.units = layer.units if PUBLISHED else TRACKER_UNITS.get(layer.units, layer.units)
    cfgs["simulator"].num_envs = BATCH
    widths = widths or TRACKER_WIDTHS[release]
    if sorted(widths) != sorted(m.in_keys):
        raise SystemExit(f"{name}: the model reads {m.in_keys}, not {sorted(widths)}")
    source = Source(widths, seed=seed or (51 if release == "v3.1" else 53))
    scratch = tempfile.mkdtemp(prefix=f"record_{name}_")
    torch.manual_seed(8)
    env = StandInEnv(cfgs, source, num_envs=BATCH)
    agent = get_class(agent_cfg._target_)(fabric, env, agent_cfg, root_dir=Path(scratch))
    agent.setup()
    model = agent.model
    g = torch.Generator().manual_seed(98)
    proj = {k: torch.randn(w, m.actor.num_out, generator=g) * 0.1 for k, w in widths.items()}
    for _ in range(N_ITERS):
        model.train()
        obs = source.sample(BATCH)
        out = model(TensorDict(obs, batch_size=BATCH))
        want = torch.tanh(sum(obs[k] @ proj[k] for k in widths))
        loss = (out["mean_action"] - want).pow(2).mean() + (out["value"] - 1.0).pow(2).mean()
        for o in (agent.actor_optimizer, agent.critic_optimizer):
            o.zero_grad(set_to_none=True)
        loss.backward()
        for o in (agent.actor_optimizer, agent.critic_optimizer):
            o.step()
    agent.current_epoch = N_ITERS
    agent.step_count = N_ITERS * BATCH
    agent.fit_start_time = 1767225600.0
    agent.eval()
    save_note = save_agent(agent, release)
    inner = model.module if hasattr(model, "module") else model
    ckpt = copy_saved(scratch, vdir, cfgs, inner)

    inner.eval()
    obs = source.eval_batch()
    torch.manual_seed(EVAL_SEED)
    with torch.no_grad():
        td = inner(TensorDict({k: v.clone() for k, v in obs.items()}, batch_size=8))
    expected = {k: td[k] for k in ("mean_action", "value", "action", "neglogp")}
    if PUBLISHED:
        # the same forward in float64: the reference both float32 forwards are measured against
        import copy

        m64 = copy.deepcopy(inner).double()
        with torch.no_grad():
            td64 = m64(TensorDict({k: v.double() for k, v in obs.items()}, batch_size=8))
        ref = {k: td64[k].contiguous() for k in ("mean_action", "value")}
        write_safetensors(torch, os.path.join(vdir, "expected_f64.safetensors"), ref)
    write_safetensors(torch, os.path.join(vdir, "obs.safetensors"), obs)
    write_safetensors(torch, os.path.join(vdir, "expected.safetensors"), {k: v.contiguous() for k, v in expected.items()})
    norms = sorted(k[: -len(".mean")] for k in ckpt["model"] if k.endswith("running_obs_norm.mean"))
    return {
        "name": name,
        "release": release,
        "reference": {"repository": "github:NVlabs/ProtoMotions", "tag": release, "commit": None},
        "model_target": m._target_,
        "source": source_path,
        "shrunk": "hidden units 1024 -> 16",
        "action_size": m.actor.num_out,
        "obs_widths": {k: widths[k] for k in sorted(widths)},
        "train_iters": N_ITERS,
        "save_note": save_note,
        "normalizers": {n: int(ckpt["model"][n + ".count"]) for n in norms},
        "checkpoint_top_level_keys": list(ckpt.keys()),
        "eval": {"mode": "model.eval(), torch.no_grad()", "rows": EVAL_ROWS[:1] + [
            "typical 1", "typical 2", "typical 3"] + EVAL_ROWS[4:], "seed_before_forward": EVAL_SEED},
        "expected": {k: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape)}
                     for k, v in sorted(expected.items())},
        "files": files_of(vdir),
        "torch": torch.__version__,
    }


def record_one(release, root, out_dir):
    R = import_release(root)
    recorded = [record_masked_mimic(release, root, out_dir, R), record_tracker(release, root, out_dir, R)]
    if release == "v3.1":
        recorded.append(record_tracker(release, root, out_dir, R, robot="g1-amass", name="v31_g1_tracker",
                                       widths=G1_TRACKER_WIDTHS, seed=55))
        # the smpl tracker trained on complex terrain: the smpl one's
        # observations and the terrain height map (its 256 points)
        recorded.append(record_tracker(release, root, out_dir, R, robot="smpl-terrains", name="v31_terrains_tracker",
                                       widths={**TRACKER_WIDTHS["v3.1"], "terrain": 256}, seed=57))
    return recorded


# ------------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--v30", help="checkout of ProtoMotions at v3.0")
    ap.add_argument("--v31", help="checkout of ProtoMotions at v3.1")
    ap.add_argument("--v30-commit", default=TAG_COMMITS["v3.0"])
    ap.add_argument("--v31-commit", default=TAG_COMMITS["v3.1"])
    ap.add_argument("--out", default=HERE)
    ap.add_argument("--one", nargs=3, metavar=("RELEASE", "PATH", "JSON_OUT"), help=argparse.SUPPRESS)
    ap.add_argument(
        "--published-widths",
        action="store_true",
        help="keep the published hidden widths (a check of its own, into --out; not for testdata)",
    )
    args = ap.parse_args()
    reexec_deterministic()
    global PUBLISHED, LATENT
    PUBLISHED = args.published_widths
    if PUBLISHED:
        LATENT = PUBLISHED_LATENT
    if args.one:
        release, root, json_out = args.one
        recorded = record_one(release, os.path.abspath(root), args.out)
        with open(json_out, "w") as f:
            json.dump(recorded, f)
        return
    entries = []
    for release, root, commit in (("v3.0", args.v30, args.v30_commit), ("v3.1", args.v31, args.v31_commit)):
        if root is None:
            continue
        print(f"== {release} from {root}", flush=True)
        with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
            extra = ["--published-widths"] if PUBLISHED else []
            subprocess.check_call([sys.executable, os.path.abspath(__file__), "--out", args.out,
                                   "--one", release, root, tmp.name] + extra)
            recorded = json.load(open(tmp.name))
        for entry in recorded:
            entry["reference"]["commit"] = commit
            print(f"   {entry['name']}: {sum(f['bytes'] for f in entry['files'].values())} bytes", flush=True)
            entries.append(entry)
    manifest_path = os.path.join(args.out, "manifest.json")
    manifest = {}
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
    kept = {e["name"]: e for e in manifest.get("release_variants", [])}
    kept.update({e["name"]: e for e in entries})
    manifest["release_variants"] = [kept[k] for k in sorted(kept)]
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
