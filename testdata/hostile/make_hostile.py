#!/usr/bin/env python3
"""Writes testdata/hostile/: files that are broken or malicious on purpose.

Plain Python 3 (no torch): every file is built byte by byte or with the
standard library, so nothing here is ever unpickled. `tests/hostile.rs`
opens each with pmstate and expects the error (or report) named in
EXPECTED below; run `python3 testdata/hostile/make_hostile.py` to rewrite
them (the output is deterministic).
"""
import io
import json
import os
import struct
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = b"\x80\x02"


def binunicode(s):
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def global_(module, name):
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def tensor_pkl(numel=4, offset=0, size=(4,), stride=(1,), key="0", cls="FloatStorage"):
    """data.pkl of {'t': tensor} as torch writes it (protocol 2)."""
    def ints(xs):
        return b"(" + b"".join(b"J" + struct.pack("<i", x) for x in xs) + b"t"
    pid = b"(" + binunicode("storage") + global_("torch", cls) + binunicode(key) + binunicode("cpu") + b"J" + struct.pack("<i", numel) + b"tQ"
    hooks = global_("collections", "OrderedDict") + b")R"
    args = b"(" + pid + b"J" + struct.pack("<i", offset) + ints(size) + ints(stride) + b"\x89" + hooks + b"t"
    return PROTO + b"}" + binunicode("t") + global_("torch._utils", "_rebuild_tensor_v2") + args + b"R" + b"s."


def torch_zip(records, compress=None):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as z:
        for name, data in records:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = compress.get(name, zipfile.ZIP_STORED) if compress else zipfile.ZIP_STORED
            z.writestr(info, data)
    return buf.getvalue()


def ckpt(pkl, data=b"\0" * 16, extra=(), prefix="archive", compress=None):
    recs = [(f"{prefix}/data.pkl", pkl), (f"{prefix}/byteorder", b"little"), (f"{prefix}/data/0", data)]
    recs += list(extra)
    recs.append((f"{prefix}/version", b"3\n"))
    return torch_zip(recs, compress)


def reduce_call(module, name, *str_args):
    return global_(module, name) + b"(" + b"".join(binunicode(a) for a in str_args) + b"tR"


def safetensors(header, data=b""):
    h = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h + data


FILES = {}
# Code execution attempts: read as inert values, flagged, refused on write.
FILES["os_system.pt"] = ckpt(PROTO + b"}" + binunicode("x") + reduce_call("os", "system", "echo pwned > /tmp/pmstate_pwned") + b"s.")
FILES["subprocess_popen.pt"] = ckpt(PROTO + b"}" + binunicode("x") + global_("subprocess", "Popen") + b"((" + binunicode("touch") + binunicode("/tmp/pmstate_pwned") + b"ltR" + b"s.")
FILES["builtins_eval.pkl"] = PROTO + reduce_call("builtins", "eval", "__import__('os').system('echo pwned')") + b"."
# Unsafe globals where a walk over values alone does not look: a dict key
# at depth, an OrderedDict's BUILD state (_metadata), NEWOBJ arguments, a
# set member. Every one must be listed by inspect and refused by both writers.
OS_CALL = reduce_call("os", "system", "echo pwned > /tmp/pmstate_pwned")
FILES["unsafe_in_dict_key.pt"] = ckpt(PROTO + b"}" + binunicode("model") + b"}" + binunicode("inner") + b"}" + OS_CALL + b"N" + b"sss.")
FILES["unsafe_in_metadata.pt"] = ckpt(PROTO + b"}" + binunicode("model") + global_("collections", "OrderedDict") + b")R"
                                      + b"}" + binunicode("_metadata") + b"}" + OS_CALL + b"N" + b"ss" + b"b" + b"s.")
FILES["unsafe_in_newobj_args.pt"] = ckpt(PROTO + b"}" + binunicode("x") + global_("collections", "OrderedDict") + b"(" + OS_CALL + b"t\x81" + b"s.")
FILES["unsafe_in_set.pt"] = ckpt(b"\x80\x04" + b"}" + binunicode("x") + b"\x8f(" + OS_CALL + b"\x90" + b"s.")
# A key that would hide the report on a terminal (conceal, then carriage return).
FILES["unsafe_behind_escape.pt"] = ckpt(PROTO + b"}" + binunicode("\x1b[8m\rmodel") + OS_CALL + b"s.")
# A safetensors tree whose dtype node names a function: the .pt writer would emit GLOBAL torch load.
FILES["st_dtype_global.safetensors"] = safetensors({"__metadata__": {"pmstate.tree": json.dumps({"t": "dict", "items": [["d", {"t": "dtype", "name": "load"}]]}), "pmstate.storages": "{}"}})
FILES["st_opaque_global.safetensors"] = safetensors({"__metadata__": {"pmstate.tree": json.dumps({"t": "dict", "items": [[{"t": "pickle", "v": {"t": "global", "module": "os", "name": "system"}}, None]]}), "pmstate.storages": "{}"}})
# Resource exhaustion.
FILES["deep_nesting.pkl"] = PROTO + b"]" * 100_000 + b"a" * 99_999 + b"."
memo = PROTO + b"]" + b"N" * 1000 + b"e"  # not valid alone; build a proper list
memo = PROTO + b"](" + b"N" * 1000 + b"eq\x00" + b"(" + b"h\x00" * 200_000 + b"l."
FILES["memo_bomb.pkl"] = memo
FILES["huge_binunicode.pkl"] = PROTO + b"X" + struct.pack("<I", 0xFFFFFFF0) + b"abc"
FILES["giant_long4.pkl"] = PROTO + b"\x8b" + struct.pack("<i", 0x7FFFFFF0) + b"\x01\x02."
# Archives that lie.
FILES["storage_size_mismatch.pt"] = ckpt(tensor_pkl(numel=4), data=b"\0" * 12)
FILES["view_past_storage.pt"] = ckpt(tensor_pkl(numel=4, offset=2, size=(4,)))
FILES["negative_size.pt"] = ckpt(tensor_pkl(size=(-4,)))
FILES["negative_stride.pt"] = ckpt(tensor_pkl(size=(2, 2), stride=(-2, 1)))
FILES["missing_storage_record.pt"] = torch_zip([("archive/data.pkl", tensor_pkl()), ("archive/version", b"3\n")])
FILES["path_traversal.pt"] = torch_zip([("archive/data.pkl", tensor_pkl()), ("../../etc/data/0", b"\0" * 16), ("archive/version", b"3\n")])
FILES["duplicate_entries.pt"] = torch_zip([("archive/data.pkl", tensor_pkl()), ("archive/data/0", b"\0" * 16), ("archive/data/0", b"\1" * 16), ("archive/version", b"3\n")])
FILES["unknown_storage_type.pt"] = ckpt(tensor_pkl(cls="QInt8Storage"))
# 96 MiB of zeros deflated to ~100 KiB: over the default budget (32x the file + 64 MiB).
n = 24 << 20
FILES["zip_bomb.pt"] = ckpt(tensor_pkl(numel=n, size=(n,)), data=b"\0" * (4 * n), compress={"archive/data/0": zipfile.ZIP_DEFLATED})
# safetensors.
FILES["st_overlapping.safetensors"] = safetensors({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12)
FILES["st_huge_header.safetensors"] = struct.pack("<Q", 1 << 40) + b"{}"
FILES["st_bad_tree.safetensors"] = safetensors({"__metadata__": {"pmstate.tree": json.dumps({"t": "tensor", "storage": "9", "dtype": "float32", "offset": 0, "shape": [1], "stride": [1]}), "pmstate.storages": "{}"}})
# Traces.
FILES["trace_missing_tensor.pmtrace.safetensors"] = safetensors({"__metadata__": {"pm_trace": json.dumps({"format": "pm-trace", "version": 1})}})

EXPECTED = {
    "os_system.pt": "unsafe: os.system",
    "subprocess_popen.pt": "unsafe: subprocess.Popen",
    "builtins_eval.pkl": "unsafe: builtins.eval",
    "deep_nesting.pkl": "max_depth",
    "memo_bomb.pkl": "max_nodes",
    "huge_binunicode.pkl": "truncated",
    "giant_long4.pkl": "truncated",
    "storage_size_mismatch.pt": "record data/0 holds 12 bytes; its storage declares 16",
    "view_past_storage.pt": "reaches element 6",
    "negative_size.pt": "negative size -4",
    "negative_stride.pt": "negative stride -2",
    "missing_storage_record.pt": "no record data/0",
    "path_traversal.pt": "outside the archive's folder",
    "duplicate_entries.pt": "duplicate",
    "unknown_storage_type.pt": "unsupported storage type torch.QInt8Storage",
    "zip_bomb.pt": "limit on inflated data",
    "st_overlapping.safetensors": "safetensors",
    "st_huge_header.safetensors": "safetensors",
    "st_bad_tree.safetensors": "refers to storage 9, which is not in the checkpoint",
    "trace_missing_tensor.pmtrace.safetensors": "trace",
    "unsafe_in_dict_key.pt": "unsafe: os.system",
    "unsafe_in_metadata.pt": "unsafe: os.system",
    "unsafe_in_newobj_args.pt": "unsafe: os.system",
    "unsafe_in_set.pt": "unsafe: os.system",
    "unsafe_behind_escape.pt": "unsafe: os.system",
    "st_dtype_global.safetensors": "not a torch dtype",
    "st_opaque_global.safetensors": "unsafe: os.system",
}

if __name__ == "__main__":
    for name, data in sorted(FILES.items()):
        with open(os.path.join(HERE, name), "wb") as f:
            f.write(data)
    with open(os.path.join(HERE, "expected.json"), "w") as f:
        json.dump(EXPECTED, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {len(FILES)} files")
