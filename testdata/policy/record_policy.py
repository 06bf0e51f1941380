#!/usr/bin/env python3
"""Records ProtoMotions policy checkpoints and their eval-mode outputs, for the
policy-inference tests of pmstate.

usage: python testdata/policy/record_policy.py --protomotions PATH
           [--out DIR] [--reference-commit SHA] [--only NAME ...] [--no-verify]

PATH is a checkout of github:NVlabs/ProtoMotions (recorded against commit
607ca7a0bb92e261120bcab8d9f97f28b3130ffc). Its `protomotions` package is
imported from PATH at run time; nothing of it is copied here. Needs torch,
lightning, tensordict (0.9), safetensors-compatible numpy, and what
`protomotions.agents` imports (testdata/policy/requirements-record.txt pins
what it last ran with).

What each variant is built with (all ProtoMotions' own code):
- configs: `protomotions.utils.config_builder.build_standard_configs` on the
  shipped experiment files data/pretrained_models/motion_tracker/
  {smpl,g1-bones-deploy,soma-bones}/experiment_config.py (robot, simulator, terrain,
  scene_lib, motion_lib, env, agent), hidden widths shrunk; the synthetic
  variants keep those robot/simulator/env configs and replace
  `agent.model` by model configs written here with ProtoMotions' dataclasses;
- agent and model: the agent class named by `agent._target_` (PPO or AMP),
  constructed for real with `Fabric(**FabricConfig(accelerator="cpu",
  devices=1).as_kwargs())` (DDP strategy, gloo, one process) and a small
  stand-in environment (no simulator), then `agent.setup()` (LazyLinear /
  RunningMeanStd materialisation, the real weight init, optimizers through
  `fabric.setup`);
- training: `n_iters` train-mode forwards of `agent.model` on seeded batches
  whose columns have non-trivial means and scales (this is what records the
  normalizer moments), each followed by one step of every agent optimizer
  on a synthetic loss (fills the Adam state, moves weights, and a learnable
  logstd); reward normalizers are fed seeded rewards;
- checkpoint: the REAL `BaseAgent.save("last.ckpt")` path (PPO/AMP
  `get_state_dict`, `torch.save`), into a scratch root_dir; last.ckpt (and
  inference_last.ckpt where the config asks for it) are copied here, the
  env_<task>.ckpt written by the stand-in env is dropped;
- resolved configs: a FAITHFUL REPRODUCTION of
  `protomotions/train_agent.py:save_configs` (that module parses the command
  line at import, so it cannot be imported): `torch.save` of the dict
  {robot, simulator, terrain, scene_lib, motion_lib, env, agent} of the same
  config objects, as resolved_configs.pt; for the two variants built from a
  shipped experiment also resolved_configs_inference.pt, after the real
  `apply_all_inference_overrides` and the config hooks the way
  train_agent.py calls them;
- expected outputs: `agent.model` in eval mode under torch.no_grad on a
  batch whose rows include extreme values (the normalizer clamps are hit),
  with torch.manual_seed(EVAL_SEED) right before the forward (so `action` is
  reproducible); forward hooks record the input and output of every
  NormObsBase;
- verification (unless --no-verify): a second agent is built only from the
  written resolved_configs.pt, `agent.load(last.ckpt)` (the real load path,
  incl. training state) and the eval forward must give bit-identical
  tensors; likewise inference_last.ckpt with load_training_state=False.

masked_mimic is trained as SupervisedAgent trains it, from an expert tracker
(run_masked_mimic): a PPO tracker from the shipped smpl experiment, shrunk,
fed the student's widths and fitted by train() to a synthetic target (no
simulator, so no PPO run), is saved by BaseAgent.save with its
resolved_configs.pt into a scratch dir; the masked_mimic experiment's configs
are built with --expert-model-path pointing there (its env config adds the
expert_* observation components, its agent config the path), the real
SupervisedAgent loads and freezes the expert in create_model, and fit()'s
epoch runs without a simulator (mm_optimize: the real ExperienceBuffer,
collect_rollout_step labelling seeded stand-in states with the expert's
mean_action, optimize_model / perform_optimization_step); saved by
BaseAgent.save. gpc_prior is trained with SupervisedAgent's loss and
optimizer on its model alone (run_gpc_prior).

Written per variant, under testdata/policy/<variant>/: last.ckpt,
[inference_last.ckpt], resolved_configs.pt, [resolved_configs_inference.pt],
obs.safetensors (one f32 tensor per model in_key), expected.safetensors;
and testdata/policy/manifest.json. Safetensors headers are written here
without __metadata__, tensors sorted by name; the manifest is sorted JSON.
Deterministic: one CPU thread, fixed seeds, PYTHONHASHSEED=0 (the script
re-executes itself to set it); re-running with the same torch and
ProtoMotions gives the same bytes.
"""
import argparse
import copy
import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import shutil
import sys
import tempfile
from types import SimpleNamespace

# testdata/pm_reference.py: the helpers the recording scripts share
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pm_reference  # noqa: E402
from pm_reference import reexec_deterministic, reference_commit  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE_COMMIT = "607ca7a0bb92e261120bcab8d9f97f28b3130ffc"
EVAL_SEED = 1234
EVAL_ROWS = [
    "typical 0 (drawn from the training distribution)",
    "typical 1",
    "typical 2",
    "typical 3",
    "mean + 10*scale (per column)",
    "mean - 10*scale (per column)",
    "all zeros",
    "alternating +1000 / -1000 (every normalized column clamps)",
]
FIXED_RUN_START_TIME = 1767225600.0  # 2026-01-01T00:00:00Z, instead of time.time()

torch = None  # imported after the re-exec
PM = SimpleNamespace()  # ProtoMotions modules


def import_reference(root):
    global torch
    if not os.path.isdir(os.path.join(root, "protomotions", "agents")):
        raise SystemExit(f"{root}: no protomotions/agents; pass a checkout of github:NVlabs/ProtoMotions")
    sys.path.insert(0, root)
    import torch as _torch

    torch = _torch
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    torch.use_deterministic_algorithms(True)
    from lightning.fabric import Fabric
    from protomotions.utils.config_builder import build_standard_configs
    from protomotions.utils.fabric_config import FabricConfig
    from protomotions.utils.hydra_replacement import get_class
    from protomotions.utils.inference_utils import apply_all_inference_overrides
    from protomotions.components.motion_lib import MotionFileSwitchMode
    from protomotions.agents.common import config as common_config
    from protomotions.agents.common.common import NormObsBase, ObsProcessor, ModuleContainer
    from protomotions.agents.common.mlp import MLPWithConcat
    from protomotions.agents.base_agent.model import ProtoMotionsTensorDictModule
    from protomotions.agents.ppo.config import PPOActorConfig, PPOModelConfig
    from protomotions.agents.amp.config import AMPModelConfig, DiscriminatorConfig
    from protomotions.agents.base_agent.config import OptimizerConfig

    PM.Fabric = Fabric
    PM.build_standard_configs = build_standard_configs
    PM.FabricConfig = FabricConfig
    PM.get_class = get_class
    PM.apply_all_inference_overrides = apply_all_inference_overrides
    PM.MotionFileSwitchMode = MotionFileSwitchMode
    PM.C = common_config
    PM.NormObsBase = NormObsBase
    PM.ObsProcessor = ObsProcessor
    PM.ModuleContainer = ModuleContainer
    PM.MLPWithConcat = MLPWithConcat
    PM.TDModule = ProtoMotionsTensorDictModule
    PM.PPOActorConfig = PPOActorConfig
    PM.PPOModelConfig = PPOModelConfig
    PM.AMPModelConfig = AMPModelConfig
    PM.DiscriminatorConfig = DiscriminatorConfig
    PM.OptimizerConfig = OptimizerConfig


# ---------------------------------------------------------------- configs

def load_experiment(root, rel):
    path = os.path.join(root, rel)
    spec = importlib.util.spec_from_file_location("experiment_module", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def experiment_args(robot, name):
    # the fields of train_agent.py's parser that the experiment files and
    # build_standard_configs read
    return argparse.Namespace(
        robot_name=robot, simulator="isaaclab", headless=True, num_envs=4, batch_size=16,
        motion_file="dummy.motion", scenes_file=None, experiment_name=name, checkpoint=None,
        training_max_steps=10000000000000, training_max_iterations=None, seed=0,
        overrides=[], ngpu=1, nodes=1, use_wandb=False, use_slurm=False,
        torch_deterministic=False, create_config_only=False,
    )


def build_configs(root, rel, robot, name, **extra_args):
    """The experiment's configs as train_agent.py builds them; `extra_args`
    are the experiment's additional_experiment_arguments (e.g. expert_model_path)."""
    mod = load_experiment(root, rel)
    args = experiment_args(robot, name)
    for k, v in extra_args.items():
        setattr(args, k, v)
    cfgs = PM.build_standard_configs(
        args=args,
        terrain_config_fn=mod.terrain_config,
        scene_lib_config_fn=mod.scene_lib_config,
        motion_lib_config_fn=mod.motion_lib_config,
        env_config_fn=mod.env_config,
        configure_robot_and_simulator_fn=getattr(mod, "configure_robot_and_simulator", None),
        agent_config_fn=getattr(mod, "agent_config", None),
    )
    return cfgs, mod, args


def inference_configs(cfgs, mod, args):
    """What train_agent.py does before saving resolved_configs_inference.pt."""
    inf = {k: copy.deepcopy(v) for k, v in cfgs.items()}
    PM.apply_all_inference_overrides(
        inf["robot"], inf["simulator"], inf["env"], inf["agent"], inf["terrain"],
        inf["motion_lib"], inf["scene_lib"], experiment_module=mod, args=args,
    )
    for key in ("robot", "simulator", "terrain", "scene_lib", "motion_lib", "env", "agent"):
        hook = getattr(inf[key], "prepare_inference_config_for_save", None)
        if callable(hook):
            hook()
    return inf


def save_resolved_configs(cfgs, path):
    """train_agent.py:save_configs, the pickled part: same dict, same order."""
    resolved = {
        "robot": cfgs["robot"],
        "simulator": cfgs["simulator"],
        "terrain": cfgs["terrain"],
        "scene_lib": cfgs["scene_lib"],
        "motion_lib": cfgs["motion_lib"],
        "env": cfgs["env"],
        "agent": cfgs["agent"],
    }
    torch.save(resolved, path)


# ------------------------------------------------------ observation widths

def _fake_context_tensor(path, n, b, d, f, h, c, a, g):
    leaf = path.split(".")[-1]

    def quat(*shape):
        x = torch.randn(*shape, 4, generator=g)
        return x / x.norm(dim=-1, keepdim=True)

    def rn(*shape):
        return torch.randn(*shape, generator=g)

    if leaf == "anchor_idx":
        return 0
    if path.startswith("historical."):
        if leaf in ("actions", "processed_actions"):
            return rn(n, h, a)
        if leaf == "rigid_body_rot":
            return quat(n, h, b)
        if leaf.startswith("rigid_body"):
            return rn(n, h, b, 3)
        if leaf == "ground_heights":
            return rn(n, h)
        if leaf == "body_contacts":
            return rn(n, h, c)
    if path.startswith("mimic."):
        if leaf == "future_rot":
            return quat(n, f, b)
        if leaf in ("future_pos", "future_vel", "future_ang_vel"):
            return rn(n, f, b, 3)
        if leaf == "future_anchor_rot":
            return quat(n, f)
        if leaf.startswith("future_anchor"):
            return rn(n, f, 3)
        if leaf.startswith("future_dof"):
            return rn(n, f, d)
        if leaf == "ref_anchor_pos":
            return rn(n, 3)
    if leaf == "rigid_body_rot":
        return quat(n, b)
    if leaf.startswith("rigid_body"):
        return rn(n, b, 3)
    if leaf == "ground_heights":
        return rn(n)
    if leaf == "body_contacts":
        return rn(n, c)
    if leaf.startswith("dof_"):
        return rn(n, d)
    if leaf == "anchor_rot":
        return quat(n)
    if leaf in ("anchor_pos", "root_local_ang_vel"):
        return rn(n, 3)
    # nearest_surface: the terrain and scene inputs are optional and do not
    # change its width (one vector per selected body)
    if path.startswith(("terrain.", "scene.")):
        return None
    if leaf == "root_pos":
        return rn(n, 3)
    if leaf == "root_rot":
        return quat(n)
    raise KeyError(f"no stand-in for context path {path}")


def real_obs_widths(env_cfg, robot_cfg):
    """Width of every observation component, by calling its own compute
    function (with its static params) on stand-in context tensors."""
    g = torch.Generator().manual_seed(0)
    n = 2
    ki = robot_cfg.kinematic_info
    b, d, a = ki.num_bodies, ki.num_dofs, robot_cfg.number_of_actions
    h = max(1, env_cfg.num_state_history_steps)
    c = max(1, len(robot_cfg.contact_bodies or []))
    fs = getattr(env_cfg.control_components.get("mimic"), "future_steps", 1) if env_cfg.control_components else 1
    f = fs if isinstance(fs, int) else len(fs)
    out = {}
    for key, comp in env_cfg.observation_components.items():
        kw = {p: _fake_context_tensor(path, n, b, d, f, h, c, a, g) for p, path in comp.get_bindings_dict().items()}
        kw.update(comp.get_params())
        out[key] = int(comp.get_compute_func()(**kw).reshape(n, -1).shape[1])
    return out


# ------------------------------------------------------------- model configs

def mlp(in_keys, out_key, num_out, layers, **kw):
    C = PM.C
    return C.MLPWithConcatConfig(
        in_keys=list(in_keys), out_keys=[out_key], num_out=num_out,
        layers=[C.MLPLayerConfig(units=u, activation=act, use_layer_norm=ln) for (u, act, ln) in layers],
        **kw,
    )


def ops(*items):
    C = PM.C
    table = {
        "fwd": lambda: C.ModuleOperationForwardConfig(),
        "sphere": lambda: C.ModuleOperationSphereProjectionConfig(),
        "reshape": lambda s: C.ModuleOperationReshapeConfig(new_shape=list(s)),
        "permute": lambda o: C.ModuleOperationPermuteConfig(new_order=list(o)),
        "squeeze": lambda dim: C.ModuleOperationSqueezeConfig(squeeze_dim=dim),
        "unsqueeze": lambda dim: C.ModuleOperationUnsqueezeConfig(unsqueeze_dim=dim),
        "expand": lambda s: C.ModuleOperationExpandConfig(expand_shape=list(s)),
    }
    out = []
    for it in items:
        if isinstance(it, str):
            out.append(table[it]())
        else:
            out.append(table[it[0]](*it[1:]))
    return out


def shrink_units(mlp_cfg, mapping):
    for layer in mlp_cfg.layers:
        layer.units = mapping[layer.units]


# ------------------------------------------------------------------ variants
# Each variant: name, description, builder(root) -> dict with
#   cfgs (7 configs), widths {key: width} for every model in_key,
#   [real_widths], [inference_cfgs], n_iters, batch, seed, source.

def shipped_ppo_tracker(root, rel, robot, name, seed):
    """A PPO tracker from a shipped experiment config, hidden units shrunk,
    observation widths and action size as in the real config."""
    cfgs, mod, args = build_configs(root, rel, robot, name)
    model = cfgs["agent"].model
    shrink_units(model.actor.mu_model, {1024: 16})
    shrink_units(model.critic, {1024: 16})
    widths = real_obs_widths(cfgs["env"], cfgs["robot"])
    return dict(
        cfgs=cfgs, inference_cfgs=inference_configs(cfgs, mod, args),
        widths={k: widths[k] for k in model.in_keys}, n_iters=300, batch=16, seed=seed, source=rel,
        shrunk="hidden units 1024 -> 16; observation widths and action size as in the real config",
    )


def v_smpl_tracker(root):
    return shipped_ppo_tracker(root, "data/pretrained_models/motion_tracker/smpl/experiment_config.py",
                               "smpl", "smpl_tracker", seed=1)


def v_g1_amp_deploy(root):
    rel = "data/pretrained_models/motion_tracker/g1-bones-deploy/experiment_config.py"
    cfgs, mod, args = build_configs(root, rel, "g1", "g1_amp_deploy")
    model = cfgs["agent"].model
    shrink_units(model.actor.mu_model, {1024: 16})
    shrink_units(model.critic, {1024: 16})
    shrink_units(model.discriminator.models[0], {1024: 16, 512: 12})
    shrink_units(model.disc_critic.models[0], {512: 12, 256: 8})
    real = real_obs_widths(cfgs["env"], cfgs["robot"])
    # the actor's inputs keep their real widths; the critic's and the
    # discriminators' (493, 3168, 3451) are cut to keep the files small
    small = {"max_coords_obs": 41, "mimic_max_coords_target_poses": 48, "historical_max_coords_obs": 56}
    widths = {k: small.get(k, real[k]) for k in model.in_keys}
    return dict(
        cfgs=cfgs, inference_cfgs=inference_configs(cfgs, mod, args),
        widths=widths, real_widths={k: real[k] for k in model.in_keys}, n_iters=300, batch=16, seed=2,
        source=rel,
        shrunk="hidden units 1024/512/256 -> 16/12/8; widths of max_coords_obs, "
               "mimic_max_coords_target_poses, historical_max_coords_obs cut (real_widths has the real ones)",
    )


def v_soma_tracker(root):
    return shipped_ppo_tracker(root, "data/pretrained_models/motion_tracker/soma-bones/experiment_config.py",
                               "soma23", "soma_tracker", seed=8)


def v_soma_fsq_tracker(root):
    rel = "data/pretrained_models/motion_tracker/soma_bones_fsq/experiment_config.py"
    cfgs, mod, args = build_configs(root, rel, "soma23", "soma_fsq_tracker")
    model = cfgs["agent"].model
    fsq = model.actor.mu_model
    shrink_units(fsq.encoder, {1024: 16, 512: 12, 256: 8})
    shrink_units(fsq.decoder, {1024: 16, 512: 12, 256: 8})
    shrink_units(model.critic, {1024: 16})
    widths = real_obs_widths(cfgs["env"], cfgs["robot"])
    return dict(
        cfgs=cfgs, inference_cfgs=inference_configs(cfgs, mod, args),
        widths={k: widths[k] for k in model.in_keys}, n_iters=300, batch=16, seed=9, source=rel,
        shrunk="hidden units 1024/512/256 -> 16/12/8 (encoder, decoder, critic); 9 levels x 40 FSQ scalars, "
               "observation widths and action size as in the real config",
    )


def v_soma_fsq_amp(root):
    rel = "data/pretrained_models/motion_tracker/soma_bones_fsq_amp_muon/experiment_config.py"
    cfgs, mod, args = build_configs(root, rel, "soma23", "soma_fsq_amp")
    model = cfgs["agent"].model
    fsq = model.actor.mu_model
    shrink_units(fsq.encoder, {1024: 16, 512: 12, 256: 8})
    shrink_units(fsq.decoder, {1024: 16, 512: 12, 256: 8})
    shrink_units(model.critic, {1024: 16})
    shrink_units(model.discriminator.models[0], {1024: 16, 512: 12})
    shrink_units(model.disc_critic.models[0], {512: 12, 256: 8})
    real = real_obs_widths(cfgs["env"], cfgs["robot"])
    # the actor's inputs keep their real widths; the discriminators'
    # (historical_max_coords_obs) is cut to keep the files small
    small = {"historical_max_coords_obs": 56}
    widths = {k: small.get(k, real[k]) for k in model.in_keys}
    return dict(
        cfgs=cfgs, inference_cfgs=inference_configs(cfgs, mod, args),
        widths=widths, real_widths={k: real[k] for k in model.in_keys}, n_iters=300, batch=16, seed=10,
        source=rel,
        shrunk="hidden units 1024/512/256 -> 16/12/8 (encoder, decoder, critic, discriminator, disc critic); "
               "9 levels x 40 FSQ scalars; width of historical_max_coords_obs cut (real_widths has the real one)",
    )


def _synthetic_base(root, which):
    if which == "ppo":
        rel = "data/pretrained_models/motion_tracker/smpl/experiment_config.py"
        cfgs, _, _ = build_configs(root, rel, "smpl", "synthetic")
    else:
        rel = "data/pretrained_models/motion_tracker/g1-bones-deploy/experiment_config.py"
        cfgs, _, _ = build_configs(root, rel, "g1", "synthetic")
    return cfgs, rel


def _ppo_model(in_keys, actor, critic, num_out, logstd=-2.9, learnable=False, actor_lr=2e-5, critic_lr=1e-4):
    return PM.PPOModelConfig(
        in_keys=list(in_keys),
        out_keys=["action", "mean_action", "neglogp", "value"],
        actor=PM.PPOActorConfig(
            mu_key=actor.out_keys[0], in_keys=list(actor.in_keys), num_out=num_out,
            actor_logstd=logstd, learnable_std=learnable, mu_model=actor,
        ),
        critic=critic,
        actor_optimizer=PM.OptimizerConfig(_target_="torch.optim.Adam", lr=actor_lr),
        critic_optimizer=PM.OptimizerConfig(_target_="torch.optim.Adam", lr=critic_lr),
    )


def v_layernorm_activations(root):
    cfgs, rel = _synthetic_base(root, "ppo")
    keys = ["obs_a", "obs_b", "obs_c"]
    actor = mlp(keys, "actor_trunk_out", 6,
                [(24, "ReLU", True), (20, "Tanh", True), (16, "elu", False), (16, "GELU", False)],
                normalize_obs=True, norm_clamp_value=4.0, norm_ema_decay=0.99, output_activation="tanh")
    critic = mlp(keys, "value", 1,
                 [(16, "SiLU", True), (16, "mish", False), (12, "identity", False)],
                 normalize_obs=True, norm_clamp_value=5, norm_ema_decay=0.99, output_activation="elu")
    cfgs["agent"].model = _ppo_model(keys, actor, critic, 6, logstd=-1.5, learnable=True, actor_lr=3e-3,
                                     critic_lr=3e-3)
    return dict(cfgs=cfgs, widths={"obs_a": 7, "obs_b": 5, "obs_c": 6}, n_iters=300, batch=16, seed=3,
                source=f"synthetic (robot/simulator/env from {rel})")


def v_welford_clamps(root):
    cfgs, rel = _synthetic_base(root, "ppo")
    keys = ["obs_a", "obs_b"]
    actor = mlp(keys, "actor_trunk_out", 5, [(16, "relu", False), (16, "relu", False)],
                normalize_obs=True, norm_clamp_value=2.5, norm_ema_decay=None)
    critic = mlp(keys, "value", 1, [(16, "tanh", False)],
                 normalize_obs=True, norm_clamp_value=None, norm_ema_decay=None)
    cfgs["agent"].model = _ppo_model(keys, actor, critic, 5, logstd=-0.7)
    cfgs["agent"].save_inference_checkpoint = True
    cfgs["agent"].reward_norm_ema_decay = None
    return dict(cfgs=cfgs, widths={"obs_a": 9, "obs_b": 4}, n_iters=300, batch=16, seed=4,
                source=f"synthetic (robot/simulator/env from {rel})")


def v_container_obsprocessor(root):
    cfgs, rel = _synthetic_base(root, "ppo")
    C = PM.C
    keys = ["obs_a", "obs_b", "obs_c"]
    actor = C.ModuleContainerConfig(
        in_keys=list(keys), out_keys=["actor_trunk_out"],
        models=[
            C.ObsProcessorConfig(in_keys=["obs_a"], out_keys=["obs_a_norm"], normalize_obs=True,
                                 norm_clamp_value=3, norm_ema_decay=0.999, module_operations=ops("fwd")),
            # ObsProcessorConfig.module_operations defaults to [] (no Forward):
            # normalize_obs=True is then inert, a passthrough whose lazy
            # RunningMeanStd never materializes (no state_dict keys)
            C.ObsProcessorConfig(in_keys=["obs_b"], out_keys=["obs_b_same"], normalize_obs=True),
            mlp(["obs_a_norm", "obs_b_same", "obs_c"], "actor_trunk_out", 4,
                [(16, "relu", False), (12, "relu", False)], normalize_obs=False),
        ],
    )
    critic = C.ModuleContainerConfig(
        in_keys=list(keys), out_keys=["value"],
        models=[
            mlp(["obs_c", "obs_a"], "critic_hidden", 8, [(16, "relu", False)],
                normalize_obs=True, norm_clamp_value=5.0, norm_ema_decay=0.999),
            mlp(["critic_hidden", "obs_b"], "value", 1, [(8, "relu", False)], normalize_obs=False),
        ],
    )
    cfgs["agent"].model = _ppo_model(keys, actor, critic, 4)
    return dict(cfgs=cfgs, widths={"obs_a": 6, "obs_b": 3, "obs_c": 5}, n_iters=300, batch=16, seed=5,
                source=f"synthetic (robot/simulator/env from {rel})")


def v_module_ops_ppo(root):
    cfgs, rel = _synthetic_base(root, "ppo")
    keys = ["obs_a", "obs_b", "obs_c"]
    # each row (width 18) split into two rows of 9: normalizer of width 9,
    # the MLP applied per half, halves concatenated back: 2 * 5 = 10 actions
    actor = mlp(keys, "actor_trunk_out", 5, [(16, "relu", False), (16, "relu", False)],
                normalize_obs=True, norm_clamp_value=5, norm_ema_decay=0.999,
                module_operations=ops(("reshape", ["batch_size * 2", -1]), "fwd", ("reshape", ["batch_size", -1])))
    # L2-normalized raw obs, then the 3-D forward path (T = 1)
    critic = mlp(keys, "value", 1, [(16, "relu", False)],
                 normalize_obs=True, norm_clamp_value=5.0, norm_ema_decay=0.999,
                 module_operations=ops("sphere", ("unsqueeze", 1), "fwd", ("squeeze", 1)))
    cfgs["agent"].model = _ppo_model(keys, actor, critic, 10)
    return dict(cfgs=cfgs, widths={"obs_a": 7, "obs_b": 5, "obs_c": 6}, n_iters=300, batch=16, seed=6,
                source=f"synthetic (robot/simulator/env from {rel})")


def v_module_ops_amp(root):
    cfgs, rel = _synthetic_base(root, "amp")
    C = PM.C
    keys = ["obs_a", "obs_b", "disc_obs"]
    # tokens: [B, 12] -> [B, 3, 4]; per-token normalizer (width 4) and MLP; 3 * 3 = 9 actions
    actor = mlp(["obs_a", "obs_b"], "actor_trunk_out", 3, [(16, "elu", True), (16, "relu", False)],
                normalize_obs=True, norm_clamp_value=5, norm_ema_decay=0.999,
                module_operations=ops(("reshape", ["batch_size", 3, -1]), "fwd", ("reshape", ["batch_size", -1])))
    # [B, 12] -> [B, 2, 6] -> [B, 6, 2] -> [B, 12] (an interleave), then forward
    critic = mlp(["obs_a", "obs_b"], "value", 1, [(16, "relu", False)],
                 normalize_obs=True, norm_clamp_value=5.0, norm_ema_decay=0.999,
                 module_operations=ops(("reshape", ["batch_size", 2, -1]), ("permute", [0, 2, 1]),
                                       ("reshape", ["batch_size", -1]), "fwd"))
    disc = PM.DiscriminatorConfig(
        in_keys=["disc_obs"], out_keys=["disc_logits"],
        models=[mlp(["disc_obs"], "disc_logits", 1, [(16, "relu", True), (12, "relu", False)],
                    normalize_obs=True, norm_clamp_value=3.5, norm_ema_decay=None,
                    module_operations=ops("sphere", "fwd"))],
    )
    # [B, 17] -> [B, 1, 17] -> [B, 2, 17] (expand: two equal tokens), 3-D
    # forward path, [B, 2, 1] -> [B, 2]: disc_value has two equal columns
    disc_critic = C.ModuleContainerConfig(
        in_keys=["obs_b", "disc_obs"], out_keys=["disc_value"],
        models=[mlp(["obs_b", "disc_obs"], "disc_value", 1, [(12, "relu", False)],
                    normalize_obs=True, norm_clamp_value=5, norm_ema_decay=0.999,
                    module_operations=ops(("unsqueeze", 1), ("expand", [-1, 2, -1]), "fwd",
                                          ("reshape", ["batch_size", -1])))],
    )
    base = _ppo_model(keys, actor, critic, 9, logstd=-2.0, learnable=True, actor_lr=1e-3)
    cfgs["agent"].model = PM.AMPModelConfig(
        in_keys=keys, out_keys=["action", "mean_action", "neglogp", "value", "disc_logits", "disc_value"],
        actor=base.actor, critic=base.critic,
        actor_optimizer=base.actor_optimizer, critic_optimizer=base.critic_optimizer,
        discriminator=disc, disc_critic=disc_critic,
    )
    cfgs["agent"].normalize_rewards = True
    cfgs["agent"].l2c2.enabled = False
    cfgs["agent"].l2c2.obs_pairs = {}
    return dict(cfgs=cfgs, widths={"obs_a": 8, "obs_b": 4, "disc_obs": 13}, n_iters=300, batch=16, seed=7,
                source=f"synthetic (robot/simulator/env from {rel})")



# ------------------------------------------------------------- MaskedMimic

MM_WIDTHS = {
    # per future / historical step x steps (5 each, as the experiment), shrunk per step
    "max_coords_obs": 24, "masked_mimic_target_poses": 5 * 10, "masked_mimic_target_masks": 5 * 3,
    "masked_mimic_target_times": 5, "masked_mimic_target_poses_masks": 5, "historical_pose_obs": 5 * 6,
    "previous_actions": 69,
    # the privileged encoder's (training only); mimic_target_poses is also the expert's
    "mimic_target_poses": 40, "masked_mimic_target_bodies_masks": 5 * 3,
}
MM_MASK_KEYS = ["masked_mimic_target_masks", "masked_mimic_target_poses_masks", "masked_mimic_target_bodies_masks"]
# observation components of the experiment's env that no model reads (the
# experience buffer still holds them): width chosen here
MM_ENV_ONLY_WIDTHS = {"historical_max_coords_obs": 2 * 12}
# the values ObsSource draws (masks are drawn by mm_masks); env-only keys last,
# so that the moments drawn for the model keys do not depend on them
MM_SOURCE_WIDTHS = {**{k: w for k, w in MM_WIDTHS.items() if k not in MM_MASK_KEYS}, **MM_ENV_ONLY_WIDTHS}

MM_EXPERT_REL = "data/pretrained_models/motion_tracker/smpl/experiment_config.py"
MM_EXPERT_DIR = "masked_mimic_expert"  # relative to the scratch dir the variant runs in
MM_EXPERT = dict(seed=23, n_iters=2000, batch=16, actor_lr=1e-3)
# one epoch as fit() runs it: num_steps rollout steps of num_envs envs, then
# optimize_model (num_envs * num_steps * num_mini_epochs / batch_size steps)
MM_EPOCHS = 20
MM_STUDENT_LR = 1e-3
MM_DONE_PROB = 0.05  # stand-in episode ends (reset the model's rollout vae_noise)
MM_HELD_OUT = 64


def v_masked_mimic(root, expert_model_path=None):
    """MaskedMimic from the shipped experiment (examples/experiments/masked_mimic/transformer.py)
    with `--expert-model-path` set to the expert tracker (see mm_expert), widths shrunk."""
    rel = "examples/experiments/masked_mimic/transformer.py"
    # additional_experiment_arguments: --expert-model-path
    cfgs, mod, args = build_configs(root, rel, "smpl", "masked_mimic", expert_model_path=expert_model_path)
    m = cfgs["agent"].model
    units = {1024: 24, 256: 16, 128: 12}
    for container in (m.encoder, m.prior, m.trunk):
        for sub in container.models:
            if hasattr(sub, "layers"):
                shrink_units(sub, units)
            if getattr(sub, "num_out", None) == 512:
                sub.num_out = 32
            if getattr(sub, "num_out", None) == 64:
                sub.num_out = 8
            if type(sub).__name__ == "TransformerConfig":
                sub.transformer_token_size = 32
                sub.latent_dim = 32
                sub.ff_size = 48
                sub.num_layers = 2
    m.vae.vae_latent_dim = 8
    # the experiment's lr (2e-5) is for thousands of epochs; the few here
    # would leave the student near its initial, nearly constant, output
    experiment_lr = m.optimizer.lr
    m.optimizer.lr = MM_STUDENT_LR
    try:
        inf = inference_configs(cfgs, mod, args)
    except Exception as e:  # noqa: BLE001 (the eval overrides need a motion file)
        print(f"   no inference configs: {type(e).__name__}: {e}")
        inf = None
    return dict(cfgs=cfgs, inference_cfgs=inf, widths=dict(MM_WIDTHS), n_epochs=MM_EPOCHS, seed=22,
                source=rel, experiment_lr=experiment_lr,
                shrunk="tokens 512 -> 32, ff 1024 -> 48, 4 -> 2 layers (4 heads kept), hidden units "
                       "1024/256/128 -> 24/16/12, latent 64 -> 8; observation widths chosen here "
                       "(5 future and 5 historical steps as the experiment, fewer values per step)")


def mm_masks(g, n, rows_fixed=False):
    """0/1 float masks: random, or for the eval batch one pattern per row
    (all valid, all masked, alternating, random...)."""
    out = {}
    for k in MM_MASK_KEYS:
        w = MM_WIDTHS[k]
        m = (torch.rand(n, w, generator=g) < 0.6).float()
        if rows_fixed:
            m[0] = 1.0
            m[1] = 0.0
            m[2] = torch.tensor([float(i % 2 == 0) for i in range(w)])
            m[3, : w // 2] = 0.0
        out[k] = m
    return out


class ObsView:
    """The keys of another source a model is fed (the expert's training)."""

    def __init__(self, source, keys):
        self.source, self.keys = source, list(keys)

    def sample(self, n):
        obs = self.source.sample(n)
        return {k: obs[k] for k in self.keys}


class MMObsSource:
    """What the masked_mimic env would observe, from seeded values instead of
    a simulator: ObsSource's columns, mm_masks' masks, and each expert_<key>
    the experiment adds (get_expert_observation_components: a copy of the
    expert's own component, computed from the same state) as the same value
    as <key>."""

    def __init__(self, seed, expert_keys, stream=0):
        self.base = ObsSource(MM_SOURCE_WIDTHS, seed, stream=stream)
        self.g = torch.Generator().manual_seed(6000 + seed + 100000 * stream)
        self.expert_keys = list(expert_keys)

    def sample(self, n):
        obs = self.base.sample(n)
        obs.update(mm_masks(self.g, n))
        for k in self.expert_keys:
            obs[f"expert_{k}"] = obs[k].clone()
        return obs


def mm_expert(fabric, root, scratch_rel):
    """The expert tracker: a PPO tracker from the shipped smpl experiment
    (ProtoMotions' PPO agent and model), hidden units shrunk, fed the
    MaskedMimic variant's widths for its keys, trained by train() towards a
    fixed function of the state (no simulator, so not a PPO run), saved by
    the real BaseAgent.save into scratch_rel with its resolved_configs.pt,
    where load_resolved_configs_from_checkpoint finds it."""
    cfgs, _mod, _args = build_configs(root, MM_EXPERT_REL, "smpl", "masked_mimic_expert")
    model = cfgs["agent"].model
    shrink_units(model.actor.mu_model, {1024: 16})
    shrink_units(model.critic, {1024: 16})
    keys = list(model.in_keys)
    missing = [k for k in keys if k not in MM_WIDTHS]
    if missing:
        raise SystemExit(f"masked_mimic: the expert reads {missing}, not in MM_WIDTHS")
    if cfgs["robot"].number_of_actions != MM_WIDTHS["previous_actions"]:
        raise SystemExit("masked_mimic: the expert's action size is not MM_WIDTHS['previous_actions']")
    seed = MM_EXPERT["seed"]
    # an untrained actor (relu MLP, default init) gives nearly the same
    # mean_action for every state: labels without information. The expert is
    # pulled instead towards a fixed function of the standardized state
    # (what its normalizers learn), at a higher actor lr than the experiment's
    experiment_lr = model.actor_optimizer.lr
    model.actor_optimizer.lr = MM_EXPERT["actor_lr"]
    torch.manual_seed(seed)
    # the student's distribution (same seed, so the same per-column moments;
    # another stream of draws)
    base = ObsSource(MM_SOURCE_WIDTHS, 22, stream=2)
    source = ObsView(base, keys)
    n_act = cfgs["robot"].number_of_actions
    d = sum(MM_WIDTHS[k] for k in keys)
    w = torch.randn(d, n_act, generator=torch.Generator().manual_seed(8000 + seed), dtype=torch.float64) / math.sqrt(d)

    def target(obs):
        z = torch.cat([(obs[k].double() - base.mean[k]) / base.scale[k] for k in keys], dim=-1)
        return (0.5 * torch.tanh(z @ w)).float()

    os.makedirs(scratch_rel)
    agent = make_agent(fabric, cfgs, source, scratch_rel)
    train(agent, source, MM_EXPERT["n_iters"], MM_EXPERT["batch"], seed, target=target)
    # how much of the target's spread it follows (on fresh states)
    check = ObsView(ObsSource(MM_SOURCE_WIDTHS, 22, stream=4), keys).sample(256)
    with torch.no_grad():
        mean_action = agent.model(agent.obs_dict_to_tensordict(dict(check)))["mean_action"]
    goal = target(check)
    fit = {"target_variance": float(goal.var(dim=0, unbiased=False).mean()),
           "mean_action_variance": float(mean_action.var(dim=0, unbiased=False).mean()),
           "mse_to_target": float((mean_action - goal).pow(2).mean())}
    print(f"   expert on 256 fresh states: {fit}", flush=True)
    agent.save("last.ckpt")
    os.remove(os.path.join(scratch_rel, "env_0.ckpt"))
    save_resolved_configs(cfgs, os.path.join(scratch_rel, "resolved_configs.pt"))
    ck = os.path.join(scratch_rel, "last.ckpt")
    return {
        "source": MM_EXPERT_REL,
        "agent_target": cfgs["agent"]._target_,
        "model_target": model._target_,
        "actor_in_keys": list(model.actor.in_keys),
        "obs_widths": {k: MM_WIDTHS[k] for k in keys},
        "action_size": cfgs["robot"].number_of_actions,
        "shrunk": "hidden units 1024 -> 16 (actor and critic); observation widths the MaskedMimic variant's; "
                  f"actor lr {experiment_lr} -> {MM_EXPERT['actor_lr']}",
        "train": {"iters": MM_EXPERT["n_iters"], "batch": MM_EXPERT["batch"], "seed": seed,
                  "how": "train() as for the tracker variants (normalizer moments, one step of each agent "
                         "optimizer per iteration on a synthetic loss), mean_action pulled towards "
                         "0.5 * tanh(z @ W), z the state standardized by the source's moments, W fixed seeded "
                         "normal / sqrt(width): no simulator, so not a PPO run (an untrained actor's mean_action "
                         "hardly depends on the state)",
                  "fit_on_256_fresh_states": fit},
        "saved_with": "BaseAgent.save (real code path) + resolved_configs.pt, into a scratch dir "
                      f"(expert_model_path '{ck}', relative to it); not kept",
        "checkpoint_sha256": sha256(ck),
    }


def mm_optimize(agent, source, n_epochs, seed, held_out):
    """fit()'s epoch without a simulator: the real ExperienceBuffer, its keys
    registered as fit() registers them; per epoch num_steps rollout steps in
    eval mode (observations from `source`, collect_rollout_step: the student's
    outputs and the expert's mean_action as expert_actions through
    _collect_rollout_output; post_env_step_modifications and
    record_rollout_step with stand-in rewards and episode ends), then
    optimize_model (DictDataset minibatches, perform_optimization_step:
    supervised_step = compute_supervision_loss with the config's loss +
    compute_model_loss's KL at the schedule's coefficient, _step_optimizer
    with gradient clipping and the configured optimizer)."""
    from protomotions.agents.utils.data import ExperienceBuffer
    import numpy as np
    np.random.seed(seed)  # DictDataset.shuffle draws from numpy's global RNG
    torch.manual_seed(5000 + seed)  # vae_noise resets draw from torch's
    g = torch.Generator().manual_seed(4000 + seed)
    agent.experience_buffer = buf = ExperienceBuffer(agent.num_envs, agent.num_steps, device=agent.device)
    obs_td = agent.obs_dict_to_tensordict(agent.add_agent_info_to_obs(agent.env.get_obs()))
    for key, t in obs_td.items():
        buf.register_key(key, shape=t.shape[1:], dtype=t.dtype)
    with agent._eval_model_for_buffer_registration(), torch.no_grad():
        agent._register_model_output_keys(agent.model(obs_td))
    buf.register_key("rewards")
    if agent.config.normalize_rewards:
        buf.register_key("unnormalized_rewards")
    buf.register_key("dones", dtype=torch.long)
    agent.register_algorithm_experience_buffer_keys()
    agent.register_algorithm_experience_buffer_keys_from_obs(obs_td)
    buffer_keys = sorted(k for k, _ in buf.named_buffers())

    curve = [{"epoch": 0, **held_out_loss(agent, held_out)}]  # before any step
    print(f"   before training: held out: privileged {curve[0]['held_out_privileged_mse']:.5f}, "
          f"prior {curve[0]['held_out_prior_mse']:.5f}", flush=True)
    done_indices = torch.arange(agent.num_envs, dtype=torch.long)
    agent.model.reset_rollout_context(env_ids=done_indices)  # fit(): reset on start
    agent.fit_start_time = FIXED_RUN_START_TIME
    for _ in range(n_epochs):
        agent.eval()
        with torch.no_grad():
            for step in range(agent.num_steps):
                agent.pre_collect_step(step)
                obs_td = agent.obs_dict_to_tensordict(agent.add_agent_info_to_obs(agent.env.get_obs()))
                for key, t in obs_td.items():
                    buf.update_data(key, step, t)
                out = agent.collect_rollout_step(obs_td, step)
                agent.check_for_nans(obs_td, out)
                rewards = torch.randn(agent.num_envs, generator=g) * 0.5 + 1.0
                dones = (torch.rand(agent.num_envs, generator=g) < MM_DONE_PROB).long()
                dones, terminated, extras = agent.post_env_step_modifications(dones, dones.clone(), {})
                done_indices = dones.nonzero(as_tuple=False).squeeze(-1)
                agent.record_rollout_step(None, out["action"], rewards, dones, terminated, done_indices,
                                          extras, step)
                agent.step_count += agent.get_step_count_increment()
            agent.normalize_rewards_in_buffer()
        log = agent.optimize_model()
        agent.current_epoch += 1
        curve.append({"epoch": agent.current_epoch,
                      "train_loss": float(log["losses/supervised_loss"]),
                      "train_mse": float(log[f"{agent.config.loss.log_prefix}/mse"]),
                      "kld_term": float(log["model/kld_loss"]),
                      "kld_coeff": float(log["model/kld_coeff"]),
                      **held_out_loss(agent, held_out)})
        c = curve[-1]
        print(f"   epoch {c['epoch']:3d}: train loss {c['train_loss']:.5f} (mse {c['train_mse']:.5f}, "
              f"kld term {c['kld_term']:.2e}); held out: privileged {c['held_out_privileged_mse']:.5f}, "
              f"prior {c['held_out_prior_mse']:.5f}", flush=True)
    agent.eval()
    return curve, buffer_keys


def mm_held_out(agent, source, seed):
    """A fixed batch with its expert labels (vae_noise given: the batch is
    larger than the rollout state)."""
    obs = source.sample(MM_HELD_OUT)
    obs["vae_noise"] = torch.randn(MM_HELD_OUT, agent.config.model.vae.vae_latent_dim,
                                   generator=torch.Generator().manual_seed(7000 + seed))
    td = agent.obs_dict_to_tensordict(obs)
    agent.eval()
    with torch.no_grad():
        labels = agent._collect_rollout_output(td.clone())["expert_actions"].clone()
    return td, labels


def held_out_loss(agent, held_out):
    td, labels = held_out
    agent.eval()
    with torch.no_grad():
        out = agent.model(td.clone())
    return {"held_out_privileged_mse": float((out["privileged_action"] - labels).pow(2).mean()),
            "held_out_prior_mse": float((out["action"] - labels).pow(2).mean())}


def run_masked_mimic(fabric, root, out_dir, name, desc, builder, verify):
    """The expert tracker first (mm_expert), then the masked_mimic experiment's
    configs with --expert-model-path set to it, the REAL SupervisedAgent
    (make_agent: its create_model loads and freezes the expert's actor, the
    stand-in env provides the expert_* observations), trained by mm_optimize,
    saved by the real BaseAgent.save path. Runs in a scratch dir (the expert's
    path in resolved_configs.pt is relative to it)."""
    from tensordict import TensorDict
    out_dir = os.path.abspath(out_dir)
    root = os.path.abspath(root)
    vdir = os.path.join(out_dir, name)
    if os.path.isdir(vdir):
        shutil.rmtree(vdir)
    os.makedirs(vdir)
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as scratch:
        os.chdir(scratch)
        try:
            return _run_masked_mimic(fabric, root, vdir, name, desc, builder, verify, TensorDict)
        finally:
            os.chdir(cwd)


def _run_masked_mimic(fabric, root, vdir, name, desc, builder, verify, TensorDict):
    expert = mm_expert(fabric, root, MM_EXPERT_DIR)
    expert_path = os.path.join(MM_EXPERT_DIR, "last.ckpt")
    spec = builder(root, expert_model_path=expert_path)
    cfgs = spec["cfgs"]
    env_keys = list(cfgs["env"].observation_components)
    expert_keys = [k[len("expert_"):] for k in env_keys if k.startswith("expert_")]
    if sorted(expert_keys) != sorted(expert["actor_in_keys"]):
        raise SystemExit(f"{name}: the env's expert_* components {expert_keys} are not the expert actor's "
                         f"in_keys {expert['actor_in_keys']}")
    mcfg = cfgs["agent"].model
    model_keys = set(PM.get_class(mcfg._target_)(config=copy.deepcopy(mcfg)).in_keys)
    own = [k for k in env_keys if not k.startswith("expert_")]
    if set(own) != set(MM_WIDTHS) | set(MM_ENV_ONLY_WIDTHS) or not model_keys <= set(MM_WIDTHS):
        raise SystemExit(f"{name}: env components {own} / model in_keys {sorted(model_keys)} do not match "
                         "MM_WIDTHS + MM_ENV_ONLY_WIDTHS")
    seed = spec["seed"]
    torch.manual_seed(seed)
    source = MMObsSource(seed, expert_keys)
    agent = make_agent(fabric, cfgs, source, ".")
    if agent.expert_model is None or any(p.requires_grad for p in agent.expert_model.parameters()):
        raise SystemExit(f"{name}: SupervisedAgent did not load a frozen expert")
    # the expert's actor as the agent loaded it must be the saved one
    saved = torch.load(expert_path, map_location="cpu", weights_only=False)["model"]
    for k, v in agent.expert_actor.state_dict().items():
        if not torch.equal(v, saved[f"_actor.{k}"]):
            raise SystemExit(f"{name}: expert actor {k} differs from the expert checkpoint")
    held_out = mm_held_out(agent, MMObsSource(seed, expert_keys, stream=3), seed)
    label_var = float(held_out[1].var(dim=0, unbiased=False).mean())
    print(f"   held-out expert labels: per-action variance {label_var:.5f} (the MSE of their mean)", flush=True)
    curve, buffer_keys = mm_optimize(agent, source, spec["n_epochs"], seed, held_out)
    first, last = curve[1], curve[-1]
    if not (last["train_loss"] < first["train_loss"] and last["held_out_privileged_mse"]
            < curve[0]["held_out_privileged_mse"]):
        raise SystemExit(f"{name}: the supervised loss did not decrease: {first} -> {last}")
    agent.save("last.ckpt")
    shutil.copyfile("last.ckpt", os.path.join(vdir, "last.ckpt"))
    save_resolved_configs(cfgs, os.path.join(vdir, "resolved_configs.pt"))
    if spec.get("inference_cfgs") is not None:
        save_resolved_configs(spec["inference_cfgs"], os.path.join(vdir, "resolved_configs_inference.pt"))
    model = agent.model
    latent = mcfg.vae.vae_latent_dim

    # eval batch: inference keys only
    inf_keys = model.get_inference_in_keys()
    ev = ObsSource(MM_SOURCE_WIDTHS, seed).eval_batch()
    ev.update(mm_masks(torch.Generator().manual_seed(3001), 8, rows_fixed=True))
    obs = {k: ev[k] for k in inf_keys}
    noise = torch.randn(8, latent, generator=torch.Generator().manual_seed(3002))
    noise[6] = 0.0

    def infer(m, o, nz):
        captured = {}
        handles = []
        for path, mod in m.named_modules():
            if isinstance(mod, PM.NormObsBase) and mod.config.normalize_obs:
                def hook(_m, inp, out, path=path):
                    captured[path] = out.detach().clone()
                handles.append(mod.register_forward_hook(hook))
        try:
            td = TensorDict({**{k: v.clone() for k, v in o.items()}, "vae_noise": nz.clone()},
                            batch_size=[nz.shape[0]])
            with torch.no_grad():
                out = m.forward_inference(td)
        finally:
            for h in handles:
                h.remove()
        res = {}
        for k in sorted(out.keys()):
            if k in o or k == "vae_noise" or k.startswith("norm_"):
                continue
            res[k] = out[k].detach().clone()
        for p, v in captured.items():
            res[f"norm.{p}.out"] = v
        return res

    model.eval()
    expected = infer(model, obs, noise)
    zero = infer(model, obs, torch.zeros_like(noise))
    expected["zero_noise.action"] = zero["action"]
    expected["zero_noise.latent"] = zero["latent"]
    m64 = copy.deepcopy(model).double()
    e64 = infer(m64, {k: v.double() for k, v in obs.items()}, noise.double())
    for k, v in e64.items():
        expected[f"f64.{k}"] = v
    write_safetensors(os.path.join(vdir, "obs.safetensors"), {**obs, "vae_noise": noise})
    write_safetensors(os.path.join(vdir, "expected.safetensors"), expected)

    def check(got, how):
        for k, v in got.items():
            if not torch.equal(v, expected[k]):
                raise SystemExit(f"{name}: {k} differs after {how}")

    verified = []
    if verify:
        loaded = torch.load(os.path.join(vdir, "resolved_configs.pt"), map_location="cpu", weights_only=False)
        torch.manual_seed(999)  # different init: everything must come from the checkpoint
        with tempfile.TemporaryDirectory() as scratch:
            again = make_agent(fabric, loaded, MMObsSource(seed + 77, expert_keys), scratch)
            again.load(os.path.join(vdir, "last.ckpt"), load_env=False, load_training_state=True)
            again.eval()
            check(infer(again.model, obs, noise), "agent.load")
        verified.append("last.ckpt (SupervisedAgent from resolved_configs.pt, expert reloaded from its path, "
                        "agent.load with load_training_state=True)")
        if spec.get("inference_cfgs") is not None:
            loaded = torch.load(os.path.join(vdir, "resolved_configs_inference.pt"), map_location="cpu",
                                weights_only=False)
            assert loaded["agent"].expert_model_path is None
            torch.manual_seed(998)
            fresh = PM.get_class(loaded["agent"].model._target_)(config=loaded["agent"].model)
            with torch.no_grad():  # materialize the lazy normalizers before load_state_dict
                fresh.train()
                fresh(TensorDict({**source.sample(2), "vae_noise": torch.zeros(2, latent)}, batch_size=[2]))
            fresh.load_state_dict(torch.load(os.path.join(vdir, "last.ckpt"), map_location="cpu",
                                             weights_only=False)["model"])
            fresh.eval()
            check(infer(fresh, obs, noise), "load_state_dict from the inference configs")
            verified.append("last.ckpt's model through resolved_configs_inference.pt (no expert: "
                            "load_state_dict into a fresh MaskedMimicModel)")
    ck = torch.load(os.path.join(vdir, "last.ckpt"), map_location="cpu", weights_only=False)
    files = {}
    for f in sorted(os.listdir(vdir)):
        p = os.path.join(vdir, f)
        files[f] = {"bytes": os.path.getsize(p), "sha256": sha256(p)}
    lr = mcfg.optimizer.lr
    return {
        "name": name,
        "description": desc,
        "source": spec["source"],
        "shrunk": spec["shrunk"],
        "agent_target": cfgs["agent"]._target_,
        "agent_class": f"{type(agent).__module__}.{type(agent).__name__}",
        "model_target": mcfg._target_,
        # chosen here, not the env config's component widths (its compute functions need
        # masked-mimic context stand-ins real_obs_widths does not make)
        "chosen_obs_widths": dict(MM_WIDTHS),
        "env_only_obs_widths": dict(MM_ENV_ONLY_WIDTHS),
        "inference_in_keys": list(inf_keys),
        "expert": expert,
        "checkpoint_top_level_keys": list(ck.keys()),
        "saved_with": "BaseAgent.save (real code path: SupervisedAgent.get_state_dict, model + "
                      "supervised_optimizer; stand-in env, Fabric DDP/gloo on 1 CPU process)",
        "resolved_configs_with": "reproduction of train_agent.save_configs; resolved_configs.pt keeps the "
                                 f"expert's path ('{expert_path}', relative to the scratch dir it ran in) and "
                                 "its expert_* components; resolved_configs_inference.pt after the "
                                 "experiment's apply_inference_overrides (expert removed)",
        "train": {
            "epochs": spec["n_epochs"], "seed": seed,
            "num_envs": agent.num_envs, "num_steps": agent.num_steps, "batch": cfgs["agent"].batch_size,
            "num_mini_epochs": agent.num_mini_epochs,
            "optimizer_steps": spec["n_epochs"] * agent.max_num_batches(),
            "optimizer": f"{mcfg.optimizer._target_} lr {lr} (the experiment's {spec['experiment_lr']} raised: "
                         "a few epochs at it leave the student near its initial output)",
            "kld_term": "compute_model_loss's KL term (mean KL x the schedule's coefficient), as logged",
            "gradient_clip_val": cfgs["agent"].gradient_clip_val,
            "loss": f"compute_supervision_loss ({cfgs['agent'].loss.loss_type.value}: "
                    f"{cfgs['agent'].loss.prediction_key} vs {cfgs['agent'].loss.target_key}) + "
                    "MaskedMimicModel.compute_model_loss (KL at the schedule's coefficient)",
            "how": "SupervisedAgent's own code paths (see mm_optimize): rollouts of the student in eval mode "
                   "labelled by the frozen expert's mean_action, the real ExperienceBuffer, optimize_model / "
                   "perform_optimization_step. The states come from the seeded ObsSource (MMObsSource), not "
                   "from a simulator: the student's actions are not applied to anything, rewards and episode "
                   f"ends (p={MM_DONE_PROB}, resetting the rollout vae_noise) are seeded stand-ins",
            "experience_buffer_keys": buffer_keys,
            "loss_curve": curve,  # epoch 0: the held-out losses before training
            "held_out_label_variance": label_var,
            "held_out": f"{MM_HELD_OUT} rows of another stream of the same source, labelled by the expert; "
                        "privileged: the encoder path (the loss's prediction), prior: the deployed path "
                        "(action), both with the same vae_noise",
        },
        "eval": {"rows": EVAL_ROWS, "masks": "row 0 all valid, 1 all masked, 2 alternating, 3 first half masked, "
                                             "others random", "vae_noise": "seeded normal, row 6 zero",
                 "mode": "model.eval(), torch.no_grad(), forward_inference; f64.*: the same in float64"},
        "expected": {k: {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")}
                     for k, v in sorted(expected.items())},
        "verified_reload": verified,
        "files": files,
    }


def v_gpc_prior(root):
    """The GPC prior from the shipped gpc_prior/soma_bones experiment config,
    over the frozen FSQ tracker recorded as soma_fsq_tracker (its last.ckpt
    is the tracker checkpoint the experiment asks for)."""
    rel = "data/pretrained_models/gpc_prior/soma_bones/experiment_config.py"
    mod = load_experiment(root, rel)
    args = experiment_args("soma23", "gpc_prior")
    args.tracker_checkpoint = os.path.join(HERE, "soma_fsq_tracker", "last.ckpt")
    cfgs = PM.build_standard_configs(
        args=args,
        terrain_config_fn=mod.terrain_config,
        scene_lib_config_fn=mod.scene_lib_config,
        motion_lib_config_fn=mod.motion_lib_config,
        env_config_fn=mod.env_config,
        configure_robot_and_simulator_fn=getattr(mod, "configure_robot_and_simulator", None),
        agent_config_fn=mod.agent_config,
    )
    model = cfgs["agent"].model
    prior = model.prior
    prior.d_model = 16
    prior.ff_size = 32
    prior.num_layers = 2
    shrink_units(prior.context_encoder.models[0], {1024: 16})
    prior.context_encoder.models[0].num_out = 16
    prior.token_encoder.models[0].num_out = 16
    # 40 FSQ scalars of 9 levels, 2 per prior token: 20 tokens over a
    # vocabulary of 81 (the published 5 per token gives 8 tokens of 9^5)
    model.fsq_scalars_per_prior_token = 2
    # a temperature other than 1 so that the division is exercised
    model.temperature = 0.8
    widths = {"max_coords_obs": 343, "mimic_target_poses": 3864}
    return dict(
        cfgs=cfgs, mod=mod, args=args, widths=widths, n_iters=40, batch=16, seed=11, source=rel,
        shrunk="d_model 1024 -> 16, ff 4096 -> 32, 6 -> 2 layers (4 heads kept), context MLP 1024 -> 16; "
               "fsq_scalars_per_prior_token 5 -> 2 (20 tokens, vocabulary 81); temperature 0.8 (top_p 0.9 kept); "
               "the frozen decoder is soma_fsq_tracker's",
    )


VARIANTS = [
    ("smpl_tracker", "PPO motion tracker built from the shipped smpl experiment config "
                     "(3 in_keys, 69 actions, 6+4 relu layers, EMA 0.999 normalizers, int clamp 5, fixed std)",
     v_smpl_tracker),
    ("g1_amp_deploy", "AMP tracker built from the shipped g1-bones-deploy experiment config "
                      "(learnable std, critic float clamp 5.0, discriminator and disc critic containers)",
     v_g1_amp_deploy),
    ("soma_tracker", "PPO max-coords tracker built from the shipped soma-bones experiment config "
                     "(soma23 robot, 66 actions, max_coords_obs + mimic_target_poses + previous_actions, "
                     "normalized_pd_fixed_gains_action with tanh)",
     v_soma_tracker),
    ("soma_fsq_tracker", "PPO FSQ tracker built from the shipped soma_bones_fsq experiment config "
                         "(actor mu_model FSQAutoEncoder: MLPWithConcat encoder over mimic_target_poses -> "
                         "40 scalars, tanh bound, round to 9 levels, decoder over max_coords_obs + codes; "
                         "Muon actor optimizer)",
     v_soma_fsq_tracker),
    ("soma_fsq_amp", "AMP FSQ tracker built from the shipped soma_bones_fsq_amp_muon experiment config "
                     "(FSQAutoEncoder actor over max_coords_obs + nearest_surface + codes, discriminator and "
                     "disc critic containers over historical_max_coords_obs)",
     v_soma_fsq_amp),
    ("layernorm_activations", "PPO: use_layer_norm on several layers (only layer 0 gets one), every "
                              "activation name get_activation_func accepts, mixed case, tanh/elu output "
                              "activations, learnable std moved off its init, EMA 0.99",
     v_layernorm_activations),
    ("welford_clamps", "PPO: Welford normalizers (norm_ema_decay None), float clamp 2.5 and no clamp (None); "
                       "save_inference_checkpoint on (inference_last.ckpt)",
     v_welford_clamps),
    ("container_obsprocessor", "PPO: actor and critic as ModuleContainers of ObsProcessor / MLPWithConcat "
                               "(int clamp 3, a non-normalizing ObsProcessor, chained MLPs)",
     v_container_obsprocessor),
    ("module_ops_ppo", "PPO: reshape by 'batch_size * 2' (norm_obs not stored: batch changes), sphere "
                       "projection, unsqueeze/squeeze around the forward (3-D forward path)",
     v_module_ops_ppo),
    ("module_ops_amp", "AMP: per-token reshape, permute, sphere projection, expand; discriminator with "
                       "LayerNorm and a Welford normalizer with clamp 3.5; reward normalizers on",
     v_module_ops_amp),
    ("masked_mimic", "MaskedMimic (VAE prior with a transformer over the current state, 5 masked future "
                     "target poses and 5 historical poses; trunk MLP over the latent), from the shipped "
                     "masked_mimic/transformer.py experiment, shrunk; trained by SupervisedAgent from a frozen "
                     "expert tracker (smpl PPO, shrunk)", v_masked_mimic),
    ("gpc_prior", "GPC prior (DiscreteAutoregressiveLatentPriorModel) built from the shipped gpc_prior/soma_bones "
                  "experiment config over the frozen soma_fsq_tracker decoder: context MLP (gelu, normalized) as "
                  "the sequence prefix, one-hot token Linear, learned positions, post-norm gelu transformer under "
                  "the context-prefix causal mask, logits head; mixed-radix tokens over 9 FSQ levels",
     v_gpc_prior),
]


# ------------------------------------------------------------ runtime pieces

class ObsSource:
    """Seeded observations with per-column means and scales."""

    def __init__(self, widths, seed, stream=0):
        self.widths = dict(widths)
        g = torch.Generator().manual_seed(1000 + seed)
        self.mean, self.scale = {}, {}
        for k, w in self.widths.items():
            self.mean[k] = (torch.rand(w, generator=g, dtype=torch.float64) * 6.0 - 3.0)
            self.scale[k] = torch.exp(torch.rand(w, generator=g, dtype=torch.float64)
                                      * (math.log(5.0) - math.log(0.05)) + math.log(0.05))
        # another stream: the same moments, other draws
        self.g = torch.Generator().manual_seed(2000 + seed + 100000 * stream)

    def sample(self, n):
        return {k: (self.mean[k] + self.scale[k] * torch.randn(n, w, generator=self.g, dtype=torch.float64)).float()
                for k, w in self.widths.items()}

    def eval_batch(self):
        g = torch.Generator().manual_seed(3000)
        out = {}
        for k, w in self.widths.items():
            m, s = self.mean[k], self.scale[k]
            rows = [m + s * torch.randn(w, generator=g, dtype=torch.float64) for _ in range(4)]
            rows.append(m + 10.0 * s)
            rows.append(m - 10.0 * s)
            rows.append(torch.zeros(w, dtype=torch.float64))
            rows.append(torch.tensor([1000.0 if i % 2 == 0 else -1000.0 for i in range(w)], dtype=torch.float64))
            out[k] = torch.stack(rows).float()
        return out


class StandInEnv:
    """What BaseAgent, the evaluator and setup() read from an env."""

    def __init__(self, cfgs, source, num_envs):
        self.num_envs = num_envs
        self.robot_config = cfgs["robot"]
        self.config = cfgs["env"]
        self.dt = 1.0 / 30.0
        self.motion_lib = SimpleNamespace(
            config=SimpleNamespace(motion_file_switch_mode=PM.MotionFileSwitchMode.FIXED),
            motion_file_shard_cycle=0,
        )
        self.motion_manager = None
        self.source = source

    def get_obs(self):
        return self.source.sample(self.num_envs)

    def get_task_id(self):
        return 0

    def get_state_dict(self):
        return {}


def make_agent(fabric, cfgs, source, root_dir):
    env = StandInEnv(cfgs, source, num_envs=cfgs["simulator"].num_envs)
    agent_cfg = cfgs["agent"]
    agent = PM.get_class(agent_cfg._target_)(fabric, env, agent_cfg, root_dir=root_dir)
    agent.setup()
    return agent


def agent_optimizers(agent):
    opts = [agent.actor_optimizer, agent.critic_optimizer]
    comp = getattr(agent, "amp_component", None)
    if comp is not None:
        opts.append(comp.discriminator_optimizer)
        if comp.use_disc_critic:
            opts.append(comp.disc_critic_optimizer)
    return opts


def train(agent, source, n_iters, batch, seed, target=None):
    """`target`: None (mean_action pulled to 0.3), or a function of the
    observation dict giving the mean_action to pull to."""
    g = torch.Generator().manual_seed(4000 + seed)
    torch.manual_seed(5000 + seed)  # PPOActor samples actions with the global RNG
    opts = agent_optimizers(agent)
    for _ in range(n_iters):
        agent.train()
        obs = source.sample(batch)
        td = agent.obs_dict_to_tensordict(obs)
        out = agent.model(td)
        if target is None:
            loss = (out["mean_action"] - 0.3).pow(2).mean() + 1e-2 * out["neglogp"].mean()
        else:
            loss = (out["mean_action"] - target(obs)).pow(2).mean()
        loss = loss + (out["value"] - 1.0).pow(2).mean()
        if "disc_logits" in out.keys():
            loss = loss + torch.nn.functional.softplus(-out["disc_logits"]).mean()
            loss = loss + (out["disc_value"] - 0.5).pow(2).mean()
        for o in opts:
            o.zero_grad(set_to_none=True)
        loss.backward()
        for o in opts:
            o.step()
    # reward normalizers and counters, as a run would have left them
    with torch.no_grad():
        norms = [agent.running_reward_norm]
        comp = getattr(agent, "amp_component", None)
        if comp is not None:
            norms.append(comp.running_reward_norm)
        for rn in norms:
            if rn is None:
                continue
            for _ in range(8):
                r = torch.randn(agent.num_envs, generator=g) * 0.5 + 1.0
                term = (torch.rand(agent.num_envs, generator=g) < 0.2)
                rn.record_reward(r, term)
        if agent.adv_mean_ema is not None:
            agent.adv_mean_ema.fill_(0.0625)
            agent.adv_std_ema.fill_(1.25)
    agent.current_epoch = n_iters
    agent.step_count = n_iters * batch
    agent.fit_start_time = FIXED_RUN_START_TIME
    agent.eval()


def eval_outputs(agent, obs):
    """Eval-mode forward; every NormObsBase's input and output via hooks."""
    model = agent.model
    model.eval()
    captured = {}
    handles = []
    for path, mod in model.named_modules():
        if isinstance(mod, PM.NormObsBase) and mod.config.normalize_obs:
            def hook(m, inp, out, path=path):
                captured[path] = (inp[0].detach().clone(), out.detach().clone())
            handles.append(mod.register_forward_hook(hook))
    fsq = {}
    for path, mod in model.named_modules():
        if type(mod).__name__ == "FSQAutoEncoder":
            # the encoder's raw output and the codes the decoder reads (the
            # TensorDict key is overwritten in place, so both are cloned here)
            def enc_hook(m, inp, out, path=path, ae=mod):
                fsq[f"fsq.{path}.encoder_out"] = out[ae.encoder_out_keys[0]].detach().clone()

            def dec_pre_hook(m, args, path=path, ae=mod):
                fsq[f"fsq.{path}.codes"] = args[0][ae.latent_key].detach().clone()
            handles.append(mod.encoder.register_forward_hook(enc_hook))
            handles.append(mod.decoder.register_forward_pre_hook(dec_pre_hook))
    try:
        td = agent.obs_dict_to_tensordict({k: v.clone() for k, v in obs.items()})
        torch.manual_seed(EVAL_SEED)
        with torch.no_grad():
            out = model(td)
    finally:
        for h in handles:
            h.remove()
    res = {}
    canonical = ["action", "mean_action", "neglogp", "value", "disc_logits", "disc_value"]
    for k in canonical:
        if k in out.keys():
            res[k] = out[k].detach().clone()
    actor = model._actor
    res["logstd"] = actor.logstd.detach().clone()
    res["std"] = torch.exp(actor.logstd.detach())
    if "disc_logits" in res:
        res["disc_reward"] = model._discriminator.compute_disc_reward(res["disc_logits"]).detach().clone()
    # other TensorDict outputs (container intermediates, mu_key); the
    # `norm_<in_keys[0]>` entries MLPWithConcat writes are left out: they
    # duplicate a normalizer output (or another module's, when two MLPs share
    # in_keys[0]: the later one overwrites it)
    for k in sorted(out.keys()):
        if k in obs or k in canonical or k.startswith("norm_"):
            continue
        res[f"td.{k}"] = out[k].detach().clone()
    mods = dict(model.named_modules())
    for k in sorted(fsq):
        if k.endswith(".codes"):
            continue
        ae = mods[k[len("fsq."):-len(".encoder_out")]]
        res[k] = fsq[k]
        # the bounded latent (tanh(e) * half_L) the rounding sees, and the
        # non-persistent buffer it is scaled by
        res[k.replace(".encoder_out", ".bounded")] = ae.bound(fsq[k]).detach().clone()
        res[k.replace(".encoder_out", ".half_L")] = ae.half_L.detach().clone()
    actor_codes = [k for k in sorted(fsq) if k.startswith("fsq._actor.") and k.endswith(".codes")]
    if actor_codes:
        res["latent_codes"] = fsq[actor_codes[0]]
    actor_norms = [p for p in captured if p.startswith("_actor.")]
    if actor_norms:
        res["norm_obs"] = captured[actor_norms[0]][1]
    for p, (i, o) in captured.items():
        # the normalizer's input is the concatenated in_keys unless module
        # operations ran before the forward
        parent = mods[p.rsplit(".", 1)[0]] if "." in p else model
        trivial = [type(op).__name__ for op in parent.config.module_operations] == ["ModuleOperationForwardConfig"]
        if not trivial:
            res[f"norm.{p}.in"] = i
        res[f"norm.{p}.out"] = o
    return res, captured


# ------------------------------------------------------------------ writing

def write_safetensors(path, tensors):
    """pm_reference.write_safetensors with this script's torch."""
    pm_reference.write_safetensors(torch, path, tensors)

def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def jsonable(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    return repr(v)


def describe_ops(op_list):
    out = []
    for op in op_list:
        d = {"op": type(op).__name__}
        for f in dataclasses.fields(op):
            d[f.name] = jsonable(getattr(op, f.name))
        out.append(d)
    return out


def describe_modules(model, widths, captured, norm_pre):
    """Every ProtoMotions TensorDict module and normalizer in forward-relevant
    detail, keyed by its path in the state dict."""
    mods = []
    for path, mod in model.named_modules():
        if not isinstance(mod, PM.TDModule):
            continue
        cfg = getattr(mod, "config", None)
        d = {"path": path, "class": f"{type(mod).__module__}.{type(mod).__name__}",
             "config_target": getattr(cfg, "_target_", None),
             "in_keys": list(getattr(mod, "in_keys", []) or []),
             "out_keys": list(getattr(mod, "out_keys", []) or [])}
        if isinstance(mod, (PM.MLPWithConcat, PM.ObsProcessor)):
            d["normalize_obs"] = bool(cfg.normalize_obs)
            d["norm_clamp_value"] = cfg.norm_clamp_value
            d["norm_clamp_value_type"] = type(cfg.norm_clamp_value).__name__
            d["norm_ema_decay"] = cfg.norm_ema_decay
            d["module_operations"] = describe_ops(cfg.module_operations)
            d["in_widths"] = {k: widths.get(k) for k in cfg.in_keys}
            if mod.norm is not None and cfg.normalize_obs and not hasattr(mod.norm.running_obs_norm, "mean"):
                d["normalizer"] = {"never_materialized": True,
                                   "why": "no Forward in module_operations: the normalizer is never called, "
                                          "so the lazy RunningMeanStd has no buffers and no state_dict keys"}
            elif mod.norm is not None and cfg.normalize_obs:
                rms = mod.norm.running_obs_norm
                np_ = f"{path}.norm" if path else "norm"
                d["normalizer"] = {
                    "state_dict_prefix": f"{np_}.running_obs_norm.",
                    "shape": list(rms.mean.shape), "epsilon": rms.epsilon,
                    "count": int(rms.count), "mode": "welford" if rms.ema_decay is None else "ema",
                    "clamped_elements_in_eval": norm_pre.get(np_, {}).get("clamped"),
                    "max_abs_pre_clamp_in_eval": norm_pre.get(np_, {}).get("max_abs"),
                }
        if isinstance(mod, PM.MLPWithConcat):
            d["num_out"] = cfg.num_out
            d["layers"] = [{"units": l.units, "activation": l.activation, "use_layer_norm": bool(l.use_layer_norm)}
                           for l in cfg.layers]
            d["output_activation"] = cfg.output_activation
            d["sequential"] = [f"{type(m).__name__}" + (f"({m.in_features}->{m.out_features})"
                                                          if isinstance(m, torch.nn.Linear) else
                                                          f"({list(m.normalized_shape)}, eps={m.eps})"
                                                          if isinstance(m, torch.nn.LayerNorm) else "")
                               for m in mod.mlp]
        if type(mod).__name__ == "PPOActor":
            d["num_out"] = cfg.num_out
            d["mu_key"] = cfg.mu_key
            d["actor_logstd"] = cfg.actor_logstd
            d["learnable_std"] = bool(cfg.learnable_std)
        mods.append(d)
    return mods


def norm_pre_clamp(captured, model):
    """For each normalizer: how many eval elements fell outside the clamp."""
    out = {}
    mods = dict(model.named_modules())
    for p, (inp, _o) in captured.items():
        rms = mods[p].running_obs_norm
        pre = (inp - rms.mean.float()) / torch.sqrt(rms.var.float() + rms.epsilon)
        c = rms.clamp_value
        out[p] = {"clamped": None if c is None else int((pre.abs() > c).sum()),
                  "max_abs": float(pre.abs().max())}
    return out


def run_variant(fabric, root, out_dir, name, desc, builder, verify):
    spec = builder(root)
    cfgs = spec["cfgs"]
    torch.manual_seed(spec["seed"])
    vdir = os.path.join(out_dir, name)
    if os.path.isdir(vdir):
        shutil.rmtree(vdir)
    os.makedirs(vdir)
    source = ObsSource(spec["widths"], spec["seed"])

    with tempfile.TemporaryDirectory() as scratch:
        agent = make_agent(fabric, cfgs, source, scratch)
        train(agent, source, spec["n_iters"], spec["batch"], spec["seed"])
        agent.save("last.ckpt")
        ckpt_files = ["last.ckpt"]
        if cfgs["agent"].save_inference_checkpoint:
            ckpt_files.append("inference_last.ckpt")
        for f in ckpt_files:
            shutil.copyfile(os.path.join(scratch, f), os.path.join(vdir, f))

    save_resolved_configs(cfgs, os.path.join(vdir, "resolved_configs.pt"))
    if spec.get("inference_cfgs") is not None:
        save_resolved_configs(spec["inference_cfgs"], os.path.join(vdir, "resolved_configs_inference.pt"))

    obs = source.eval_batch()
    expected, captured = eval_outputs(agent, obs)
    pre = norm_pre_clamp(captured, agent.model)
    write_safetensors(os.path.join(vdir, "obs.safetensors"), obs)
    write_safetensors(os.path.join(vdir, "expected.safetensors"), expected)

    verified = []
    if verify:
        loaded = torch.load(os.path.join(vdir, "resolved_configs.pt"), map_location="cpu", weights_only=False)
        for f, training_state in [(f, f == "last.ckpt") for f in ckpt_files]:
            with tempfile.TemporaryDirectory() as scratch:
                torch.manual_seed(999)  # different init: everything must come from the checkpoint
                again = make_agent(fabric, loaded, ObsSource(spec["widths"], spec["seed"] + 77), scratch)
                again.load(os.path.join(vdir, f), load_env=False, load_training_state=training_state)
                got, _ = eval_outputs(again, obs)
                assert sorted(got) == sorted(expected), (name, f, sorted(got), sorted(expected))
                for k in expected:
                    if not torch.equal(got[k], expected[k]):
                        raise SystemExit(f"{name}/{f}: {k} differs after agent.load")
                verified.append(f"{f} (load_training_state={training_state})")

    ck = torch.load(os.path.join(vdir, "last.ckpt"), map_location="cpu", weights_only=False)
    model_sd = ck["model"]
    files = {}
    for f in sorted(os.listdir(vdir)):
        p = os.path.join(vdir, f)
        files[f] = {"bytes": os.path.getsize(p), "sha256": sha256(p)}
    model = agent.model
    entry = {
        "name": name,
        "description": desc,
        "source": spec["source"],
        "shrunk": spec.get("shrunk"),
        "agent_target": cfgs["agent"]._target_,
        "model_target": cfgs["agent"].model._target_,
        "model_class": f"{type(model).__module__}.{type(model).__name__}",
        "model_in_keys": list(cfgs["agent"].model.in_keys),
        "model_out_keys": list(cfgs["agent"].model.out_keys),
        "obs_widths": dict(spec["widths"]),
        "real_obs_widths": spec.get("real_widths"),
        "action_size": int(model._actor.logstd.shape[0]),
        "actor_logstd_config": cfgs["agent"].model.actor.actor_logstd,
        "learnable_std": bool(cfgs["agent"].model.actor.learnable_std),
        "modules": describe_modules(model, spec["widths"], captured, pre),
        "checkpoint_top_level_keys": list(ck.keys()),
        "model_state_dict": {k: {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")}
                             for k, v in model_sd.items()},
        "saved_with": "BaseAgent.save (real code path; stand-in env, Fabric DDP/gloo on 1 CPU process)",
        "resolved_configs_with": "reproduction of train_agent.save_configs (torch.save of the 7-key dict)",
        "train": {"iters": spec["n_iters"], "batch": spec["batch"], "seed": spec["seed"],
                  "epoch": ck["epoch"], "step_count": ck["step_count"]},
        "eval": {"rows": EVAL_ROWS, "seed_before_forward": EVAL_SEED, "mode": "model.eval(), torch.no_grad()"},
        "expected": {k: {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")}
                     for k, v in sorted(expected.items())},
        "verified_reload": verified,
        "files": files,
    }
    return entry



# ------------------------------------------------------------ the GPC prior

GPC_SAMPLING = [(0.9, 0.8), (0.5, 1.0), (0.99, 1.3)]  # (top_p, temperature) keep masks recorded


def gpc_eval(model, obs, tokens, gen_seed):
    """Teacher-forced eval forward with per-stage tensors, the keep masks of
    the sampler on its logits, and one seeded generation."""
    from protomotions.agents.common import autoregressive as AR
    model.eval()
    prior = model.prior
    res = {}
    captured = {}
    handles = []
    for path, m in model.named_modules():
        if isinstance(m, PM.NormObsBase) and m.config.normalize_obs:
            def hook(mm, inp, out, path=path):
                captured[path] = out.detach().clone()
            handles.append(m.register_forward_hook(hook))
    layers = {}
    for i, layer in enumerate(prior._transformer.layers):
        def lhook(mm, inp, out, i=i):
            layers[i] = out.detach().clone()
        handles.append(layer.register_forward_hook(lhook))
    try:
        with torch.no_grad():
            td = TensorDictCls({k: v.clone() for k, v in obs.items()}, batch_size=tokens.shape[0])
            td["target_latent"] = tokens.clone()
            torch.manual_seed(EVAL_SEED)
            out = model(td)
            # the same stages again, one by one, with the model's own methods
            ptd = model._prior_tensordict(td, tokens)
            context = prior.encode_context(ptd)
            token_emb = prior.encode_tokens(ptd[prior.token_key])
            seq = prior.add_positions(torch.cat([context.unsqueeze(1), token_emb], dim=1))
            fsq_indices = model.latent_tokenization.prior_tokens_to_fsq_indices(tokens)
            fsq_codes = model.latent_decoder.indices_to_codes(fsq_indices)
    finally:
        for h in handles:
            h.remove()
    logits = out["latent_logits"].detach().clone()
    res["logits"] = logits
    res["mean_action"] = out["mean_action"].detach().clone()
    res["prior_tokens"] = tokens.clone()
    res["stage.context_embedding"] = context
    res["stage.token_embedding"] = token_emb
    res["stage.sequence"] = seq
    for i in sorted(layers):
        res[f"stage.layer.{i}"] = layers[i]
    res["stage.causal_mask"] = prior._mask(tokens.shape[1], torch.device("cpu")).clone()
    res["stage.fsq_indices"] = fsq_indices
    res["stage.fsq_codes"] = fsq_codes
    for p, o in captured.items():
        res[f"norm.{p}.out"] = o
    # the sampler: probabilities and keep masks on these logits
    for top_p, temp in GPC_SAMPLING:
        tag = f"p{top_p}_t{temp}"
        probs = torch.nn.functional.softmax(logits / temp, dim=-1)
        res[f"sampling.{tag}.probs"] = probs
        res[f"sampling.{tag}.keep"] = AR._top_p_keep_mask(probs, top_p).to(torch.uint8)
        res[f"sampling.{tag}.logp"] = AR.sampling_log_probs(logits, p=top_p, temperature=temp)
    # a generation (its draws are torch's; the logits of each step given the
    # drawn prefix are what a reimplementation can match)
    with torch.no_grad():
        gtd = TensorDictCls({k: v.clone() for k, v in obs.items()}, batch_size=tokens.shape[0])
        torch.manual_seed(gen_seed)
        g = model(gtd)
    res["generate.tokens"] = g["latent"].detach().clone()
    res["generate.logits"] = g["latent_logits"].detach().clone()
    res["generate.mean_action"] = g["mean_action"].detach().clone()
    res.update(gpc_f64(model, obs, tokens))
    return res


def gpc_f64(model, obs, tokens):
    """The same teacher-forced stages in float64 (a double copy of the model;
    its float32 one-hot and mask made double): the reference the error
    bounds of the tests are measured against."""
    md = copy.deepcopy(model).double()
    md.eval()
    prior = md.prior
    vocab = prior.vocab_size
    one_hot = lambda t: torch.nn.functional.one_hot(t.long(), vocab).double()  # noqa: E731
    md.latent_tokenization.one_hot_prior_tokens = one_hot
    prior._one_hot_tokens = lambda t: one_hot(t) if t.dim() == 2 else t.double()  # noqa: E731
    n = tokens.shape[1]
    prior._causal_masks = {(n, torch.device("cpu")): prior._mask(n, torch.device("cpu")).double()}
    layers = {}
    hs = [layer.register_forward_hook(lambda m, i, o, k=k: layers.__setitem__(k, o.detach().clone()))
          for k, layer in enumerate(prior._transformer.layers)]
    try:
        with torch.no_grad():
            td = TensorDictCls({k: v.double() for k, v in obs.items()}, batch_size=tokens.shape[0])
            td["target_latent"] = tokens.clone()
            out = md(td)
            ptd = md._prior_tensordict(td, tokens)
            context = prior.encode_context(ptd)
    finally:
        for h in hs:
            h.remove()
    res = {"f64.logits": out["latent_logits"], "f64.mean_action": out["mean_action"],
           "f64.context_embedding": context}
    for k in sorted(layers):
        res[f"f64.layer.{k}"] = layers[k]
    return {k: v.detach().clone() for k, v in res.items()}


def run_gpc_prior(fabric, root, out_dir, name, desc, builder, verify):
    """Built with ProtoMotions' own classes (the model class named by the
    config, its pretrained-decoder loader), trained a few steps the way
    SupervisedAgent trains it (teacher-forced logits against the frozen
    tracker's target tokens, compute_supervision_loss with the config's
    loss, the config's AdamW on optimization_module(), gradient clipping):
    the agent loop itself (rollouts of the expert in a simulator) is not
    run. Saved as {"model": state_dict} with the inference configs
    (prepare_inference_config_for_save embeds the decoder's config)."""
    from tensordict import TensorDict
    from protomotions.agents.common.supervision import compute_supervision_loss
    global TensorDictCls
    TensorDictCls = TensorDict
    spec = builder(root)
    cfgs = spec["cfgs"]
    torch.manual_seed(spec["seed"])
    vdir = os.path.join(out_dir, name)
    if os.path.isdir(vdir):
        shutil.rmtree(vdir)
    os.makedirs(vdir)
    source = ObsSource(spec["widths"], spec["seed"])
    mcfg = cfgs["agent"].model
    model = PM.get_class(mcfg._target_)(config=mcfg)
    g = torch.Generator().manual_seed(4000 + spec["seed"])
    opt = None
    for _ in range(spec["n_iters"]):
        model.train()
        td = TensorDict(source.sample(spec["batch"]), batch_size=spec["batch"])
        model.target_latent_encoder(td)
        out = model(td)
        loss, _ = compute_supervision_loss(out, cfgs["agent"].loss)
        if opt is None:
            o = mcfg.optimizer
            opt = PM.get_class(o._target_)(model.optimization_module().parameters(), lr=o.lr,
                                           weight_decay=o.weight_decay, eps=o.eps, betas=o.betas)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.optimization_module().parameters(), cfgs["agent"].gradient_clip_val)
        opt.step()
    del g
    inf = inference_configs(cfgs, spec["mod"], spec["args"])
    assert not inf["agent"].model.latent_decoder.checkpoint_path
    save_resolved_configs(inf, os.path.join(vdir, "resolved_configs_inference.pt"))
    torch.save({"model": model.state_dict()}, os.path.join(vdir, "inference_last.ckpt"))

    ev = source.eval_batch()
    with torch.no_grad():
        etd = TensorDict({k: v.clone() for k, v in ev.items()}, batch_size=8)
        model.eval()
        model.target_latent_encoder(etd)
    n_tok = model.latent_tokenization.num_prior_tokens
    vocab = model.latent_tokenization.prior_token_vocab_size
    tg = torch.Generator().manual_seed(6000)
    tokens = etd["target_latent"].clone()
    # rows 4..7: drawn over the whole vocabulary, with its first and last entries
    rnd = torch.randint(0, vocab, (4, n_tok), generator=tg)
    rnd[0, 0], rnd[1, 1], rnd[2, 2], rnd[3, 3] = 0, vocab - 1, 0, vocab - 1
    tokens[4:] = rnd
    obs = {"max_coords_obs": ev["max_coords_obs"]}
    expected = gpc_eval(model, obs, tokens, gen_seed=EVAL_SEED + 1)
    write_safetensors(os.path.join(vdir, "obs.safetensors"), {"max_coords_obs": obs["max_coords_obs"],
                                                                "prior_tokens": tokens})
    write_safetensors(os.path.join(vdir, "expected.safetensors"), expected)

    verified = []
    if verify:
        loaded = torch.load(os.path.join(vdir, "resolved_configs_inference.pt"), map_location="cpu",
                            weights_only=False)
        torch.manual_seed(999)
        again = PM.get_class(loaded["agent"].model._target_)(config=loaded["agent"].model)
        sd = torch.load(os.path.join(vdir, "inference_last.ckpt"), map_location="cpu", weights_only=False)["model"]
        again.materialize_from_state_dict(sd)
        from protomotions.agents.utils.normalization import materialize_lazy_running_stats_from_state_dict
        materialize_lazy_running_stats_from_state_dict(again, sd)
        again.load_state_dict(sd, strict=True)
        got = gpc_eval(again, obs, tokens, gen_seed=EVAL_SEED + 1)
        assert sorted(got) == sorted(expected)
        for k in expected:
            if not torch.equal(got[k], expected[k]):
                raise SystemExit(f"{name}: {k} differs after reload from the inference configs")
        verified.append("inference_last.ckpt through resolved_configs_inference.pt (embedded decoder config, "
                        "load_state_dict strict)")

    files = {}
    for f in sorted(os.listdir(vdir)):
        p = os.path.join(vdir, f)
        files[f] = {"bytes": os.path.getsize(p), "sha256": sha256(p)}
    sd = model.state_dict()
    return {
        "name": name,
        "description": desc,
        "source": spec["source"],
        "shrunk": spec["shrunk"],
        "agent_target": cfgs["agent"]._target_,
        "model_target": mcfg._target_,
        "model_class": f"{type(model).__module__}.{type(model).__name__}",
        "model_in_keys": list(model.in_keys),
        "obs_widths": {"max_coords_obs": spec["widths"]["max_coords_obs"]},
        "modules": describe_modules(model, spec["widths"], {}, {}),
        "num_prior_tokens": n_tok,
        "vocab_size": vocab,
        "temperature": model.temperature,
        "top_p": model.top_p,
        "sampling_recorded": [{"top_p": p, "temperature": t} for p, t in GPC_SAMPLING],
        "model_state_dict": {k: {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")}
                             for k, v in sd.items()},
        "saved_with": "torch.save({'model': model.state_dict()}) (no agent: see run_gpc_prior)",
        "resolved_configs_with": "inference_configs (apply_all_inference_overrides, "
                                 "prepare_inference_config_for_save), train_agent.save_configs reproduction",
        "train": {"iters": spec["n_iters"], "batch": spec["batch"], "seed": spec["seed"],
                  "how": "teacher-forced compute_supervision_loss (config loss), AdamW on "
                         "optimization_module(), clip_grad_norm_(gradient_clip_val)"},
        "eval": {"rows": EVAL_ROWS, "tokens": "rows 0-3: the frozen tracker's target tokens of the eval rows; "
                 "rows 4-7: uniform over the vocabulary (with its first and last entries)",
                 "seed_before_forward": EVAL_SEED, "generation_seed": EVAL_SEED + 1,
                 "mode": "model.eval(), torch.no_grad()"},
        "expected": {k: {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")}
                     for k, v in sorted(expected.items())},
        "verified_reload": verified,
        "files": files,
    }


RUNNERS = {"masked_mimic": run_masked_mimic, "gpc_prior": run_gpc_prior}


# the manifest keys this recorder writes (any other key is another recorder's)
MANIFEST_KEYS = ("description", "reference", "torch", "tolerance_note", "variants")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--protomotions", required=True, help="checkout of github:NVlabs/ProtoMotions")
    ap.add_argument("--out", default=HERE)
    ap.add_argument("--reference-commit", default=None)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--no-verify", action="store_true")
    args = ap.parse_args()
    reexec_deterministic()
    root = os.path.abspath(args.protomotions)
    commit = reference_commit(root, args.reference_commit)
    import_reference(root)
    import logging
    logging.disable(logging.WARNING)

    fabric = PM.Fabric(**PM.FabricConfig(accelerator="cpu", devices=1, num_nodes=1, loggers=[],
                                         callbacks=[]).as_kwargs())
    fabric.launch()

    os.makedirs(args.out, exist_ok=True)
    manifest_path = os.path.join(args.out, "manifest.json")
    old, others = {}, {}
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            previous = json.load(f)
        if args.only:
            old = {v["name"]: v for v in previous["variants"]}
        # keys other recorders own (record_releases.py's release_variants) are kept
        others = {k: v for k, v in previous.items() if k not in MANIFEST_KEYS}
    entries = []
    for name, desc, builder in VARIANTS:
        if args.only and name not in args.only:
            if name in old:
                entries.append(old[name])
            continue
        print(f"== {name}", flush=True)
        runner = RUNNERS.get(name, run_variant)
        entries.append(runner(fabric, root, args.out, name, desc, builder, not args.no_verify))
        print(f"   {sum(f['bytes'] for f in entries[-1]['files'].values())} bytes; "
              f"verified: {entries[-1]['verified_reload']}", flush=True)
    manifest = {
        "description": "ProtoMotions policies saved by the real BaseAgent.save path, with eval-mode outputs; "
                       "see record_policy.py",
        "reference": {"repository": "github:NVlabs/ProtoMotions", "commit": commit},
        "torch": torch.__version__,
        "tolerance_note": "expected.* are float32 results of torch CPU kernels (1 thread); a reimplementation "
                          "should compare normalizer outputs tightly (a few ulp) and MLP outputs with a "
                          "relative tolerance",
        "variants": entries,
        **others,
    }
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    total = 0
    for dirpath, _, fnames in os.walk(args.out):
        for fn in fnames:
            total += os.path.getsize(os.path.join(dirpath, fn))
    print(f"total under {args.out}: {total} bytes")


if __name__ == "__main__":
    main()
