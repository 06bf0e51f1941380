#!/usr/bin/env python3
"""Records what `pmstate migrate` needs from today's ProtoMotions, and
verifies its output with today's ProtoMotions' own code.

usage: python testdata/migrate/record_migrate.py templates --protomotions PATH
       python testdata/migrate/record_migrate.py verify --protomotions PATH [--pmstate BIN] [--no-write]
       python testdata/migrate/record_migrate.py kernels --protomotions PATH --v31 V31_PATH
       python testdata/migrate/record_migrate.py g1-kernels --protomotions PATH --v31 V31_PATH
       python testdata/migrate/record_migrate.py g1-observations --protomotions PATH
       python testdata/migrate/record_migrate.py g1-actions --protomotions PATH --v31 V31_PATH
       python testdata/migrate/record_migrate.py terrain --protomotions PATH --v31 V31_PATH

Order: templates, verify (rewrites verified.json's cases), then kernels,
g1-kernels, g1-observations, g1-actions, terrain (each adds its part).

PATH is a checkout of github:NVlabs/ProtoMotions at commit
607ca7a0bb92e261120bcab8d9f97f28b3130ffc; its `protomotions` package is
imported from PATH at run time, nothing of it is copied here.

templates: today's configs of the experiments in TEMPLATES (the shipped
smpl motion-tracker experiment,
data/pretrained_models/motion_tracker/smpl/experiment_config.py, and
today's PPO G1 tracker, examples/experiments/mimic/mlp_bm_l2c2.py, given
by `g1_for_v31` what v3.1's G1 tracker reads from today's own factories:
its history observations, root-frame critic observations, anchor terms and
today's generic PD action config, without L2C2), built
with today's `build_standard_configs` exactly as
testdata/policy/record_policy.py builds them (its helpers are imported), and
the inference configs after today's `apply_all_inference_overrides`; pickled
with torch.save as train_agent.py's save_configs does, into
templates/<name>/{resolved_configs.pt,resolved_configs_inference.pt}
(--only NAME... records only those).
These pickles are data (today's dataclass instances, every field today's
classes have, with today's defaults); `pmstate migrate` embeds them and
overlays the old release's values onto them.

verify: for each recorded old-release case (CASES; or each `--case NAME
OLD_CKPT OLD_DIR`, nothing written), runs `pmstate migrate
OLD OUT --json`, then with TODAY's code: torch.load(weights_only=False) of
the migrated resolved_configs.pt and resolved_configs_inference.pt (today's
classes must resolve), builds the agent from each with a stand-in env
(record_policy.py's make_agent: the agent class of agent._target_,
agent.setup()), `agent.load(OUT/last.ckpt)` (training state: counters,
reward normalizer, both optimizers) for resuming and
`load_training_state=False` for evaluation, runs the eval forward on the old
recording's obs.safetensors with torch.manual_seed(1234) first (as
record_releases.py recorded) and compares mean_action, value, action and
neglogp with the OLD release's expected.safetensors (bit for bit required);
for resume also one optimizer step (the restored Adam state is used);
every context binding of the migrated components must be a FieldPath with
its name and parent path (`unresolvable_bindings` empty).
Writes verified.json (per case: the SHA-256 of every migrated file, the
report, and the comparison) and the migrated torch files under
<case>/ (not the report file, which names this run's paths); the CI tests
(crates/policy/tests/migrate.rs, crates/cli/tests/migrate_cli.rs) re-run
`migrate` and require byte-identical files and the same report, so a
change to migrate forces re-verification. --no-write only checks.

kernels (after verify): the mapped components' math, today's against
v3.1's, for each case. On the same seeded random states (64 envs, the
robot's bodies and dofs, the env's history steps, the mimic control's
future steps; the reference root height is body 0's z; the anchor values
are the robot's anchor body's), today's compute_func of each
component of the migrated resolved_configs.pt with its static_params and
its dynamic_vars bound to those states, against v3.1's own function
(V31_PATH's package, imported in a process of its own) bound by v3.1's
configs (its variables and indices_subset); the env-level parameters
(weight, min_value, ...) are not kernel arguments in either release.
Components whose v3.1 inputs are not generated here (the noisy context,
the reduced-coords target poses, the smpl tracker's previous actions) are
listed as not compared. Adds kernels_vs_v31 to each case in verified.json.

g1-kernels: the table entries for the v3.1 G1 tracker's BeyondMimic-style
rewards and terminations (G1_ENTRIES), which no migrated case exercises yet
(the G1 tracker is refused at its observations): v3.1's function, bound as
v3.1's configs bind it (the anchor read from the context), against today's,
bound as today's G1 template binds it (the reference anchor as the reference
body at anchor_idx), each in a process of its own on the same seeded random
states (64 envs, 30 bodies, anchor body 16), without density weights.
Adds g1_table_kernels_vs_v31 to verified.json.

g1-observations (after verify): the v3.1 G1 tracker's four actor
observations, computed by the components of the MIGRATED configs
(testdata/migrate/v31_g1_tracker, training and inference files) with their
own bindings on v3.1's recorded context values
(testdata/deploy/v31_g1_tracker/inputs_b16.safetensors) against v3.1's
values (obs_b16.safetensors); context paths v3.1's observations do not
read are filled twice (zeros, random), both runs must match; adds
g1_observations_vs_v31 to verified.json.

g1-actions (after verify): the migrated action config's function and
tensors (today's normalized_pd_fixed_gains_action) against v3.1's PD
targets (its build_pd_action_offset_scale, clamp_actions clamp, offset +
scale * action, in V31_PATH's package) on v3.1's recorded mean actions
(whose recorded PD targets must be reproduced) and on actions past the
clamp, and the gains against v3.1's control_info; adds g1_actions_vs_v31.

terrain (after verify): for each case on a ComplexTerrainConfig (v3.1's
smpl-terrains tracker, whose model reads the `terrain` height map that both
releases compute in code), each release builds its Terrain from its own
file's terrain config (v3.1's from the old configs, today's from each
migrated file) after the same seeds, and samples height maps at the same
seeded root states: height samples and maps must be bit-identical; adds
terrain_vs_v31 to the case.
"""
import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from pm_reference import reexec_deterministic  # noqa: E402

EVAL_SEED = 1234
SMPL_REL = "data/pretrained_models/motion_tracker/smpl/experiment_config.py"
# today's experiments a template is recorded from: (template name, experiment
# relative to the ProtoMotions checkout, robot name)
TEMPLATES = [
    ("smpl_tracker", SMPL_REL, "smpl"),
    # today's PPO G1 tracker (BeyondMimic-style rewards, reduced-coords
    # observations), given by g1_for_v31 the components v3.1's G1 tracker
    # reads, from today's own factories: the G1 tracker's template
    ("g1_tracker", "examples/experiments/mimic/mlp_bm_l2c2.py", "g1"),
    # today's smpl tracker on complex terrain (the terrain height map as an
    # input): the template of v3.1's smpl-terrains tracker
    ("smpl_terrains_tracker", "examples/experiments/mimic/mlp_complex_terrain.py", "smpl"),
]


def g1_for_v31(cfgs):
    """Today's G1 experiment given, from today's own factories and helpers,
    what v3.1's G1 tracker (motion_tracker/g1-amass) reads and today's
    experiment lacks; `pmstate migrate` takes every context binding from
    here, never makes one up:
    - actions: today's generic `make_pd_action_config` (offsets and scales
      from the joint limits, the robot's fixed gains), v3.1's built-in PD
      formula; migrate sets its transform to v3.1's clamp;
    - history observations: `historical_reduced_coords_obs_factory` (noisy,
      and clean for an inference-only file), `historical_max_coords_obs_factory`,
      and `previous_actions_factory(processed=False)` (the policy's actions,
      as v3.1's history holds them);
    - the critic's max-coords observations (current, history, target poses)
      in the root's frame, as v3.1 computes them: their `anchor_body_index`
      binding removed, so today's functions take their default, body 0 (the
      G1's anchor is the torso, body 16);
    - v3.1's anchor-position reward and the two anchor terminations:
      `global_anchor_pos_rew_factory`, `anchor_pos_error_term_factory`,
      `anchor_ori_error_term_factory`;
    - no L2C2 (v3.1 trained without it; its clean observation pairs are not
      v3.1's inputs)."""
    from protomotions.agents.ppo.config import L2C2Config
    from protomotions.envs.action import make_pd_action_config
    from protomotions.envs.component_factories import (anchor_ori_error_term_factory,
                                                       anchor_pos_error_term_factory,
                                                       global_anchor_pos_rew_factory,
                                                       historical_max_coords_obs_factory,
                                                       historical_reduced_coords_obs_factory,
                                                       previous_actions_factory)
    env = cfgs["env"]
    obs = env.observation_components
    obs["noisy_historical_reduced_coords_obs"] = historical_reduced_coords_obs_factory(use_noisy=True)
    obs["clean_historical_reduced_coords_obs"] = historical_reduced_coords_obs_factory(use_noisy=False)
    obs["historical_max_coords_obs"] = historical_max_coords_obs_factory(
        use_noisy=False, local_obs=True, root_height_obs=True, observe_contacts=False)
    obs["historical_previous_actions"] = previous_actions_factory(processed=False)
    for name in ("max_coords_obs", "historical_max_coords_obs", "mimic_max_coords_target_poses"):
        del obs[name].dynamic_vars["anchor_body_index"]
    env.reward_components["global_anchor_pos"] = global_anchor_pos_rew_factory()
    env.termination_components["bad_ref_pos"] = anchor_pos_error_term_factory()
    env.termination_components["bad_ref_ori"] = anchor_ori_error_term_factory()
    env.action_config = make_pd_action_config(cfgs["robot"])
    cfgs["agent"].l2c2 = L2C2Config()
    return cfgs


# a template's adaptation to the old release's layout (template name -> function)
ADAPT = {"g1_tracker": g1_for_v31}
CASES = [
    # (name, old checkpoint relative to the repo, old expected outputs, migrate's flags)
    # v3.1's action_smoothness has no same-math counterpart today (see the
    # report): dropped explicitly, so resuming trains without it
    ("v31_tracker", "testdata/policy/v31_tracker/last.ckpt", "testdata/policy/v31_tracker",
     ["--drop-unmatched-terms"]),
    # the G1's density-weighted rewards, physical action rate, soft joint
    # limits and relative-body termination have none either (see the report)
    ("v31_g1_tracker", "testdata/policy/v31_g1_tracker/last.ckpt", "testdata/policy/v31_g1_tracker",
     ["--drop-unmatched-terms"]),
    # on complex terrain; its robot names no contact bodies, so its contact
    # reward has none either
    ("v31_terrains_tracker", "testdata/policy/v31_terrains_tracker/last.ckpt", "testdata/policy/v31_terrains_tracker",
     ["--drop-unmatched-terms"]),
]


def read_safetensors(torch, path):
    from safetensors.torch import load_file
    return load_file(path)


def load_record_policy():
    path = os.path.join(REPO, "testdata", "policy", "record_policy.py")
    spec = importlib.util.spec_from_file_location("record_policy", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def templates(rp, root, only=None):
    for name, rel, robot in TEMPLATES:
        if only and name not in only:
            continue
        cfgs, mod, args = rp.build_configs(root, rel, robot, name)
        if name in ADAPT:
            cfgs = ADAPT[name](cfgs)
        inf = rp.inference_configs(cfgs, mod, args)
        out = os.path.join(HERE, "templates", name)
        os.makedirs(out, exist_ok=True)
        rp.save_resolved_configs(cfgs, os.path.join(out, "resolved_configs.pt"))
        rp.save_resolved_configs(inf, os.path.join(out, "resolved_configs_inference.pt"))
        print(f"wrote {out}")


def verify(rp, root, pmstate, write, cases=None):
    cases = CASES if cases is None else cases
    torch = rp.torch
    from tensordict import TensorDict  # noqa: F401  (today's agent builds TensorDicts)
    fabric = rp.PM.Fabric(**rp.PM.FabricConfig(accelerator="cpu", devices=1, num_nodes=1, loggers=[],
                                               callbacks=[]).as_kwargs())
    fabric.launch()
    results = []
    for name, old_ckpt, old_dir, flags in cases:
        out = tempfile.mkdtemp(prefix=f"migrate_{name}_")
        os.rmdir(out)
        proc = subprocess.run([pmstate, "migrate", *flags, os.path.join(REPO, old_ckpt), out, "--json"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{name}: pmstate migrate failed: {proc.stderr}")
        report = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
        obs = {k: v for k, v in read_safetensors(torch, os.path.join(REPO, old_dir, "obs.safetensors")).items()}
        expected = read_safetensors(torch, os.path.join(REPO, old_dir, "expected.safetensors"))
        checks = {}
        for cfg_file, training_state in (("resolved_configs.pt", True), ("resolved_configs_inference.pt", False)):
            cfgs = torch.load(os.path.join(out, cfg_file), weights_only=False)
            classes = {k: f"{type(v).__module__}.{type(v).__qualname__}" for k, v in cfgs.items()}
            source = rp.ObsSource({k: v.shape[1] for k, v in obs.items()}, seed=0)
            scratch = Path(tempfile.mkdtemp(prefix="migrate_agent_"))
            agent = rp.make_agent(fabric, cfgs, source, scratch)
            agent.load(os.path.join(out, "last.ckpt"), load_env=False, load_training_state=training_state)
            model = agent.model.module if hasattr(agent.model, "module") else agent.model
            model.eval()
            torch.manual_seed(EVAL_SEED)
            with torch.no_grad():
                td = model(TensorDict({k: v.clone() for k, v in obs.items()}, batch_size=obs[next(iter(obs))].shape[0]))
            cmp = {}
            for k, want in expected.items():
                got = td[k]
                cmp[k] = {"bit_identical": bool(torch.equal(got, want)),
                          "max_abs_diff": float((got.double() - want.double()).abs().max())}
            # every context binding resolvable: a FieldPath with its name and parent path
            unresolved = [f"{t}.{n}.{a}" for t in ("observation_components", "reward_components",
                                                   "termination_components")
                          for n, c in getattr(cfgs["env"], t).items() for a, fp in c.dynamic_vars.items()
                          if not (hasattr(fp, "_parent_path") and hasattr(fp, "name"))]
            check = {"configs": cfg_file, "classes": classes, "load_training_state": training_state,
                     "outputs": cmp, "unresolvable_bindings": unresolved}
            if training_state:
                check["restored"] = {"epoch": agent.current_epoch, "step_count": agent.step_count,
                                     "reward_norm_count": int(agent.running_reward_norm.count),
                                     "actor_optimizer_states": len(agent.actor_optimizer.state_dict()["state"]),
                                     "critic_optimizer_states": len(agent.critic_optimizer.state_dict()["state"])}
                # the restored training state is the old release's, exactly
                saved = torch.load(os.path.join(REPO, old_ckpt), weights_only=False)
                for opt_name in ("actor_optimizer", "critic_optimizer"):
                    got_state = getattr(agent, opt_name).state_dict()["state"]
                    want_state = saved[opt_name]["state"]
                    check["restored"][f"{opt_name}_equal"] = sorted(got_state) == sorted(want_state) and all(
                        torch.equal(got_state[i][m], want_state[i][m]) for i in want_state for m in want_state[i])
                check["restored"]["reward_norm_equal"] = all(
                    torch.equal(agent.running_reward_norm.state_dict()[k], saved["running_reward_norm"][k])
                    for k in saved["running_reward_norm"])
                norms = [m for m in model.modules() if hasattr(m, "ema_decay")]
                check["restored"]["obs_normalizers_welford"] = bool(norms) and all(m.ema_decay is None for m in norms)
                # one resumed optimizer step: the restored Adam moments are used
                model.train()
                o = source.sample(8)
                res = model(TensorDict(o, batch_size=8))
                loss = res["mean_action"].pow(2).mean() + res["value"].pow(2).mean()
                for opt in (agent.actor_optimizer, agent.critic_optimizer):
                    opt.zero_grad(set_to_none=True)
                loss.backward()
                for opt in (agent.actor_optimizer, agent.critic_optimizer):
                    opt.step()
                check["resumed_step"] = "ok"
            checks[cfg_file] = check
            ok = all(c["bit_identical"] for c in cmp.values())
            print(f"{name} {cfg_file} (training state {training_state}): "
                  f"{'bit identical' if ok else 'DIFFERENT'} {cmp}", flush=True)
        files = {f: sha256(os.path.join(out, f)) for f in sorted(os.listdir(out))}
        if write:
            keep = os.path.join(HERE, name)
            os.makedirs(keep, exist_ok=True)
            for f in files:
                if f != "migrate_report.json":  # names the paths of this run; kept in verified.json
                    shutil.copyfile(os.path.join(out, f), os.path.join(keep, f))
        restored = checks["resolved_configs.pt"]["restored"]
        resumed_ok = all(v for k, v in restored.items() if k.endswith("_equal") or k.endswith("_welford"))
        results.append({"name": name, "resume_state_verified": resumed_ok, "old_checkpoint": old_ckpt, "flags": flags, "migrated_sha256": files,
                        "report": report, "checks": checks,
                        "verified": resumed_ok and all(c["bit_identical"] for ch in checks.values()
                                                        for c in ch["outputs"].values())
                        and not any(ch["unresolvable_bindings"] for ch in checks.values())})
    if not all(r["verified"] for r in results):
        raise SystemExit("some migrated case differs from the old release's outputs")
    if not write:
        print("verified (nothing written)")
        return
    with open(os.path.join(HERE, "verified.json"), "w") as f:
        json.dump({"protomotions_commit": "607ca7a0bb92e261120bcab8d9f97f28b3130ffc", "torch": torch.__version__,
                   "cases": results}, f, indent=1, sort_keys=True)
        f.write("\n")


# ------------------------------------------------------------------ kernels
# v3.1 context keys -> today's context paths (parent, name), as the mapped
# components bind them
V31_KEYS = {
    ("current", "rigid_body_pos"): "current_state_rigid_body_pos",
    ("current", "rigid_body_rot"): "current_state_rigid_body_rot",
    ("current", "rigid_body_vel"): "current_state_rigid_body_vel",
    ("current", "rigid_body_ang_vel"): "current_state_rigid_body_ang_vel",
    ("current", "root_height"): "current_state_root_height",
    ("current", "dof_forces"): "current_state_dof_forces",
    ("current", "dof_vel"): "current_state_dof_vel",
    ("current", "rigid_body_contacts"): "current_state_rigid_body_contacts",
    ("mimic.ref_state", "rigid_body_pos"): "ref_state_rigid_body_pos",
    ("mimic.ref_state", "rigid_body_rot"): "ref_state_rigid_body_rot",
    ("mimic.ref_state", "rigid_body_vel"): "ref_state_rigid_body_vel",
    ("mimic.ref_state", "rigid_body_ang_vel"): "ref_state_rigid_body_ang_vel",
    ("mimic.ref_state", "rigid_body_contacts"): "ref_state_rigid_body_contacts",
    ("", "ground_heights"): "ground_heights_beneath_root",
    ("", "body_contacts"): "body_contacts",
    # the G1's anchor and state history (v3.1's historical_* keys)
    ("current", "anchor_pos"): "current_state_anchor_pos",
    ("current", "anchor_rot"): "current_state_anchor_rot",
    **{("mimic", f"future_{k}"): f"mimic_ref_{k}" for k in ("pos", "rot", "vel", "ang_vel")},
    **{("historical", k): f"historical_{k}" for k in (
        "rigid_body_pos", "rigid_body_rot", "rigid_body_vel", "rigid_body_ang_vel", "ground_heights",
        "body_contacts", "actions", "dof_pos", "dof_vel", "root_local_ang_vel", "anchor_rot")},
}
# the parameters the env applies around a kernel (not kernel arguments)
ENV_PARAMS = {"weight", "min_value", "max_value", "zero_during_grace_period"}
N = 64


def future_count(future_steps):
    """How many future poses today's mimic control provides: `future_steps`
    N (the next N steps) or a list of step offsets."""
    return future_steps if isinstance(future_steps, int) else len(future_steps)


def kernel_inputs(torch, B, D, H, F, anchor):
    """Seeded states for B bodies, D dofs, H history steps, F future steps; the anchor
    values are body `anchor`'s (as both releases' contexts take them)."""
    g = torch.Generator().manual_seed(77)

    def quat(*shape):
        q = torch.randn(*shape, 4, generator=g)
        return q / q.norm(dim=-1, keepdim=True)

    x = {}
    for side in ("current_state", "ref_state"):
        x[f"{side}_rigid_body_pos"] = torch.randn(N, B, 3, generator=g) * 0.3 + torch.tensor([0.0, 0.0, 0.9])
        x[f"{side}_rigid_body_rot"] = quat(N, B)
        x[f"{side}_rigid_body_vel"] = torch.randn(N, B, 3, generator=g)
        x[f"{side}_rigid_body_ang_vel"] = torch.randn(N, B, 3, generator=g) * 2
        x[f"{side}_rigid_body_contacts"] = torch.rand(N, B, generator=g) > 0.5
    x["current_state_root_height"] = x["current_state_rigid_body_pos"][:, 0, 2].clone()
    x["ref_state_root_height"] = x["ref_state_rigid_body_pos"][:, 0, 2].clone()
    x["current_state_dof_forces"] = torch.randn(N, D, generator=g) * 50
    x["current_state_dof_vel"] = torch.randn(N, D, generator=g) * 3
    x["ground_heights_beneath_root"] = torch.rand(N, generator=g) * 0.1
    x["body_contacts"] = torch.rand(N, B, generator=g) > 0.5
    for side in ("current_state", "ref_state"):
        x[f"{side}_anchor_pos"] = x[f"{side}_rigid_body_pos"][:, anchor].clone()
        x[f"{side}_anchor_rot"] = x[f"{side}_rigid_body_rot"][:, anchor].clone()
    x["historical_rigid_body_pos"] = torch.randn(N, H, B, 3, generator=g) * 0.3 + torch.tensor([0.0, 0.0, 0.9])
    x["historical_rigid_body_rot"] = quat(N, H, B)
    x["historical_rigid_body_vel"] = torch.randn(N, H, B, 3, generator=g)
    x["historical_rigid_body_ang_vel"] = torch.randn(N, H, B, 3, generator=g) * 2
    x["historical_ground_heights"] = torch.rand(N, H, generator=g) * 0.1
    x["historical_body_contacts"] = torch.rand(N, H, B, generator=g) > 0.5
    x["historical_actions"] = torch.randn(N, H, D, generator=g)
    # the mimic control's future reference poses (F steps)
    x["mimic_ref_pos"] = torch.randn(N, F, B, 3, generator=g) * 0.3 + torch.tensor([0.0, 0.0, 0.9])
    x["mimic_ref_rot"] = quat(N, F, B)
    x["mimic_ref_vel"] = torch.randn(N, F, B, 3, generator=g)
    x["mimic_ref_ang_vel"] = torch.randn(N, F, B, 3, generator=g) * 2
    return x


def old_kernels(v31_root, configs_path, inputs_path, out_path):
    """In a process of its own (v3.1's package): v3.1's functions as its
    configs bind them, on the shared inputs."""
    sys.path.insert(0, v31_root)
    import torch
    cfgs = torch.load(configs_path, weights_only=False)
    x = torch.load(inputs_path)
    body_names = list(cfgs["robot"].kinematic_info.body_names)
    naming = cfgs["robot"].common_naming_to_robot_body_names
    out = {}
    for table in ("reward_components", "termination_components", "observation_components"):
        for name, c in getattr(cfgs["env"], table).items():
            if any(isinstance(v, str) and v not in x for v in c.variables.values()):
                out[f"{table}.{name}"] = "not run: a context value not generated here"
                continue
            kwargs = {k: (x[v] if isinstance(v, str) else v) for k, v in c.variables.items()}
            if kwargs.get("num_future_steps") is not None:
                continue  # a number of future steps of its own: not mapped by migrate
            if c.indices_subset is not None:
                names = [b for grp in c.indices_subset for b in naming.get(grp, [grp])]
                kwargs["indices"] = torch.tensor([body_names.index(b) for b in names])
            try:
                out[f"{table}.{name}"] = c.function(**kwargs)
            except TypeError as e:
                out[f"{table}.{name}"] = f"not run: {e}"
    torch.save(out, out_path)


def kernels(rp, root, v31_root, case_dir):
    """Today's kernels, bound by the migrated configs, against v3.1's own
    functions bound by the old configs, on the same random states."""
    torch = rp.torch
    cfgs = torch.load(os.path.join(HERE, case_dir, "resolved_configs.pt"), weights_only=False)
    anchor = cfgs["robot"].anchor_body_index or 0
    x = kernel_inputs(torch, len(cfgs["robot"].kinematic_info.body_names), cfgs["robot"].kinematic_info.num_dofs,
                      cfgs["env"].num_state_history_steps,
                      future_count(cfgs["env"].control_components["mimic"].future_steps), anchor)
    scratch = tempfile.mkdtemp(prefix="migrate_kernels_")
    inputs = os.path.join(scratch, "inputs.pt")
    torch.save(x, inputs)
    old_out = os.path.join(scratch, "old.pt")
    old_cfg = os.path.join(REPO, "testdata", "policy", case_dir, "resolved_configs.pt")
    subprocess.check_call([sys.executable, os.path.abspath(__file__), "old-kernels", "--protomotions", v31_root,
                           "--args", old_cfg, inputs, old_out])
    old = torch.load(old_out)
    body_names = list(cfgs["robot"].kinematic_info.body_names)
    # today's contact_body_ids (build_body_ids_tensor: none when contact_bodies is None)
    contact_ids = torch.tensor([body_names.index(b) for b in cfgs["robot"].contact_bodies or []], dtype=torch.long)
    results = {}
    for table in ("reward_components", "termination_components", "observation_components"):
        for name, comp in getattr(cfgs["env"], table).items():
            key = f"{table}.{name}"
            if key not in old or isinstance(old[key], str):
                results[key] = "not compared (v3.1's not run: " + str(old.get(key, "target poses")) + ")"
                continue
            kwargs = {}
            for arg, fp in comp.dynamic_vars.items():
                path = (fp._parent_path, fp.name)
                if path == ("", "contact_body_ids"):
                    kwargs[arg] = contact_ids
                elif fp.name == "anchor_idx":
                    kwargs[arg] = anchor  # the robot's anchor body (SMPL: the root)
                else:
                    kwargs[arg] = x[V31_KEYS[path]]
            kwargs.update({k: v for k, v in comp.static_params.items() if k not in ENV_PARAMS})
            got = comp.compute_func(**kwargs)
            want = old[key]
            same = torch.equal(got, want)
            results[key] = {"bit_identical": bool(same),
                            "max_abs_diff": float((got.double() - want.double()).abs().max())}
    return results


# ------------------------------------------------------------ g1-kernels
# The G1 tracker's BeyondMimic-style table entries (migrate/tables.rs), today's
# function against v3.1's on the same seeded random states, bound as each
# release binds them: v3.1 reads the anchor from its context
# (current_state_anchor_*, ref_state_anchor_* = the reference body at the
# anchor), today's reads the reference anchor as ref_rigid_body_*[:, anchor_idx].
# No density weights: with them v3.1's math is not today's (refused).
G1_BODIES, G1_ANCHOR = 30, 16
# (name, v3.1 module.function, today's module.function, parameters)
G1_ENTRIES = [
    ("global_anchor_pos", "rewards.tracking.global_position_error_exp",
     "rewards.tracking.compute_global_anchor_pos_rew", {"sigma": 0.3}),
    ("global_anchor_ori", "rewards.tracking.global_orientation_error_exp",
     "rewards.tracking.compute_global_anchor_ori_rew", {"sigma": 0.4}),
    ("relative_body_pos", "rewards.tracking.relative_body_position_error_exp",
     "rewards.tracking.compute_relative_body_pos_rew", {"sigma": 0.3}),
    ("relative_body_ori", "rewards.tracking.relative_body_orientation_error_exp",
     "rewards.tracking.compute_relative_body_ori_rew", {"sigma": 0.4}),
    ("body_lin_vel", "rewards.tracking.global_velocity_error_exp",
     "rewards.tracking.compute_global_body_lin_vel_rew", {"sigma": 1.0}),
    ("body_ang_vel", "rewards.tracking.global_velocity_error_exp",
     "rewards.tracking.compute_global_body_ang_vel_rew", {"sigma": 3.14}),
    ("bad_ref_pos", "terminations.tracking.anchor_pos_error",
     "terminations.tracking.compute_anchor_pos_error_term", {"threshold": 0.5}),
    ("bad_ref_ori", "terminations.tracking.anchor_ori_error",
     "terminations.tracking.compute_anchor_ori_error_term", {"threshold": 0.8}),
]


def g1_inputs(torch):
    g = torch.Generator().manual_seed(78)

    def quat(*shape):
        q = torch.randn(*shape, 4, generator=g)
        return q / q.norm(dim=-1, keepdim=True)

    x = {}
    for side in ("cur", "ref"):
        x[f"{side}_pos"] = torch.randn(N, G1_BODIES, 3, generator=g) * 0.3 + torch.tensor([0.0, 0.0, 0.8])
        x[f"{side}_rot"] = quat(N, G1_BODIES)
        x[f"{side}_vel"] = torch.randn(N, G1_BODIES, 3, generator=g)
        x[f"{side}_ang_vel"] = torch.randn(N, G1_BODIES, 3, generator=g) * 2
    return x


def g1_old_kwargs(name, x, p):
    a = G1_ANCHOR
    ca, ra = (x["cur_pos"][:, a], x["cur_rot"][:, a]), (x["ref_pos"][:, a], x["ref_rot"][:, a])
    return {
        "global_anchor_pos": dict(x=ca[0], ref_x=ra[0]),
        "global_anchor_ori": dict(q=ca[1], ref_q=ra[1]),
        "relative_body_pos": dict(body_pos=x["cur_pos"], ref_body_pos=x["ref_pos"], anchor_pos=ca[0],
                                  ref_anchor_pos=ra[0], anchor_rot=ca[1], ref_anchor_rot=ra[1]),
        "relative_body_ori": dict(body_rot=x["cur_rot"], ref_body_rot=x["ref_rot"], anchor_rot=ca[1],
                                  ref_anchor_rot=ra[1]),
        "body_lin_vel": dict(x=x["cur_vel"], ref_x=x["ref_vel"]),
        "body_ang_vel": dict(x=x["cur_ang_vel"], ref_x=x["ref_ang_vel"]),
        "bad_ref_pos": dict(anchor_pos=ca[0], ref_anchor_pos=ra[0]),
        "bad_ref_ori": dict(anchor_rot=ca[1], ref_anchor_rot=ra[1]),
    }[name] | p


def g1_today_kwargs(name, x, p):
    a = G1_ANCHOR
    cap, car = x["cur_pos"][:, a], x["cur_rot"][:, a]
    return {
        "global_anchor_pos": dict(current_anchor_pos=cap, ref_rigid_body_pos=x["ref_pos"], anchor_idx=a),
        "global_anchor_ori": dict(current_anchor_rot=car, ref_rigid_body_rot=x["ref_rot"], anchor_idx=a),
        "relative_body_pos": dict(current_rigid_body_pos=x["cur_pos"], ref_rigid_body_pos=x["ref_pos"],
                                  current_anchor_rot=car, ref_rigid_body_rot=x["ref_rot"],
                                  current_anchor_pos=cap, anchor_idx=a),
        "relative_body_ori": dict(current_rigid_body_rot=x["cur_rot"], ref_rigid_body_rot=x["ref_rot"],
                                  current_anchor_rot=car, anchor_idx=a),
        "body_lin_vel": dict(current_rigid_body_vel=x["cur_vel"], ref_rigid_body_vel=x["ref_vel"]),
        "body_ang_vel": dict(current_rigid_body_ang_vel=x["cur_ang_vel"], ref_rigid_body_ang_vel=x["ref_ang_vel"]),
        "bad_ref_pos": dict(current_anchor_pos=cap, ref_rigid_body_pos=x["ref_pos"], anchor_idx=a),
        "bad_ref_ori": dict(current_anchor_rot=car, ref_rigid_body_rot=x["ref_rot"], anchor_idx=a),
    }[name] | p


def g1_call(root, inputs_path, out_path, old):
    """v3.1's (old) or today's functions on the shared inputs, in this process."""
    sys.path.insert(0, root)
    import importlib
    import torch
    x = torch.load(inputs_path)
    out = {}
    for name, old_fn, new_fn, p in G1_ENTRIES:
        mod, fn = (old_fn if old else new_fn).rsplit(".", 1)
        f = getattr(importlib.import_module(f"protomotions.envs.{mod}"), fn)
        out[name] = f(**(g1_old_kwargs if old else g1_today_kwargs)(name, x, p))
    torch.save(out, out_path)


def g1_kernels(torch, root, v31_root):
    scratch = tempfile.mkdtemp(prefix="migrate_g1_kernels_")
    inputs = os.path.join(scratch, "inputs.pt")
    torch.save(g1_inputs(torch), inputs)
    outs = {}
    for tag, r in (("old", v31_root), ("today", root)):
        outs[tag] = os.path.join(scratch, f"{tag}.pt")
        subprocess.check_call([sys.executable, os.path.abspath(__file__), f"g1-call-{tag}", "--protomotions", r,
                               "--args", inputs, outs[tag], "-"])
    old, new = torch.load(outs["old"]), torch.load(outs["today"])
    res = {}
    for name, old_fn, new_fn, _ in G1_ENTRIES:
        got, want = new[name], old[name]
        res[name] = {"v31": old_fn, "today": new_fn, "bit_identical": bool(torch.equal(got, want)),
                     "max_abs_diff": float((got.double() - want.double()).abs().max())}
    return res


# ------------------------------------------------------- g1-observations
# The v3.1 G1 tracker's actor observations and actions, through the MIGRATED
# configs (testdata/migrate/v31_g1_tracker) with today's code, against v3.1's
# own values: testdata/deploy/v31_g1_tracker/inputs_b16.safetensors (v3.1's
# context values, recorded by record_releases_deploy.py), obs_b16.safetensors
# (v3.1's observation components on them) and torch_b16.safetensors (v3.1's
# mean actions and its PD targets: offset + scale * clamp(action), offsets
# and scales by v3.1's build_pd_action_offset_scale).
G1_OBS_DIR = "testdata/deploy/v31_g1_tracker"
G1_CASE = "v31_g1_tracker"
# today's context paths -> v3.1's recorded context keys (v3.1's inference
# file binds its clean keys; the training file's noisy components read
# today's noisy views, fed here the same recorded values)
G1_PATHS = {
    "dof_pos": "current_state_dof_pos", "dof_vel": "current_state_dof_vel",
    "anchor_rot": "current_state_anchor_rot", "root_local_ang_vel": "current_state_root_local_ang_vel",
    "future_anchor_rot": "mimic_ref_anchor_rot", "future_dof_pos": "mimic_ref_dof_pos",
    "future_dof_vel": "mimic_ref_dof_vel",
}
G1_HIST_PATHS = {"dof_pos": "historical_dof_pos", "dof_vel": "historical_dof_vel",
                 "root_local_ang_vel": "historical_root_local_ang_vel", "anchor_rot": "historical_anchor_rot",
                 "actions": "historical_actions"}


def g1_resolve(torch, x, path, fill):
    """A recorded value for today's context path; paths v3.1's observations do
    not read (today's functions take them and, with these parameters, leave
    them unused) get `fill`: each observation is computed with two fills and
    both must give v3.1's values."""
    parent, _, name = path.rpartition(".")
    if parent in ("noisy", "current", "mimic") and name in G1_PATHS:
        return x[G1_PATHS[name]]
    if parent in ("noisy_historical", "historical") and name in G1_HIST_PATHS:
        return x[G1_HIST_PATHS[name]]
    n = x["current_state_dof_pos"].shape[0]
    shapes = {"anchor_pos": (n, 3), "ref_anchor_pos": (n, 3), "future_anchor_pos": (n, 1, 3),
              "future_anchor_vel": (n, 1, 3), "future_anchor_ang_vel": (n, 1, 3), "root_rot": (n, 3, 4)}
    if name not in shapes:
        raise SystemExit(f"g1-observations: no recorded value for today's context path {path}")
    if fill == 0:
        v = torch.zeros(shapes[name])
        if name.endswith("rot"):
            v[..., 3] = 1.0
        return v
    return torch.randn(shapes[name], generator=torch.Generator().manual_seed(5))


def g1_observations(rp, root):
    torch = rp.torch
    from safetensors.torch import load_file
    x = load_file(os.path.join(REPO, G1_OBS_DIR, "inputs_b16.safetensors"))
    want = load_file(os.path.join(REPO, G1_OBS_DIR, "obs_b16.safetensors"))
    res = {}
    for cfg_file in ("resolved_configs.pt", "resolved_configs_inference.pt"):
        cfgs = torch.load(os.path.join(HERE, G1_CASE, cfg_file), weights_only=False)
        comps = cfgs["env"].observation_components
        for name, w in want.items():
            comp = comps[name]
            params = {k: v for k, v in comp.static_params.items() if k not in ENV_PARAMS}
            outs = []
            for fill in (0, 1):
                kwargs = {arg: g1_resolve(torch, x, fp.path, fill) for arg, fp in comp.dynamic_vars.items()}
                outs.append(comp.compute_func(**kwargs, **params))
            same_shape = all(tuple(g.shape) == tuple(w.shape) for g in outs)
            res[f"{cfg_file}:{name}"] = {
                "today": f"{comp.compute_func.__module__}.{comp.compute_func.__name__}",
                "bindings": {a: fp.path for a, fp in comp.dynamic_vars.items()},
                "shape": list(outs[0].shape), "runs": len(outs),
                "bit_identical": bool(same_shape and all(torch.equal(g, w) for g in outs)),
                "max_abs_diff": max(float((g.double() - w.double()).abs().max()) for g in outs)
                if same_shape else None}
    return res


def g1_v31_pd(v31_root, configs_path, actions_path, out_path):
    """In a process of its own (v3.1's package): v3.1's PD targets for the
    given actions, as its env and simulator compute them (process_actions'
    clamp to robot.control.clamp_actions, then BaseSimulator's
    offset + scale * action with build_pd_action_offset_scale's offsets and
    scales), and the gains its simulator drives (control_info)."""
    sys.path.insert(0, v31_root)
    import torch
    from protomotions.simulator.base_simulator.utils import build_pd_action_offset_scale
    robot = torch.load(configs_path, weights_only=False)["robot"]
    k = robot.kinematic_info
    offset, scale = build_pd_action_offset_scale(k.hinge_axes_map, k.dof_limits_lower.clone(),
                                                 k.dof_limits_upper.clone(), robot.control.action_scale,
                                                 torch.device("cpu"))
    c = robot.control.clamp_actions
    out = {}
    for key, a in torch.load(actions_path).items():
        out[key] = offset + scale * torch.clamp(a, -c, c)
    names = list(k.dof_names)
    out["stiffness"] = torch.tensor([robot.control.control_info[j].stiffness for j in names], dtype=torch.float32)
    out["damping"] = torch.tensor([robot.control.control_info[j].damping for j in names], dtype=torch.float32)
    torch.save(out, out_path)


def g1_actions(rp, root, v31_root):
    """Today's action function with the migrated action config against
    v3.1's PD targets: on v3.1's recorded mean actions (torch_b16, whose PD
    targets the deploy recording holds), and on actions past the clamp."""
    torch = rp.torch
    from safetensors.torch import load_file
    rec = load_file(os.path.join(REPO, G1_OBS_DIR, "torch_b16.safetensors"))
    g = torch.Generator().manual_seed(91)
    actions = {"mean_actions": rec["actions"], "past_the_clamp": torch.randn(16, 29, generator=g) * 3}
    scratch = tempfile.mkdtemp(prefix="migrate_g1_actions_")
    inputs, old_out = os.path.join(scratch, "actions.pt"), os.path.join(scratch, "old.pt")
    torch.save(actions, inputs)
    old_cfg = os.path.join(REPO, "testdata", "policy", G1_CASE, "resolved_configs.pt")
    subprocess.check_call([sys.executable, os.path.abspath(__file__), "g1-v31-pd", "--protomotions", v31_root,
                           "--args", old_cfg, inputs, old_out])
    old = torch.load(old_out)
    res = {"v31_recorded_pd_targets_reproduced": bool(torch.equal(old["mean_actions"], rec["joint_pos_targets"]))}
    for cfg_file in ("resolved_configs.pt", "resolved_configs_inference.pt"):
        ac = torch.load(os.path.join(HERE, G1_CASE, cfg_file), weights_only=False)["env"].action_config
        fn = ac["fn"]
        params = {k: v for k, v in ac.items() if k != "fn"}
        for key, a in actions.items():
            got = fn(a.clone(), **params)
            pd = got["processed_action"] if isinstance(got, dict) else got
            res[f"{cfg_file}:{key}"] = {"bit_identical": bool(torch.equal(pd, old[key])),
                                        "max_abs_diff": float((pd.double() - old[key].double()).abs().max())}
        for gain in ("stiffness", "damping"):
            res[f"{cfg_file}:{gain}"] = {"bit_identical": bool(torch.equal(params[gain], old[gain]))}
    return res


# ---------------------------------------------------------------- terrain
# The `terrain` input of v3.1's smpl-terrains tracker is computed in code by
# both releases (TerrainObs over Terrain.get_height_maps) from the terrain
# config migrate carries over: each release builds its Terrain from its own
# file's config (v3.1's from the old configs, today's from the migrated
# ones), after the same seeds, and samples height maps at the same root
# states; the height samples and the maps must be bit-identical.
TERRAIN_ENVS = 4


def terrain_build(root, configs_path, out_path):
    """In a process of its own (root's package): the height samples and the
    height maps at seeded root states of the Terrain that configs' terrain builds."""
    sys.path.insert(0, root)
    import random
    from types import SimpleNamespace

    import numpy as np
    import torch
    from protomotions.components.terrains.terrain import Terrain
    tc = torch.load(configs_path, weights_only=False)["terrain"]
    np.random.seed(0)
    random.seed(0)
    torch.manual_seed(0)
    t = Terrain(tc, TERRAIN_ENVS, "cpu")
    g = torch.Generator().manual_seed(3)
    pos = torch.zeros(TERRAIN_ENVS, 3)
    pos[:, :2] = torch.rand(TERRAIN_ENVS, 2, generator=g) * 20 + 5
    rot = torch.nn.functional.normalize(torch.randn(TERRAIN_ENVS, 4, generator=g), dim=-1)
    maps = t.get_height_maps(SimpleNamespace(root_pos=pos, root_rot=rot))
    torch.save({"class": type(tc).__name__, "height_samples": torch.as_tensor(np.asarray(t.height_samples)),
                "height_maps": maps}, out_path)


def terrain(root, v31_root):
    """terrain_vs_v31 of each case whose migrated terrain is a ComplexTerrainConfig."""
    import torch
    scratch = tempfile.mkdtemp(prefix="migrate_terrain_")
    res = {}
    for name, _, old_dir, _ in CASES:
        migrated = {f: os.path.join(HERE, name, f) for f in ("resolved_configs.pt", "resolved_configs_inference.pt")}
        old_out = os.path.join(scratch, f"{name}_old.pt")
        subprocess.check_call([sys.executable, os.path.abspath(__file__), "terrain-build", "--protomotions", v31_root,
                               "--args", os.path.join(REPO, old_dir, "resolved_configs.pt"), old_out, "-"])
        old = torch.load(old_out)
        if old["class"] != "ComplexTerrainConfig":
            continue
        res[name] = {}
        for f, path in migrated.items():
            new_out = os.path.join(scratch, f"{name}_{f}.pt")
            subprocess.check_call([sys.executable, os.path.abspath(__file__), "terrain-build", "--protomotions", root,
                                   "--args", path, new_out, "-"])
            new = torch.load(new_out)
            res[name][f] = {"class": new["class"], "height_samples_bit_identical":
                            bool(torch.equal(new["height_samples"], old["height_samples"])),
                            "height_maps_bit_identical": bool(torch.equal(new["height_maps"], old["height_maps"])),
                            "height_points": int(new["height_maps"].shape[1])}
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("step", choices=["templates", "verify", "kernels", "g1-kernels", "g1-observations", "g1-actions",
                                     "terrain", "old-kernels", "g1-call-old", "g1-call-today", "g1-v31-pd",
                                     "terrain-build"])
    ap.add_argument("--v31", help="kernels: a checkout of ProtoMotions v3.1 (494e54d3)")
    ap.add_argument("--args", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--only", nargs="*", help="templates: record only these templates (names of TEMPLATES)")
    ap.add_argument("--protomotions", required=True)
    ap.add_argument("--pmstate", default=os.path.join(REPO, "target", "debug", "pmstate"))
    ap.add_argument("--no-write", action="store_true", help="verify only: write neither verified.json nor the migrated files")
    ap.add_argument("--case", nargs=3, action="append", metavar=("NAME", "OLD_CKPT", "OLD_DIR"),
                    help="verify: this recorded case instead of CASES (with --drop-unmatched-terms; implies "
                         "--no-write), e.g. a published-width recording of record_releases.py --published-widths")
    args = ap.parse_args()
    reexec_deterministic()
    root = os.path.abspath(args.protomotions)
    if args.step == "old-kernels":
        old_kernels(root, *args.args)
        return
    if args.step == "g1-v31-pd":
        g1_v31_pd(root, *args.args)
        return
    if args.step == "terrain-build":
        terrain_build(root, args.args[0], args.args[1])
        return
    if args.step == "terrain":
        res = terrain(root, os.path.abspath(args.v31))
        for k, v in res.items():
            print(k, v)
        path = os.path.join(HERE, "verified.json")
        with open(path) as f:
            rec = json.load(f)
        for case in rec["cases"]:
            if case["name"] in res:
                case["terrain_vs_v31"] = res[case["name"]]
        with open(path, "w") as f:
            json.dump(rec, f, indent=1, sort_keys=True)
            f.write("\n")
        return
    if args.step in ("g1-call-old", "g1-call-today"):
        g1_call(root, args.args[0], args.args[1], args.step == "g1-call-old")
        return
    if args.step == "g1-kernels":
        import torch
        res = g1_kernels(torch, root, os.path.abspath(args.v31))
        for k, v in res.items():
            print(k, v)
        path = os.path.join(HERE, "verified.json")
        with open(path) as f:
            rec = json.load(f)
        rec["g1_table_kernels_vs_v31"] = res
        with open(path, "w") as f:
            json.dump(rec, f, indent=1, sort_keys=True)
            f.write("\n")
        return
    rp = load_record_policy()
    rp.import_reference(root)
    import logging
    logging.disable(logging.WARNING)
    if args.step == "templates":
        templates(rp, root, args.only)
    elif args.step in ("g1-observations", "g1-actions"):
        if args.step == "g1-observations":
            res, rec_key = g1_observations(rp, root), "g1_observations_vs_v31"
        else:
            res, rec_key = g1_actions(rp, root, os.path.abspath(args.v31)), "g1_actions_vs_v31"
        for k, v in res.items():
            print(k, v)
        path = os.path.join(HERE, "verified.json")
        with open(path) as f:
            rec = json.load(f)
        rec[rec_key] = res
        with open(path, "w") as f:
            json.dump(rec, f, indent=1, sort_keys=True)
            f.write("\n")
    elif args.step == "kernels":
        path = os.path.join(HERE, "verified.json")
        with open(path) as f:
            rec = json.load(f)
        for case in rec["cases"]:
            res = kernels(rp, root, os.path.abspath(args.v31), case["name"])
            for k, v in res.items():
                print(case["name"], k, v)
            case["kernels_vs_v31"] = res
        with open(path, "w") as f:
            json.dump(rec, f, indent=1, sort_keys=True)
            f.write("\n")
    else:
        cases = [(n, os.path.abspath(c), os.path.abspath(d), ["--drop-unmatched-terms"]) for n, c, d in args.case or []]
        verify(rp, root, os.path.abspath(args.pmstate), not args.no_write and not cases, cases or None)


if __name__ == "__main__":
    main()
