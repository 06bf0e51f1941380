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


# ---------------------------------------------------------------------------
# Hardening II: amplification, quadratic lookups, overflowing shapes,
# traces, JSON, ambiguous containers, writes that would not read back.
# (The multi-megabyte bombs are generated by the Rust tests themselves, in a
# temporary folder: tests/hostile_cli.rs.)

def long1(v):
    """LONG1 of a (possibly huge) int."""
    n = (v.bit_length() + 8) // 8 or 1
    return b"\x8a" + bytes([n]) + v.to_bytes(n, "little", signed=True)


def int_(v):
    return b"J" + struct.pack("<i", v) if -2**31 <= v < 2**31 else long1(v)


def tensor_expr(size, stride, numel=1, offset=0, cls="FloatStorage", key="0", legacy=False):
    """A _rebuild_tensor_v2 call with any (huge) size/stride ints; legacy
    streams give the persistent id a sixth field (no view)."""
    tup = lambda xs: b"(" + b"".join(int_(x) for x in xs) + b"t"
    view = b"N" if legacy else b""
    pid = b"(" + binunicode("storage") + global_("torch", cls) + binunicode(key) + binunicode("cpu") + int_(numel) + view + b"tQ"
    hooks = global_("collections", "OrderedDict") + b")R"
    args = b"(" + pid + int_(offset) + tup(size) + tup(stride) + b"\x89" + hooks + b"t"
    return global_("torch._utils", "_rebuild_tensor_v2") + args + b"R"


def tensor_pkl_raw(size, stride, numel=1, offset=0, cls="FloatStorage", key="0"):
    """data.pkl of {'t': tensor} with any (huge) size/stride ints."""
    return PROTO + b"}" + binunicode("t") + tensor_expr(size, stride, numel, offset, cls, key) + b"s."


def v3_tensor(key, nbytes, dtype, size, stride, offset=0):
    """A _rebuild_tensor_v3 call over an UntypedStorage of nbytes."""
    tup = lambda xs: b"(" + b"".join(int_(x) for x in xs) + b"t"
    pid = b"(" + binunicode("storage") + global_("torch.storage", "UntypedStorage") + binunicode(key) + binunicode("cpu") + int_(nbytes) + b"tQ"
    hooks = global_("collections", "OrderedDict") + b")R"
    args = b"(" + pid + int_(offset) + tup(size) + tup(stride) + b"\x89" + hooks + global_("torch", dtype) + b"t"
    return global_("torch._utils", "_rebuild_tensor_v3") + args + b"R"


def dict_pkl(items):
    """A protocol-2 dict of (str key, pickled value) pairs."""
    return PROTO + b"}" + b"(" + b"".join(binunicode(k) + v for k, v in items) + b"u."


# 4. Amplification: a list of 16 memoized 64-byte strings, referenced 2^20
# times from one list (2 MB of BINGETs, a few KB deflated): within the old
# budget it unfolded into 4.6 GB; now a max_nodes limit error.
amp = PROTO + b"(" + b"".join(binunicode(chr(65 + i) * 64) for i in range(16)) + b"lq\x01(" + b"h\x01" * (1 << 20) + b"l."
FILES["amplified_memo_list.pt"] = torch_zip([("archive/data.pkl", amp), ("archive/version", b"3\n")],
                                            {"archive/data.pkl": zipfile.ZIP_DEFLATED})
# 5. Lookups: one dict of 50,000 keys; a foreign safetensors of 25,000 tensors.
FILES["dict_50k_keys.pt"] = ckpt(PROTO + b"}" + b"(" + b"".join(binunicode(f"k{i}") + int_(i) for i in range(50_000)) + b"u.")
hdr = {f"t{i}": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i in range(25_000)}
FILES["st_25k_tensors.safetensors"] = safetensors(hdr, b"\0" * (4 * 25_000))
# 6. Shapes whose element count wraps u64, legal in torch for stride-0 views.
FILES["shape_wraps_u64.pt"] = ckpt(tensor_pkl_raw((3, 6148914691236517206), (0, 0)), data=b"\0" * 4)
FILES["shape_2p63.pt"] = ckpt(tensor_pkl_raw((2**63 - 1, 2, 1), (0, 0, 0)), data=b"\0" * 4)
FILES["shape_2p32_squared.pt"] = ckpt(tensor_pkl_raw((2**32, 2**32), (0, 0)), data=b"\0" * 4)
# ... and one that fits: 10^12 elements over one float (4 TB if gathered).
FILES["view_1e12.pt"] = ckpt(PROTO + b"}" + binunicode("model") + b"}" + binunicode("w") + tensor_expr((10**6, 10**6), (0, 0)) + b"ss.", data=b"\0" * 4)
# 7. Traces: 8000 steps naming one 256 KiB tensor; world size 4096; a 10^12 shape.
def trace_file(doc, tensors):
    header = {"__metadata__": {"format": "pm-trace", "trace": json.dumps(doc)}}
    off = 0
    blobs = []
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
        blobs.append(data)
    return safetensors(header, b"".join(blobs))
def trace_doc(steps, world=1, shape=None):
    return {"format": "pm-trace", "version": 1, "description": "hostile",
            "reference": {"implementation": "x", "source": "x", "torch": "x", "device": "cpu", "dist_backend": None},
            "module": {"class": "RunningMeanStd", "shape": shape, "epsilon": 1e-05, "clamp_value": None, "ema_decay": None, "gamma": None},
            "world_size": world, "steps": steps}
D = 16384
upd = {"op": "record_moments", "x": ["x"], "batch_mean": ["m"], "batch_var": ["v"], "batch_count": ["c"],
       "state": {"mean": "sm", "var": "sv", "count": "c"}}
FILES["trace_8000_steps_one_tensor.pmtrace.safetensors"] = trace_file(
    trace_doc([upd] * 8000, shape=[D]),
    [("x", "F32", [4, D], b"\0" * (16 * D)), ("m", "F32", [D], b"\0" * (4 * D)), ("v", "F32", [D], b"\0" * (4 * D)),
     ("sm", "F64", [D], b"\0" * (8 * D)), ("sv", "F64", [D], b"\0" * (8 * D)), ("c", "I64", [], struct.pack("<q", 4))])
w = 4096
upd_w = {"op": "record_moments", "x": ["x"] * w, "batch_mean": ["m"] * w, "batch_var": ["m"] * w, "batch_count": ["c"] * w,
         "combined_mean": "m", "combined_var": "m", "combined_count": "c", "state": {"mean": "s", "var": "s", "count": "c"}}
FILES["trace_world_4096.pmtrace.safetensors"] = trace_file(
    trace_doc([upd_w], world=w, shape=[2]),
    [("x", "F32", [1, 2], b"\0" * 8), ("m", "F32", [2], b"\0" * 8), ("s", "F64", [2], b"\0" * 16), ("c", "I64", [], struct.pack("<q", 1))])
FILES["trace_shape_1e12.pmtrace.safetensors"] = trace_file(trace_doc([], shape=[10**12]), [])
# 8. A list of 2 million floats (deflated): converts within the memory budget.
FILES["two_million_floats.pt"] = torch_zip(
    [("archive/data.pkl", PROTO + b"}" + binunicode("floats") + b"]" + (b"(" + b"G" + struct.pack(">d", 0.5) * 1 + (b"G" + struct.pack(">d", 0.5)) * 999 + b"e") * 2000 + b"s."),
     ("archive/version", b"3\n")], {"archive/data.pkl": zipfile.ZIP_DEFLATED})
# 9. Writes that would not read back: refused before anything is written.
FILES["f32_over_6_byte_storage.pt"] = ckpt(dict_pkl([("t", v3_tensor("0", 6, "float32", (1,), (1,)))]), data=b"\1" * 6)
FILES["two_dtypes_one_storage.pt"] = ckpt(dict_pkl([("f", v3_tensor("0", 4, "float32", (1,), (1,))), ("i", v3_tensor("0", 4, "int32", (1,), (1,)))]), data=b"\1" * 4)
FILES["persistent_id_as_key.pt"] = ckpt(PROTO + b"}" + b"(" + binunicode("storage") + global_("torch", "FloatStorage") + binunicode("0") + binunicode("cpu") + int_(4) + b"tQ" + b"N" + b"s.")
FILES["deep_list_70.pt"] = ckpt(PROTO + b"}" + binunicode("deep") + b"]" * 70 + b"a" * 69 + b"s.")
FILES["big_bytes_value.pt"] = torch_zip(
    [("archive/data.pkl", PROTO + b"}" + binunicode("blob") + global_("_codecs", "encode") + b"X" + struct.pack("<I", 60 << 20) + b"\0" * (60 << 20) + binunicode("latin1") + b"\x86R" + b"s."),
     ("archive/version", b"3\n")], {"archive/data.pkl": zipfile.ZIP_DEFLATED})
tensor_node = lambda obj: {"t": "tensor", "storage": "0", "dtype": "float32", "offset": 0, "shape": [1], "stride": [1], "requires_grad": False, "parameter": None, "object": obj}
other = dict(tensor_node(7), shape=[], stride=[])
FILES["st_object_identity.safetensors"] = safetensors(
    {"__metadata__": {"pmstate.tree": json.dumps({"t": "dict", "items": [["a", tensor_node(7)], ["b", other]]}),
                      "pmstate.storages": json.dumps({"0": {"tensor": "w", "typed": True, "dtype": "float32", "location": "cpu"}})},
     "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4)
# 10. Ambiguous containers.
def raw_safetensors(header_text, data=b""):
    h = header_text.encode()
    h += b" " * (-(len(h) + 8) % 8)
    return struct.pack("<Q", len(h)) + h + data
FILES["st_duplicate_key.safetensors"] = raw_safetensors('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', b"\0" * 8)
FILES["st_duplicate_metadata.safetensors"] = raw_safetensors('{"__metadata__":{"format":"pt","format":"np"}}')
def with_zip64_end(z):
    """The same archive, its end record pointing (through a ZIP64 locator)
    at a ZIP64 end record: the classic counts saturated, as an archive with
    more than 65,535 entries has them."""
    eocd = z.rindex(b"PK\x05\x06")
    n, cd_size, cd_off = struct.unpack("<HII", z[eocd + 10:eocd + 20])
    z64 = struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n, n, cd_size, cd_off)
    loc = struct.pack("<IIQI", 0x07064B50, 0, eocd, 1)
    end = bytearray(z[eocd:])
    end[8:12] = b"\xff\xff\xff\xff"
    return z[:eocd] + z64 + loc + bytes(end)
FILES["zip64_duplicate_entries.pt"] = with_zip64_end(FILES["duplicate_entries.pt"])
legacy_magic = b"\x80\x02\x8a\x0a" + bytes([0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19]) + b"."
legacy = (legacy_magic + b"\x80\x02M\xe9\x03." + b"\x80\x02}" + binunicode("little_endian") + b"\x88s."
          + b"\x80\x02}" + binunicode("t") + tensor_expr((4,), (1,), numel=4, legacy=True) + b"s." + b"\x80\x02]" + b"(" + binunicode("0") + binunicode("0") + b"e."
          + struct.pack("<q", 4) + b"\0" * 16 + struct.pack("<q", 4) + b"\0" * 16)
FILES["legacy_duplicate_storage.pt"] = legacy


# ---------------------------------------------------------------------------
# Hardening II, second round: what an audit found still quadratic, missed or
# ambiguous.

# 11. Normalizer groups: 15,000 `n{i}.mean/var/count` triples over one
# memoized tensor each (a few bytes per group): `inspect` and `normalizers`
# summarized each group with a walk over the whole tree.
G = 15_000
groups = (binunicode("n0.mean") + tensor_expr((1,), (1,), numel=2, cls="DoubleStorage") + b"q\x01"
          + binunicode("n0.var") + tensor_expr((1,), (1,), numel=2, offset=1, cls="DoubleStorage") + b"q\x02"
          + binunicode("n0.count") + tensor_expr((), (), numel=1, cls="LongStorage", key="1") + b"q\x03")
groups += b"".join(binunicode(f"n{i}.mean") + b"h\x01" + binunicode(f"n{i}.var") + b"h\x02"
                   + binunicode(f"n{i}.count") + b"h\x03" for i in range(1, G))
FILES["many_normalizer_groups.pt"] = torch_zip(
    [("archive/data.pkl", PROTO + b"}(" + groups + b"u."), ("archive/byteorder", b"little"),
     ("archive/data/0", struct.pack("<dd", 0.5, 4.0)), ("archive/data/1", struct.pack("<q", 4)),
     ("archive/version", b"3\n")])
# 12. One dict of 200,000 int keys: `diff` found each non-string key with a linear search.
FILES["dict_200k_int_keys.pt"] = ckpt(PROTO + b"}(" + b"".join(int_(i) + b"N" for i in range(200_000)) + b"u.")
# 13. Unsafe globals in NEWOBJ_EX keyword arguments, and in SETITEMS / APPENDS
# applied to an object (a REDUCE result with no BUILD) rather than to a dict or list.
FILES["unsafe_in_newobj_ex_kwargs.pt"] = ckpt(b"\x80\x04" + b"}" + binunicode("x") + global_("collections", "OrderedDict")
                                              + b")" + b"}" + binunicode("k") + OS_CALL + b"s" + b"\x92" + b"s.")
FILES["unsafe_in_setitems_on_object.pt"] = ckpt(PROTO + b"}" + binunicode("x") + global_("collections", "Counter") + b")R"
                                                + b"(" + binunicode("k") + OS_CALL + b"u" + b"s.")
FILES["unsafe_in_appends_on_object.pt"] = ckpt(PROTO + b"}" + binunicode("x") + global_("collections", "Counter") + b")R"
                                               + b"(" + OS_CALL + b"e" + b"s.")
# 14. Lists nested 255 deep in a dict: depth 256, the pickle reader's max_depth.
FILES["deep_list_255.pt"] = ckpt(PROTO + b"}" + binunicode("deep") + b"]" * 255 + b"a" * 254 + b"s.")
# 15. A duplicate entry past the count the end record declares: the zip
# reader reads as many central directory headers as the end record counts
# (4, all distinct), Python's zipfile walks the directory's size (5, the
# last data/0 winning).
def with_entry_count(z, n):
    eocd = z.rindex(b"PK\x05\x06")
    return z[:eocd + 8] + struct.pack("<HH", n, n) + z[eocd + 12:]
FILES["zip_understated_count.pt"] = with_entry_count(torch_zip(
    [("archive/data.pkl", tensor_pkl()), ("archive/byteorder", b"little"), ("archive/data/0", b"\0" * 16),
     ("archive/version", b"3\n"), ("archive/data/0", b"\1" * 16)]), 4)
# 16. Traces whose safetensors header names a tensor, or a __metadata__ key, twice
# (the safetensors crate keeps one of the two).
def trace_header_text(tensor_entries, doc_texts):
    meta = ",".join('"trace":' + json.dumps(t) for t in doc_texts)
    return '{"__metadata__":{"format":"pm-trace",' + meta + "}," + ",".join(tensor_entries) + "}"
one_step = trace_doc([{"op": "load_state_dict", "state": {"mean": "m", "var": "m", "count": "c"}}], shape=[1])
m_entry = '"m":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}'
FILES["trace_duplicate_tensor.pmtrace.safetensors"] = raw_safetensors(trace_header_text(
    [m_entry, '"c":{"dtype":"I64","shape":[],"data_offsets":[8,16]}', '"c":{"dtype":"I64","shape":[],"data_offsets":[8,16]}'],
    [json.dumps(one_step)]), b"\0" * 8 + struct.pack("<q", 1))
FILES["trace_duplicate_metadata.pmtrace.safetensors"] = raw_safetensors(trace_header_text(
    [m_entry, '"c":{"dtype":"I64","shape":[],"data_offsets":[8,16]}'],
    [json.dumps(one_step), json.dumps(trace_doc([], shape=[1]))]), b"\0" * 8 + struct.pack("<q", 1))

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
    "amplified_memo_list.pt": "max_nodes",
    "dict_50k_keys.pt": "ok",
    "st_25k_tensors.safetensors": "ok",
    "shape_wraps_u64.pt": "element count overflows",
    "shape_2p63.pt": "element count overflows",
    "shape_2p32_squared.pt": "element count overflows",
    "view_1e12.pt": "ReadOptions::max_view_bytes",
    "trace_8000_steps_one_tensor.pmtrace.safetensors": "ok",
    "trace_world_4096.pmtrace.safetensors": "ok",
    "trace_shape_1e12.pmtrace.safetensors": "module shape",
    "two_million_floats.pt": "ok",
    "f32_over_6_byte_storage.pt": "ok",
    "two_dtypes_one_storage.pt": "ok",
    "persistent_id_as_key.pt": "ok",
    "deep_list_70.pt": "ok",
    "big_bytes_value.pt": "ok",
    "st_object_identity.safetensors": "one object identity",
    "st_duplicate_key.safetensors": "tensor 'a' is listed twice",
    "st_duplicate_metadata.safetensors": "__metadata__ key 'format' is listed twice",
    "zip64_duplicate_entries.pt": "duplicate",
    "legacy_duplicate_storage.pt": "listed twice",
    "many_normalizer_groups.pt": "ok",
    "dict_200k_int_keys.pt": "ok",
    "unsafe_in_newobj_ex_kwargs.pt": "unsafe: os.system",
    "unsafe_in_setitems_on_object.pt": "unsafe: os.system",
    "unsafe_in_appends_on_object.pt": "unsafe: os.system",
    "deep_list_255.pt": "ok",
    "zip_understated_count.pt": "readers would disagree on the archive's entries",
    "trace_duplicate_tensor.pmtrace.safetensors": "tensor 'c' is listed twice",
    "trace_duplicate_metadata.pmtrace.safetensors": "__metadata__ key 'trace' is listed twice",
}

if __name__ == "__main__":
    for name, data in sorted(FILES.items()):
        with open(os.path.join(HERE, name), "wb") as f:
            f.write(data)
    with open(os.path.join(HERE, "expected.json"), "w") as f:
        json.dump(EXPECTED, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {len(FILES)} files")
