#!/usr/bin/env python3
"""Deep comparison of two checkpoints as PyTorch loads them: the oracle for
pmstate's writer tests.

usage: python torch_compare.py A B [--no-identity]
       python torch_compare.py --weights-only-check FILE

A and B are loaded with torch.load(weights_only=True, map_location="cpu")
(files ending in .safetensors with safetensors.torch.load_file) and compared
as trees:

  * the same exact types: dict vs OrderedDict, tuple vs list, Parameter vs
    Tensor, bool vs int, ...
  * the same key order in every dict, and the same `_metadata` on
    OrderedDicts (present on both or neither, same prefixes in the same
    order, same contents);
  * floats and complex numbers bit for bit (so -0.0 != 0.0 and NaN payloads
    count), ints, str, bytes, sets, None, torch.device, torch.dtype by value;
  * tensors: dtype, shape, stride, storage_offset, requires_grad, and the
    bytes of the tensor's elements (contiguous, little-endian); plus the
    size and bytes of the whole underlying storage (what the file holds);
  * the storage-sharing pattern: for every tensor, the first tensor (in
    depth-first walk order) that views the same storage has the same path in
    A and B; likewise for tensor object identity (the same tensor object under
    two keys), unless --no-identity is given.

Prints one JSON object {"equal": bool, "differences": [...]} and exits 0 when
equal, 1 when not; on a load error it prints {"equal": false, "error": ...,
"file": ...} and exits 2.

--weights-only-check FILE only tries torch.load(FILE, weights_only=True,
map_location="cpu") and prints {"file": ..., "ok": true} (exit 0) or
{"file": ..., "ok": false, "error_type": ..., "error": ...} (exit 1).
It never loads anything with weights_only=False.

The helpers (type_name, tensor_bytes, storage_bytes, walk) are also used by
make_checkpoints.py to write manifest.json.
"""
import argparse
import collections
import json
import struct
import sys

import torch

MAX_DIFFERENCES = 200


def type_name(x):
    """The type names used in manifest.json and in differences."""
    if isinstance(x, torch.nn.Parameter):
        return "Parameter"
    if isinstance(x, torch.Tensor):
        return "Tensor" if type(x) is torch.Tensor else f"Tensor<{type(x).__name__}>"
    if isinstance(x, torch.device):
        return "torch.device"
    if isinstance(x, torch.dtype):
        return "torch.dtype"
    if type(x) is collections.OrderedDict:
        return "OrderedDict"
    t = type(x)
    if t.__module__ == "builtins":
        return t.__name__
    return f"{t.__module__}.{t.__qualname__}"


def tensor_bytes(t):
    """The tensor's elements in row-major order, little-endian, as bytes
    (works for 0-d, empty, bool, complex, float8 and the unsigned types)."""
    t = t.detach().cpu().contiguous().reshape(-1)
    if t.numel() == 0:
        return b""
    u8 = t.view(torch.uint8)
    if sys.byteorder != "little" and t.element_size() > 1:
        u8 = u8.reshape(-1, t.element_size()).flip(1).reshape(-1)
    return u8.numpy().tobytes()


def storage_bytes(t):
    """The bytes of the tensor's whole storage (as stored in the file)."""
    s = t.detach().untyped_storage()
    if s.nbytes() == 0:
        return b""
    return torch.empty(0, dtype=torch.uint8).set_(s).numpy().tobytes()


def storage_key(t):
    """Identifies the storage (StorageImpl) a tensor views; unlike data_ptr
    it tells apart distinct empty storages."""
    return t.detach().untyped_storage()._cdata


def float_bits(f):
    return struct.pack(">d", f).hex()


def walk(obj, path=()):
    """Yields (path, value, kind) in depth-first order; kind is "container"
    for dicts/lists/tuples (before their children) and "leaf" otherwise.
    Sets are leaves. Dict keys and list indices are path elements."""
    if isinstance(obj, dict):
        yield path, obj, "container"
        for k, v in obj.items():
            yield from walk(v, path + (k,))
    elif type(obj) in (list, tuple):
        yield path, obj, "container"
        for i, v in enumerate(obj):
            yield from walk(v, path + (i,))
    else:
        yield path, obj, "leaf"


def load(path):
    if str(path).endswith(".safetensors"):
        import safetensors.torch
        return safetensors.torch.load_file(path, device="cpu")
    return torch.load(path, weights_only=True, map_location="cpu")


class Comparer:
    def __init__(self, identity=True):
        self.identity = identity
        self.diffs = []
        self.truncated = False

    def diff(self, path, what, a, b):
        if len(self.diffs) >= MAX_DIFFERENCES:
            self.truncated = True
            return
        self.diffs.append({"path": [jsonable_key(p) for p in path], "what": what,
                           "a": show(a), "b": show(b)})

    def compare(self, a, b, path=()):
        ta, tb = type_name(a), type_name(b)
        if ta != tb:
            self.diff(path, "type", ta, tb)
            return
        if isinstance(a, dict):
            ka, kb = list(a.keys()), list(b.keys())
            if ka != kb or [type(k) for k in ka] != [type(k) for k in kb]:
                self.diff(path, "keys", ka, kb)
            ma, mb = getattr(a, "_metadata", None), getattr(b, "_metadata", None)
            if (ma is None) != (mb is None):
                self.diff(path, "_metadata presence", ma is not None, mb is not None)
            elif ma is not None:
                self.compare(ma, mb, path + ("<_metadata>",))
            for k in ka:
                if k in b:
                    self.compare(a[k], b[k], path + (k,))
        elif type(a) in (list, tuple):
            if len(a) != len(b):
                self.diff(path, "length", len(a), len(b))
            for i, (x, y) in enumerate(zip(a, b)):
                self.compare(x, y, path + (i,))
        elif isinstance(a, torch.Tensor):
            self.compare_tensor(a, b, path)
        elif type(a) is float:
            if float_bits(a) != float_bits(b):
                self.diff(path, "value", a, b)
        elif type(a) is complex:
            if (float_bits(a.real), float_bits(a.imag)) != (float_bits(b.real), float_bits(b.imag)):
                self.diff(path, "value", a, b)
        elif type(a) in (set, frozenset):
            if a != b:
                self.diff(path, "value", sorted(map(repr, a)), sorted(map(repr, b)))
        else:
            try:
                same = a == b
            except Exception:
                same = False
            if not same:
                self.diff(path, "value", a, b)

    def compare_tensor(self, a, b, path):
        for what, fa, fb in (
            ("dtype", str(a.dtype), str(b.dtype)),
            ("shape", list(a.shape), list(b.shape)),
            ("stride", list(a.stride()), list(b.stride())),
            ("storage_offset", a.storage_offset(), b.storage_offset()),
            ("requires_grad", a.requires_grad, b.requires_grad),
            ("device", str(a.device), str(b.device)),
            ("layout", str(a.layout), str(b.layout)),
            ("storage_nbytes", a.untyped_storage().nbytes(), b.untyped_storage().nbytes()),
        ):
            if fa != fb:
                self.diff(path, what, fa, fb)
        if str(a.dtype) != str(b.dtype) or list(a.shape) != list(b.shape):
            return
        ba, bb = tensor_bytes(a), tensor_bytes(b)
        if ba != bb:
            first = next(i for i in range(min(len(ba), len(bb))) if ba[i] != bb[i]) \
                if len(ba) == len(bb) else None
            self.diff(path, "contents", f"{len(ba)} bytes", f"{len(bb)} bytes, first differing byte {first}")
        elif a.untyped_storage().nbytes() == b.untyped_storage().nbytes() and storage_bytes(a) != storage_bytes(b):
            self.diff(path, "storage contents", "storage bytes differ outside the view", "")

    def compare_sharing(self, a, b):
        """Storage-sharing and tensor-identity patterns: for each tensor (in
        walk order), the path of the first tensor that views the same storage
        and of the first one that is the same object must be the same."""
        def pattern(obj):
            storages, objects, rows = {}, {}, []
            for p, v, kind in walk(obj):
                if kind == "leaf" and isinstance(v, torch.Tensor):
                    rows.append((p, storages.setdefault(storage_key(v), p), objects.setdefault(id(v), p)))
            return rows
        pa, pb = pattern(a), pattern(b)
        if [p for p, _, _ in pa] != [p for p, _, _ in pb]:
            return  # structure differences are reported already
        for (p, sa, oa), (_, sb, ob) in zip(pa, pb):
            if sa != sb:
                self.diff(p, "storage first shared with", path_json(sa), path_json(sb))
            if self.identity and oa != ob:
                self.diff(p, "same object as", path_json(oa), path_json(ob))


def path_json(p):
    return [jsonable_key(k) for k in p]


def jsonable_key(k):
    if isinstance(k, (str, int)) and not isinstance(k, bool):
        return k
    return repr(k)


def show(x):
    if isinstance(x, (bool, int, str)) or x is None:
        return x
    if isinstance(x, float):
        return repr(x)
    if isinstance(x, list):
        return [show(v) for v in x]
    return repr(x)


def compare_objects(a, b, identity=True):
    c = Comparer(identity)
    c.compare(a, b)
    c.compare_sharing(a, b)
    return c.diffs, c.truncated


def weights_only_check(path):
    try:
        torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:
        return {"file": path, "ok": False, "error_type": f"{type(e).__module__}.{type(e).__name__}",
                "error": str(e)}
    return {"file": path, "ok": True}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*")
    ap.add_argument("--weights-only-check", metavar="FILE")
    ap.add_argument("--no-identity", action="store_true",
                    help="do not require the same tensor-object identity pattern")
    a = ap.parse_args(argv)
    if a.weights_only_check:
        if a.files:
            ap.error("--weights-only-check takes no other files")
        r = weights_only_check(a.weights_only_check)
        print(json.dumps(r, indent=1, sort_keys=True))
        return 0 if r["ok"] else 1
    if len(a.files) != 2:
        ap.error("expected two files A B")
    objs = []
    for f in a.files:
        try:
            objs.append(load(f))
        except Exception as e:
            print(json.dumps({"equal": False, "file": f,
                              "error": f"{type(e).__module__}.{type(e).__name__}: {e}"}, indent=1, sort_keys=True))
            return 2
    diffs, truncated = compare_objects(objs[0], objs[1], identity=not a.no_identity)
    out = {"equal": not diffs, "differences": diffs}
    if truncated:
        out["truncated"] = True
    print(json.dumps(out, indent=1, sort_keys=True))
    return 0 if not diffs else 1


if __name__ == "__main__":
    sys.exit(main())
