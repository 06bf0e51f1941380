#!/usr/bin/env python3
"""Times checkpoint I/O on torch, safetensors and the `pmstate` binary side by side.

usage: python benches/ckpt_side_by_side.py [--pmstate target/release/pmstate]
           [--runs 5] [--hidden 2048] [--dir DIR] [--keep] [--json OUT]

Writes a PPO-like checkpoint with real torch.save into a new temporary folder
(in DIR if given; removed at the end unless --keep): a model of two MLPs (actor and critic,
hidden width --hidden; 2048 gives 32M parameters) whose state dict mimics
ProtoMotions' names, with f64 running mean/var and i64 count buffers for the
observation normalizers; one real torch.optim.Adam step per network, so the
optimizer state holds exp_avg and exp_avg_sq for every parameter; and the
scalars ProtoMotions' agent saves. About 385 MiB.

Every row is the median (and the fastest) of --runs timed runs after one untimed warm-up run,
with a **warm page cache**: the checkpoint was just written and nothing is
dropped between runs (so reads come from memory; writes go to the page cache
and the disk as the kernel flushes them). Every write goes to a fresh file:
before each run the previous output is removed and os.sync() called,
untimed (freeing a 385 MiB file can take 0.1-0.2 s, which would otherwise
land in whichever run replaces it). Rows:

- torch.load(weights_only=True) and torch.load(mmap=True, weights_only=True)
  of the whole checkpoint (mmap: tensors are views of the mapped file, their
  data is read when first touched);
- torch.save of the whole checkpoint (no fsync);
- safetensors.torch save_file / load_file of the model state dict, and of
  every tensor of the checkpoint flattened to one dict (the same bytes a
  pmstate convert writes); load_file maps the file and returns lazily
  (safetensors 0.8's default mmap backend), backend="pread" reads it all;
- cp of the checkpoint (copy_file_range), and cp followed by an fsync of the
  copy (pmstate's writers fsync before renaming the file into place);
- the pmstate binary: inspect --json (in-process `seconds` it reports, and
  the process's wall time), convert X.ckpt X.safetensors and convert
  X.safetensors back.pt (each with --no-fsync, then with the default fsync),
  convert --select model X.ckpt model.safetensors
  (wall time; convert --json also reports in-process seconds).

It also runs inspect once with a cold cache for this one file
(posix_fadvise DONTNEED after an fsync) and reports how many of the file's
bytes are resident afterwards (util-linux `fincore`), i.e. how much inspect
read; and checks the round trip (back.pt loads with torch.load and equals
the original, tensor for tensor).
"""
import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn
import safetensors.torch as st

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MIB = 1 << 20


class RunningMeanStd(nn.Module):
    """Buffers as ProtoMotions' RunningMeanStd saves them."""

    def __init__(self, dim):
        super().__init__()
        self.register_buffer("mean", torch.full((dim,), 0.25, dtype=torch.float64))
        self.register_buffer("var", torch.full((dim,), 1.5, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(123456789, dtype=torch.int64))


class ObsEncoder(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.running_obs_norm = RunningMeanStd(dim)


class Net(nn.Module):
    def __init__(self, obs, hidden, out):
        super().__init__()
        self.input_models = nn.ModuleDict({"obs": ObsEncoder(obs)})
        dims = [obs, hidden, hidden, hidden, hidden, hidden // 2, out]
        layers = []
        for i, (a, b) in enumerate(zip(dims, dims[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(dims) - 2:
                layers.append(nn.ReLU())
        self.mlp = nn.Sequential(*layers)


class Actor(nn.Module):
    def __init__(self, obs, hidden, act):
        super().__init__()
        self.logstd = nn.Parameter(torch.full((act,), -2.9))
        self.mu = Net(obs, hidden, act)


class PPOModel(nn.Module):
    def __init__(self, obs, hidden, act):
        super().__init__()
        self._actor = Actor(obs, hidden, act)
        self._critic = Net(obs, hidden, 1)


def adam_step(params, lr):
    opt = torch.optim.Adam(params, lr=lr)
    g = torch.Generator().manual_seed(1)
    for p in opt.param_groups[0]["params"]:
        p.grad = torch.rand(p.shape, generator=g) * 1e-3
    opt.step()
    return opt


def ppo_checkpoint(hidden):
    torch.manual_seed(0)
    model = PPOModel(hidden // 2, hidden, 69)
    actor_opt = adam_step(model._actor.parameters(), 2e-5)
    critic_opt = adam_step(model._critic.parameters(), 1e-4)
    reward = collections.OrderedDict(mean=torch.tensor([0.5], dtype=torch.float64),
                                     var=torch.tensor([2.0], dtype=torch.float64),
                                     count=torch.tensor(4096, dtype=torch.int64))
    return {
        "model": model.state_dict(),
        "epoch": 1234,
        "step_count": 3135137969,
        "run_start_time": 1700000000.25,
        "best_evaluated_score": None,
        "running_reward_norm": reward,
        "evaluator": {"eval_count": 3},
        "motion_shard_cycle": 4,
        "actor_optimizer": actor_opt.state_dict(),
        "critic_optimizer": critic_opt.state_dict(),
        "adv_mean_ema": torch.tensor([0.0123]),
        "adv_std_ema": torch.tensor([0.9876]),
        "adaptive_lr": {"actor_lr": 3e-5, "critic_lr": 1e-4 / 1.5},
    }


def flat_tensors(obj, prefix=""):
    """Every tensor in a nested dict/list, by dotted key (cloned: safetensors refuses shared storages)."""
    out = {}
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj.detach().contiguous()
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flat_tensors(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(flat_tensors(v, f"{prefix}.{i}" if prefix else str(i)))
    return out


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fresh(path):
    """Removes `path` if present and syncs the file systems, so the next write starts from a settled disk."""
    def setup():
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        os.sync()
    return setup


def timed(fn, runs, setup=None):
    """Median and all wall seconds of `fn` over `runs` calls, after one warm-up; `setup` runs untimed before each."""
    if setup:
        setup()
    res = fn()
    samples = []
    for _ in range(runs):
        if setup:
            setup()
        t = time.perf_counter()
        res = fn()
        samples.append(time.perf_counter() - t)
        del res  # drop the previous result before the next call (torch.load results are big)
        res = None
    return statistics.median(samples), samples


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pmstate", default=os.path.join(ROOT, "target", "release", "pmstate"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--dir", help="make the work folder in DIR (default: the system's temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (its path is printed)")
    ap.add_argument("--json", help="also write the rows to this file")
    a = ap.parse_args()
    pm = os.path.abspath(a.pmstate)
    if not os.access(pm, os.X_OK):
        sys.exit(f"{pm}: not found; build it with `cargo build --release -p pmstate-cli`")
    torch.set_num_threads(1)
    if a.dir:
        os.makedirs(a.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="pmstate-ckpt-bench-", dir=a.dir)
    try:
        rows, extra = bench(a, pm, work)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    report(a, rows, extra)


def bench(a, pm, work):
    p = lambda name: os.path.join(work, name)
    ckpt_path, st_path, back, model_st = p("last.ckpt"), p("last.safetensors"), p("back.pt"), p("model.safetensors")
    ckpt = ppo_checkpoint(a.hidden)
    torch.save(ckpt, ckpt_path)
    size = os.path.getsize(ckpt_path)
    model_flat = {k: v.contiguous() for k, v in ckpt["model"].items()}
    all_flat = flat_tensors(ckpt)
    model_bytes = sum(v.numel() * v.element_size() for v in model_flat.values())
    all_bytes = sum(v.numel() * v.element_size() for v in all_flat.values())
    rows = []

    def add(name, what, nbytes, fn, note="", out=None):
        med, samples = timed(fn, a.runs, fresh(out) if out else None)
        rows.append({"name": name, "what": what, "bytes": nbytes, "seconds": med, "samples": samples, "note": note})
        print(f"  {name}: {med * 1e3:.1f} ms", file=sys.stderr)

    print(f"checkpoint {ckpt_path}: {size / MIB:.1f} MiB; {a.runs} runs each", file=sys.stderr)
    if a.keep:
        print(f"work folder (kept): {work}", file=sys.stderr)
    add("torch.load", "torch.load(weights_only=True)", size, lambda: torch.load(ckpt_path, weights_only=True))
    add("torch.load mmap", "torch.load(mmap=True, weights_only=True)", size,
        lambda: torch.load(ckpt_path, mmap=True, weights_only=True), "lazy: tensor data read when touched")
    add("torch.save", "torch.save of the checkpoint", size, lambda: torch.save(ckpt, p("resaved.ckpt")), "no fsync",
        p("resaved.ckpt"))
    add("safetensors save model", "safetensors.torch.save_file(model state dict)", model_bytes,
        lambda: st.save_file(model_flat, p("st_model.safetensors")), "no fsync", p("st_model.safetensors"))
    add("safetensors load model", "safetensors.torch.load_file(model state dict)", model_bytes,
        lambda: st.load_file(p("st_model.safetensors")), "lazy: mmap backend (the default)")
    add("safetensors save all", "safetensors.torch.save_file(every tensor, flattened)", all_bytes,
        lambda: st.save_file(all_flat, p("st_all.safetensors")), "no fsync", p("st_all.safetensors"))
    add("safetensors load all", "safetensors.torch.load_file(every tensor, flattened)", all_bytes,
        lambda: st.load_file(p("st_all.safetensors")), "lazy: mmap backend (the default)")
    add("safetensors load all pread", "safetensors.torch.load_file(every tensor, flattened, backend='pread')",
        all_bytes, lambda: st.load_file(p("st_all.safetensors"), backend="pread"), "reads every byte")
    del ckpt, model_flat, all_flat
    for name in ["resaved.ckpt", "st_model.safetensors", "st_all.safetensors"]:
        os.remove(p(name))

    add("cp", "cp X.ckpt copy.ckpt", size, lambda: subprocess.run(["cp", ckpt_path, p("copy.ckpt")], check=True),
        "no fsync", p("copy.ckpt"))

    def cp_fsync():
        subprocess.run(["cp", ckpt_path, p("copy.ckpt")], check=True)
        fsync_path(p("copy.ckpt"))

    add("cp + fsync", "cp X.ckpt copy.ckpt, then fsync the copy", size, cp_fsync, "", p("copy.ckpt"))
    os.remove(p("copy.ckpt"))

    inproc = []

    def inspect():
        r = run_json([pm, "inspect", "--json", ckpt_path])
        inproc.append(r["seconds"])
        return r

    info = inspect()
    add("pmstate inspect", "pmstate inspect --json X.ckpt (process wall time)", size, inspect)
    inproc = inproc[-a.runs:]
    rows.append({"name": "pmstate inspect (in-process)", "what": "the `seconds` inspect --json reports",
                 "bytes": size, "seconds": statistics.median(inproc), "samples": inproc, "note": ""})

    def convert(*args):
        r = run_json([pm, "convert", "--json", *args])
        assert r["ok"], r
        return r

    add("pmstate convert -> safetensors, no fsync", "pmstate convert --no-fsync X.ckpt X.safetensors", size,
        lambda: convert("--no-fsync", ckpt_path, st_path), "rename", st_path)
    add("pmstate convert -> .pt, no fsync", "pmstate convert --no-fsync X.safetensors back.pt", size,
        lambda: convert("--no-fsync", st_path, back), "rename", back)
    add("pmstate convert -> safetensors", "pmstate convert X.ckpt X.safetensors", size,
        lambda: convert(ckpt_path, st_path), "fsync + rename", st_path)
    add("pmstate convert -> .pt", "pmstate convert X.safetensors back.pt", size,
        lambda: convert(st_path, back), "fsync + rename", back)
    add("pmstate convert --select model", "pmstate convert --select model X.ckpt model.safetensors", model_bytes,
        lambda: convert("--select", "model", ckpt_path, model_st), "fsync + rename", model_st)

    # Cold cache for this file only: inspect then reads what it needs from disk.
    fsync_path(ckpt_path)
    fd = os.open(ckpt_path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    before = resident(ckpt_path)
    t = time.perf_counter()
    cold = run_json([pm, "inspect", "--json", ckpt_path])
    cold_wall = time.perf_counter() - t
    after = resident(ckpt_path)

    # The round trip: back.pt (via safetensors) loads with torch and equals the original.
    orig = torch.load(ckpt_path, weights_only=True)
    again = torch.load(back, weights_only=True)
    fo, fa = flat_tensors(orig), flat_tensors(again)
    same = fo.keys() == fa.keys() and all(torch.equal(fo[k], fa[k]) for k in fo)
    same = same and orig["epoch"] == again["epoch"] and orig["actor_optimizer"]["param_groups"] == \
        again["actor_optimizer"]["param_groups"]
    extra = {
        "file_bytes": size, "model_bytes": model_bytes, "all_tensor_bytes": all_bytes,
        "tensors": len(info["tensors"]), "normalizers": [g["name"] for g in info["normalizers"]],
        "cold_inspect": {"seconds_in_process": cold["seconds"], "wall_seconds": cold_wall,
                         "resident_bytes_before": before, "resident_bytes_after": after},
        "round_trip_equal": bool(same),
        "torch_version": torch.__version__, "cpus": os.cpu_count(), "runs": a.runs,
    }
    return rows, extra


def resident(path):
    """Bytes of `path` in the page cache (util-linux fincore), or None without it."""
    try:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", path],
                             check=True, capture_output=True, text=True).stdout
        return int(out.split()[0])
    except (OSError, subprocess.CalledProcessError, ValueError, IndexError):
        return None


def report(a, rows, extra):
    by = {r["name"]: r["seconds"] for r in rows}
    cp, cp_sync = by["cp"], by["cp + fsync"]
    print(f"torch {extra['torch_version']}, {extra['cpus']} CPUs, torch.set_num_threads(1); checkpoint "
          f"{extra['file_bytes'] / MIB:.1f} MiB ({extra['tensors']} tensors; model state dict "
          f"{extra['model_bytes'] / MIB:.1f} MiB); median of {extra['runs']} runs, warm page cache\n")
    print("| what | MiB | ms | fastest ms | MiB/s | / cp | / cp + fsync | note |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        mib = r["bytes"] / MIB
        print(f"| {r['what']} | {mib:.0f} | {r['seconds'] * 1e3:.1f} | {min(r['samples']) * 1e3:.1f} "
              f"| {mib / r['seconds']:.0f} | {r['seconds'] / cp:.2f} | {r['seconds'] / cp_sync:.2f} | {r['note']} |")
    c = extra["cold_inspect"]
    fmt = lambda b: "?" if b is None else f"{b / 1024:.0f} KiB"
    print(f"\ncold-cache inspect (this file evicted): {c['seconds_in_process'] * 1e3:.1f} ms in-process, "
          f"{c['wall_seconds'] * 1e3:.1f} ms wall; file resident before {fmt(c['resident_bytes_before'])}, "
          f"after {fmt(c['resident_bytes_after'])} of {extra['file_bytes'] / MIB:.0f} MiB")
    print(f"round trip X.ckpt -> X.safetensors -> back.pt equal under torch.load: {extra['round_trip_equal']}")
    goal1 = by["pmstate inspect (in-process)"] < 0.005
    fast = by["pmstate convert -> safetensors, no fsync"] / cp
    durable = by["pmstate convert -> safetensors"] / cp_sync
    verdict = lambda r: "met" if r <= 1.2 else "NOT met"
    verdict_pt = lambda r: "met" if r <= 1.1 else "NOT met"
    print(f"goal inspect < 5 ms in-process: {'met' if goal1 else 'NOT met'}")
    print(f"goal convert -> safetensors within 1.2x of cp: --no-fsync / cp = {fast:.2f} ({verdict(fast)}); "
          f"default (fsync) / (cp + fsync) = {durable:.2f} ({verdict(durable)}); "
          f"default / cp = {by['pmstate convert -> safetensors'] / cp:.2f}")
    # .pt writing against torch.save, like for like (neither syncs), median and fastest run
    fastest = {r["name"]: min(r["samples"]) for r in rows}
    pt, pt_min = by["pmstate convert -> .pt, no fsync"] / by["torch.save"], \
        fastest["pmstate convert -> .pt, no fsync"] / fastest["torch.save"]
    print(f"goal convert -> .pt within 1.1x of torch.save: --no-fsync / torch.save = {pt:.2f} median, "
          f"{pt_min:.2f} fastest ({verdict_pt(pt)}); default (fsync) / torch.save = "
          f"{by['pmstate convert -> .pt'] / by['torch.save']:.2f} (torch.save does not sync)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, **extra}, f, indent=1)


if __name__ == "__main__":
    main()
