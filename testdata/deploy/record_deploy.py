#!/usr/bin/env python3
"""Records ProtoMotions' unified deployment pipeline (sensors -> observations ->
actor -> PD targets) for the deploy tests of pmstate.

usage: python testdata/deploy/record_deploy.py --protomotions PATH [--out DIR]
           [--reference-commit SHA] [--only NAME ...]

Run from the repository root. PATH is a checkout of github:NVlabs/ProtoMotions
(recorded against commit 607ca7a0bb92e261120bcab8d9f97f28b3130ffc); its
`protomotions` package and `deployment/export_bm_tracker_onnx.py` are imported
from PATH at run time, nothing of them is copied here. Needs torch,
tensordict (0.9), onnx, onnxruntime, pyyaml, lightning.

What is recorded, per variant (g1_amp_deploy, the AMP tracker that
testdata/policy/record_policy.py builds from the shipped g1-bones-deploy
experiment config, and soma_tracker, the max-coords PPO tracker it builds
from the shipped soma-bones config, both at shrunk widths):
- the REAL exporter, `export_bm_tracker_onnx.export_tracker(checkpoint, ...)`,
  run on the committed checkpoint, with the checkpoint path given relative to
  the repository root (the YAML records it). Its `unified_pipeline.yaml` is
  committed as `contract.yaml`; the ONNX graph is not (it is rebuilt from the
  checkpoint by anyone who reruns this script).
- the exporter's own torch module: `torch.onnx.export` is wrapped while the
  exporter runs so that the `UnifiedPipelineModule` it exports is kept, then
  run in eval mode under no_grad (`torch_<case>.safetensors`), with its
  observation module's outputs (`obs_<case>.safetensors`, one tensor per
  observation key, in the order the actor reads them).
- onnxruntime (CPU provider, one thread) on the exported graph
  (`ort_<case>.safetensors`).
- for soma_tracker, the max-coords observation functions called directly on
  the b16 inputs with other parameters and anchor bodies than the pipeline's
  (`functions_b16.safetensors`, see record_functions).
- the inputs (`inputs_<case>.safetensors`), named exactly as the graph's
  inputs. Cases: b1 (one row) and b16 (sixteen rows), seeded. The anchor
  rotations include identity, w < 0, upside down (180 deg about x), pitched
  +-90 deg (the anchor's x axis vertical: the heading is atan2 of two
  near-zero numbers) and 1e-3 rad from those; the future anchor rotations
  likewise; joint values N(0, 1) and a few large ones.

The runtime around the graph (g1 only): ProtoMotions' deployment loop
(`deployment/test_tracker_mujoco.py`'s per-step body, without the simulator)
run by this script over a recorded sensor stream, with its own
`deployment.motion_utils.MotionPlayer` and `deployment.tracker_inputs`
(`init_tracker_alignment`, `align_future_motion_refs`,
`build_tracker_onnx_inputs`). The clip is synthetic (`synthetic.motion`,
written here in the `.motion` format: a torch.save dict of fps, dof_pos,
dof_vel, rigid_body_*), because the clips ProtoMotions ships are retargeted
from motion-capture datasets whose licences forbid redistribution here; it
has 30 fps source frames (resampled to 50 Hz), a slerp across a sign flip
(q and -q) and a near-identical pair. With `--runtime-clip PATH --out DIR`
the same is recorded on another clip (ProtoMotions' own
examples/data/g1_crouch_to_run.motion) into a scratch folder, not committed:
crates/deploy/tests/replay.rs runs this when PMSTATE_PYTHON and
PMSTATE_PROTOMOTIONS are set and compares pmstate with it. The sensors (`sensors.safetensors`:
dof_pos, dof_vel, anchor_rot, root_local_ang_vel, anchor_pos, each [T, ...])
follow the reference with noise, from a start heading 1 rad away and a start
position elsewhere, so the start-of-motion alignment matters. Recorded
(`replay.safetensors`): the player's resampled arrays (`player.*`), every
step's graph inputs (`inputs.<name>`, [T, ...]), and torch's and
onnxruntime's outputs per step (`torch.*`, `ort.*`), the PD targets fed
back as `historical.processed_actions` as the loop does; and the same loop
with the output EMA filter at alpha 0.8 (`ema.torch.joint_pos_targets`).

Two gaps of the exporter are patched AT RUN TIME for soma_tracker (nothing of
ProtoMotions is modified on disk; g1_amp_deploy is exported unpatched: the
patches are installed only while a variant that needs them runs):
- `_MockHistorical` has `processed_actions` but no `actions`, so the
  exporter's MockContext cannot resolve soma's `historical.actions` binding
  (previous_actions_factory(processed=False)). The patch adds
  `actions = torch.randn(num_envs, history_steps, num_dofs)`, the same shape
  and draw as `processed_actions`.
- `_build_yaml` has no descriptor branch for `current.rigid_body_pos/rot/
  vel/ang_vel` and `ground_heights`, and raises ("The exported graph has
  inputs this YAML cannot describe"). The patch wraps it: the original is
  called without those inputs, then an entry for each is inserted at its
  place in the graph's input order, with the kinds pmstate's contract uses
  (EXTRA_DESCRIPTORS below: `body_pos`, `body_rot`, `body_vel`,
  `body_ang_vel` with element names [body_names, axes], named after the
  exporter's reference_motion_body_* kinds; `ground_height` without element
  names), and `_runtime.onnx_in_names` restored to the full list. Every other
  field is the exporter's own.
The manifest lists the patches applied per variant (`exporter_patches`).
The exporter's free-text `source` notes on a few inputs (ProtoMotions' prose)
are removed from the committed contract.yaml, which is then dumped again as
the exporter dumps it; the manifest lists those inputs
(`contract_source_notes_removed`).

Deterministic: one CPU thread, fixed seeds; safetensors headers without
__metadata__, tensors sorted by element size then name.
"""
import argparse
import json
import math
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from pm_reference import reexec_deterministic, reference_commit, write_safetensors  # noqa: E402

VARIANTS = {
    "g1_amp_deploy": "testdata/policy/g1_amp_deploy/last.ckpt",
    "soma_tracker": "testdata/policy/soma_tracker/last.ckpt",
}
# variants whose observation functions are also recorded called directly
# (record_functions)
FUNCTION_CASES = {"soma_tracker"}
# variants the unpatched exporter cannot export (see the docstring)
NEEDS_PATCHES = {"soma_tracker"}
XYZ = ["x", "y", "z"]
XYZW = ["x", "y", "z", "w"]
# context key -> (kind, element names per axis after the batch axis, or None)
EXTRA_DESCRIPTORS = {
    "current.rigid_body_pos": ("body_pos", XYZ),
    "current.rigid_body_rot": ("body_rot", XYZW),
    "current.rigid_body_vel": ("body_vel", XYZ),
    "current.rigid_body_ang_vel": ("body_ang_vel", XYZ),
    "ground_heights": ("ground_height", None),
}
CASES = {"b1": (1, 11), "b16": (16, 12)}


def special_quats(torch):
    """Anchor rotations (xyzw) at the edges of the heading computation."""
    s = math.sqrt(0.5)
    e = 1e-3
    qs = [
        [0.0, 0.0, 0.0, 1.0],            # identity
        [0.0, 0.0, 0.0, -1.0],           # identity, w < 0
        [1.0, 0.0, 0.0, 0.0],            # upside down: 180 deg about x
        [0.0, 1.0, 0.0, 0.0],            # 180 deg about y
        [0.0, s, 0.0, s],                # pitched +90 deg: x axis straight down
        [0.0, -s, 0.0, s],               # pitched -90 deg: x axis straight up
        [math.sin(e / 2), 0.0, 0.0, math.cos(e / 2)],
        [0.0, math.sin(math.pi / 4 + e / 2), 0.0, math.cos(math.pi / 4 + e / 2)],
        [0.3, -0.2, 0.9, -0.25],         # w < 0, mostly yaw
    ]
    t = torch.tensor(qs, dtype=torch.float32)
    return t / t.norm(dim=-1, keepdim=True)


def random_quats(torch, g, shape, negate_half=True):
    q = torch.randn(*shape, 4, generator=g)
    q = q / q.norm(dim=-1, keepdim=True)
    if negate_half:
        flip = torch.rand(*shape, 1, generator=g) < 0.5
        q = torch.where(flip, -q, q)
    return q


def make_inputs(torch, keys_to_shapes, batch, seed):
    """One tensor per context key, batch rows, the specials spread over rows."""
    g = torch.Generator().manual_seed(seed)
    special = special_quats(torch)
    out = {}
    for key, shape in keys_to_shapes.items():
        full = [batch] + list(shape[1:])
        if key.endswith("_rot"):
            q = random_quats(torch, g, full[:-1])
            flat = q.reshape(batch, -1, 4)
            offset = 0 if key.startswith("current") else 3
            for r in range(batch):
                # row r's first rotation is a special one, cycling through them
                flat[r, 0] = special[(r + offset) % len(special)] if batch > 1 else special[8]
            out[key] = flat.reshape(full).contiguous()
        else:
            t = torch.randn(*full, generator=g)
            if batch > 1:
                t.view(batch, -1)[batch - 1, :: max(1, t[0].numel() // 5)] *= 40.0
            out[key] = t
    return out


def install_patches(torch, exporter):
    """The two run-time fixes (see the docstring); returns an undo function
    and the list of what was patched, for the manifest."""
    mock_cls = exporter._MockHistorical
    real_init = mock_cls.__init__
    real_build = exporter._build_yaml

    def init(self, num_envs, history_steps, num_dofs):
        real_init(self, num_envs, history_steps, num_dofs)
        self.actions = torch.randn(num_envs, history_steps, num_dofs)

    def build(**kw):
        names = list(kw["onnx_in_names"])
        to_key = kw["onnx_name_to_key"]
        extra = [n for n in names if to_key.get(n, n) in EXTRA_DESCRIPTORS]
        content = real_build(**dict(kw, onnx_in_names=[n for n in names if n not in extra]))
        described = {e["name"]: e for e in content["policy_inputs"]}
        for n in extra:
            key = to_key.get(n, n)
            kind, axes = EXTRA_DESCRIPTORS[key]
            entry = {"name": n, "key": key, "shape": kw["input_shapes"].get(key, "unknown"), "kind": kind}
            if axes is not None:
                entry["element_names"] = [kw["body_names"], axes]
            described[n] = entry
        content["policy_inputs"] = [described[n] for n in names]
        content["_runtime"]["onnx_in_names"] = names
        return content

    mock_cls.__init__ = init
    exporter._build_yaml = build

    def undo():
        mock_cls.__init__ = real_init
        exporter._build_yaml = real_build

    patches = [
        "export_bm_tracker_onnx._MockHistorical: adds `actions` (randn [num_envs, history_steps, num_dofs])",
        "export_bm_tracker_onnx._build_yaml: descriptors for " + ", ".join(
            f"{k} (kind {v[0]})" for k, v in EXTRA_DESCRIPTORS.items()) + "; everything else is the original's",
    ]
    return undo, patches


def import_exporter(protomotions):
    """ProtoMotions' deployment/export_bm_tracker_onnx.py, imported from the
    checkout at `protomotions` (also used by record_sim.py)."""
    sys.path.insert(0, protomotions)
    sys.path.insert(0, os.path.join(protomotions, "deployment"))
    import export_bm_tracker_onnx as exporter
    return exporter


def export_pipeline(exporter, ckpt_rel, output_dir):
    """The exporter run on `ckpt_rel` (relative to the repository root: the
    YAML records it) into `output_dir`; returns the path of the .onnx graph,
    whose unified_pipeline.yaml lies next to it (also used by record_sim.py)."""
    return exporter.export_tracker(checkpoint=ckpt_rel, output_dir=output_dir, validate=True)


def record(args, torch, name, ckpt_rel, outdir):
    exporter = import_exporter(args.protomotions)
    undo, patches = (install_patches(torch, exporter) if name in NEEDS_PATCHES else (lambda: None, []))
    try:
        on_case = record_functions if name in FUNCTION_CASES else None
        entry = record_with(args, torch, exporter, ckpt_rel, outdir, on_case, name)
    finally:
        undo()
    if patches:
        entry["exporter_patches"] = patches
    return entry


def record_functions(torch, outdir, case, ctx):
    """The max-coords observation functions called directly (not through the
    exporter) on the b16 inputs with the parameters and anchor indices the
    exported pipeline does not exercise (its anchor is body 0, local_obs and
    with_velocities on): one tensor per call in functions_b16.safetensors."""
    if case != "b16":
        return None
    from protomotions.envs.obs.humanoid import compute_humanoid_max_coords_observations
    from protomotions.envs.obs.target_poses import build_max_coords_target_poses
    out = {}
    with torch.no_grad():
        for local, height, anchor in [(True, True, 5), (False, True, 5), (True, False, 22), (False, False, 0)]:
            out[f"max_coords_l{int(local)}_h{int(height)}_a{anchor}"] = compute_humanoid_max_coords_observations(
                body_pos=ctx["current.rigid_body_pos"], body_rot=ctx["current.rigid_body_rot"],
                body_vel=ctx["current.rigid_body_vel"], body_ang_vel=ctx["current.rigid_body_ang_vel"],
                ground_height=ctx["ground_heights"], body_contacts=None, local_obs=local,
                root_height_obs=height, observe_contacts=False, w_last=True, anchor_body_index=anchor)
        for vel, rel, anchor in [(True, True, 5), (False, True, 5), (True, False, 22), (False, False, 0)]:
            out[f"targets_v{int(vel)}_r{int(rel)}_a{anchor}"] = build_max_coords_target_poses(
                current_state_body_pos=ctx["current.rigid_body_pos"],
                current_state_body_rot=ctx["current.rigid_body_rot"],
                current_state_body_vel=ctx["current.rigid_body_vel"],
                current_state_body_ang_vel=ctx["current.rigid_body_ang_vel"],
                mimic_ref_pos=ctx["mimic.future_pos"], mimic_ref_rot=ctx["mimic.future_rot"],
                mimic_ref_vel=ctx["mimic.future_vel"], mimic_ref_ang_vel=ctx["mimic.future_ang_vel"],
                with_velocities=vel, w_last=True, future_steps=[1], with_relative=rel,
                anchor_body_index=anchor)
    write_safetensors(torch, os.path.join(outdir, f"functions_{case}.safetensors"), out)
    return sorted(out)


def record_with(args, torch, exporter, ckpt_rel, outdir, on_case=None, name=None):
    import yaml
    import onnxruntime as ort

    os.makedirs(outdir, exist_ok=True)
    captured = {}
    real_export = torch.onnx.export

    def capture(module, inputs, path, **kw):
        captured["module"] = module
        captured["input_names"] = list(kw["input_names"])
        return real_export(module, inputs, path, **kw)

    torch.onnx.export = capture
    with tempfile.TemporaryDirectory() as tmp:
        try:
            onnx_path = export_pipeline(exporter, ckpt_rel, tmp)
        finally:
            torch.onnx.export = real_export
        with open(os.path.join(tmp, "unified_pipeline.yaml")) as f:
            contract_text = f.read()
        contract = yaml.safe_load(contract_text)
        # the exporter's free-text `source` notes are ProtoMotions' prose, not
        # committed here: dropped, the YAML dumped again as the exporter dumps
        # it (only when there are any, so other contracts keep their bytes)
        sourced = [e["key"] for e in contract["policy_inputs"] if e.pop("source", None) is not None]
        if sourced:
            contract_text = yaml.dump(contract, default_flow_style=None, sort_keys=False)
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        session = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
        onnx_inputs = [(i.name, i.shape) for i in session.get_inputs()]
        onnx_outputs = [o.name for o in session.get_outputs()]
        runtime = None
        if name == "g1_amp_deploy":
            runtime = record_runtime(args, torch, captured["module"].eval(), contract, outdir, str(onnx_path))

    with open(os.path.join(outdir, "contract.yaml"), "w") as f:
        f.write(contract_text)

    unified = captured["module"].eval()
    obs_keys_in = unified.observation_module.get_input_keys()
    name_to_key = contract["_runtime"]["onnx_name_to_in_key"]
    shapes = {e["key"]: e["shape"] for e in contract["policy_inputs"]}
    # every context key the observation module takes, graph input or not
    mock_shapes = {}
    for k in obs_keys_in:
        if k in shapes:
            mock_shapes[k] = shapes[k]
    manifest_cases = {}
    for case, (batch, seed) in CASES.items():
        ctx = make_inputs(torch, {k: shapes[k] for k in obs_keys_in if k in shapes}, batch, seed)
        # context keys the graph dropped (unused by the actor's observations)
        # still take a tensor in the torch module: zeros of the mock's shape
        g = torch.Generator().manual_seed(seed + 100)
        full_args = []
        for k in obs_keys_in:
            if k in ctx:
                full_args.append(ctx[k])
            else:
                cur = exporter._resolve_attr_path(k, exporter.MockContext(
                    num_envs=batch, num_dofs=contract["robot"]["num_dofs"],
                    num_bodies=contract["robot"]["num_bodies"],
                    num_future_steps=len(contract["motion"]["future_step_indices"]),
                    anchor_idx=contract["robot"]["anchor_body_index"]))
                full_args.append(torch.randn(cur.shape, generator=g))
        with torch.no_grad():
            obs = unified.observation_module(*full_args)
            obs_named = dict(zip(unified.observation_module.get_output_keys(), obs))
            t_out = unified(*full_args)
        t_named = dict(zip(onnx_outputs, t_out))
        feeds = {n: ctx[name_to_key[n]].numpy() for n, _ in onnx_inputs}
        o_out = session.run(onnx_outputs, feeds)
        o_named = {n: torch.from_numpy(v) for n, v in zip(onnx_outputs, o_out)}
        inputs_named = {n: ctx[name_to_key[n]] for n, _ in onnx_inputs}
        write_safetensors(torch, os.path.join(outdir, f"inputs_{case}.safetensors"), inputs_named)
        write_safetensors(torch, os.path.join(outdir, f"obs_{case}.safetensors"), obs_named)
        write_safetensors(torch, os.path.join(outdir, f"torch_{case}.safetensors"), t_named)
        write_safetensors(torch, os.path.join(outdir, f"ort_{case}.safetensors"), o_named)
        diffs = {n: float((o_named[n] - t_named[n]).abs().max()) for n in onnx_outputs}
        manifest_cases[case] = {"batch": batch, "seed": seed, "max_abs_ort_minus_torch": diffs}
        called = on_case(torch, outdir, case, ctx) if on_case else None
        if called:
            manifest_cases[case]["functions"] = called
    return {
        "runtime": runtime,
        "checkpoint": ckpt_rel,
        "onnx_inputs": [n for n, _ in onnx_inputs],
        "onnx_outputs": onnx_outputs,
        "observation_keys": list(unified.observation_module.get_output_keys()),
        "cases": manifest_cases,
        **({"contract_source_notes_removed": sourced} if sourced else {}),
    }


def write_motion(torch, clip, path):
    """`clip` (a dict as synthetic_clip returns) written in ProtoMotions'
    .motion format: torch.save of the dict (also used by record_sim.py)."""
    torch.save(clip, path)


def synthetic_clip(torch, num_dofs, num_bodies, frames=97, fps=30, seed=21):
    """A smooth clip in ProtoMotions' .motion format."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(frames, dtype=torch.float64) / fps
    def waves(*shape):
        amp = torch.rand(*shape, generator=g, dtype=torch.float64) * 0.8
        freq = 0.3 + torch.rand(*shape, generator=g, dtype=torch.float64) * 2.0
        phase = torch.rand(*shape, generator=g, dtype=torch.float64) * 6.28
        arg = t.view(-1, *([1] * len(shape))) * freq + phase
        return amp * torch.sin(arg), amp * freq * torch.cos(arg)
    dof_pos, dof_vel = waves(num_dofs)
    pos, vel = waves(num_bodies, 3)
    pos = pos + torch.tensor([0.0, 0.0, 0.9], dtype=torch.float64)
    pos[:, :, 0] += 1.5 * t.view(-1, 1)                       # walks forward
    angle, ang_vel = waves(num_bodies)
    axis = torch.randn(num_bodies, 3, generator=g, dtype=torch.float64)
    axis = axis / axis.norm(dim=-1, keepdim=True)
    yaw = 0.4 * t.view(-1, 1)                                  # turns
    half = angle / 2
    q_body = torch.cat([axis * torch.sin(half).unsqueeze(-1), torch.cos(half).unsqueeze(-1)], dim=-1)
    q_yaw = torch.stack([torch.zeros_like(yaw), torch.zeros_like(yaw), torch.sin(yaw / 2), torch.cos(yaw / 2)], -1)
    q_yaw = q_yaw.expand(frames, num_bodies, 4)
    x1, y1, z1, w1 = q_yaw.unbind(-1)
    x2, y2, z2, w2 = q_body.unbind(-1)
    rot = torch.stack([w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2, w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2,
                       w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2, w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2], -1)
    rot[50:, 3] = -rot[50:, 3]                                 # body 3 flips sign mid-clip
    rot[20, 5] = rot[19, 5]                                    # body 5 holds still for a frame
    ang = axis.unsqueeze(0) * ang_vel.unsqueeze(-1)
    f = torch.float32
    return {
        "fps": fps,
        "dof_pos": dof_pos.to(f), "dof_vel": dof_vel.to(f),
        "rigid_body_pos": pos.to(f), "rigid_body_rot": rot.to(f),
        "rigid_body_vel": vel.to(f), "rigid_body_ang_vel": ang.to(f),
        "rigid_body_contacts": torch.zeros(frames, num_bodies, dtype=torch.bool),
    }


def record_runtime(args, torch, unified, contract, outdir, runtime_onnx):
    """The deployment loop over a sensor stream; see the module docstring."""
    import numpy as np
    import onnxruntime as ort
    sys.path.insert(0, args.protomotions)
    from deployment.motion_utils import MotionPlayer
    from deployment.tracker_inputs import (align_future_motion_refs, build_tracker_onnx_inputs,
                                           init_tracker_alignment)
    nd, nb = contract["robot"]["num_dofs"], contract["robot"]["num_bodies"]
    anchor = contract["robot"]["anchor_body_index"]
    steps = contract["motion"]["future_step_indices"]
    dt = contract["dt"]
    if args.runtime_clip:
        clip_path = args.runtime_clip
    else:
        clip = synthetic_clip(torch, nd, nb)
        clip_path = os.path.join(os.path.dirname(outdir), "synthetic.motion")
        write_motion(torch, clip, clip_path)
    player = MotionPlayer(clip_path, control_dt=dt)
    T = player.total_frames
    g = np.random.default_rng(5)
    ref = [player.get_state_at_frame(i) for i in range(T)]
    yaw0 = 1.0
    q_yaw = np.array([0, 0, math.sin(yaw0 / 2), math.cos(yaw0 / 2)], dtype=np.float32)

    def qmul(a, b):
        ax, ay, az, aw = a
        bx, by, bz, bw = b
        return np.array([aw * bx + ax * bw + ay * bz - az * by, aw * by - ax * bz + ay * bw + az * bx,
                         aw * bz + ax * by - ay * bx + az * bw, aw * bw - ax * bx - ay * by - az * bz], np.float32)
    sensors = {
        "dof_pos": np.stack([r["dof_pos"] + 0.05 * g.standard_normal(nd) for r in ref]).astype(np.float32),
        "dof_vel": np.stack([r["dof_vel"] + 0.2 * g.standard_normal(nd) for r in ref]).astype(np.float32),
        "anchor_rot": np.stack([qmul(q_yaw, r["body_rot"][anchor]) for r in ref]).astype(np.float32),
        "root_local_ang_vel": g.standard_normal((T, 3)).astype(np.float32),
        "anchor_pos": np.stack([r["body_pos"][anchor] + np.array([2.0, -1.0, 0.0]) for r in ref]).astype(np.float32),
    }
    sensors["anchor_rot"] /= np.linalg.norm(sensors["anchor_rot"], axis=-1, keepdims=True)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    session = ort.InferenceSession(runtime_onnx, so, providers=["CPUExecutionProvider"])
    in_names = contract["_runtime"]["onnx_in_names"]
    name_to_key = contract["_runtime"]["onnx_name_to_in_key"]
    out_names = contract["_runtime"]["onnx_out_names"]
    obs_keys = unified.observation_module.get_input_keys()
    key_to_name = {v: k for k, v in name_to_key.items()}

    def loop(alpha, use_ort):
        rec = {}
        prev_actions, ema_prev, alignment = None, None, None
        for frame in range(T):
            if alignment is None:
                alignment = init_tracker_alignment(
                    robot_anchor_pos=sensors["anchor_pos"][0], robot_anchor_rot=sensors["anchor_rot"][0],
                    motion_anchor_pos=player.get_state_at_frame(0)["body_pos"][anchor],
                    motion_anchor_rot=player.get_state_at_frame(0)["body_rot"][anchor])
            future = align_future_motion_refs(player.get_future_references(frame, steps), alignment)
            feeds = build_tracker_onnx_inputs(
                onnx_input_names=in_names, onnx_name_to_key=name_to_key,
                dof_pos=sensors["dof_pos"][frame], dof_vel=sensors["dof_vel"][frame],
                anchor_rot=sensors["anchor_rot"][frame], root_local_ang_vel=sensors["root_local_ang_vel"][frame],
                future_refs=future, anchor_body_index=anchor, num_dofs=nd, prev_actions=prev_actions)
            if use_ort:
                outs = dict(zip(out_names, session.run(out_names, feeds)))
            else:
                full = [torch.from_numpy(feeds[key_to_name[k]]) if k in key_to_name
                        else torch.zeros(1, *([1] * 0)) for k in obs_keys]
                with torch.no_grad():
                    outs = {n: t.numpy() for n, t in zip(out_names, unified(*full))}
            pd = outs["joint_pos_targets"].squeeze().copy()
            if alpha < 1.0:
                if ema_prev is None:
                    ema_prev = pd.copy()
                pd = alpha * pd + (1.0 - alpha) * ema_prev
                ema_prev = pd.copy()
            prev_actions = pd.copy()
            for n, v in feeds.items():
                rec.setdefault(f"inputs.{n}", []).append(v[0])
            rec.setdefault("actions", []).append(outs["actions"][0])
            rec.setdefault("joint_pos_targets", []).append(pd)
        return {k: torch.from_numpy(np.stack(v).astype(np.float32)) for k, v in rec.items()}

    out = {}
    for k, v in loop(1.0, use_ort=False).items():
        out[k if k.startswith("inputs.") else f"torch.{k}"] = v
    for k, v in loop(1.0, use_ort=True).items():
        if not k.startswith("inputs."):
            out[f"ort.{k}"] = v
    out["ema.torch.joint_pos_targets"] = loop(0.8, use_ort=False)["joint_pos_targets"]
    for k in ("dof_pos", "dof_vel", "body_rot", "body_pos", "body_vel", "body_ang_vel"):
        out[f"player.{k}"] = torch.from_numpy(np.stack([r[k] for r in ref]).astype(np.float32))
    write_safetensors(torch, os.path.join(outdir, "sensors.safetensors"),
                      {k: torch.from_numpy(v) for k, v in sensors.items()})
    write_safetensors(torch, os.path.join(outdir, "replay.safetensors"), out)
    return {"clip": clip_path if args.runtime_clip else os.path.relpath(clip_path, ROOT), "frames": T, "control_dt": dt, "ema_alpha": 0.8,
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--protomotions", required=True)
    ap.add_argument("--out", default=HERE)
    ap.add_argument("--reference-commit")
    ap.add_argument("--only", nargs="*", default=None, help="record these variants, keep the others' entries")
    ap.add_argument("--runtime-clip", help="record g1's runtime on this .motion clip instead of the synthetic one; "
                    "needs --out (a scratch folder: recordings of a clip we do not ship are not committed)")
    args = ap.parse_args()
    if args.runtime_clip and os.path.abspath(args.out) == HERE:
        raise SystemExit("--runtime-clip records into a scratch folder: pass --out")
    if args.runtime_clip:
        args.only = ["g1_amp_deploy"]
    reexec_deterministic()
    if os.path.abspath(os.getcwd()) != ROOT:
        raise SystemExit(f"run from the repository root ({ROOT}): the YAML records the checkpoint path")
    import torch
    import onnxruntime
    torch.set_num_threads(1)
    torch.manual_seed(0)
    manifest = {
        "description": "ProtoMotions' unified deploy pipeline exported by its own "
                       "export_bm_tracker_onnx.py, run by torch and onnxruntime; see record_deploy.py",
        "reference": {"repository": "github:NVlabs/ProtoMotions",
                      "commit": reference_commit(args.protomotions, args.reference_commit)},
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "variants": {},
    }
    manifest_path = os.path.join(args.out, "manifest.json")
    old = {}
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            previous = json.load(f)
        if args.only and not args.runtime_clip:
            old = previous["variants"]
        # keys other recorders own (record_releases_deploy.py's releases) are kept
        manifest.update({k: v for k, v in previous.items() if k not in manifest})
    for name, ckpt in VARIANTS.items():
        if args.only and name not in args.only:
            if name in old:
                manifest["variants"][name] = old[name]
            continue
        manifest["variants"][name] = record(args, torch, name, ckpt, os.path.join(args.out, name))
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
