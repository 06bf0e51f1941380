#!/usr/bin/env python3
"""Records what `pmstate migrate` needs from today's ProtoMotions, and
verifies its output with today's ProtoMotions' own code.

usage: python testdata/migrate/record_migrate.py templates --protomotions PATH
       python testdata/migrate/record_migrate.py verify --protomotions PATH [--pmstate BIN] [--no-write]
       python testdata/migrate/record_migrate.py kernels --protomotions PATH --v31 V31_PATH

PATH is a checkout of github:NVlabs/ProtoMotions at commit
607ca7a0bb92e261120bcab8d9f97f28b3130ffc; its `protomotions` package is
imported from PATH at run time, nothing of it is copied here.

templates: today's configs of the shipped smpl motion-tracker experiment
(data/pretrained_models/motion_tracker/smpl/experiment_config.py), built
with today's `build_standard_configs` exactly as
testdata/policy/record_policy.py builds them (its helpers are imported), and
the inference configs after today's `apply_all_inference_overrides`; pickled
with torch.save as train_agent.py's save_configs does, into
templates/smpl_tracker/{resolved_configs.pt,resolved_configs_inference.pt}.
These pickles are data (today's dataclass instances, every field today's
classes have, with today's defaults); `pmstate migrate` embeds them and
overlays the old release's values onto them.

verify: for each recorded old-release case (CASES), runs `pmstate migrate
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
for resume also one optimizer step (the restored Adam state is used).
Writes verified.json (per case: the SHA-256 of every migrated file, the
report, and the comparison) and the migrated torch files under
<case>/ (not the report file, which names this run's paths); the CI tests
(crates/policy/tests/migrate.rs, crates/cli/tests/migrate_cli.rs) re-run
`migrate` and require byte-identical files and the same report, so a
change to migrate forces re-verification. --no-write only checks.

kernels (after verify): the mapped components' math, today's against
v3.1's. On the same seeded random states (64 envs, 24 bodies, 69 dofs;
the reference root height is body 0's z), today's compute_func of each
component of the migrated resolved_configs.pt with its static_params and
its dynamic_vars bound to those states, against v3.1's own function
(V31_PATH's package, imported in a process of its own) bound by v3.1's
configs (its variables and indices_subset); the env-level parameters
(weight, min_value, ...) are not kernel arguments in either release.
Components whose v3.1 inputs are not generated here (the target poses,
the previous actions) are listed as not compared. Adds kernels_vs_v31 to
verified.json.
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
CASES = [
    # (name, old checkpoint relative to the repo, old expected outputs, migrate's flags)
    # v3.1's action_smoothness has no same-math counterpart today (see the
    # report): dropped explicitly, so resuming trains without it
    ("v31_tracker", "testdata/policy/v31_tracker/last.ckpt", "testdata/policy/v31_tracker",
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


def templates(rp, root):
    cfgs, mod, args = rp.build_configs(root, SMPL_REL, "smpl", "smpl_tracker")
    inf = rp.inference_configs(cfgs, mod, args)
    out = os.path.join(HERE, "templates", "smpl_tracker")
    os.makedirs(out, exist_ok=True)
    rp.save_resolved_configs(cfgs, os.path.join(out, "resolved_configs.pt"))
    rp.save_resolved_configs(inf, os.path.join(out, "resolved_configs_inference.pt"))
    print(f"wrote {out}")


def verify(rp, root, pmstate, write):
    torch = rp.torch
    from tensordict import TensorDict  # noqa: F401  (today's agent builds TensorDicts)
    fabric = rp.PM.Fabric(**rp.PM.FabricConfig(accelerator="cpu", devices=1, num_nodes=1, loggers=[],
                                               callbacks=[]).as_kwargs())
    fabric.launch()
    results = []
    for name, old_ckpt, old_dir, flags in CASES:
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
            check = {"configs": cfg_file, "classes": classes, "load_training_state": training_state,
                     "outputs": cmp}
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
                                                        for c in ch["outputs"].values())})
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
}
# the parameters the env applies around a kernel (not kernel arguments)
ENV_PARAMS = {"weight", "min_value", "max_value", "zero_during_grace_period"}
N, B, D = 64, 24, 69


def kernel_inputs(torch):
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
            if "num_future_steps" in kwargs:
                continue  # target poses: shapes of the mimic control, not exercised here
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
    x = kernel_inputs(torch)
    scratch = tempfile.mkdtemp(prefix="migrate_kernels_")
    inputs = os.path.join(scratch, "inputs.pt")
    torch.save(x, inputs)
    old_out = os.path.join(scratch, "old.pt")
    old_cfg = os.path.join(REPO, "testdata", "policy", case_dir, "resolved_configs.pt")
    subprocess.check_call([sys.executable, os.path.abspath(__file__), "old-kernels", "--protomotions", v31_root,
                           "--args", old_cfg, inputs, old_out])
    old = torch.load(old_out)
    cfgs = torch.load(os.path.join(HERE, case_dir, "resolved_configs.pt"), weights_only=False)
    body_names = list(cfgs["robot"].kinematic_info.body_names)
    contact_ids = torch.tensor([body_names.index(b) for b in cfgs["robot"].contact_bodies])
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
                    kwargs[arg] = 0  # the root, as v3.1's max coords are taken (SMPL has no anchor_body_name)
                else:
                    kwargs[arg] = x[V31_KEYS[path]]
            kwargs.update({k: v for k, v in comp.static_params.items() if k not in ENV_PARAMS})
            got = comp.compute_func(**kwargs)
            want = old[key]
            same = torch.equal(got, want)
            results[key] = {"bit_identical": bool(same),
                            "max_abs_diff": float((got.double() - want.double()).abs().max())}
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("step", choices=["templates", "verify", "kernels", "old-kernels"])
    ap.add_argument("--v31", help="kernels: a checkout of ProtoMotions v3.1 (494e54d3)")
    ap.add_argument("--args", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--protomotions", required=True)
    ap.add_argument("--pmstate", default=os.path.join(REPO, "target", "debug", "pmstate"))
    ap.add_argument("--no-write", action="store_true", help="verify only: write neither verified.json nor the migrated files")
    args = ap.parse_args()
    reexec_deterministic()
    root = os.path.abspath(args.protomotions)
    if args.step == "old-kernels":
        old_kernels(root, *args.args)
        return
    rp = load_record_policy()
    rp.import_reference(root)
    import logging
    logging.disable(logging.WARNING)
    if args.step == "templates":
        templates(rp, root)
    elif args.step == "kernels":
        res = kernels(rp, root, os.path.abspath(args.v31), "v31_tracker")
        for k, v in res.items():
            print(k, v)
        path = os.path.join(HERE, "verified.json")
        with open(path) as f:
            rec = json.load(f)
        rec["cases"][0]["kernels_vs_v31"] = res
        with open(path, "w") as f:
            json.dump(rec, f, indent=1, sort_keys=True)
            f.write("\n")
    else:
        verify(rp, root, os.path.abspath(args.pmstate), not args.no_write)


if __name__ == "__main__":
    main()
