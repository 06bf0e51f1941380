#!/usr/bin/env python3
"""Records what ProtoMotions' normalization.py does on real PyTorch, for the
bit-exactness tests of crates/norm (tests/torch_xcheck.rs).

usage: python testdata/record_norm_xcheck.py --protomotions PATH [--reference-commit SHA] [--out FILE]

PATH is a checkout of github:NVlabs/ProtoMotions. The module file is loaded
by path; nothing of it is copied. Every tensor is stored as its dtype, shape
and little-endian bytes in hex, so that the Rust side reads back the exact
bits. Each update step records the batch moments torch computed, so that the
Rust replay can feed the same moments and compare the state bit for bit.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pm_reference import Fabric1, load_reference, reference_commit  # noqa: E402

DT = {torch.float32: "f32", torch.float64: "f64", torch.int64: "i64", torch.uint8: "u8", torch.bool: "u8"}


def enc(t):
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    return {"dtype": DT[t.dtype], "shape": list(t.shape), "hex": t.numpy().tobytes().hex()}


def state(m):
    return {"mean": enc(m.mean), "var": enc(m.var), "count": int(m.count)}


def record_step(m, x):
    bm = torch.mean(x, dim=0)
    bv = torch.var(x, dim=0, unbiased=False)
    m.record_moments(x)
    return {"op": "record", "x": enc(x), "batch_mean": enc(bm), "batch_var": enc(bv), "batch_count": x.shape[0], "state": state(m)}


def normalize_step(m, x, un_norm):
    out = m.normalize(x, un_norm=un_norm)
    std = torch.sqrt(m.var.float() + m.epsilon)
    return {"op": "normalize", "x": enc(x), "un_norm": un_norm, "std": enc(std), "out": enc(out), "state": state(m)}


def reward_step(m, r, term):
    m.record_reward(r, term)
    d = m.discounted_reward
    return {
        "op": "reward", "reward": enc(r), "terminated": enc(term), "discounted": enc(d),
        "batch_mean": enc(torch.mean(d, dim=0)), "batch_var": enc(torch.var(d, dim=0, unbiased=False)),
        "batch_count": d.shape[0], "state": state(m),
    }


def cases(ref, g):
    out = []

    def obs(name, shape, steps, clamp=None, ema=None, init=None, eps=1e-5):
        m = ref.RunningMeanStd(Fabric1(), shape=shape, epsilon=eps, device="cpu", clamp_value=clamp, ema_decay=ema)
        case = {"name": name, "kind": "running", "shape": list(shape) if shape else None, "epsilon": eps,
                "clamp": clamp, "ema_decay": ema, "gamma": None, "init": None, "steps": []}
        if init is not None:
            m.mean.copy_(init[0]); m.var.copy_(init[1]); m.count.fill_(init[2])
            case["init"] = state(m)
        for s in steps:
            kind = s[0]
            if kind == "record":
                case["steps"].append(record_step(m, s[1]))
            elif kind == "normalize":
                case["steps"].append(normalize_step(m, s[1], s[2]))
            elif kind == "ema":
                m.ema_decay = s[1]
                case["steps"].append({"op": "set_ema", "ema_decay": s[1], "state": state(m)})
        out.append(case)

    def rnd(n, d, scale=1.0, offset=0.0, dtype=torch.float32):
        return (torch.randn(n, d, generator=g, dtype=torch.float64) * scale + offset).to(dtype)

    obs("welford_lazy", None, [("record", rnd(7, 5, 3, 1)), ("record", rnd(1, 5)), ("record", rnd(2, 5, 0.1, -4)),
                               ("record", rnd(513, 5, 10, 100)), ("normalize", rnd(9, 5, 3), False),
                               ("normalize", rnd(9, 5, 3), True)])
    obs("welford_clamp", (4,), [("record", rnd(33, 4, 2, 5)), ("normalize", rnd(16, 4, 50), False),
                                ("normalize", rnd(16, 4, 9), True)], clamp=2.0)
    obs("ema", (6,), [("record", rnd(64, 6, 2, 3)), ("record", rnd(5, 6, 0.5, -1)), ("record", rnd(1, 6)),
                      ("normalize", rnd(8, 6, 3), False)], ema=0.999)
    obs("switch", (3,), [("record", rnd(10, 3)), ("ema", 0.9), ("record", rnd(10, 3, 4, 2)),
                         ("ema", None), ("record", rnd(3, 3, 1, 7)), ("normalize", rnd(4, 3), False)])
    obs("count_2p24", (2,), [("record", rnd(7, 2)), ("record", rnd(1, 2)), ("record", rnd(3, 2))],
        init=(torch.tensor([0.5, -0.5], dtype=torch.float64), torch.tensor([2.0, 3.0], dtype=torch.float64), 16777210))
    obs("offset_small_spread", (3,), [("record", rnd(100, 3, 1e-3, 1e4)), ("record", rnd(50, 3, 1e-3, 1e4)),
                                      ("normalize", rnd(5, 3, 1e-3, 1e4), False)])
    obs("f64_input", (3,), [("record", rnd(20, 3, 2, 1, torch.float64)), ("record", rnd(9, 3, 1, 0, torch.float64)),
                            ("normalize", rnd(5, 3, 2, 1, torch.float64), False),
                            ("normalize", rnd(5, 3, 2, 1, torch.float64), True)], clamp=1.5)
    obs("multi_dim", (2, 3), [("record", rnd(12, 6).reshape(12, 2, 3)), ("normalize", rnd(4, 6).reshape(4, 2, 3), False)])

    for name, ema in [("reward_welford", None), ("reward_ema", 0.99)]:
        m = ref.RewardRunningMeanStd(Fabric1(), shape=(1,), gamma=0.99, device="cpu", clamp_value=5.0, ema_decay=ema)
        case = {"name": name, "kind": "reward", "shape": [1], "epsilon": 1e-5, "clamp": 5.0, "ema_decay": ema,
                "gamma": 0.99, "init": None, "steps": []}
        for i in range(6):
            r = torch.randn(16, generator=g) * 0.3 + 1.0
            term = torch.rand(16, generator=g) < 0.2
            case["steps"].append(reward_step(m, r, term))
        for un in (False, True):
            x = torch.randn(16, generator=g) * 4
            out_ = m.normalize(x, un_norm=un)
            case["steps"].append({"op": "normalize", "x": enc(x), "un_norm": un,
                                  "std": enc(torch.sqrt(m.var.float() + m.epsilon)), "out": enc(out_), "state": state(m)})
        out.append(case)
    return out


def combines(ref, g):
    out = []
    for k, dtype, counts in [(2, torch.float32, [3, 5]), (3, torch.float32, [4, 1, 7]), (4, torch.float32, [2, 9, 1, 3]),
                             (5, torch.float64, [1, 2, 3, 4, 5]), (2, torch.float32, [16777210, 7]),
                             (3, torch.float32, [16777216, 1, 1])]:
        means = [torch.randn(4, generator=g).to(dtype) * 3 for _ in range(k)]
        vars_ = [torch.rand(4, generator=g).to(dtype) * 2 for _ in range(k)]
        ct = torch.tensor(counts)
        # As rank 0 sees it with world size k: stacked gathered tensors.
        mean, var, count = ref.combine_moments(torch.stack(means), torch.stack(vars_), ct)
        out.append({"means": [enc(m) for m in means], "vars": [enc(v) for v in vars_], "counts": counts,
                    "mean": enc(mean), "var": enc(var), "count": int(count)})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--protomotions", required=True)
    ap.add_argument("--reference-commit", help="the checkout's commit, when PATH is not a git work tree")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "torch", "norm_xcheck.json"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    ref, commit = load_reference(a.protomotions), reference_commit(a.protomotions, a.reference_commit)
    g = torch.Generator().manual_seed(20261129)
    doc = {"format": "pmstate-norm-xcheck", "torch": torch.__version__, "reference": commit,
           "cases": cases(ref, g), "combine": combines(ref, g)}
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, a.out)
    print(f"wrote {a.out}: {len(doc['cases'])} cases, {len(doc['combine'])} combines (torch {torch.__version__}, reference {commit})")


if __name__ == "__main__":
    main()
