#!/usr/bin/env python3
"""Writes the torch-written checkpoint fixtures in this folder and their
manifest.json (see README.md).

usage: python testdata/checkpoints/make_checkpoints.py --protomotions PATH
           [--reference-commit SHA] [--out DIR]

PATH is a checkout of github:NVlabs/ProtoMotions; its
protomotions/agents/utils/normalization.py is loaded by path through
../pm_reference.py (nothing of it is copied): the normalizer states in the
PPO fixtures come from the real RunningMeanStd / RewardRunningMeanStd. The
module tree around them is our own and only mimics ProtoMotions' parameter
names. Everything is seeded, runs on one CPU thread and carries no
timestamps, so re-running with the same torch version writes the same bytes.

hostile_os_system.pt holds a pickle REDUCE of os.system: this script never
loads it with weights_only=False, and nor must anything else.
"""
import argparse
import builtins
import collections
import hashlib
import io
import json
import os
import pickletools
import struct
import sys
import tempfile
import zipfile
from unittest import mock

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from pm_reference import Fabric1, load_reference, reference_commit  # noqa: E402
import torch_compare as tc  # noqa: E402

REF = None  # protomotions.agents.utils.normalization, loaded by path

PWNED = "/tmp/pmstate_pwned"
OBS_DIM, FUTURE_DIM, HIDDEN, ACT_DIM = 12, 5, 32, 6


# ---------------------------------------------------------------------------
# A small module tree whose state_dict names mimic a ProtoMotions PPOModel
# (_actor.logstd, _actor.mu.input_models.<key>.running_obs_norm.*,
# _actor.mu.mlp.N.*, _critic...). Only the normalizers are ProtoMotions code.

class ObsEncoder(nn.Module):
    """Holds a lazy (shape=None) RunningMeanStd, as ProtoMotions builds its
    observation normalizers; records moments while training."""

    def __init__(self):
        super().__init__()
        self.running_obs_norm = REF.RunningMeanStd(fabric=None, shape=None, device="cpu", clamp_value=5.0)

    def forward(self, x):
        y = self.running_obs_norm.normalize(x)
        if self.training:
            self.running_obs_norm.record_moments(x)
        return y


def lazy_mlp(out):
    return nn.Sequential(nn.LazyLinear(HIDDEN), nn.LayerNorm(HIDDEN), nn.ReLU(),
                         nn.LazyLinear(HIDDEN), nn.ReLU(), nn.LazyLinear(out))


class Mu(nn.Module):
    def __init__(self):
        super().__init__()
        # "future" is never fed, so its lazy normalizer never gets buffers.
        self.input_models = nn.ModuleDict({"obs": ObsEncoder(), "future": ObsEncoder()})
        self.mlp = lazy_mlp(ACT_DIM)

    def forward(self, obs):
        return self.mlp(self.input_models["obs"](obs))


class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self.logstd = nn.Parameter(torch.ones(ACT_DIM) * -2.9)
        self.mu = Mu()

    def forward(self, obs):
        return self.mu(obs), self.logstd


class Critic(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_models = nn.ModuleDict({"obs": ObsEncoder()})
        self.mlp = lazy_mlp(1)

    def forward(self, obs):
        return self.mlp(self.input_models["obs"](obs))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self._actor = Actor()
        self._critic = Critic()


def train_small_ppo():
    """A few real rollouts and two real Adam steps per optimizer."""
    g = torch.Generator().manual_seed(1234)
    model = Model()
    model.train()
    obs0 = torch.randn(16, OBS_DIM, generator=g)
    with torch.no_grad():  # materialize the LazyLinears (and record moments once)
        model._actor(obs0)
        model._critic(obs0)
    actor_opt = torch.optim.Adam(model._actor.parameters(), lr=2e-5)
    critic_opt = torch.optim.Adam(model._critic.parameters(), lr=1e-4)
    reward_norm = REF.RewardRunningMeanStd(fabric=Fabric1(), shape=(1,), gamma=0.99, device="cpu")
    for _ in range(2):
        obs = torch.randn(24, OBS_DIM, generator=g) * 3.0 + 0.5
        actions = torch.randn(24, ACT_DIM, generator=g)
        returns = torch.randn(24, 1, generator=g)
        advantages = torch.randn(24, generator=g)
        reward = torch.randn(24, 1, generator=g) + 1.0
        terminated = (torch.rand(24, 1, generator=g) < 0.1).float()
        reward_norm.record_reward(reward, terminated)

        mu, logstd = model._actor(obs)
        dist = torch.distributions.Normal(mu, torch.exp(logstd))
        actor_loss = -(dist.log_prob(actions).sum(-1) * advantages).mean()
        actor_opt.zero_grad(set_to_none=True)
        actor_loss.backward()
        actor_opt.step()

        value = model._critic(obs)
        critic_loss = ((value - returns) ** 2).mean()
        critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        critic_opt.step()
    return model, actor_opt, critic_opt, reward_norm


def ppo_checkpoint():
    """The dict BaseAgent.get_state_dict + PPOAgent.get_state_dict build, in
    their insertion order (normalize_rewards, an evaluator, a non-FIXED
    motion-file switch mode, EMA advantage normalization and adaptive LR all
    enabled, so every optional key is present)."""
    model, actor_opt, critic_opt, reward_norm = train_small_ppo()
    state = {
        "model": model.state_dict(),
        "epoch": 1234,
        "step_count": 2**31 + 987654321,  # past 2**31: pickled as LONG1
        "run_start_time": 1700000000.25,  # fixed, not a clock reading
        "best_evaluated_score": None,
        "running_reward_norm": reward_norm.state_dict(),
        "evaluator": {"eval_count": 3},
        "motion_shard_cycle": 4,  # an int (agent.motion_shard_cycle)
        "actor_optimizer": actor_opt.state_dict(),
        "critic_optimizer": critic_opt.state_dict(),
        "adv_mean_ema": torch.tensor([0.0123], dtype=torch.float32),
        "adv_std_ema": torch.tensor([0.9876], dtype=torch.float32),
        # PPOAgent stores a dict of two floats under "adaptive_lr".
        "adaptive_lr": {"actor_lr": 2e-5 * 1.5, "critic_lr": 1e-4 / 1.5},
    }
    return state


def inference_checkpoint(state):
    """BaseAgent.get_inference_state_dict: a *plain dict* of detached CPU
    clones (no _metadata, no shared storages) plus the scalars."""
    return {
        "model": {k: v.detach().cpu().clone() for k, v in state["model"].items()},
        "epoch": state["epoch"],
        "step_count": state["step_count"],
        "run_start_time": state["run_start_time"],
        "best_evaluated_score": state["best_evaluated_score"],
    }


def u8(values, dtype):
    return torch.tensor(values, dtype=torch.uint8).view(dtype)


def dtypes_views():
    g = torch.Generator().manual_seed(99)
    f32_bits = torch.tensor([b - 2**32 if b >= 2**31 else b
                             for b in (0x7FC00001, 0xFFC00000, 0x80000000, 0x00000001, 0x7F800000, 0x3F800000)],
                            dtype=torch.int32).view(torch.float32)
    dtypes = {
        "float16": torch.tensor([0.0, -0.0, 1.5, 65504.0, float("inf"), float("nan"), 6e-8], dtype=torch.float16),
        "bfloat16": torch.tensor([0.0, -1.0, 3.140625, 1e38, float("-inf"), float("nan")], dtype=torch.bfloat16),
        "float32": f32_bits,  # NaN payloads, -0.0, the smallest subnormal, inf, 1.0
        "float64": torch.tensor([0.1, -0.0, 1e308, 5e-324, float("nan"), -float("inf")], dtype=torch.float64),
        "int8": torch.tensor([-128, -1, 0, 1, 127], dtype=torch.int8),
        "int16": torch.tensor([-32768, -1, 0, 32767], dtype=torch.int16),
        "int32": torch.tensor([-2**31, -1, 0, 2**31 - 1], dtype=torch.int32),
        "int64": torch.tensor([-2**63, -1, 0, 2**63 - 1], dtype=torch.int64),
        "uint8": torch.tensor([0, 1, 128, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True, True], dtype=torch.bool),
        "complex64": torch.tensor([1 + 2j, -0.5 - 0j, complex("nan+1j")], dtype=torch.complex64),
        "complex128": torch.tensor([1e300 + 1e-300j, -1j], dtype=torch.complex128),
        "uint16": torch.tensor([0, 1, 0x8000, 0xFFFF], dtype=torch.int32).to(torch.uint16),
        "uint32": torch.tensor([0, 1, 2**31, 2**32 - 1], dtype=torch.int64).to(torch.uint32),
        "uint64": torch.tensor([0, 1, -2**63, -1], dtype=torch.int64).view(torch.uint64),
        "float8_e4m3fn": u8([0x00, 0x38, 0x7E, 0x7F, 0x80, 0x01], torch.float8_e4m3fn),
        "float8_e5m2": u8([0x00, 0x3C, 0x7B, 0x7C, 0x7E, 0xFC], torch.float8_e5m2),
    }
    special = {
        "zero_d_float32": torch.tensor(3.5),
        "zero_d_int64": torch.tensor(-7, dtype=torch.int64),
        "zero_d_bool": torch.tensor(True),
        "zero_d_float8_e5m2": u8([0x3C], torch.float8_e5m2).reshape(()),
        "empty_float32": torch.empty(0, dtype=torch.float32),
        "empty_int32_0x3": torch.empty((0, 3), dtype=torch.int32),
        "empty_uint16": torch.empty(0, dtype=torch.uint16),
        "matrix_float64": torch.randn(3, 4, generator=g, dtype=torch.float64),
    }
    base = torch.arange(20, dtype=torch.float32)
    m = torch.arange(12, dtype=torch.int64).reshape(3, 4)
    views = {
        "base": base,
        "slice_2_6": base[2:6],  # storage_offset 2
        "every_other": base[1::2],  # stride (2,), offset 1
        "matrix": m,
        "matrix_t": m.t(),  # stride (1, 4): non-contiguous
        "matrix_col1": m[:, 1],  # stride (4,), offset 1
        "expand": torch.tensor([1.0, 2.0], dtype=torch.float64).expand(3, 2),  # stride (0, 1)
        "tail_of_unsaved": torch.arange(8, dtype=torch.int16)[5:],  # only a view of this storage is saved
    }
    w = torch.randn(2, 3, generator=g)
    s = torch.randn(2, 5, generator=g)
    tied = {
        "same_a": w,  # the same tensor object twice
        "same_b": w,
        "row0": s[0],  # two different views of one storage
        "row1": s[1],
    }
    params = {
        "param": nn.Parameter(torch.randn(3, generator=g)),  # requires_grad=True
        "param_frozen": nn.Parameter(torch.randn(2, generator=g), requires_grad=False),
        "leaf_requires_grad": torch.randn(2, generator=g).requires_grad_(True),
    }
    scalars = {
        "int_small": 7,
        "int_neg": -1,
        "int_2p31": 2**31,
        "big_2p70": 2**70,
        "big_neg_2p40": -2**40,
        "true": True,
        "false": False,
        "float": 0.1,
        "nan": float("nan"),
        "inf": float("inf"),
        "neg_inf": float("-inf"),
        "neg_zero": -0.0,
        "str": "h\u00e9llo \u2713",
        "empty_str": "",
        "bytes": b"\x00\x01\xffpm",  # empty bytes would break weights_only: see empty_bytes.pt
        "set": {3, 1, 2},
        "complex": complex(1.5, -2.0),
        "tuple": (1, "a", 2.5),
        "list": [1, "a", 2.5],
        "empty_tuple": (),
        "empty_list": [],
        "empty_dict": {},
        "nested_int_keys": {0: {1: "one", -7: [None, True]}, 2**40: "big key", 5: (0.5,)},
        "device": torch.device("cpu"),
        "dtype": torch.float32,
        "none": None,
        "ordered_no_metadata": collections.OrderedDict([("z", 1), ("a", 2)]),
    }
    return {"dtypes": dtypes, "special": special, "views": views, "tied": tied,
            "params": params, "scalars": scalars}


def small_model_state():
    torch.manual_seed(7)
    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    return net.state_dict()


def legacy_object():
    base = torch.arange(6, dtype=torch.float64)
    return {
        "model": small_model_state(),
        "epoch": 5,
        "step_count": 2**33,
        "lr": 3e-4,
        "best_evaluated_score": None,
        "views": {"base": base, "tail": base[3:]},
    }


def save_legacy(obj, path):
    """torch.save(..., _use_new_zipfile_serialization=False). torch names
    legacy storages str(storage._cdata), a C pointer, which would make every
    run differ; while saving, those names become the storage's first-seen
    index ("0", "1", ...), which the loader treats the same way."""
    names = {}
    for _, v, kind in tc.walk(obj):
        if kind == "leaf" and isinstance(v, torch.Tensor):
            names.setdefault(tc.storage_key(v), builtins.str(len(names)))
    used = set()

    class KeyStr(builtins.str):
        def __new__(cls, x="", *rest):
            if not rest and type(x) is int and x in names:
                used.add(x)
                return names[x]
            return builtins.str(x, *rest)

    with mock.patch.object(torch.serialization, "str", KeyStr, create=True):
        with open(path, "wb") as f:
            torch.save(obj, f, _use_new_zipfile_serialization=False)
    if used != set(names):
        raise SystemExit("legacy save: not every storage name was replaced")


class OsSystem:
    """Pickles as a call of os.system. Never unpickle it outside weights_only."""

    def __reduce__(self):
        return (os.system, (f"echo pwned > {PWNED}",))


def rezip_deflated(src, dst):
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            zi = zipfile.ZipInfo(info.filename, date_time=(1980, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = 0o644 << 16
            zi.create_system = 3
            zout.writestr(zi, zin.read(info.filename), compress_type=zipfile.ZIP_DEFLATED, compresslevel=6)


# ---------------------------------------------------------------------------
# manifest.json

def key_json(k):
    if type(k) in (str, int):
        return k
    raise SystemExit(f"unsupported key type in fixture: {k!r}")


def scalar_json(v):
    """(type, value[, bits]) for a non-tensor leaf."""
    t = tc.type_name(v)
    if v is None:
        return {"type": t, "value": None}
    if type(v) is bool:
        return {"type": t, "value": v}
    if type(v) is int:
        return {"type": t, "value": str(v)}
    if type(v) is float:
        return {"type": t, "value": repr(v), "bits": tc.float_bits(v)}
    if type(v) is complex:
        return {"type": t, "value": {"real": repr(v.real), "imag": repr(v.imag)},
                "bits": {"real": tc.float_bits(v.real), "imag": tc.float_bits(v.imag)}}
    if type(v) is str:
        return {"type": t, "value": v}
    if type(v) is bytes:
        return {"type": t, "value": v.hex()}
    if type(v) in (set, frozenset):
        return {"type": t, "value": [scalar_json(x) for x in v]}
    if isinstance(v, (torch.device, torch.dtype)):
        return {"type": t, "value": str(v)}
    raise SystemExit(f"unsupported leaf in fixture: {t}")


def tree_json(obj):
    containers, leaves = [], []
    storages, objects = {}, {}
    for path, v, kind in tc.walk(obj):
        p = [key_json(k) for k in path]
        if kind == "container":
            c = {"path": p, "type": tc.type_name(v)}
            if isinstance(v, dict):
                c["keys"] = [key_json(k) for k in v.keys()]
                md = getattr(v, "_metadata", None)
                if md is not None:
                    # a list of [prefix, entry] pairs: keeps the order
                    c["metadata"] = [[k, dict(e)] for k, e in md.items()]
            else:
                c["len"] = len(v)
            containers.append(c)
        elif isinstance(v, torch.Tensor):
            leaves.append({
                "path": p,
                "type": tc.type_name(v),
                "dtype": str(v.dtype),
                "shape": list(v.shape),
                "stride": list(v.stride()),
                "storage_offset": v.storage_offset(),
                "requires_grad": v.requires_grad,
                "storage_nbytes": v.untyped_storage().nbytes(),
                "storage_group": storages.setdefault(tc.storage_key(v), len(storages)),
                "object_group": objects.setdefault(id(v), len(objects)),
                "sha256": hashlib.sha256(tc.tensor_bytes(v)).hexdigest(),
            })
        else:
            leaves.append({"path": p, **scalar_json(v)})
    return containers, leaves


def zip_json(path):
    if not zipfile.is_zipfile(path):
        return None
    with zipfile.ZipFile(path) as z:
        return [{"name": i.filename, "compress_type": i.compress_type,
                 "compression": {0: "stored", 8: "deflated"}.get(i.compress_type, str(i.compress_type)),
                 "file_size": i.file_size, "compress_size": i.compress_size}
                for i in z.infolist()]


def pickle_json(path):
    """PROTO and the GLOBALs of data.pkl, read with pickletools (which
    executes nothing)."""
    if not zipfile.is_zipfile(path):
        return None
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        data = z.read(name)
    proto, globals_ = None, []
    for op, arg, _ in pickletools.genops(data):
        if op.name == "PROTO":
            proto = arg
        elif op.name == "GLOBAL" and arg not in globals_:
            globals_.append(arg)
    return {"record": name, "protocol": proto, "globals": globals_}


def describe(name, outdir, meta, walk_weights_only_false=False, note=None):
    path = os.path.join(outdir, name)
    with open(path, "rb") as f:
        raw = f.read()
    check = tc.weights_only_check(path)
    check.pop("file")
    if "error" in check:
        check["error"] = check["error"].replace(os.path.abspath(outdir), "<dir>")
    entry = {
        "file": name,
        "size": len(raw),
        "sha256": hashlib.sha256(raw).hexdigest(),
        "torch_version": torch.__version__,
        "reference_commit": meta["reference_commit"],
        "format": "zip" if zipfile.is_zipfile(path) else "legacy",
        "zip_entries": zip_json(path),
        "data_pkl": pickle_json(path),
        "weights_only_true": check,
    }
    if note:
        entry["note"] = note
    if check["ok"]:
        obj = torch.load(path, weights_only=True, map_location="cpu")
        entry["walked_with"] = "weights_only=True"
    elif walk_weights_only_false:
        # Only for our own trusted fixtures that hold nothing executable.
        obj = torch.load(path, weights_only=False, map_location="cpu")
        entry["walked_with"] = "weights_only=False"
    else:
        obj = None
        entry["walked_with"] = None
    if obj is not None:
        entry["containers"], entry["leaves"] = tree_json(obj)
    return entry


# ---------------------------------------------------------------------------

def self_checks(outdir):
    def p(n):
        return os.path.join(outdir, n)
    full = tc.load(p("ppo_full.ckpt"))
    for other in ("ppo_full.ckpt", "deflated.ckpt"):
        diffs, _ = tc.compare_objects(full, tc.load(p(other)))
        if diffs:
            raise SystemExit(f"self-check: ppo_full.ckpt != {other}: {diffs[:3]}")
    flipped = tc.load(p("ppo_full.ckpt"))
    w = flipped["model"]["_actor.mu.mlp.0.weight"]
    w.view(torch.int32).view(-1)[3] ^= 1
    with tempfile.TemporaryDirectory() as tmp:
        torch.save(flipped, os.path.join(tmp, "flipped.ckpt"))
        diffs, _ = tc.compare_objects(full, tc.load(os.path.join(tmp, "flipped.ckpt")))
    if not diffs:
        raise SystemExit("self-check: a flipped bit went unnoticed")
    if os.path.exists(PWNED):
        raise SystemExit(f"{PWNED} exists: something executed the hostile fixture")


def main():
    global REF
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--protomotions", required=True, help="a checkout of github:NVlabs/ProtoMotions")
    ap.add_argument("--reference-commit")
    ap.add_argument("--out", default=HERE)
    a = ap.parse_args()
    root = os.path.abspath(a.protomotions)
    REF = load_reference(root)
    meta = {"reference_commit": reference_commit(root, a.reference_commit)}

    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    out = a.out
    os.makedirs(out, exist_ok=True)

    def p(n):
        return os.path.join(out, n)

    state = ppo_checkpoint()
    torch.save(state, p("ppo_full.ckpt"))
    torch.save(inference_checkpoint(state), p("inference.ckpt"))
    torch.save(dtypes_views(), p("dtypes_views.pt"))
    save_legacy(legacy_object(), p("legacy.pt"))
    rezip_deflated(p("ppo_full.ckpt"), p("deflated.ckpt"))
    torch.save({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "step": 2**40,
                "name": "protocol4", "nested": {"a": [1, 2.5, None]}, "b": b"xy"},
               p("protocol4.pt"), pickle_protocol=4)
    torch.save({"b": b"", "ok": 1}, p("empty_bytes.pt"))
    torch.save({"model": {"w": torch.tensor([1.0, 2.0])}, "payload": OsSystem()}, p("hostile_os_system.pt"))

    self_checks(out)

    fixtures = [
        describe("ppo_full.ckpt", out, meta),
        describe("inference.ckpt", out, meta),
        describe("dtypes_views.pt", out, meta),
        describe("legacy.pt", out, meta, walk_weights_only_false=True,
                 note="torch.save(_use_new_zipfile_serialization=False); storage names made "
                      "deterministic (\"0\", \"1\", ...) instead of C pointers"),
        describe("deflated.ckpt", out, meta,
                 note="ppo_full.ckpt re-zipped by Python zipfile with ZIP_DEFLATED, same entry order"),
        describe("protocol4.pt", out, meta, walk_weights_only_false=True,
                 note="torch.save(pickle_protocol=4): weights_only=True refuses it, weights_only=False reads it"),
        describe("empty_bytes.pt", out, meta, walk_weights_only_false=True,
                 note="protocol 2 pickles b'' as REDUCE(GLOBAL __builtin__ bytes, ()), which "
                      "weights_only=True refuses; non-empty bytes use _codecs.encode and load"),
        describe("hostile_os_system.pt", out, meta,
                 note="data.pkl REDUCEs os.system (pickled as GLOBAL 'posix system'); "
                      "NEVER load with weights_only=False"),
    ]
    manifest = {
        "description": "torch-written checkpoint fixtures; see README.md",
        "torch_version": torch.__version__,
        "reference_commit": meta["reference_commit"],
        "fixtures": fixtures,
    }
    with open(p("manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True, ensure_ascii=False)
        f.write("\n")
    for e in fixtures:
        print(f"{e['file']}: {e['size']} bytes, weights_only=True "
              f"{'ok' if e['weights_only_true']['ok'] else 'refused'}")
    if os.path.exists(PWNED):
        raise SystemExit(f"{PWNED} exists: something executed the hostile fixture")


if __name__ == "__main__":
    main()
