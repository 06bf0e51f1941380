#!/usr/bin/env python3
"""Records ProtoMotions' own MuJoCo sim-to-sim loop (deployment/
test_tracker_mujoco.py) on a small robot of ours, for comparison step by step
with `pmstate deploy sim`.

usage: python testdata/deploy/record_sim.py --protomotions PATH [--out DIR]
           [--mjcf PATH] [--steps N] [--reference-commit SHA]

Run from the repository root (the exporter's YAML records the checkpoint
path relative to it). PATH is a checkout of github:NVlabs/ProtoMotions
(recorded against commit 607ca7a0bb92e261120bcab8d9f97f28b3130ffc); its
`deployment` package (test_tracker_mujoco's load_mujoco_model,
set_initial_pose and read_robot_state, motion_utils.MotionPlayer,
tracker_inputs) and its exporter are imported from PATH at run time, nothing
of them is copied here. Needs mujoco 3.17.0 (what pmstate links), torch,
tensordict, onnx, onnxruntime, pyyaml, lightning, numpy.

The robot (`robot.xml`, written into DIR by this script unless --mjcf names
another MJCF, e.g. ProtoMotions' own
protomotions/data/assets/mjcf/g1_bm_no_mesh_box_feet.xml, in which case
no robot.xml is written): a G1-shaped skeleton of capsules, spheres and boxes
(box feet), about 36 kg, pelvis about 0.8 m up, with exactly the body order
and joint order of the g1_amp_deploy contract (33 bodies in MuJoCo's
depth-first order, 29 hinges: pitch about y, roll about x, yaw about z), 29
motors in joint order. Its numbers are ours. It is written so that every
step of ProtoMotions' model setup matters: it has a <sensor> section and no
floor and no light (the MJCF patch strips the one and adds the others),
`timestep` 0.002 (the loader sets the contract's physics_dt), passive joint
stiffness, damping and frictionloss (the loader zeroes them), motor
ctrlrange (the loader turns ctrllimited off) and per-joint
actuatorfrcrange (which the loader keeps). Robot geoms collide with the
floor only (contype 1, conaffinity 0 in the robot's default class, so the
floor the patch adds keeps MuJoCo's main defaults).

The clip (`clip.motion`, written into DIR for the MJCF in use, ours or
--mjcf's): the synthetic clip testdata/deploy/synthetic.motion (written by
record_deploy.py, whose pelvis starts at z = 0.227 m, which would put the
robot's legs under the floor) lifted: every body position's z shifted by one
float32 constant, everything else (frames, fps, joint values, rotations,
velocities, contacts) the source's, written with record_deploy.write_motion
(the .motion format). The constant puts the robot on the floor at the
clip's first frame: on the model as load_mujoco_model builds it (patched,
with its floor at z = 0), after set_initial_pose from the player of the
source clip, the lowest point of the robot's geoms (lowest_point: each
geom's exact lowest point from its world pose and size, the lowest corner
for boxes) is measured, and the shift makes it CLEARANCE (1 mm) above z = 0;
checked on the written clip (within 1e-6 m: the float32 rounding of the
shifted pelvis height). The player's frame 0 is the source's frame 0
(resampling starts at t = 0; its body_pos and dof_pos are checked equal),
so the shift applies to the source frames as they are.

The loop: the g1_amp_deploy checkpoint (testdata/policy/g1_amp_deploy/
last.ckpt) is exported with ProtoMotions' exporter (record_deploy.py's
export_pipeline) into a temporary folder (the graph is not committed), its
unified_pipeline.yaml is read as test_tracker_mujoco.run() reads it, and
run()'s per-step body is executed on the lifted clip (DIR/clip.motion)
after load_mujoco_model and set_initial_pose: read_robot_state, the alignment on the first step, the
future references aligned, the odometry/reference-position inputs where the
graph asks for them, build_tracker_onnx_inputs, onnxruntime (CPU provider,
one thread), joint_pos_targets squeezed, the acceleration clamp and the EMA
as run() does them (off for this contract: pd_target_max_accel null,
action_ema_alpha 1.0), the targets fed back as the next step's
historical.processed_actions, data.ctrl[:] = targets, `decimation`
mj_step calls. Without the viewer and the real-time pacing.

Recorded (`loop.safetensors` in DIR), T = the player's frames (161) or
--steps:
- qpos [T, nq] f64, qvel [T, nv] f64: copies taken at the top of each step,
  before the step reads the state (row 0 is set_initial_pose's state);
- joint_pos_targets [T, 29] f32: what the step wrote into data.ctrl;
- actions [T, 29] f32: the graph's raw `actions` output;
- sensitivity_qpos [T] f64: the same loop rerun with each step's PD targets
  multiplied by (1 + 1e-7 s), s a fixed seeded sign pattern in {-1, +1}
  (computed in float64, so data.ctrl gets the exact relative perturbation,
  the fed-back actions the float32 rounding of it), right after the graph's
  output (before clamp and EMA, where a float difference of another
  implementation enters); per step, max |qpos_perturbed - qpos|. It shows
  how the closed loop with contacts amplifies float differences, i.e. what
  tolerance a step-by-step comparison can hold to and for how long.
`manifest.json`: versions (mujoco, torch, onnxruntime, numpy), the
reference commit, T, the MJCF (file name, sha256, whether written here),
model sizes, the clip and its lift (`clip_lift`: source, z_shift, the
lowest point before and after, the lowest geom), the checkpoint,
physics_dt, decimation, the MJCF's own timestep, pelvis height (qpos[2]: first, min, last) and the sensitivity
block (steps 1, 10, 50, 100, T-1 and the max).

Deterministic: one CPU thread, fixed seed, safetensors headers without
__metadata__ (pm_reference.write_safetensors); two runs give the same bytes.
"""
import argparse
import hashlib
import importlib.util
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from pm_reference import reexec_deterministic, reference_commit, write_safetensors  # noqa: E402

VARIANT = "g1_amp_deploy"
SOURCE_CLIP = "testdata/deploy/synthetic.motion"
CLIP_FILE = "clip.motion"
CLEARANCE = 1e-3
CONTRACT = "testdata/deploy/g1_amp_deploy/contract.yaml"
PERTURBATION = 1e-7
PERTURBATION_SEED = 7
SENSITIVITY_STEPS = (1, 10, 50, 100)
MUJOCO_VERSION = "3.17.0"


def load_record_deploy():
    """testdata/deploy/record_deploy.py as a module (its exporter helpers)."""
    spec = importlib.util.spec_from_file_location("record_deploy", os.path.join(HERE, "record_deploy.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------
# The robot
# ---------------------------------------------------------------------------

def _joint(name, axis, lo, hi, armature, force):
    return {"name": name, "axis": axis, "range": f"{lo} {hi}", "armature": armature, "force": force}


def _body(name, pos, joint=None, geoms=(), children=(), extra=()):
    return {"name": name, "pos": pos, "joint": joint, "geoms": list(geoms), "children": list(children),
            "extra": list(extra)}


X, Y, Z = "1 0 0", "0 1 0", "0 0 1"


def _leg(side, s):
    """One leg, `s` = +1 (left, +y) or -1 (right)."""
    p = side + "_"
    roll = ("-0.5", "2.8") if s > 0 else ("-2.8", "0.5")
    return _body(p + "hip_pitch_link", f"0 {0.065 * s:g} -0.1",
                 _joint(p + "hip_pitch_joint", Y, "-2.4", "2.7", "0.025", "90"),
                 [f'type="capsule" size="0.04" fromto="0 0 0 0 {0.04 * s:g} -0.02" mass="1.3"'], [
        _body(p + "hip_roll_link", f"0 {0.05 * s:g} -0.03",
              _joint(p + "hip_roll_joint", X, *roll, "0.025", "90"),
              ['type="capsule" size="0.045" fromto="0 0 0 0 0 -0.08" mass="1.5"'], [
            _body(p + "hip_yaw_link", "0 0 -0.1",
                  _joint(p + "hip_yaw_joint", Z, "-2.7", "2.7", "0.025", "90"),
                  ['type="capsule" size="0.05" fromto="0 0 -0.02 0 0 -0.2" mass="2.5"'], [
                _body(p + "knee_link", "0 0 -0.22",
                      _joint(p + "knee_joint", Y, "-0.08", "2.8", "0.03", "140"),
                      ['type="capsule" size="0.04" fromto="0 0 -0.02 0 0 -0.27" mass="1.9"'], [
                    _body(p + "ankle_pitch_link", "0 0 -0.3",
                          _joint(p + "ankle_pitch_joint", Y, "-0.85", "0.5", "0.02", "50"),
                          ['type="sphere" size="0.025" mass="0.1"'], [
                        _body(p + "ankle_roll_link", "0 0 -0.02",
                              _joint(p + "ankle_roll_joint", X, "-0.26", "0.26", "0.02", "50"),
                              ['type="box" size="0.1 0.035 0.018" pos="0.035 0 -0.02" mass="0.6"']),
                    ]),
                ]),
            ]),
        ]),
    ])


def _arm(side, s):
    """One arm, hanging from torso_link."""
    p = side + "_"
    roll = ("-1.5", "2.2") if s > 0 else ("-2.2", "1.5")
    return _body(p + "shoulder_pitch_link", f"0 {0.12 * s:g} 0.3",
                 _joint(p + "shoulder_pitch_joint", Y, "-3", "2.6", "0.015", "25"),
                 ['type="sphere" size="0.035" mass="0.7"'], [
        _body(p + "shoulder_roll_link", f"0 {0.04 * s:g} -0.01",
              _joint(p + "shoulder_roll_joint", X, *roll, "0.015", "25"),
              ['type="capsule" size="0.035" fromto="0 0 0 0 0 -0.05" mass="0.6"'], [
            _body(p + "shoulder_yaw_link", "0 0 -0.08",
                  _joint(p + "shoulder_yaw_joint", Z, "-2.6", "2.6", "0.01", "25"),
                  ['type="capsule" size="0.03" fromto="0 0 0 0 0 -0.1" mass="0.8"'], [
                _body(p + "elbow_link", "0 0 -0.12",
                      _joint(p + "elbow_joint", Y, "-1", "2.1", "0.01", "25"),
                      ['type="capsule" size="0.028" fromto="0 0 0 0 0 -0.09" mass="0.6"'], [
                    _body(p + "wrist_roll_link", "0 0 -0.1",
                          _joint(p + "wrist_roll_joint", X, "-1.9", "1.9", "0.008", "25"),
                          ['type="sphere" size="0.02" mass="0.1"'], [
                        _body(p + "wrist_pitch_link", "0 0 -0.03",
                              _joint(p + "wrist_pitch_joint", Y, "-1.6", "1.6", "0.008", "5"),
                              ['type="sphere" size="0.02" mass="0.1"'], [
                            _body(p + "wrist_yaw_link", "0 0 -0.03",
                                  _joint(p + "wrist_yaw_joint", Z, "-1.6", "1.6", "0.008", "5"),
                                  ['type="sphere" size="0.02" mass="0.1"'], [
                                _body(p + "rubber_hand", "0 0 -0.06", None,
                                      ['type="sphere" size="0.035" mass="0.2"']),
                            ]),
                        ]),
                    ]),
                ]),
            ]),
        ]),
    ])


def robot_tree():
    torso = _body("torso_link", "0 0 0.01", _joint("waist_pitch_joint", Y, "-0.5", "0.5", "0.03", "50"),
                  ['type="box" size="0.07 0.11 0.16" pos="0 0 0.18" mass="7.5"'],
                  [_arm("left", 1), _arm("right", -1)], extra=['<site name="imu" pos="0 0 0.05"/>'])
    waist = _body("waist_yaw_link", "0 0 0.02", _joint("waist_yaw_joint", Z, "-2.6", "2.6", "0.03", "88"),
                  ['type="capsule" size="0.04" fromto="0 0 0 0 0 0.03" mass="0.3"'], [
        _body("waist_roll_link", "0 0 0.04", _joint("waist_roll_joint", X, "-0.5", "0.5", "0.03", "50"),
              ['type="sphere" size="0.035" mass="0.3"'], [torso]),
    ])
    head = _body("head", "0 0 0.45", None, ['type="sphere" size="0.07" mass="1"'])
    return _body("pelvis", "0 0 0.81", "free", ['type="box" size="0.06 0.1 0.05" pos="0 0 -0.04" mass="4.5"'],
                 [head, _leg("left", 1), _leg("right", -1), waist])


def _emit(body, depth, lines, joints):
    ind = "  " * depth
    cls = ' childclass="robot"' if body["joint"] == "free" else ""
    lines.append(f'{ind}<body name="{body["name"]}" pos="{body["pos"]}"{cls}>')
    j = body["joint"]
    if j == "free":
        lines.append(f'{ind}  <freejoint name="floating_base_joint"/>')
    elif j is not None:
        joints.append(j["name"])
        lines.append(f'{ind}  <joint name="{j["name"]}" axis="{j["axis"]}" range="{j["range"]}" '
                     f'armature="{j["armature"]}" actuatorfrcrange="-{j["force"]} {j["force"]}"/>')
    for g in body["geoms"]:
        lines.append(f"{ind}  <geom {g}/>")
    for e in body["extra"]:
        lines.append(f"{ind}  {e}")
    for c in body["children"]:
        _emit(c, depth + 1, lines, joints)
    lines.append(f"{ind}</body>")


def robot_xml():
    """Our MJCF, as text (see the module docstring)."""
    body_lines, joints = [], []
    _emit(robot_tree(), 2, body_lines, joints)
    head = [
        '<mujoco model="pmstate_g1_shaped">',
        '  <compiler angle="radian" autolimits="true"/>',
        '  <option timestep="0.002"/>',
        "  <default>",
        '    <default class="robot">',
        '      <joint limited="true" stiffness="2" damping="0.5" frictionloss="0.1"/>',
        '      <geom contype="1" conaffinity="0" condim="3" friction="0.9 0.005 0.0001" rgba="0.6 0.6 0.7 1"/>',
        '      <motor ctrlrange="-1 1"/>',
        "    </default>",
        "  </default>",
        "  <worldbody>",
    ]
    tail = ["  </worldbody>", "  <actuator>"]
    tail += [f'    <motor class="robot" name="{j}" joint="{j}"/>' for j in joints]
    tail += [
        "  </actuator>",
        "  <sensor>",
        '    <framequat name="torso_quat" objtype="body" objname="torso_link"/>',
        '    <gyro name="torso_gyro" site="imu"/>',
        '    <jointpos name="left_knee_pos" joint="left_knee_joint"/>',
        "  </sensor>",
        "</mujoco>",
    ]
    return "\n".join(head + body_lines + tail) + "\n"


def check_model(model, mujoco, body_names, joint_names):
    """The contract's body and joint order (MuJoCo index i+1 is contract
    index i, the world body and the free joint being index 0), one actuator
    per hinge in joint order."""
    assert model.nbody == len(body_names) + 1, (model.nbody, len(body_names))
    for i, n in enumerate(body_names):
        assert model.body(i + 1).name == n, (i, model.body(i + 1).name, n)
    assert model.njnt == len(joint_names) + 1 and model.jnt_type[0] == mujoco.mjtJoint.mjJNT_FREE
    for i, n in enumerate(joint_names):
        assert model.joint(i + 1).name == n, (i, model.joint(i + 1).name, n)
    assert model.nu == len(joint_names)
    for i in range(model.nu):
        assert model.actuator_trntype[i] == mujoco.mjtTrn.mjTRN_JOINT and model.actuator_trnid[i, 0] == i + 1, i
    assert model.nq == 7 + len(joint_names) and model.nv == 6 + len(joint_names)


# ---------------------------------------------------------------------------
# The clip
# ---------------------------------------------------------------------------

def lowest_point(np, mujoco, model, data):
    """The lowest world z of the robot's geoms (every geom not on the world
    body) at `data`'s kinematics, each geom's exact lowest point from its
    world pose (geom_xpos, geom_xmat) and size: sphere z - r; capsule
    z - |a_z| h - r; cylinder z - |a_z| h - r sqrt(1 - a_z^2); ellipsoid
    z - sqrt(sum (R_zi s_i)^2); box z - sum |R_zi| s_i (its lowest corner),
    R_zi the world z of the geom's local axis i, a_z = R_z2; any other type
    (mesh, ...) by the lowest corner of its geom_aabb box. Returns (z, geom
    name or index, and its body)."""
    G = mujoco.mjtGeom
    best = (np.inf, None)
    for g in range(model.ngeom):
        if model.geom_bodyid[g] == 0:
            continue
        t, size = model.geom_type[g], model.geom_size[g]
        z, rz = data.geom_xpos[g][2], data.geom_xmat[g].reshape(3, 3)[2]
        if t == G.mjGEOM_SPHERE:
            low = z - size[0]
        elif t == G.mjGEOM_CAPSULE:
            low = z - abs(rz[2]) * size[1] - size[0]
        elif t == G.mjGEOM_CYLINDER:
            low = z - abs(rz[2]) * size[1] - size[0] * np.sqrt(max(0.0, 1.0 - rz[2] ** 2))
        elif t == G.mjGEOM_ELLIPSOID:
            low = z - np.sqrt(np.sum((rz * size) ** 2))
        elif t == G.mjGEOM_BOX:
            low = z - np.sum(np.abs(rz) * size)
        else:
            aabb = model.geom_aabb[g]
            low = z + rz @ aabb[:3] - np.sum(np.abs(rz) * aabb[3:])
        if low < best[0]:
            body = model.body(model.geom_bodyid[g]).name
            best = (float(low), f"{model.geom(g).name or 'geom ' + str(g)} (body {body})")
    return best


def initial_lowest(pm, np, mujoco, meta, mjcf_path, clip_path):
    """The lowest geom point at the clip's first frame, set as the loop sets
    it (load_mujoco_model's patched model, set_initial_pose from the
    player); also the player."""
    ttm, MotionPlayer = pm[0], pm[1]
    timing, control = meta["timing"], meta["control"]
    player = MotionPlayer(clip_path, motion_index=0, control_dt=timing["control_dt"])
    model, data = ttm.load_mujoco_model(mjcf_path, control["stiffness"], control["damping"], timing["physics_dt"])
    ttm.set_initial_pose(model, data, player)
    return lowest_point(np, mujoco, model, data), player


def lift_clip(pm, np, torch, mujoco, write_motion, meta, mjcf_path, source_path, out_path):
    """The source clip with every body position's z shifted by one float32
    constant so that the robot of `mjcf_path`, set at the clip's first frame,
    has its lowest geom point CLEARANCE above the floor (z = 0); written to
    `out_path` with record_deploy's writer. The player's frame 0 is the
    source's frame 0 (resampling starts at t = 0; checked), so the shift is
    computed from the player's and applied to the source frames. Returns the
    manifest's entry."""
    src = torch.load(source_path, map_location="cpu", weights_only=False)
    (low0, _), player = initial_lowest(pm, np, mujoco, meta, mjcf_path, source_path)
    f0 = player.get_state_at_frame(0)
    for k, sk in (("body_pos", "rigid_body_pos"), ("dof_pos", "dof_pos")):
        assert np.array_equal(f0[k], src[sk][0].numpy()), f"player frame 0 {k} differs from the source's"
    shift = np.float32(CLEARANCE - low0)
    lifted = dict(src)
    pos = src["rigid_body_pos"].clone()
    pos[..., 2] += torch.tensor(shift)
    lifted["rigid_body_pos"] = pos
    write_motion(torch, lifted, out_path)
    (low1, geom), _ = initial_lowest(pm, np, mujoco, meta, mjcf_path, out_path)
    assert abs(low1 - CLEARANCE) < 1e-6, (low1, CLEARANCE)
    return {"source": SOURCE_CLIP, "z_shift": float(shift), "target_clearance": CLEARANCE,
            "lowest_point_before": low0, "lowest_point_after": low1, "lowest_geom": geom,
            "rule": "rigid_body_pos[..., 2] += z_shift (float32), everything else the source's; z_shift = "
                    "float32(target_clearance - lowest_point_before), the lowest point of the robot's geoms (not "
                    "the world body's) after load_mujoco_model and set_initial_pose on the source clip"}


# ---------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------

def run_loop(pm, np, mujoco, session, meta, mjcf_path, clip_path, steps, perturb=None):
    """test_tracker_mujoco.run()'s setup and per-step body (one pass of the
    clip, no viewer, no pacing, no synthetic odometry corruption), recording
    the state at the top of each step. `perturb`: a sign pattern; the graph's
    PD targets are multiplied by (1 + PERTURBATION * perturb)."""
    ttm, MotionPlayer, ti, quat_rotate_np = pm
    robot_meta, timing, control = meta["robot"], meta["timing"], meta["control"]
    anchor_body_index = robot_meta["anchor_body_index"]
    root_body_index = robot_meta["root_body_index"]
    num_dofs = robot_meta["num_dofs"]
    control_dt, decimation = timing["control_dt"], timing["decimation"]
    future_step_indices = meta["motion"]["future_step_indices"]
    pd_target_max_accel = control.get("pd_target_max_accel")
    action_ema_alpha = control.get("action_ema_alpha", 1.0)
    onnx_name_to_key = meta["_runtime"]["onnx_name_to_in_key"]
    requirements = ti.get_tracker_input_requirements(onnx_name_to_key)
    actual_in_names = [i.name for i in session.get_inputs()]
    actual_out_names = [o.name for o in session.get_outputs()]
    assert actual_out_names[1] == "joint_pos_targets", actual_out_names

    player = MotionPlayer(clip_path, motion_index=0, control_dt=control_dt)
    model, data = ttm.load_mujoco_model(mjcf_path, control["stiffness"], control["damping"], timing["physics_dt"])
    T = player.total_frames if steps is None else min(steps, player.total_frames)

    use_ema = action_ema_alpha < 1.0
    ttm.set_initial_pose(model, data, player)
    prev_pd = prev_prev_pd = ema_prev_targets = prev_actions = alignment = None
    motion_anchor_start = player.get_state_at_frame(0)["body_pos"][anchor_body_index]
    rec = {"qpos": [], "qvel": [], "joint_pos_targets": [], "actions": []}
    for frame_idx in range(T):
        rec["qpos"].append(data.qpos.copy())
        rec["qvel"].append(data.qvel.copy())

        robot_state = ttm.read_robot_state(data, anchor_body_index, root_body_index)
        if alignment is None:
            alignment = ti.init_tracker_alignment(
                robot_anchor_pos=robot_state["body_pos"][anchor_body_index],
                robot_anchor_rot=robot_state["body_rot"][anchor_body_index],
                motion_anchor_pos=motion_anchor_start,
                motion_anchor_rot=player.get_state_at_frame(0)["body_rot"][anchor_body_index])
        future_refs = player.get_future_references(frame_idx, future_step_indices)
        future_refs = ti.align_future_motion_refs(future_refs, alignment)
        odom_disp_start = None
        if requirements.odom_from_start or requirements.odom_start_xy:
            odom_disp_start = ti.compute_odom_disp_start(
                robot_state["body_pos"][anchor_body_index, :2], alignment, corruption_fn=None)
        ref_rigid_body_pos = ref_anchor_pos = None
        if requirements.ref_rigid_body_pos or requirements.ref_anchor_pos:
            cur_ref_body_pos = player.get_state_at_frame(frame_idx)["body_pos"]
            motion_disp = cur_ref_body_pos - alignment.motion_anchor_start_pos
            aligned = (alignment.robot_anchor_start_pos
                       + quat_rotate_np(alignment.heading_offset, motion_disp)).astype(np.float32)
            if requirements.ref_rigid_body_pos:
                ref_rigid_body_pos = aligned
            if requirements.ref_anchor_pos:
                ref_anchor_pos = aligned[anchor_body_index]
        onnx_inputs = ti.build_tracker_onnx_inputs(
            onnx_input_names=actual_in_names, dof_pos=robot_state["dof_pos"], dof_vel=robot_state["dof_vel"],
            anchor_rot=robot_state["body_rot"][anchor_body_index],
            root_local_ang_vel=robot_state["root_local_ang_vel"], future_refs=future_refs,
            onnx_name_to_key=onnx_name_to_key, anchor_body_index=anchor_body_index, num_dofs=num_dofs,
            prev_actions=prev_actions,
            odom_start_xy=alignment.odom_start_xy if requirements.odom_start_xy else None,
            odom_disp_start=odom_disp_start,
            odom_start_heading_inv=alignment.odom_start_heading_inv if requirements.start_heading else None,
            ref_rigid_body_pos=ref_rigid_body_pos, ref_anchor_pos=ref_anchor_pos)
        ort_out = session.run(actual_out_names, onnx_inputs)
        pd_targets = ort_out[1].squeeze().copy()
        if perturb is not None:
            pd_targets = pd_targets * (1.0 + PERTURBATION * perturb)
        if pd_target_max_accel is not None and prev_pd is not None and prev_prev_pd is not None:
            delta = pd_targets - prev_pd
            prev_delta = prev_pd - prev_prev_pd
            accel = delta - prev_delta
            clamped_accel = np.clip(accel, -pd_target_max_accel, pd_target_max_accel)
            pd_targets = prev_pd + prev_delta + clamped_accel
        prev_prev_pd = prev_pd
        prev_pd = pd_targets.copy()
        if use_ema:
            if ema_prev_targets is None:
                ema_prev_targets = pd_targets.copy()
            pd_targets = action_ema_alpha * pd_targets + (1.0 - action_ema_alpha) * ema_prev_targets
            ema_prev_targets = pd_targets.copy()
        prev_actions = pd_targets.copy()
        data.ctrl[:] = pd_targets
        for _ in range(decimation):
            mujoco.mj_step(model, data)

        rec["joint_pos_targets"].append(np.asarray(pd_targets, dtype=np.float32))
        rec["actions"].append(np.asarray(ort_out[0]).reshape(-1).astype(np.float32))
    out = {k: np.stack(v) for k, v in rec.items()}
    return out, model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--protomotions", required=True)
    ap.add_argument("--out", default=os.path.join(HERE, "sim"))
    ap.add_argument("--mjcf", help="run on this MJCF instead of writing ours (the clip is lifted for it)")
    ap.add_argument("--steps", type=int, help="control steps (default: the clip's frames at control_dt)")
    ap.add_argument("--reference-commit")
    args = ap.parse_args()
    reexec_deterministic()
    if os.path.abspath(os.getcwd()) != ROOT:
        raise SystemExit(f"run from the repository root ({ROOT}): the YAML records the checkpoint path")
    import numpy as np
    import torch
    import mujoco
    import onnxruntime as ort
    import yaml
    if mujoco.__version__ != MUJOCO_VERSION:
        raise SystemExit(f"mujoco {mujoco.__version__}: record with {MUJOCO_VERSION} (what pmstate links)")
    torch.set_num_threads(1)
    torch.manual_seed(0)

    pm_root = os.path.abspath(args.protomotions)
    record_deploy = load_record_deploy()
    exporter = record_deploy.import_exporter(pm_root)
    from deployment import test_tracker_mujoco as ttm
    from deployment import tracker_inputs as ti
    from deployment.motion_utils import MotionPlayer
    from deployment.state_utils import quat_rotate_np
    pm = (ttm, MotionPlayer, ti, quat_rotate_np)

    os.makedirs(args.out, exist_ok=True)
    if args.mjcf:
        mjcf_path = os.path.abspath(args.mjcf)
        written = False
    else:
        mjcf_path = os.path.abspath(os.path.join(args.out, "robot.xml"))
        with open(mjcf_path, "w") as f:
            f.write(robot_xml())
        written = True
    with open(mjcf_path, "rb") as f:
        mjcf_sha = hashlib.sha256(f.read()).hexdigest()
    # the MJCF's own timestep (MuJoCo's default where it sets none), read from
    # the XML: an MJCF may not compile before the patch (sensors on missing sites)
    import xml.etree.ElementTree as ET
    option = ET.parse(mjcf_path).getroot().find("option")
    own_timestep = float(option.get("timestep")) if option is not None and option.get("timestep") \
        else float(mujoco.MjOption().timestep)

    ckpt = record_deploy.VARIANTS[VARIANT]
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = str(record_deploy.export_pipeline(exporter, ckpt, tmp))
        with open(onnx_path.replace(".onnx", ".yaml")) as f:
            meta = yaml.safe_load(f)
        with open(os.path.join(ROOT, CONTRACT)) as f:
            committed = yaml.safe_load(f)
        for k in ("robot", "timing", "control", "motion", "_runtime"):
            assert meta[k] == committed[k], f"exported {k} differs from {CONTRACT}"
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        session = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
        # run()'s warm-up call on zeros (the session keeps no state)
        dummy = {i.name: np.zeros([1 if (d is None or isinstance(d, str)) else d for d in i.shape], np.float32)
                 for i in session.get_inputs()}
        session.run([o.name for o in session.get_outputs()], dummy)

        clip_path = os.path.abspath(os.path.join(args.out, CLIP_FILE))
        lift = lift_clip(pm, np, torch, mujoco, record_deploy.write_motion, meta, mjcf_path,
                         os.path.join(ROOT, SOURCE_CLIP), clip_path)
        rec, model = run_loop(pm, np, mujoco, session, meta, mjcf_path, clip_path, args.steps)
        check_model(model, mujoco, meta["robot"]["body_names"], meta["robot"]["joint_names"])
        T = rec["qpos"].shape[0]
        signs = np.where(np.random.default_rng(PERTURBATION_SEED).random(meta["robot"]["num_dofs"]) < 0.5, -1.0, 1.0)
        pert, _ = run_loop(pm, np, mujoco, session, meta, mjcf_path, clip_path, args.steps, perturb=signs)

    sens = np.abs(pert["qpos"] - rec["qpos"]).max(axis=1)
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in rec.items()}
    tensors["sensitivity_qpos"] = torch.from_numpy(sens.astype(np.float64))
    assert tensors["qpos"].dtype == torch.float64 and tensors["qvel"].dtype == torch.float64
    write_safetensors(torch, os.path.join(args.out, "loop.safetensors"), tensors)

    z = rec["qpos"][:, 2]
    at = {str(s): float(sens[s]) for s in sorted(set(SENSITIVITY_STEPS) | {T - 1}) if s < T}
    manifest = {
        "description": "ProtoMotions' MuJoCo sim-to-sim loop (deployment/test_tracker_mujoco.py's per-step body) "
                       "on the g1_amp_deploy pipeline; see record_sim.py",
        "reference": {"repository": "github:NVlabs/ProtoMotions",
                      "commit": reference_commit(pm_root, args.reference_commit)},
        "mujoco": mujoco.__version__,
        "torch": torch.__version__,
        "onnxruntime": ort.__version__,
        "numpy": np.__version__,
        "steps": T,
        "mjcf": {"file": os.path.basename(mjcf_path), "sha256": mjcf_sha, "written_by_this_script": written,
                 "timestep_in_file": own_timestep},
        "model": {"nq": int(model.nq), "nv": int(model.nv), "nu": int(model.nu), "nbody": int(model.nbody),
                  "total_mass": float(model.body_subtreemass[1])},
        "clip": os.path.relpath(clip_path, ROOT) if clip_path.startswith(ROOT + os.sep) else clip_path,
        "clip_lift": lift,
        "checkpoint": ckpt,
        "contract": CONTRACT,
        "control_dt": meta["timing"]["control_dt"],
        "physics_dt": meta["timing"]["physics_dt"],
        "decimation": meta["timing"]["decimation"],
        "action_ema_alpha": meta["control"].get("action_ema_alpha", 1.0),
        "pd_target_max_accel": meta["control"].get("pd_target_max_accel"),
        "onnxruntime_session": "CPUExecutionProvider, intra_op_num_threads 1, inter_op_num_threads 1",
        "pelvis_height": {"first": float(z[0]), "min": float(z.min()), "argmin": int(z.argmin()),
                          "last": float(z[-1])},
        "sensitivity": {
            "perturbation": "pd_targets * (1 + 1e-7 * s) after the graph, s in {-1, +1} per joint from "
                            f"numpy default_rng({PERTURBATION_SEED}).random(num_dofs) < 0.5 -> -1",
            "relative": PERTURBATION,
            "signs": [int(v) for v in signs],
            "max_abs_qpos_diff_at_step": at,
            "max_abs_qpos_diff_max": float(sens.max()),
        },
    }
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
