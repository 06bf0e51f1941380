#!/usr/bin/env python3
"""Writes the reader's test vectors: real CPython pickles, protocols 0 to 5.

Run with any Python 3.8+ (no third-party packages), from anywhere:

    python3 crates/pickle/tests/data/make_vectors.py

It writes `vectors/<case>.p<N>.pkl` next to itself for every case and
protocol, and `vectors/expected.json`, which describes the `Value` each
case must decode to, in this tagged JSON schema (see tests/vectors.rs):

    ["none"]  ["bool", true]  ["int", "<decimal>"]  ["float", "<16 hex digits of the IEEE bits>"]
    ["str", "..."]  ["bytes", "<hex>"]  ["bytearray", "<hex>"]
    ["list", [V...]]  ["tuple", [V...]]  ["set", [V...]]  ["frozenset", [V...]]
    ["dict", [[K, V]...]]  ["global", "module", "name"]
    ["reduce", callable, args, [[K, V]...setitems], [V...appends]]
    ["newobj", cls, args, kwargs-or-null, [[K, V]...], [V...]]
    ["build", object, state]  ["persid", V]

expected.json maps each case to {"all": V} when every protocol decodes to
the same value, else to {"0": V, "1": V, ...}. Set iteration order is made
reproducible by re-running under PYTHONHASHSEED=0.
"""

import collections
import dataclasses
import json
import os
import pickle
import struct
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vectors")
PROTOCOLS = range(0, 6)


@dataclasses.dataclass
class Point:
    x: int
    y: str


# ----- the tagged schema -----


def plain(obj):
    """Expected value of plain Python data."""
    if obj is None:
        return ["none"]
    if isinstance(obj, bool):
        return ["bool", obj]
    if isinstance(obj, int):
        return ["int", str(obj)]
    if isinstance(obj, float):
        return ["float", struct.pack(">d", obj).hex()]
    if isinstance(obj, str):
        return ["str", obj]
    if isinstance(obj, bytes):
        return ["bytes", obj.hex()]
    if isinstance(obj, bytearray):
        return ["bytearray", bytes(obj).hex()]
    if isinstance(obj, list):
        return ["list", [plain(x) for x in obj]]
    if isinstance(obj, tuple):
        return ["tuple", [plain(x) for x in obj]]
    if isinstance(obj, dict) and type(obj) is dict:
        return ["dict", [[plain(k), plain(v)] for k, v in obj.items()]]
    if isinstance(obj, frozenset):
        return ["frozenset", [plain(x) for x in obj]]
    if isinstance(obj, set):
        return ["set", [plain(x) for x in obj]]
    raise TypeError(f"no plain form for {type(obj)}")


def glob(module, name):
    return ["global", module, name]


def reduce_(callable_, args, setitems=(), appends=()):
    return ["reduce", callable_, args, list(setitems), list(appends)]


def newobj(cls, args, kwargs=None, setitems=(), appends=()):
    return ["newobj", cls, args, kwargs, list(setitems), list(appends)]


def build(obj, state):
    return ["build", obj, state]


def builtins_module(proto):
    # Protocols below 3 write Python 2 module names (fix_imports).
    return "__builtin__" if proto < 3 else "builtins"


# ----- the cases -----

ordered = collections.OrderedDict([("b", 1), ("a", 2)])
ordered_with_attr = collections.OrderedDict([("w", [1.5]), ("v", None)])
ordered_with_attr._metadata = {"": {"version": 1}}
shared_list = [1, "x"]

CASES = [
    # name, object, expected (a function of the protocol) or None for plain(object)
    ("none", None, None),
    ("true", True, None),
    ("false", False, None),
    ("int_0", 0, None),
    ("int_m1", -1, None),
    ("int_255", 255, None),
    ("int_256", 256, None),
    ("int_65535", 65535, None),
    ("int_65536", 65536, None),
    ("int_2p31m1", 2**31 - 1, None),
    ("int_m2p31", -(2**31), None),
    ("int_2p31", 2**31, None),
    ("int_2p63m1", 2**63 - 1, None),
    ("int_m2p63", -(2**63), None),
    ("int_2p63", 2**63, None),
    ("int_2p64", 2**64, None),
    ("int_m2p40", -(2**40), None),
    ("int_2p70", 2**70, None),
    ("int_m2p70", -(2**70), None),
    ("int_2p2000", 2**2000, None),
    ("float_1_5", 1.5, None),
    ("float_m0", -0.0, None),
    ("float_inf", float("inf"), None),
    ("float_ninf", float("-inf"), None),
    ("float_nan", float("nan"), None),
    ("float_denormal", 1e-310, None),
    ("float_pi", 3.141592653589793, None),
    ("str_empty", "", None),
    ("str_ascii", "hello", None),
    ("str_unicode", "h\u00e9llo w\u00f6rld \u2713 \U0001f389", None),
    ("str_escapes", "a\\b\nc\r\x00\x1a'\"\\u0041", None),
    ("bytes_empty", b"", None),
    ("bytes_small", b"\x00\x01abc\x80\xff", None),
    ("bytes_300", bytes(range(256)) + b"x" * 44, None),
    ("bytearray_empty", bytearray(), None),
    ("bytearray_small", bytearray(b"ab\xff"), None),
    ("list_empty", [], None),
    ("list_1001", list(range(1001)), None),
    ("tuple_sizes", ((), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)), None),
    ("tuple_nested", ((), ((),), (1, (2, (3, ("x",))))), None),
    (
        "nested",
        {"a": [1, (2, "x"), {3: None}], 5: (), "f": 1.5, "t": True, "n": None, "neg": -7, "l": [[], [[]]]},
        None,
    ),
    ("dict_1001", {i: str(i) for i in range(1001)}, None),
    ("dict_tuple_keys", {(1, 2): "a", (3, "x"): "b", (): "c"}, None),
    ("set_ints", {1, 2, 3, 100}, None),
    ("set_strs", {"a", "bc", "def"}, None),
    ("set_empty", set(), None),
    ("frozenset_mixed", frozenset({1, "a", (2, 3)}), None),
    ("frozenset_empty", frozenset(), None),
    ("shared_refs", [shared_list, shared_list, {"k": shared_list}, (shared_list,)], None),
    (
        "ordered_dict",
        ordered,
        lambda p: reduce_(
            glob("collections", "OrderedDict"),
            ["tuple", []],
            setitems=[[plain("b"), plain(1)], [plain("a"), plain(2)]],
        ),
    ),
    (
        "ordered_dict_attr",
        ordered_with_attr,
        lambda p: build(
            reduce_(
                glob("collections", "OrderedDict"),
                ["tuple", []],
                setitems=[[plain("w"), plain([1.5])], [plain("v"), plain(None)]],
            ),
            plain({"_metadata": {"": {"version": 1}}}),
        ),
    ),
    (
        "counter",
        collections.Counter("abracadabra"),
        lambda p: reduce_(glob("collections", "Counter"), ["tuple", [plain(dict(collections.Counter("abracadabra")))]]),
    ),
    (
        "dataclass",
        Point(7, "seven"),
        lambda p: build(
            reduce_(
                glob("copy_reg", "_reconstructor"),
                ["tuple", [glob("__main__", "Point"), glob("__builtin__", "object"), ["none"]]],
            )
            if p < 2
            else newobj(glob("__main__", "Point"), ["tuple", []]),
            plain({"x": 7, "y": "seven"}),
        ),
    ),
    (
        "complex",
        complex(1.0, -2.5),
        lambda p: reduce_(glob(builtins_module(p), "complex"), ["tuple", [plain(1.0), plain(-2.5)]]),
    ),
]


def main():
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        if f.endswith(".pkl") or f == "expected.json":
            os.remove(os.path.join(OUT, f))
    expected = {}
    for name, obj, expect in CASES:
        per_proto = {}
        for p in PROTOCOLS:
            with open(os.path.join(OUT, f"{name}.p{p}.pkl"), "wb") as f:
                f.write(pickle.dumps(obj, protocol=p))
            per_proto[str(p)] = expect(p) if expect else plain(obj)
        values = list(per_proto.values())
        expected[name] = {"all": values[0]} if all(v == values[0] for v in values) else per_proto
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        # One case per line: compact, yet diffs stay readable.
        lines = [f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in expected.items()]
        f.write("{\n" + ",\n".join(lines) + "\n}\n")
    print(f"wrote {len(CASES)} cases x {len(PROTOCOLS)} protocols to {OUT} (Python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
