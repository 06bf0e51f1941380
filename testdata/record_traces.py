#!/usr/bin/env python3
"""Records pm-trace v1 files (docs/trace-format.md) by running the real
ProtoMotions normalizers on PyTorch.

usage: python testdata/record_traces.py --protomotions PATH [--out testdata/traces]
           [--reference-commit SHA] [--only NAME ...]

PATH is a checkout of github:NVlabs/ProtoMotions; its
protomotions/agents/utils/normalization.py is loaded by path (nothing of it
is copied). World sizes > 1 run W real processes through Lightning Fabric
(accelerator cpu, strategy ddp_spawn, gloo); each rank records its inputs
and batch moments, rank 0 its combined moments and state, and the parent
merges them into one trace. Seeds are fixed: re-running with the same torch
version writes the same bytes.
"""
import argparse
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pm_reference import Fabric1, load_reference, reference_commit  # noqa: E402

REF = None  # the reference module, loaded in every process


class Recorder:
    """Collects one rank's steps: JSON fields plus named tensors."""

    def __init__(self, module, rank, world_size):
        self.m = module
        self.rank = rank
        self.w = world_size
        self.steps = []
        self.tensors = {}
        self.combine_calls = []
        self._patch()

    def _patch(self):
        # Capture combine_moments' results without changing them.
        orig = REF.combine_moments
        calls = self.combine_calls

        def wrapped(means, vars, counts):
            out = orig(means, vars, counts)
            calls.append(out)
            return out

        REF.combine_moments = wrapped

    def t(self, name, tensor):
        self.tensors[name] = tensor.detach().clone().contiguous().cpu()
        return name

    def per_rank(self, step, field, tensor):
        return self.t(f"s{step:04d}.{field}.r{self.rank}", tensor)

    def state(self, step):
        return {
            "mean": self.t(f"s{step:04d}.state.mean", self.m.mean),
            "var": self.t(f"s{step:04d}.state.var", self.m.var),
            "count": self.t(f"s{step:04d}.state.count", self.m.count),
        }

    def _moments(self, s, step, x):
        s["batch_mean"] = self.per_rank(step, "batch_mean", torch.mean(x, dim=0))
        s["batch_var"] = self.per_rank(step, "batch_var", torch.var(x, dim=0, unbiased=False))
        s["batch_count"] = self.per_rank(step, "batch_count", torch.tensor(x.shape[0], dtype=torch.int64))

    def _combined(self, s, step):
        if self.w > 1 and self.rank == 0:
            mean, var, count = self.combine_calls[0]
            s["combined_mean"] = self.t(f"s{step:04d}.combined_mean", mean)
            s["combined_var"] = self.t(f"s{step:04d}.combined_var", var)
            s["combined_count"] = self.t(f"s{step:04d}.combined_count", torch.as_tensor(count, dtype=torch.int64))

    def _run(self, s, fn):
        try:
            fn()
        except Exception as e:  # the reference raised: record that, no results
            s["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
            return False
        return True

    def record_moments(self, x):
        step = len(self.steps)
        s = {"op": "record_moments", "x": self.per_rank(step, "x", x)}
        self.combine_calls.clear()
        if self._run(s, lambda: self.m.record_moments(x)):
            self._moments(s, step, x)
            self._combined(s, step)
            s["state"] = self.state(step)
        self.steps.append(s)

    def record_reward(self, reward, terminated):
        step = len(self.steps)
        s = {"op": "record_reward", "reward": self.per_rank(step, "reward", reward),
             "terminated": self.per_rank(step, "terminated", terminated)}
        self.combine_calls.clear()
        if self._run(s, lambda: self.m.record_reward(reward, terminated)):
            d = self.m.discounted_reward
            s["discounted_reward"] = self.per_rank(step, "discounted_reward", d)
            self._moments(s, step, d)
            self._combined(s, step)
            s["state"] = self.state(step)
        self.steps.append(s)

    def normalize(self, x, un_norm=False):
        step = len(self.steps)
        s = {"op": "normalize", "x": self.t(f"s{step:04d}.x", x), "un_norm": un_norm}
        out = {}
        if self._run(s, lambda: out.setdefault("y", self.m.normalize(x, un_norm=un_norm))):
            s["out"] = self.t(f"s{step:04d}.out", out["y"])
            s["std"] = self.t(f"s{step:04d}.std", torch.sqrt(self.m.var.float() + self.m.epsilon))
            s["state"] = self.state(step)
        self.steps.append(s)

    def load_state_dict(self, mean, var, count):
        step = len(self.steps)
        sd = {"mean": mean, "var": var, "count": torch.tensor(count, dtype=torch.int64)}
        wrapper = torch.nn.Module()
        wrapper.norm = self.m
        prefixed = {f"norm.{k}": v for k, v in sd.items()}
        REF.materialize_lazy_running_stats_from_state_dict(wrapper, prefixed)
        s = {"op": "load_state_dict"}
        if self._run(s, lambda: self.m.load_state_dict(sd)):
            s["state"] = self.state(step)
        self.steps.append(s)

    def set_ema_decay(self, d):
        step = len(self.steps)
        self.m.ema_decay = d
        self.steps.append({"op": "set_ema_decay", "ema_decay": d, "state": self.state(step)})

    def combine(self, means, vars_, counts):
        step = len(self.steps)
        s = {"op": "combine_moments",
             "means": [self.t(f"s{step:04d}.means.{i}", m) for i, m in enumerate(means)],
             "vars": [self.t(f"s{step:04d}.vars.{i}", v) for i, v in enumerate(vars_)],
             "counts": self.t(f"s{step:04d}.counts", torch.tensor(counts, dtype=torch.int64))}
        res = {}
        ct = torch.tensor(counts, dtype=torch.int64)
        # As rank 0 calls it with gathered tensors: stacked parts.
        if self._run(s, lambda: res.setdefault("r", self.orig_combine(torch.stack(means), torch.stack(vars_), ct))):
            mean, var, count = res["r"]
            s["mean"] = self.t(f"s{step:04d}.mean", mean)
            s["var"] = self.t(f"s{step:04d}.var", var)
            s["count"] = self.t(f"s{step:04d}.count", torch.as_tensor(count, dtype=torch.int64))
        self.steps.append(s)

    def orig_combine(self, *a):
        out = REF.combine_moments(*a)
        self.combine_calls.clear()
        return out


ST_DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64", torch.bool: "BOOL", torch.uint8: "U8",
             torch.int32: "I32", torch.float16: "F16", torch.bfloat16: "BF16"}


def write_safetensors(path, tensors, metadata):
    """A safetensors file with a deterministic header (safetensors' own
    writer keeps __metadata__ in a hash map, whose order changes from run to
    run). Data sorted by element size (largest first, so every tensor is
    aligned), then name; header padded with spaces to a multiple of 8."""
    names = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    header = {"__metadata__": dict(sorted(metadata.items()))}
    blobs, offset = [], 0
    for k in names:
        t = tensors[k].contiguous()
        flat = t.reshape(-1)
        if t.dtype == torch.bool:
            flat = flat.to(torch.uint8)
        data = flat.view(torch.uint8).numpy().tobytes()
        header[k] = {"dtype": ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(g, *shape, scale=1.0, offset=0.0, dtype=torch.float32):
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale + offset).to(dtype)


# ---- scenarios: (name, description, module kwargs, world size, body(rec, g, rank)) ----

def obs_module(fabric, **kw):
    return REF.RunningMeanStd(fabric, device="cpu", **kw)


def reward_module(fabric, **kw):
    return REF.RewardRunningMeanStd(fabric, device="cpu", **kw)


def s_lazy_welford(r, g, rank):
    for n in (1, 2, 7, 4096, 3):
        r.record_moments(randn(g, n, 5, scale=2.0, offset=0.5))
    r.normalize(randn(g, 9, 5, scale=3.0))
    r.normalize(randn(g, 9, 5, scale=1.0), un_norm=True)


def s_fixed_clamp(r, g, rank):
    r.record_moments(randn(g, 64, 4, scale=0.5, offset=1.0))
    r.record_moments(randn(g, 5, 4, scale=0.5, offset=1.0))
    r.normalize(randn(g, 32, 4, scale=5.0, offset=1.0))  # many beyond the clamp
    r.normalize(randn(g, 32, 4, scale=4.0), un_norm=True)  # clamped before scaling


def s_no_clamp(r, g, rank):
    r.record_moments(randn(g, 33, 3, scale=7.0, offset=-2.0))
    r.normalize(randn(g, 8, 3, scale=50.0))
    r.normalize(randn(g, 8, 3, scale=50.0), un_norm=True)


def s_ema_from_start(r, g, rank):
    for n in (16, 1, 9, 200):
        r.record_moments(randn(g, n, 6, scale=1.5, offset=3.0))
    r.normalize(randn(g, 4, 6, scale=2.0, offset=3.0))


def s_switch(r, g, rank):
    r.record_moments(randn(g, 10, 3))
    r.record_moments(randn(g, 11, 3, offset=1.0))
    r.set_ema_decay(0.9)
    r.record_moments(randn(g, 10, 3, scale=4.0, offset=2.0))
    r.record_moments(randn(g, 3, 3, scale=4.0, offset=2.0))
    r.set_ema_decay(None)
    r.record_moments(randn(g, 5, 3, scale=1.0, offset=7.0))
    r.normalize(randn(g, 4, 3))


def s_count_2p24(r, g, rank):
    r.load_state_dict(torch.tensor([0.5, -0.5], dtype=torch.float64), torch.tensor([2.0, 3.0], dtype=torch.float64),
                      16777210)
    for n in (7, 1, 1, 2, 3, 1000):
        r.record_moments(randn(g, n, 2))
    r.normalize(randn(g, 3, 2))


def s_multi_dim(r, g, rank):
    r.record_moments(randn(g, 12, 2, 3, 4, scale=2.0))
    r.record_moments(randn(g, 5, 2, 3, 4, offset=1.0))
    r.normalize(randn(g, 3, 2, 3, 4))
    r.normalize(randn(g, 2, 2, 3, 4), un_norm=True)


def s_awkward(r, g, rank):
    x = randn(g, 50, 4, scale=1e-3, offset=1e4)  # large offset, small spread
    x[:, 1] = 3.25                                   # a constant feature
    x[:, 2] = x[:, 2] * 0 + randn(g, 50, scale=1e-30)  # tiny magnitudes
    r.record_moments(x)
    y = randn(g, 21, 4, scale=1e-3, offset=1e4)
    y[:, 1] = 3.25
    r.record_moments(y)
    r.normalize(randn(g, 5, 4, scale=1e-3, offset=1e4))


def s_float64_input(r, g, rank):
    r.record_moments(randn(g, 20, 3, scale=2.0, offset=1.0, dtype=torch.float64))
    r.record_moments(randn(g, 9, 3, dtype=torch.float64))
    r.normalize(randn(g, 5, 3, scale=2.0, dtype=torch.float64))
    r.normalize(randn(g, 5, 3, scale=2.0, dtype=torch.float64), un_norm=True)


def s_errors(r, g, rank):
    r.record_moments(randn(g, 6, 3))
    r.normalize(randn(g, 4, 5))         # wrong feature size: torch raises
    r.record_moments(randn(g, 6, 4))    # wrong feature size: torch raises, state unchanged
    r.record_moments(randn(g, 6, 3, offset=2.0))
    r.normalize(randn(g, 4, 3))


def s_reward(r, g, rank, n=16):
    for i in range(8):
        reward = randn(g, n, scale=0.3, offset=1.0)
        term = torch.rand(n, generator=g) < 0.25
        r.record_reward(reward, term)
    r.normalize(randn(g, n, scale=4.0))
    r.normalize(randn(g, n, scale=4.0), un_norm=True)


def s_combine(r, g, rank):
    for k, counts, dtype in [(1, [16777217], torch.float32), (2, [3, 5], torch.float32), (3, [4, 1, 7], torch.float32),
                             (4, [2, 9, 1, 3], torch.float32), (5, [1, 2, 3, 4, 5], torch.float64),
                             (2, [16777210, 7], torch.float32), (3, [16777216, 1, 1], torch.float32)]:
        means = [randn(g, 4, scale=3.0).to(dtype) for _ in range(k)]
        vars_ = [torch.rand(4, generator=g, dtype=torch.float64).to(dtype) * 2 for _ in range(k)]
        r.combine(means, vars_, counts)


def s_dist_welford(r, g, rank):
    sizes = {0: [3, 8, 1], 1: [5, 2, 4], 2: [1, 6, 7], 3: [9, 1, 2]}[rank]
    for n in sizes:
        r.record_moments(randn(g, n, 3, scale=1.0 + rank, offset=rank))
    if rank == 0:
        r.normalize(randn(g, 4, 3))


def s_dist_ema(r, g, rank):
    for n in ([4, 7] if rank % 2 == 0 else [6, 1]):
        r.record_moments(randn(g, n, 2, 3, scale=2.0, offset=-rank))
    if rank == 0:
        r.normalize(randn(g, 2, 2, 3))


def s_dist_reward(r, g, rank):
    n = 8 + 3 * rank
    for i in range(5):
        r.record_reward(randn(g, n, scale=0.5, offset=1.0), torch.rand(n, generator=g) < 0.3)
    if rank == 0:
        r.normalize(randn(g, 6, scale=3.0))


SCENARIOS = [
    ("lazy_welford", "lazy shape; batches of 1, 2, 7, 4096, 3; normalize and un_norm", "obs", dict(shape=None), 1, s_lazy_welford),
    ("fixed_clamp", "fixed shape, clamp 1.5 hit by normalize and by un_norm's input", "obs", dict(shape=(4,), clamp_value=1.5), 1, s_fixed_clamp),
    ("no_clamp", "no clamp, large values", "obs", dict(shape=(3,)), 1, s_no_clamp),
    ("ema_from_start", "EMA 0.999 from the first batch", "obs", dict(shape=(6,), ema_decay=0.999, clamp_value=5.0), 1, s_ema_from_start),
    ("switch_welford_ema_welford", "Welford -> EMA 0.9 -> Welford (stale count)", "obs", dict(shape=(3,)), 1, s_switch),
    ("count_2p24", "a loaded count of 16777210, then batches crossing 2^24", "obs", dict(shape=None), 1, s_count_2p24),
    ("multi_dim", "observations of shape (2, 3, 4), lazy", "obs", dict(shape=None, clamp_value=5.0), 1, s_multi_dim),
    ("awkward_values", "large offset with small spread, a constant feature, tiny magnitudes", "obs", dict(shape=(4,)), 1, s_awkward),
    ("float64_input", "float64 batches and normalize inputs", "obs", dict(shape=(3,), clamp_value=1.5), 1, s_float64_input),
    ("reference_errors", "steps where the reference raises (shape mismatches)", "obs", dict(shape=(3,)), 1, s_errors),
    ("reward_welford", "RewardRunningMeanStd, Welford, gamma 0.99, terminations", "reward", dict(shape=(1,), gamma=0.99, clamp_value=5.0), 1, s_reward),
    ("reward_ema", "RewardRunningMeanStd, EMA 0.99, gamma 0.9, terminations", "reward", dict(shape=(1,), gamma=0.9, ema_decay=0.99, clamp_value=5.0), 1, s_reward),
    ("combine_direct", "combine_moments called directly, k = 1..5, counts past 2^24", "obs", dict(shape=(4,)), 1, s_combine),
    ("dist_w2_welford", "world size 2, uneven per-rank batches, Welford", "obs", dict(shape=None, clamp_value=5.0), 2, s_dist_welford),
    ("dist_w3_welford", "world size 3 (odd part carried), uneven batches, Welford", "obs", dict(shape=(3,)), 3, s_dist_welford),
    ("dist_w4_welford", "world size 4, uneven batches, Welford", "obs", dict(shape=(3,)), 4, s_dist_welford),
    ("dist_w3_ema", "world size 3, EMA 0.9, multi-dimensional", "obs", dict(shape=(2, 3), ema_decay=0.9), 3, s_dist_ema),
    ("dist_w2_reward", "world size 2, RewardRunningMeanStd, Welford", "reward", dict(shape=(1,), gamma=0.95), 2, s_dist_reward),
]


def module_json(kind, kw):
    return {
        "class": "RunningMeanStd" if kind == "obs" else "RewardRunningMeanStd",
        "shape": list(kw["shape"]) if kw.get("shape") is not None else None,
        "epsilon": kw.get("epsilon", 1e-5),
        "clamp_value": kw.get("clamp_value"),
        "ema_decay": kw.get("ema_decay"),
        "gamma": kw.get("gamma"),
    }


def run_rank(fabric, scenario, outdir):
    """One rank's part: run the body, save its steps and tensors."""
    name, _, kind, kw, world, body = scenario
    torch.set_num_threads(1)
    rank = fabric.global_rank if world > 1 else 0
    module = (obs_module if kind == "obs" else reward_module)(fabric, **kw)
    rec = Recorder(module, rank, world)
    body(rec, gen(hash_seed(name) + 1000 * rank), rank)
    torch.save({"steps": rec.steps, "tensors": rec.tensors}, os.path.join(outdir, f"rank{rank}.pt"))


def hash_seed(name):
    return sum((i + 1) * ord(c) for i, c in enumerate(name))


def _spawned(fabric, root, scenario_name, outdir):
    global REF
    REF = load_reference(root)
    scenario = next(s for s in SCENARIOS if s[0] == scenario_name)
    run_rank(fabric, scenario, outdir)


def merge(parts, world):
    """Rank 0's steps, with per-rank fields turned into lists by rank."""
    steps = []
    per_rank_fields = {"x", "reward", "terminated", "discounted_reward", "batch_mean", "batch_var", "batch_count"}
    for i, s0 in enumerate(parts[0]["steps"]):
        s = dict(s0)
        for f in per_rank_fields & set(s0):
            if s0["op"] in ("record_moments", "record_reward"):
                s[f] = [parts[r]["steps"][i][f] for r in range(world)]
        steps.append(s)
    tensors = {}
    for p in parts:
        tensors.update(p["tensors"])
    return steps, tensors


def record(scenario, root, outdir, meta):
    name, desc, kind, kw, world, body = scenario
    with tempfile.TemporaryDirectory() as tmp:
        if world == 1:
            run_rank(Fabric1(), scenario, tmp)
        else:
            from lightning.fabric import Fabric
            fabric = Fabric(accelerator="cpu", devices=world, strategy="ddp_spawn")
            fabric.launch(_spawned, root, name, tmp)
        parts = [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(world)]
    steps, tensors = merge(parts, world)
    doc = {
        "format": "pm-trace",
        "version": 1,
        "description": desc,
        "reference": {
            "implementation": "protomotions.agents.utils.normalization",
            "source": meta["source"],
            "torch": torch.__version__,
            "device": "cpu",
            "dist_backend": "gloo" if world > 1 else None,
        },
        "module": module_json(kind, kw),
        "world_size": world,
        "steps": steps,
    }
    path = os.path.join(outdir, f"{name}.pmtrace.safetensors")
    write_safetensors(path, tensors, {"format": "pm-trace", "trace": json.dumps(doc)})
    print(f"wrote {path}: {len(steps)} steps, world size {world}")


def main():
    global REF
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--protomotions", required=True)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "traces"))
    ap.add_argument("--reference-commit")
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    root = os.path.abspath(a.protomotions)
    REF = load_reference(root)
    source = reference_commit(root, a.reference_commit)
    os.makedirs(a.out, exist_ok=True)
    for sc in SCENARIOS:
        if a.only and sc[0] not in a.only:
            continue
        record(sc, root, a.out, {"source": source})


if __name__ == "__main__":
    main()
