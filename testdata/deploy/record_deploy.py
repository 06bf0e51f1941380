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
from pm_reference import reference_commit  # noqa: E402

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


def reexec_deterministic():
    want = {"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if all(os.environ.get(k) == v for k, v in want.items()):
        return
    env = dict(os.environ)
    env.update(want)
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


ST_DTYPES = {"torch.float32": "F32", "torch.float64": "F64", "torch.int64": "I64"}


def write_safetensors(torch, path, tensors):
    names = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    header, blobs, offset = {}, [], 0
    for k in names:
        t = tensors[k].detach().cpu().contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        header[k] = {"dtype": ST_DTYPES[str(t.dtype)], "shape": list(t.shape),
                     "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


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


def record(args, torch, name, ckpt_rel, outdir):
    sys.path.insert(0, args.protomotions)
    sys.path.insert(0, os.path.join(args.protomotions, "deployment"))
    import export_bm_tracker_onnx as exporter
    undo, patches = (install_patches(torch, exporter) if name in NEEDS_PATCHES else (lambda: None, []))
    try:
        on_case = record_functions if name in FUNCTION_CASES else None
        entry = record_with(args, torch, exporter, ckpt_rel, outdir, on_case)
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


def record_with(args, torch, exporter, ckpt_rel, outdir, on_case=None):
    import yaml
    import onnxruntime as ort

    captured = {}
    real_export = torch.onnx.export

    def capture(module, inputs, path, **kw):
        captured["module"] = module
        captured["input_names"] = list(kw["input_names"])
        return real_export(module, inputs, path, **kw)

    torch.onnx.export = capture
    with tempfile.TemporaryDirectory() as tmp:
        try:
            onnx_path = exporter.export_tracker(checkpoint=ckpt_rel, output_dir=tmp, validate=True)
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

    os.makedirs(outdir, exist_ok=True)
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
        "checkpoint": ckpt_rel,
        "onnx_inputs": [n for n, _ in onnx_inputs],
        "onnx_outputs": onnx_outputs,
        "observation_keys": list(unified.observation_module.get_output_keys()),
        "cases": manifest_cases,
        **({"contract_source_notes_removed": sourced} if sourced else {}),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--protomotions", required=True)
    ap.add_argument("--out", default=HERE)
    ap.add_argument("--reference-commit")
    ap.add_argument("--only", nargs="*", default=None, help="record these variants, keep the others' entries")
    args = ap.parse_args()
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
    if args.only and os.path.exists(manifest_path):
        with open(manifest_path) as f:
            old = json.load(f)["variants"]
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
