#!/usr/bin/env python3
"""Records older ProtoMotions releases' motion trackers through the deploy
loop, for pmstate's deploy tests of those releases (crates/deploy/tests/releases.rs).

usage: python testdata/deploy/record_releases_deploy.py --v31 PATH31 [--v30 PATH30]
           [--today PATH] [--commit-v31 SHA] [--commit-v30 SHA] [--commit-today SHA]

Run from the repository root. PATH31 is an extraction of github:NVlabs/ProtoMotions
at tag v3.1 (PATH30: v3.0); its `protomotions` package is imported from there at
run time, nothing of it is copied here. --today is a checkout of today's
release (default /work/pm): its `deployment/motion_utils.py` and
`deployment/tracker_inputs.py` are the runtime pmstate implements (the clip
resampled at the control period, the start-of-motion alignment, the future
references), which the older releases did not ship.

The commits default to the tags' (v3.1: 494e54d3..., v3.0: 56e49e7f...), for
extractions that are not git work trees. With --v30, v3.0's G1 and H1-2
trackers are recorded too (V30_CASES, record_v30_case), after the v3.1 case,
with v3.0's `protomotions` imported in place of v3.1's.

What is recorded, per case (v31_g1_tracker: v3.1's published
motion_tracker/g1-amass):
- a checkpoint built with THAT release's classes: its published
  `resolved_configs_inference.pt` loaded with its classes, the hidden units of
  the actor and critic shrunk (1024 -> 16: the robot's observation layout and
  action size are the published ones), `PPOModel(config)` built, its lazy
  layers materialised by an eval-mode forward, the normalizers' moments and
  the weights drawn from a seeded generator (recording moments in train mode
  needs a Fabric: `RunningMeanStd.record_moments` asks its world size);
  saved as `last.ckpt` with the keys of the release's
  `BaseAgent.get_state_dict` (model, epoch, step_count, run_start_time,
  best_evaluated_score; no agent is built: it needs a simulator), next to the
  shrunk configs as `resolved_configs_inference.pt` (torch.save of the same
  7-key dict the release saved).
- `inputs_b16` / `obs_b16` / `torch_b16`: sixteen seeded rows of every context
  key the actor's observation components read (v3.1's names), the release's own
  `ObservationManager.compute_observations` on them (eager: torch.compile is
  turned off through the module's TORCH_COMPILE_AVAILABLE, its documented
  fallback) and the actor's mean action and PD targets (the release's
  `build_pd_action_offset_scale` (on clones of the limits: it writes into the
  tensors it is given) and `_action_to_pd_targets` formula, after the env's
  `process_actions` clamp).
- `replay`: the deploy loop over a sensor stream, T steps on the synthetic
  clip: robot states drawn around the clip (every body's rotation and angular
  velocity, joints), the sensors a robot would read derived from them as the
  release's env derives its context (anchor rotation: body
  `anchor_body_index`; root-local angular velocity: `compute_local_ang_vel`
  of the root), the release's own `StateHistoryBuffer` (`reset_from_single_state`
  at the start, `rotate_and_update` after each step with the clamped action,
  as `BaseEnv.post_physics_step` does) for the historical keys, today's
  deployment runtime for the future references, the release's
  ObservationManager and the actor. `sensors.safetensors` holds what pmstate's
  tracker is fed; `replay.safetensors` the per-step observations, actions and
  PD targets.

Deterministic: one CPU thread, fixed seeds; safetensors headers without
__metadata__.

v3.0 (v30_g1_tracker, v30_h1_tracker: motion_tracker/g1-amass and
h1_2-amass): the same checkpoint recipe with v3.0's classes (its configs name
no anchor body: the root, body 0, is recorded as the anchor), and v3.0's own
observation code, which its Mimic env calls in code rather than through
components: `compute_humanoid_reduced_coords_observations` (with
`root_projected_gravity` of the root), its `HistoryBuffer` (current first;
`reset_hist_default`'s fill after a reset), `MimicObs.build_target_poses`
(max-coords-simple, with velocities and the time to each target; the stub env
it reads holds the motion clock, the clip lengths and `respawn_root_offset`)
and `Mimic.get_spawn_to_ref_pose_offset_with_terrain_height_correction` for
the realigned reference. `inputs_b16` is named by pipeline input (pmstate's
context paths: v3.0 has no context keys). The loop (30 steps) reads every
body's state around the clip, in the clip's frame (v3.0 does not rotate the
reference), offset by a constant xy; the reference one control step ahead
from today's player, shifted by the realignment `align_motion_with_humanoid`
sets after each step (the robot root's xy minus the reference root's), the
motion clock advanced in float32 as `MimicMotionManager` does. The G1 loop
runs on the synthetic clip; the H1-2 (29 bodies, 27 joints) on a seeded
clip of its own, `v30_h1_tracker/clip.motion` (write_clip).
"""
import argparse
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from pm_reference import reexec_deterministic, reference_commit, write_safetensors  # noqa: E402

SHRINK = {1024: 16}
B16_SEED = 12
REPLAY_SEED = 5
# case -> the release and its published model
CASES = {
    "v31_g1_tracker": {"release": "v3.1", "model": "motion_tracker/g1-amass"},
}
# v3.0's trackers (recorded with --v30): one runtime, two robots
V30_CASES = {
    "v30_g1_tracker": {"release": "v3.0", "model": "motion_tracker/g1-amass"},
    "v30_h1_tracker": {"release": "v3.0", "model": "motion_tracker/h1_2-amass"},
}
V30_B16_SEED = 14
V30_REPLAY_SEED = 6
# loop steps (each step's observations are ~1300 floats for the G1)
V30_REPLAY_STEPS = 30


def shrink_units(mlp_cfg):
    for layer in mlp_cfg.layers:
        layer.units = SHRINK.get(layer.units, layer.units)


def quat_mul(torch, a, b):
    x1, y1, z1, w1 = a.unbind(-1)
    x2, y2, z2, w2 = b.unbind(-1)
    return torch.stack([w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2, w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2,
                        w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2, w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2], -1)


def unit(torch, q):
    return q / q.norm(dim=-1, keepdim=True)


def build_model(cfg):
    """The release's PPOModel at the (shrunk) widths of `cfg`."""
    from protomotions.agents.ppo.model import PPOModel
    from tensordict import TensorDict
    return PPOModel(cfg["agent"].model), TensorDict


def materialise(torch, model, TensorDict, widths, seed):
    g = torch.Generator().manual_seed(seed)
    batch = {k: torch.randn(64, w, generator=g) for k, w in widths.items()}
    model.eval()
    with torch.no_grad():
        # lazy layers and normalizers take their shapes from one forward
        model(TensorDict(dict(batch), batch_size=[64]))
        # the normalizers' moments set from seeded draws (recording them in
        # train mode needs a Fabric: RunningMeanStd.record_moments asks its world size)
        for name, b in model.named_buffers():
            if name.endswith("running_obs_norm.mean"):
                b.copy_(torch.randn(b.shape, generator=g, dtype=b.dtype))
            elif name.endswith("running_obs_norm.var"):
                b.copy_((0.2 + torch.rand(b.shape, generator=g, dtype=b.dtype)) ** 2)
        for name, p in model.named_parameters():
            if "logstd" in name:
                continue
            p.copy_(torch.randn(p.shape, generator=g) * (1.5 / math.sqrt(max(1, p.shape[-1]))))
    model.eval()


def pd_offset_scale(torch, robot):
    from protomotions.simulator.base_simulator.utils import build_pd_action_offset_scale
    k = robot.kinematic_info
    # clones: on the CPU, `.cpu().numpy()` there shares the tensors' memory and
    # the function writes the widened limits back into the robot config's
    # (the configs saved here keep the published limits)
    return build_pd_action_offset_scale(k.hinge_axes_map, k.dof_limits_lower.clone(), k.dof_limits_upper.clone(),
                                        robot.control.action_scale, "cpu")


def record_case(args, torch, name, spec, outdir):
    rel_root = args.v31 if spec["release"] == "v3.1" else args.v30
    sys.path.insert(0, rel_root)
    import protomotions.envs.managers.observation_manager as om
    om.TORCH_COMPILE_AVAILABLE = False  # eager: the module's own fallback when torch.compile is absent
    from protomotions.envs.obs.state_history_buffer import StateHistoryBuffer
    from protomotions.envs.obs.humanoid import compute_local_ang_vel

    src = os.path.join(rel_root, "data/pretrained_models", spec["model"], "resolved_configs_inference.pt")
    cfg = torch.load(src, weights_only=False)
    shrink_units(cfg["agent"].model.actor.mu_model)
    shrink_units(cfg["agent"].model.critic)
    robot, env = cfg["robot"], cfg["env"]
    nd = robot.kinematic_info.num_dofs
    nb = len(robot.kinematic_info.body_names)
    anchor = robot.anchor_body_index
    hist = env.num_state_history_steps
    nfut = env.control_components["mimic"].num_future_steps
    actor_keys = list(cfg["agent"].model.actor.in_keys)
    comps = {k: env.observation_components[k] for k in actor_keys}
    obs_mgr = om.ObservationManager(comps, robot, torch.device("cpu"), 16, 0.02)
    offset, scale = pd_offset_scale(torch, robot)
    clamp = robot.control.clamp_actions

    def context(state, hb, future):
        """The env's context keys the actor reads (BaseEnv._get_global_context)."""
        root_rot = state["rot"][:, 0]
        return {
            "current_state_dof_pos": state["dof_pos"], "current_state_dof_vel": state["dof_vel"],
            "current_state_anchor_rot": state["rot"][:, anchor],
            "current_state_root_local_ang_vel": compute_local_ang_vel(root_rot, state["ang_vel"][:, 0]),
            "historical_dof_pos": hb.historical_dof_pos, "historical_dof_vel": hb.historical_dof_vel,
            "historical_root_rot": hb.historical_root_rot, "historical_anchor_rot": hb.historical_anchor_rot,
            "historical_root_local_ang_vel": compute_local_ang_vel(hb.historical_root_rot,
                                                                   hb.historical_root_ang_vel),
            "historical_actions": hb.historical_actions,
            **future,
        }

    def random_state(g, batch):
        q = unit(torch, torch.randn(batch, nb, 4, generator=g))
        return {"rot": q, "ang_vel": torch.randn(batch, nb, 3, generator=g),
                "pos": torch.randn(batch, nb, 3, generator=g), "vel": torch.randn(batch, nb, 3, generator=g),
                "dof_pos": torch.randn(batch, nd, generator=g), "dof_vel": torch.randn(batch, nd, generator=g)}

    def new_buffer(batch):
        return StateHistoryBuffer(num_envs=batch, num_history_steps=hist, num_bodies=nb, num_dofs=nd,
                                  action_dim=nd, num_contact_bodies=1, anchor_body_index=anchor,
                                  device=torch.device("cpu"))

    def push(hb, s, actions, reset=False):
        zeros_g = torch.zeros(s["dof_pos"].shape[0])
        contacts = torch.zeros(s["dof_pos"].shape[0], 1, dtype=torch.bool)
        kw = dict(rigid_body_pos=s["pos"], rigid_body_rot=s["rot"], rigid_body_vel=s["vel"],
                  rigid_body_ang_vel=s["ang_vel"], dof_pos=s["dof_pos"], dof_vel=s["dof_vel"],
                  ground_heights=zeros_g, body_contacts=contacts)
        if reset:
            hb.reset_from_single_state(env_ids=torch.arange(s["dof_pos"].shape[0]), **kw)
        else:
            hb.rotate_and_update(actions=actions, **kw)

    # widths of every model key, for materialising (critic keys: zeros of the published layout's widths)
    g = torch.Generator().manual_seed(B16_SEED)
    hb = new_buffer(16)
    first = random_state(g, 16)
    push(hb, first, None, reset=True)
    for _ in range(hist + 1):
        push(hb, random_state(g, 16), torch.randn(16, nd, generator=g).clamp(-clamp, clamp))
    cur = random_state(g, 16)
    future = {
        "mimic_ref_anchor_rot": unit(torch, torch.randn(16, nfut, 4, generator=g)),
        "mimic_ref_dof_pos": torch.randn(16, nfut, nd, generator=g),
        "mimic_ref_dof_vel": torch.randn(16, nfut, nd, generator=g),
    }
    ctx = context(cur, hb, future)
    obs_mgr.compute_observations(ctx)
    obs = obs_mgr.get_observations()
    widths = {k: v.shape[-1] for k, v in obs.items()}
    critic_w = {"max_coords_obs": 1 + 3 * (nb - 1) + 12 * nb, "historical_max_coords_obs": hist * (1 + 3 * (nb - 1) + 12 * nb),
                "mimic_max_coords_target_poses": nfut * nb * 24}
    model, TensorDict = build_model(cfg)
    materialise(torch, model, TensorDict, {**widths, **critic_w}, 3)

    def act(o):
        with torch.no_grad():
            td = model._actor.mu(TensorDict({k: o[k] for k in actor_keys}, batch_size=[o[actor_keys[0]].shape[0]]))
            mean = td[cfg["agent"].model.actor.mu_key]
        clamped = torch.clamp(mean, -clamp, clamp)  # BaseEnv.process_actions
        return mean, clamped, offset + scale * clamped  # BaseSimulator._action_to_pd_targets

    os.makedirs(outdir, exist_ok=True)
    mean, _, targets = act(obs)
    inputs = {k: v for k, v in ctx.items() if k != "historical_root_rot"}
    write_safetensors(torch, os.path.join(outdir, "inputs_b16.safetensors"), {k: v.contiguous() for k, v in inputs.items()})
    write_safetensors(torch, os.path.join(outdir, "obs_b16.safetensors"), obs)
    write_safetensors(torch, os.path.join(outdir, "torch_b16.safetensors"),
                      {"actions": mean, "joint_pos_targets": targets})

    # the checkpoint and its configs
    state = {"model": model.state_dict(), "epoch": 0, "step_count": 0, "run_start_time": 0.0,
             "best_evaluated_score": None}
    torch.save(state, os.path.join(outdir, "last.ckpt"))
    torch.save({k: cfg[k] for k in ("robot", "simulator", "terrain", "scene_lib", "motion_lib", "env", "agent")},
               os.path.join(outdir, "resolved_configs_inference.pt"))

    replay = record_replay(args, torch, outdir, nd, nb, anchor, nfut, context, act, new_buffer, push,
                           om.ObservationManager(comps, robot, torch.device("cpu"), 1, 0.02), actor_keys)
    return {
        "release": spec["release"], "published": spec["model"],
        "shrunk": "hidden units 1024 -> 16 (actor and critic); observation widths, history and action size as published",
        "history_steps": hist, "num_future_steps": nfut, "anchor_body_index": anchor,
        "observation_keys": actor_keys, "obs_widths": widths, "replay": replay,
    }


def record_replay(args, torch, outdir, nd, nb, anchor, nfut, context, act, new_buffer, push, obs_mgr, actor_keys):
    import numpy as np
    sys.path.insert(0, args.today)
    from deployment.motion_utils import MotionPlayer
    from deployment.tracker_inputs import align_future_motion_refs, init_tracker_alignment
    clip_path = os.path.join(HERE, "synthetic.motion")
    player = MotionPlayer(clip_path, control_dt=0.02)
    T = min(player.total_frames, 60)
    g = torch.Generator().manual_seed(REPLAY_SEED)
    yaw = 1.0
    q_yaw = torch.tensor([0.0, 0.0, math.sin(yaw / 2), math.cos(yaw / 2)])
    states = []
    for t in range(T):
        r = player.get_state_at_frame(t)
        rot = unit(torch, quat_mul(torch, q_yaw.expand(nb, 4), torch.from_numpy(r["body_rot"]).float())
                   + 0.02 * torch.randn(nb, 4, generator=g))
        states.append({
            "rot": rot.unsqueeze(0), "ang_vel": torch.randn(1, nb, 3, generator=g),
            "pos": torch.from_numpy(r["body_pos"]).float().unsqueeze(0), "vel": torch.zeros(1, nb, 3),
            "dof_pos": (torch.from_numpy(r["dof_pos"]).float() + 0.05 * torch.randn(nd, generator=g)).unsqueeze(0),
            "dof_vel": (torch.from_numpy(r["dof_vel"]).float() + 0.2 * torch.randn(nd, generator=g)).unsqueeze(0),
        })
    steps = list(range(1, nfut + 1))
    hb = new_buffer(1)
    rec = {}
    alignment = None
    from protomotions.envs.obs.humanoid import compute_local_ang_vel
    for t in range(T):
        s = states[t]
        if t == 0:
            push(hb, s, None, reset=True)
        anchor_rot = s["rot"][0, anchor].numpy()
        if alignment is None:
            alignment = init_tracker_alignment(
                robot_anchor_pos=np.zeros(3, np.float32), robot_anchor_rot=anchor_rot,
                motion_anchor_pos=player.get_state_at_frame(0)["body_pos"][anchor],
                motion_anchor_rot=player.get_state_at_frame(0)["body_rot"][anchor])
        fut = align_future_motion_refs(player.get_future_references(t, steps), alignment)
        future = {
            "mimic_ref_anchor_rot": torch.from_numpy(np.asarray(fut["body_rot"])[:, anchor]).float().unsqueeze(0),
            "mimic_ref_dof_pos": torch.from_numpy(np.asarray(fut["dof_pos"])).float().unsqueeze(0),
            "mimic_ref_dof_vel": torch.from_numpy(np.asarray(fut["dof_vel"])).float().unsqueeze(0),
        }
        ctx = context(s, hb, future)
        obs_mgr.compute_observations(ctx)
        obs = obs_mgr.get_observations()
        mean, clamped, targets = act(obs)
        for k in actor_keys:
            rec.setdefault(f"obs.{k}", []).append(obs[k][0])
        rec.setdefault("actions", []).append(mean[0])
        rec.setdefault("joint_pos_targets", []).append(targets[0])
        rec.setdefault("sensors.dof_pos", []).append(s["dof_pos"][0])
        rec.setdefault("sensors.dof_vel", []).append(s["dof_vel"][0])
        rec.setdefault("sensors.anchor_rot", []).append(s["rot"][0, anchor])
        rec.setdefault("sensors.root_local_ang_vel", []).append(
            compute_local_ang_vel(s["rot"][:, 0], s["ang_vel"][:, 0])[0])
        # BaseEnv.post_physics_step: the next state pushed with the action just applied
        if t + 1 < T:
            push(hb, states[t + 1], clamped)
    out = {k: torch.stack(v) for k, v in rec.items()}
    sensors = {k[len("sensors."):]: v for k, v in out.items() if k.startswith("sensors.")}
    write_safetensors(torch, os.path.join(outdir, "sensors.safetensors"), sensors)
    write_safetensors(torch, os.path.join(outdir, "replay.safetensors"),
                      {k: v for k, v in out.items() if not k.startswith("sensors.")})
    return {"clip": os.path.relpath(clip_path, ROOT), "frames": T, "control_dt": 0.02,
            "robot_anchor_start_pos": [0.0, 0.0, 0.0],
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def write_clip(torch, path, nb, nd, frames=25, fps=30):
    """A smooth seeded clip (torch.save of the RobotState dict a `.motion`
    holds) for a robot the synthetic G1 clip does not fit."""
    g = torch.Generator().manual_seed(21)
    t = torch.arange(frames, dtype=torch.float32).unsqueeze(-1) / fps
    phase, amp = torch.rand(1, nd, generator=g) * 6.283, 0.1 + 0.4 * torch.rand(1, nd, generator=g)
    dof_pos = amp * torch.sin(2.0 * t + phase)
    base = torch.randn(1, nb, 3, generator=g) * 0.3 + torch.tensor([0.0, 0.0, 0.8])
    pos = base + torch.stack([0.5 * t, 0.1 * torch.sin(t), 0.02 * torch.sin(3 * t)], -1)
    axis = torch.randn(1, nb, 3, generator=g)
    axis = axis / axis.norm(dim=-1, keepdim=True)
    ang = (0.3 * torch.sin(1.5 * t)).unsqueeze(-1) + torch.rand(1, nb, 1, generator=g)
    rot = torch.cat([axis * torch.sin(ang / 2), torch.cos(ang / 2)], -1)
    d = lambda x: torch.cat([(x[1:] - x[:-1]) * fps, (x[-1:] - x[-2:-1]) * fps])  # noqa: E731
    torch.save({"fps": fps, "dof_pos": dof_pos.contiguous(), "dof_vel": d(dof_pos).contiguous(),
                "rigid_body_pos": pos.contiguous(), "rigid_body_rot": rot.contiguous(),
                "rigid_body_vel": d(pos).contiguous(), "rigid_body_ang_vel": (axis * d(ang)).contiguous(),
                "rigid_body_contacts": torch.zeros(frames, nb, dtype=torch.bool)}, path)


def use_release(root, other):
    """Imports `protomotions` from `root` from here on: the other release's
    modules are dropped (both are one package name)."""
    for m in list(sys.modules):
        if m == "protomotions" or m.startswith("protomotions."):
            del sys.modules[m]
    if other in sys.path:
        sys.path.remove(other)
    sys.path.insert(0, root)


def record_v30_case(args, torch, name, spec, outdir):
    """v3.0's Mimic env observations by v3.0's own code: the reduced coords
    (`compute_humanoid_reduced_coords_observations`: `dof_to_obs` of the
    hinges, the root's world angular velocity, `root_projected_gravity` of
    the root), their `HistoryBuffer` (current first; after a reset every
    slot the first reading, as `reset_hist_default` sets it) and
    `MimicObs.build_target_poses` (max-coords-simple with velocities, the
    time to each target appended) of references offset by
    `Mimic.get_spawn_to_ref_pose_offset_with_terrain_height_correction`
    (flat terrain: the realignment's xy offset, z zero)."""
    from types import SimpleNamespace
    from protomotions.envs.utils.humanoid import (compute_humanoid_reduced_coords_observations,
                                                  compute_humanoid_max_coords_observations, root_projected_gravity)
    from protomotions.envs.obs.humanoid_obs import HistoryBuffer
    from protomotions.envs.obs.mimic_obs import MimicObs
    from protomotions.envs.mimic.env import Mimic
    from protomotions.utils.rotations import quat_rotate_inverse

    src = os.path.join(args.v30, "data/pretrained_models", spec["model"], "resolved_configs_inference.pt")
    cfg = torch.load(src, weights_only=False)
    shrink_units(cfg["agent"].model.actor.mu_model)
    shrink_units(cfg["agent"].model.critic)
    robot, env = cfg["robot"], cfg["env"]
    k = robot.kinematic_info
    nd, nb = k.num_dofs, len(k.body_names)
    anchor = 0  # v3.0 has no anchor body: its observations read the root (body 0)
    hist = env.humanoid_obs.reduced_coords_obs.num_historical_steps
    tp = env.mimic_obs.mimic_target_pose
    nfut = tp.num_future_steps
    dt = 0.02  # the env's dt: decimation / fps of the published simulator config
    sim = cfg["simulator"]
    assert abs(sim.sim.decimation / sim.sim.fps - dt) < 1e-12, (sim.sim.decimation, sim.sim.fps)
    actor_keys = list(cfg["agent"].model.actor.in_keys)
    offset, scale = pd_offset_scale(torch, robot)
    clamp = robot.control.clamp_actions

    def reduced(state):
        return compute_humanoid_reduced_coords_observations(
            dof_pos=state["dof_pos"], dof_vel=state["dof_vel"], root_ang_vel=state["ang_vel"][:, 0, :],
            root_projected_gravity=root_projected_gravity(state["rot"][:, 0], w_last=True),
            hinge_axes_map=k.hinge_axes_map, w_last=True)

    def stub_env(batch, times, lengths, realign):
        """What MimicObs and Mimic's offset read of the env: dt, the motion
        manager's times, the motion lib's lengths, the respawn offset."""
        return SimpleNamespace(
            num_envs=batch, device=torch.device("cpu"), dt=dt, skip_height_correction=True,
            respawn_root_offset=torch.cat([realign, torch.zeros(batch, 1)], -1),
            motion_manager=SimpleNamespace(motion_times=times, motion_ids=torch.arange(batch)),
            motion_lib=SimpleNamespace(get_motion_length=lambda ids: lengths[ids]))

    def targets(state, fut, times, lengths, realign):
        batch = state["dof_pos"].shape[0]
        e = stub_env(batch, times, lengths, realign)
        mo = MimicObs(env.mimic_obs, e)
        env_ids = torch.arange(batch)
        ids_rep = env_ids.unsqueeze(1).expand(-1, nfut).reshape(-1)
        gt = fut["pos"].reshape(batch * nfut, nb, 3).clone()
        gt += Mimic.get_spawn_to_ref_pose_offset_with_terrain_height_correction(e, gt, ids_rep)
        flat = lambda x, w: x.reshape(batch * nfut, nb, w)  # noqa: E731
        return mo.build_target_poses(tp.type, tp.with_velocities, state["pos"], state["rot"], state["vel"],
                                     state["ang_vel"], gt, flat(fut["rot"], 4), flat(fut["vel"], 3),
                                     flat(fut["ang_vel"], 3), torch.zeros(batch * nfut, 1), env_ids, nfut)

    def random_state(g, batch):
        return {"rot": unit(torch, torch.randn(batch, nb, 4, generator=g)),
                "ang_vel": torch.randn(batch, nb, 3, generator=g),
                "pos": torch.randn(batch, nb, 3, generator=g), "vel": torch.randn(batch, nb, 3, generator=g),
                "dof_pos": torch.randn(batch, nd, generator=g), "dof_vel": torch.randn(batch, nd, generator=g)}

    # sixteen seeded rows: the current state, hist - 1 past ones pushed through v3.0's HistoryBuffer
    g = torch.Generator().manual_seed(V30_B16_SEED)
    past = [random_state(g, 16) for _ in range(hist - 1)]  # oldest first
    cur = random_state(g, 16)
    hb = None
    for s in past + [cur]:
        o = reduced(s)
        if hb is None:
            hb = HistoryBuffer(hist, 16, shape=(o.shape[-1],), device="cpu")
            hb.set_curr(o)
            hb.set_hist(hb.get_current())  # reset_hist_default
        else:
            hb.rotate()
            hb.set_curr(o)
    fut = {"pos": torch.randn(16, nfut, nb, 3, generator=g), "rot": unit(torch, torch.randn(16, nfut, nb, 4, generator=g)),
           "vel": torch.randn(16, nfut, nb, 3, generator=g), "ang_vel": torch.randn(16, nfut, nb, 3, generator=g)}
    times = torch.rand(16, generator=g) * 2.0
    # half the rows' clips end before the next target: the time is clamped
    lengths = times + torch.rand(16, generator=g) * 2.0 * nfut * dt
    realign = torch.randn(16, 2, generator=g)
    obs = {"reduced_coords_obs": reduced(cur), "historical_reduced_coords_obs": hb.get_all_flattened().clone(),
           "mimic_target_poses": targets(cur, fut, times, lengths, realign)}
    obs = {kk: obs[kk] for kk in actor_keys}
    widths = {kk: v.shape[-1] for kk, v in obs.items()}
    mc = compute_humanoid_max_coords_observations(cur["pos"], cur["rot"], cur["vel"], cur["ang_vel"], torch.zeros(16),
                                                  torch.zeros(16, 1, dtype=torch.bool), True, True, False, True)
    critic_w = {"max_coords_obs": mc.shape[-1], "historical_max_coords_obs": hist * mc.shape[-1]}
    model, TensorDict = build_model(cfg)
    materialise(torch, model, TensorDict, {**widths, **critic_w}, 3)

    def act(o):
        with torch.no_grad():
            td = model._actor.mu(TensorDict({kk: o[kk] for kk in actor_keys}, batch_size=[o[actor_keys[0]].shape[0]]))
            mean = td[cfg["agent"].model.actor.mu_key]
        clamped = torch.clamp(mean, -clamp, clamp)  # BaseEnv.process_actions
        return mean, clamped, offset + scale * clamped  # the simulator's PD targets

    def past_rows(f):
        return torch.stack([f(s) for s in reversed(past)], 1)  # newest first

    inputs = {
        "current_dof_pos": cur["dof_pos"], "current_dof_vel": cur["dof_vel"],
        "current_rigid_body_pos": cur["pos"], "current_rigid_body_rot": cur["rot"],
        "current_rigid_body_vel": cur["vel"], "current_rigid_body_ang_vel": cur["ang_vel"],
        "historical_dof_pos": past_rows(lambda s: s["dof_pos"]), "historical_dof_vel": past_rows(lambda s: s["dof_vel"]),
        "historical_root_rot": past_rows(lambda s: s["rot"][:, 0]),
        "historical_root_ang_vel": past_rows(lambda s: s["ang_vel"][:, 0]),
        "mimic_future_pos": fut["pos"], "mimic_future_rot": fut["rot"], "mimic_future_vel": fut["vel"],
        "mimic_future_ang_vel": fut["ang_vel"], "mimic_realign_offset": realign,
        "mimic_motion_time": times.unsqueeze(-1), "mimic_motion_length": lengths.unsqueeze(-1),
    }
    os.makedirs(outdir, exist_ok=True)
    mean, _, pd = act(obs)
    write_safetensors(torch, os.path.join(outdir, "inputs_b16.safetensors"), {kk: v.contiguous() for kk, v in inputs.items()})
    write_safetensors(torch, os.path.join(outdir, "obs_b16.safetensors"), {kk: v.contiguous() for kk, v in obs.items()})
    write_safetensors(torch, os.path.join(outdir, "torch_b16.safetensors"), {"actions": mean, "joint_pos_targets": pd})
    state = {"model": model.state_dict(), "epoch": 0, "step_count": 0, "run_start_time": 0.0,
             "best_evaluated_score": None}
    torch.save(state, os.path.join(outdir, "last.ckpt"))
    torch.save({kk: cfg[kk] for kk in ("robot", "simulator", "terrain", "scene_lib", "motion_lib", "env", "agent")},
               os.path.join(outdir, "resolved_configs_inference.pt"))

    # the loop: the robot's readings around the clip (in the clip's frame:
    # v3.0 does not rotate the reference), the reference one step ahead
    import numpy as np
    sys.path.insert(0, args.today)
    from deployment.motion_utils import MotionPlayer
    clip_path = os.path.join(HERE, "synthetic.motion")
    raw = torch.load(clip_path, weights_only=False)
    if raw["dof_pos"].shape[-1] != nd or raw["rigid_body_pos"].shape[1] != nb:
        # the synthetic clip is the G1's: other robots get one of their own
        clip_path = os.path.join(outdir, "clip.motion")
        write_clip(torch, clip_path, nb, nd)
    player = MotionPlayer(clip_path, control_dt=dt)
    T = min(player.total_frames, V30_REPLAY_STEPS)
    # the clip's length as v3.0's motion lib and the player take it: (frames - 1) / fps
    raw = torch.load(clip_path, weights_only=False)
    length = np.float32((1.0 / float(raw["fps"])) * (raw["rigid_body_pos"].shape[0] - 1))
    g = torch.Generator().manual_seed(V30_REPLAY_SEED)
    states = []
    for t in range(T):
        r = player.get_state_at_frame(t)
        states.append({
            "rot": unit(torch, torch.from_numpy(r["body_rot"]).float() + 0.02 * torch.randn(nb, 4, generator=g)).unsqueeze(0),
            "ang_vel": (torch.from_numpy(r["body_ang_vel"]).float() + 0.2 * torch.randn(nb, 3, generator=g)).unsqueeze(0),
            "pos": (torch.from_numpy(r["body_pos"]).float() + torch.tensor([0.3, -0.2, 0.0])
                    + 0.01 * torch.randn(nb, 3, generator=g)).unsqueeze(0),
            "vel": (torch.from_numpy(r["body_vel"]).float() + 0.1 * torch.randn(nb, 3, generator=g)).unsqueeze(0),
            "dof_pos": (torch.from_numpy(r["dof_pos"]).float() + 0.05 * torch.randn(nd, generator=g)).unsqueeze(0),
            "dof_vel": (torch.from_numpy(r["dof_vel"]).float() + 0.2 * torch.randn(nd, generator=g)).unsqueeze(0),
        })
    motion_times = torch.zeros(1)
    lengths = torch.tensor([float(length)])
    hb = None
    realign = None
    rec = {}
    for t in range(T):
        s = states[t]
        ref_root = lambda f: torch.from_numpy(player.get_state_at_frame(f)["body_pos"][0]).float()  # noqa: E731
        if realign is None:
            # after a reset the robot stands where the reference is offset to
            realign = (s["pos"][0, 0, :2] - ref_root(t)[:2]).unsqueeze(0)
        o = reduced(s)
        if hb is None:
            hb = HistoryBuffer(hist, 1, shape=(o.shape[-1],), device="cpu")
            hb.set_curr(o)
            hb.set_hist(hb.get_current())
        else:
            hb.rotate()
            hb.set_curr(o)
        futs = player.get_future_references(t, list(range(1, nfut + 1)))
        fut = {kk: torch.from_numpy(np.asarray(futs[src])).float().unsqueeze(0)
               for kk, src in (("pos", "body_pos"), ("rot", "body_rot"), ("vel", "body_vel"), ("ang_vel", "body_ang_vel"))}
        ob = {"reduced_coords_obs": o, "historical_reduced_coords_obs": hb.get_all_flattened().clone(),
              "mimic_target_poses": targets(s, fut, motion_times, lengths, realign)}
        mean, clamped, pd = act(ob)
        for kk in actor_keys:
            rec.setdefault(f"obs.{kk}", []).append(ob[kk][0])
        rec.setdefault("actions", []).append(mean[0])
        rec.setdefault("joint_pos_targets", []).append(pd[0])
        for kk, v in (("dof_pos", s["dof_pos"][0]), ("dof_vel", s["dof_vel"][0]), ("anchor_rot", s["rot"][0, anchor]),
                      ("root_local_ang_vel", quat_rotate_inverse(s["rot"][:, 0], s["ang_vel"][:, 0], True)[0]),
                      ("body_pos", s["pos"][0]), ("body_rot", s["rot"][0]), ("body_vel", s["vel"][0]),
                      ("body_ang_vel", s["ang_vel"][0])):
            rec.setdefault(f"sensors.{kk}", []).append(v)
        # BaseEnv.post_physics_step: the reference realigned with the robot
        # (align_motion_with_humanoid), then the motion manager's clock
        realign = (s["pos"][0, 0, :2] - ref_root(t)[:2]).unsqueeze(0)
        motion_times += dt
    out = {kk: torch.stack(v) for kk, v in rec.items()}
    write_safetensors(torch, os.path.join(outdir, "sensors.safetensors"),
                      {kk[len("sensors."):]: v.contiguous() for kk, v in out.items() if kk.startswith("sensors.")})
    write_safetensors(torch, os.path.join(outdir, "replay.safetensors"),
                      {kk: v.contiguous() for kk, v in out.items() if not kk.startswith("sensors.")})
    return {
        "release": spec["release"], "published": spec["model"],
        "shrunk": "hidden units 1024 -> 16 (actor and critic); observation widths, history and action size as published",
        "history_steps": hist, "num_future_steps": nfut, "anchor_body_index": anchor,
        "observation_keys": actor_keys, "obs_widths": widths,
        "replay": {"clip": os.path.relpath(clip_path, ROOT), "frames": T, "control_dt": dt,
                   "motion_length": float(length), "robot_offset_from_clip": [0.3, -0.2, 0.0],
                   "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()},
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--v31", required=True)
    ap.add_argument("--v30")
    ap.add_argument("--today", default="/work/pm")
    ap.add_argument("--commit-v31", default="494e54d318228e16b4438d83f5e5a8c4e1167827")
    ap.add_argument("--commit-v30", default="56e49e7f4443fb06085fae9a2eed825f0d3e85b7")
    ap.add_argument("--commit-today", help="the commit of --today when it is not a git work tree "
                    "(default: the one record_deploy.py recorded against, manifest.json's reference)")
    args = ap.parse_args()
    reexec_deterministic()
    if os.path.abspath(os.getcwd()) != ROOT:
        raise SystemExit(f"run from the repository root ({ROOT})")
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    manifest_path = os.path.join(HERE, "manifest.json")
    with open(manifest_path) as f:
        manifest = json.load(f)
    releases = manifest.setdefault("releases", {
        "description": "older releases' trackers through the deploy loop; see record_releases_deploy.py"})
    releases["description"] = "older releases' trackers through the deploy loop; see record_releases_deploy.py"
    releases["references"] = {
        "v3.1": {"repository": "github:NVlabs/ProtoMotions", "tag": "v3.1",
                 "commit": reference_commit(args.v31, args.commit_v31)},
        "today_runtime": {"repository": "github:NVlabs/ProtoMotions",
                          "commit": reference_commit(args.today, args.commit_today or manifest["reference"]["commit"])},
    }
    releases["torch"] = torch.__version__
    cases = releases.setdefault("cases", {})
    for name, spec in CASES.items():
        cases[name] = record_case(args, torch, name, spec, os.path.join(HERE, name))
    releases.pop("not_recorded", None)
    if args.v30:
        releases["references"]["v3.0"] = {"repository": "github:NVlabs/ProtoMotions", "tag": "v3.0",
                                         "commit": reference_commit(args.v30, args.commit_v30)}
        use_release(args.v30, args.v31)
        for name, spec in V30_CASES.items():
            cases[name] = record_v30_case(args, torch, name, spec, os.path.join(HERE, name))
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
