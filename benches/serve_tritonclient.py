#!/usr/bin/env python3
"""Drives `pmstate serve` with NVIDIA's own clients, `tritonclient.http` (in
JSON and with the binary tensor extension) and `tritonclient.grpc` (the
KServe V2 gRPC API and Triton's stream), and checks every answer against
`pmstate policy run` on the same rows.

usage: python benches/serve_tritonclient.py [--pmstate PATH]
           [--checkpoint testdata/policy/smpl_tracker/last.ckpt] [--obs OBS.safetensors]
           [--url HOST:PORT [--grpc-url HOST:PORT]] [--allow-skip]

Without --pmstate it runs the `pmstate` on PATH, else this checkout's
target/release/pmstate, else target/debug/pmstate.

Without --url it starts `pmstate --json serve CHECKPOINT --addr 127.0.0.1:0
--grpc-addr 127.0.0.1:0 --max-body-bytes 1000000` itself, reads the
addresses from its first lines, and stops it with SIGTERM at the end (the
server must drain and exit 0); for the Unix socket check it starts a second
one with `--grpc-addr unix:PATH`. With --url (and --grpc-url) it talks to a
server already running that serves CHECKPOINT as `policy` (the size limit
and Unix socket checks are then left out).

Checks: live/ready, server and model metadata, the model configuration,
then the recorded observation rows (testdata: written by ProtoMotions' own
code) through `infer` as JSON (binary_data=False) and as binary
(binary_data=True) for inputs and outputs: mean_action, value and std
bitwise equal to `pmstate policy run`; with the request parameters
{"sample": true, "seed": 7}, action and neglogp bitwise equal to
`pmstate policy run --sample --seed 7`.

gRPC checks (where tritonclient.grpc is installed: `pip install
'tritonclient[grpc]'`): crates/serve/proto/inference.proto against
tritonclient's own descriptors (every message, field number and type, and
every method with its streaming, as tritonclient's generated code has
them); live/ready, server and model metadata (the model's as HTTP gives
it); `infer` (raw contents) bitwise equal to `pmstate policy run` and to
the HTTP answers, also sampled; a bad request refused with
INVALID_ARGUMENT naming the input; a message over --max-body-bytes refused
and the server still serving; 8 requests (one row each) and a bad one on
one `start_stream` stream, each row's answer bitwise equal to `pmstate
policy run`'s row, the bad one's error delivered on the stream; the same
server on a Unix socket (`unix:PATH`).

Exit status: 0 all equal, 1 a difference, 2 a setup error (tritonclient or
numpy absent included: nothing was tested). With --allow-skip, a missing
tritonclient or numpy prints "SKIPPED: <reason>" and exits 0 instead (CI,
where the packages may not be installable).
"""
import argparse
import json
import os
import queue
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

np = None  # numpy and tritonclient.http, imported by import_clients()
httpclient = None
grpcclient = None  # tritonclient.grpc, when installed


def import_clients():
    """Imports numpy and tritonclient.http (and tritonclient.grpc when it is
    there); the name of the missing one, or None."""
    global np, httpclient, grpcclient
    try:
        import numpy as np
        import tritonclient.http as httpclient
    except ImportError as e:
        return e.name or str(e)
    except RuntimeError:  # tritonclient without its [http] extra says so this way
        return "tritonclient[http]"
    try:
        import tritonclient.grpc as grpcclient
    except (ImportError, RuntimeError):
        grpcclient = None
    return None


PROTO = os.path.join(ROOT, "crates/serve/proto/inference.proto")
SCALARS = {"double": 1, "float": 2, "int64": 3, "uint64": 4, "int32": 5, "bool": 8, "string": 9, "bytes": 12, "uint32": 13}


def our_proto(path):
    """Messages ({full name: {field: (number, type, repeated)}}) and methods
    ({name: (input, output, client streaming, server streaming)}) of our
    .proto: a reader for its own plain layout, not a general parser."""
    text = re.sub(r"//[^\n]*", "", open(path).read())
    toks = re.findall(r"[A-Za-z_][\w.]*|\d+|[{}=;<>,()]", text)
    # enums first (a field of an enum type is wire type 14)
    enums = {toks[j + 1] for j, t in enumerate(toks) if t == "enum"}
    package, messages, methods, stack, i = "", {}, {}, [], 0
    while i < len(toks):
        t = toks[i]
        if t == "enum":  # enum Name { VALUE = N; ... }: values are not checked
            i = toks.index("}", i) + 1
        elif t == "package":
            package, i = toks[i + 1], i + 3
        elif t == "syntax":
            i = toks.index(";", i) + 1
        elif t in ("message", "service", "oneof"):
            stack.append((t, toks[i + 1]))
            if t == "message":
                messages[".".join([package] + [n for k, n in stack if k == "message"])] = {}
            i += 3
        elif t == "}":
            stack.pop()
            i += 1
        elif t == "rpc":
            # rpc Name ( [stream] In ) returns ( [stream] Out ) { }
            j = i + 3
            cs = toks[j] == "stream"
            j += cs
            inp = toks[j]
            j += 4
            ss = toks[j] == "stream"
            j += ss
            methods[toks[i + 1]] = (f"{package}.{inp}", f"{package}.{toks[j]}", cs, ss)
            i = j + 4
        else:
            msg = ".".join([package] + [n for k, n in stack if k == "message"])
            repeated = t == "repeated"
            if repeated:
                i += 1
            if toks[i] == "map":  # map < K , V > name = N ;
                name, num, kind, repeated = toks[i + 6], int(toks[i + 8]), 11, True
                i += 10
            else:
                kind = 14 if toks[i] in enums else SCALARS.get(toks[i], 11)
                name, num = toks[i + 1], int(toks[i + 3])
                i += 5
            messages[msg][name] = (num, kind, repeated)
    return messages, methods


def repeated(field):
    """Whether a field descriptor is repeated (protobuf 6 has is_repeated; older ones only label)."""
    r = getattr(field, "is_repeated", None)
    if r is None:
        return field.label == 3
    return r() if callable(r) else r


def check_wire(check):
    """Our .proto against tritonclient's generated descriptors."""
    from tritonclient.grpc import service_pb2

    pool = service_pb2.DESCRIPTOR.pool
    messages, methods = our_proto(PROTO)
    for full, fields in messages.items():
        theirs = {f.name: (f.number, f.type, repeated(f)) for f in pool.FindMessageTypeByName(full).fields}
        wrong = {n: (v, theirs.get(n)) for n, v in fields.items() if theirs.get(n) != v}
        check(f"wire: {full} ({len(fields)} fields) as tritonclient's", not wrong)
        if wrong:
            print(f"     ours vs tritonclient's (number, type, repeated): {wrong}")
    svc = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for name, (inp, out, cs, ss) in methods.items():
        m = svc.methods_by_name.get(name)
        theirs = m and (m.input_type.full_name, m.output_type.full_name, m.client_streaming, m.server_streaming)
        check(f"wire: rpc {name}{' (bidirectional stream)' if cs and ss else ''} as tritonclient's",
              theirs == (inp, out, cs, ss))


def find_pmstate():
    """The `pmstate` on PATH, else this checkout's release build, else its debug build."""
    on_path = shutil.which("pmstate")
    if on_path:
        return on_path
    built = (os.path.join(ROOT, "target", d, "pmstate") for d in ("release", "debug"))
    return next((x for x in built if os.path.exists(x)), None)


def read_safetensors(path):
    """{name: numpy array} of a safetensors file (numpy only, no torch)."""
    kinds = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=kinds[t["dtype"]]).reshape(t["shape"])
    return out


def policy_run(pmstate, ckpt, obs, out, sample):
    cmd = [pmstate, "policy", "run", "--obs", obs, "--out", out, ckpt]
    if sample:
        cmd[3:3] = ["--sample", "--seed", "7"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return read_safetensors(out)


def same_bits(a, b):
    a, b = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


MAX_BODY = 1_000_000  # --max-body-bytes of the server this starts: 8 rows fit, 256 do not


def grpc_inputs(obs, rows=None):
    """tritonclient.grpc inputs of `obs` (rows `rows`, default all): raw contents, as tritonclient sends them."""
    out = []
    for name, arr in sorted(obs.items()):
        x = np.ascontiguousarray(arr if rows is None else arr[rows], dtype=np.float32)
        i = grpcclient.InferInput(name, list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        out.append(i)
    return out


def grpc_checks(url, obs, want, want_s, check, limits, rest_cfg):
    """Health, metadata, infer, refusals and the stream through tritonclient.grpc."""
    c = grpcclient.InferenceServerClient(url=url)
    check(f"gRPC {url}: server live", c.is_server_live())
    check("gRPC: server ready", c.is_server_ready())
    check("gRPC: model ready", c.is_model_ready("policy"))
    meta = c.get_server_metadata(as_json=True)
    check(f"gRPC: server metadata {meta['name']} {meta['version']} {meta['extensions']}", meta["name"] == "pmstate")
    mm = c.get_model_metadata("policy", as_json=True)
    check(
        "gRPC: model metadata inputs " + ", ".join(f"{i['name']}{[int(d) for d in i['shape']]}" for i in mm["inputs"]),
        sorted(i["name"] for i in mm["inputs"]) == sorted(obs),
    )
    cfg = c.get_model_config("policy", as_json=True)["config"]
    same_cfg = (cfg["name"] == rest_cfg["name"] and int(cfg["max_batch_size"]) == rest_cfg["max_batch_size"]
                and [(i["name"], i["data_type"], [int(d) for d in i.get("dims", [])]) for i in cfg["input"]]
                == [(i["name"], i["data_type"], i["dims"]) for i in rest_cfg["input"]]
                and [(o["name"], o["data_type"], [int(d) for d in o.get("dims", [])]) for o in cfg["output"]]
                == [(o["name"], o["data_type"], o["dims"]) for o in rest_cfg["output"]])
    check(f"gRPC: model config max_batch_size {cfg['max_batch_size']}, {len(cfg['input'])} inputs, "
          f"{len(cfg['output'])} outputs as GET .../config", same_cfg)
    names = ("mean_action", "value", "std")
    r = c.infer("policy", grpc_inputs(obs), outputs=[grpcclient.InferRequestedOutput(n) for n in names], request_id="g1")
    for n in names:
        got = r.as_numpy(n)
        check(f"gRPC: {n} {list(got.shape)} bitwise equal to pmstate policy run (and so to HTTP)", same_bits(got, want[n]))
    check("gRPC: the id is echoed and the version given", r.get_response().id == "g1" and r.get_response().model_version == "1")
    r = c.infer("policy", grpc_inputs(obs), outputs=[grpcclient.InferRequestedOutput(n) for n in ("action", "neglogp")],
                parameters={"sample": True, "seed": 7})
    for n in ("action", "neglogp"):
        check(f"gRPC: {n} (sample, seed 7) bitwise equal to pmstate policy run --sample --seed 7",
              same_bits(r.as_numpy(n), want_s[n]))
    try:
        bad = grpcclient.InferInput("max_coords_obs", [1, 3], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
        c.infer("policy", [bad])
        check("gRPC: a bad request is refused", False)
    except grpcclient.InferenceServerException as e:
        check(f"gRPC: a bad request is refused: {e.status()} {e.message()}",
              e.status() == "StatusCode.INVALID_ARGUMENT" and "expected 358" in e.message())
    if limits:
        big = {k: np.tile(v, (32, 1)) for k, v in obs.items()}  # 256 rows, about 1 MB of raw contents
        try:
            c.infer("policy", grpc_inputs(big))
            check(f"gRPC: a message over --max-body-bytes {MAX_BODY} is refused", False)
        except grpcclient.InferenceServerException as e:
            check(f"gRPC: a message over --max-body-bytes is refused: {e.status()} {e.message()}",
                  e.status() in ("StatusCode.OUT_OF_RANGE", "StatusCode.RESOURCE_EXHAUSTED"))
        check("gRPC: and the server keeps serving", c.infer("policy", grpc_inputs(obs, [0])).as_numpy("mean_action").shape == (1, 69))
    # Triton's stream: every row its own request, and a bad one in the middle, on one stream
    answers = queue.Queue()
    c.start_stream(callback=lambda result, error: answers.put((result, error)))
    rows = len(next(iter(obs.values())))
    for i in range(rows):
        c.async_stream_infer("policy", grpc_inputs(obs, [i]), request_id=f"row{i}",
                             outputs=[grpcclient.InferRequestedOutput("mean_action")])
        if i == 3:
            bad = grpcclient.InferInput("no_such_key", [1, 3], "FP32")
            bad.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
            c.async_stream_infer("policy", [bad], request_id="bad")
    c.stop_stream()
    got = [answers.get(timeout=60) for _ in range(rows + 1)]
    results = [r for r, e in got if e is None]
    errors = [e for r, e in got if e is not None]
    by_id = {r.get_response().id: r for r in results}
    ok = sorted(by_id) == sorted(f"row{i}" for i in range(rows)) and all(
        same_bits(by_id[f"row{i}"].as_numpy("mean_action"), want["mean_action"][i:i + 1]) for i in range(rows))
    check(f"gRPC stream: {rows} requests of one row on one stream, each bitwise equal to its row of pmstate policy run", ok)
    check(f"gRPC stream: the bad request's error on the stream: {errors[0].message() if errors else None}",
          len(errors) == 1 and "unexpected input no_such_key" in errors[0].message())
    c.close()


def uds_check(pmstate, ckpt, path, obs, want, check):
    """A second server with --grpc-addr unix:PATH: tritonclient.grpc connects to unix:PATH."""
    server = subprocess.Popen([pmstate, "--json", "serve", ckpt, "--addr", "127.0.0.1:0", "--grpc-addr", f"unix:{path}"],
                              stdout=subprocess.PIPE, text=True)
    try:
        json.loads(server.stdout.readline())
        url = json.loads(server.stdout.readline())["url"]
        # gRPC's C core names a Unix socket's path as the call's :authority, which
        # HTTP/2 servers built on the h2 crate refuse as malformed: name a host instead
        c = grpcclient.InferenceServerClient(url=url, channel_args=[("grpc.default_authority", "localhost")])
        r = c.infer("policy", grpc_inputs(obs), outputs=[grpcclient.InferRequestedOutput("mean_action")])
        check(f"gRPC on {url}: live, and mean_action bitwise equal to pmstate policy run",
              c.is_server_live() and same_bits(r.as_numpy("mean_action"), want["mean_action"]))
        c.close()
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=60)
    check(f"gRPC on a Unix socket: exited {code} on SIGTERM, the socket file removed", code == 0 and not os.path.exists(path))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pmstate", default=None)
    p.add_argument("--checkpoint", default=os.path.join(ROOT, "testdata/policy/smpl_tracker/last.ckpt"))
    p.add_argument("--obs", default=None, help="default: obs.safetensors next to the checkpoint")
    p.add_argument("--url", default=None, help="a running server (host:port); default: start one")
    p.add_argument("--grpc-url", default=None, help="the running server's gRPC address (with --url)")
    p.add_argument(
        "--allow-skip",
        action="store_true",
        help="exit 0 with SKIPPED when tritonclient or numpy is missing (default: exit 2, nothing was tested)",
    )
    a = p.parse_args()
    missing = import_clients()
    if missing is not None:
        why = f"{missing} is not installed (pip install 'tritonclient[http]' numpy)"
        if a.allow_skip:
            print(f"SKIPPED: {why}")
            return 0
        print(f"error: {why}; --allow-skip exits 0 instead", file=sys.stderr)
        return 2
    pmstate = a.pmstate or find_pmstate()
    if pmstate is None:
        print(
            "error: no pmstate binary on PATH or under target/: build it (cargo build -p pmstate-cli) or pass --pmstate",
            file=sys.stderr,
        )
        return 2
    print(f"pmstate: {pmstate}")
    obs_path = a.obs or os.path.join(os.path.dirname(a.checkpoint), "obs.safetensors")
    obs = read_safetensors(obs_path)
    tmp = tempfile.mkdtemp(prefix="pmstate-tritonclient-")
    want = policy_run(pmstate, a.checkpoint, obs_path, os.path.join(tmp, "plain.safetensors"), False)
    want_s = policy_run(pmstate, a.checkpoint, obs_path, os.path.join(tmp, "sampled.safetensors"), True)

    server = None
    url, grpc_url = a.url, a.grpc_url
    if url is None:
        cmd = [pmstate, "--json", "serve", a.checkpoint, "--addr", "127.0.0.1:0", "--max-body-bytes", str(MAX_BODY)]
        if grpcclient is not None:
            cmd += ["--grpc-addr", "127.0.0.1:0"]
        server = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        first = json.loads(server.stdout.readline())
        assert first["event"] == "listening", first
        url = first["addr"]
        if grpcclient is not None:
            second = json.loads(server.stdout.readline())
            assert second["event"] == "grpc_listening", second
            grpc_url = second["url"].removeprefix("grpc://")
    failures = []

    def check(what, ok):
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            failures.append(what)

    try:
        client = httpclient.InferenceServerClient(url=url)
        check("server live", client.is_server_live())
        check("server ready", client.is_server_ready())
        check("model ready", client.is_model_ready("policy"))
        meta = client.get_server_metadata()
        check(f"server metadata {meta['name']} {meta['version']} {meta['extensions']}", "binary_tensor_data" in meta["extensions"])
        mm = client.get_model_metadata("policy")
        check(
            "model metadata inputs " + ", ".join(f"{i['name']}{i['shape']}" for i in mm["inputs"]),
            sorted(i["name"] for i in mm["inputs"]) == sorted(obs),
        )
        cfg = client.get_model_config("policy")
        check(f"model config: max_batch_size {cfg['max_batch_size']}, sha256 {cfg['pmstate']['provenance']['sha256'][:12]}...", cfg["max_batch_size"] >= 1)

        for binary in (False, True):
            mode = "binary" if binary else "JSON"
            inputs = []
            for name, arr in sorted(obs.items()):
                i = httpclient.InferInput(name, list(arr.shape), "FP32")
                i.set_data_from_numpy(np.ascontiguousarray(arr, dtype=np.float32), binary_data=binary)
                inputs.append(i)
            outs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("mean_action", "value", "std")]
            r = client.infer("policy", inputs, outputs=outs)
            for n in ("mean_action", "value", "std"):
                got = r.as_numpy(n)
                check(f"{mode}: {n} {list(got.shape)} bitwise equal to pmstate policy run", same_bits(got, want[n]))
            outs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("action", "neglogp")]
            r = client.infer("policy", inputs, outputs=outs, parameters={"sample": True, "seed": 7})
            for n in ("action", "neglogp"):
                got = r.as_numpy(n)
                check(f"{mode}: {n} (sample, seed 7) bitwise equal to pmstate policy run --sample --seed 7", same_bits(got, want_s[n]))
        # an error comes back as the protocol's {"error": ...}, raised by the client
        try:
            bad = httpclient.InferInput("max_coords_obs", [1, 3], "FP32")
            bad.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
            client.infer("policy", [bad])
            check("a bad request is refused", False)
        except httpclient.InferenceServerException as e:
            # the widths are known (from the checkpoint and the resolved configs): the
            # too-narrow input is named before the missing ones
            check(f"a bad request is refused: {e.status()} {e.message()}",
                  "max_coords_obs" in e.message() and "expected 358" in e.message())
        client.close()
        if grpcclient is None:
            print("gRPC: skipped, tritonclient.grpc is not installed (pip install 'tritonclient[grpc]')")
        elif grpc_url is None:
            print("gRPC: skipped, no --grpc-url given with --url")
        else:
            check_wire(check)
            grpc_checks(grpc_url, obs, want, want_s, check, limits=server is not None, rest_cfg=cfg)
            if server is not None:
                with tempfile.TemporaryDirectory(prefix="pmstate-uds-") as d:
                    uds_check(pmstate, a.checkpoint, os.path.join(d, "pmstate.sock"), obs, want, check)
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            code = server.wait(timeout=60)
            check(f"server drained and exited {code} on SIGTERM", code == 0)
    print(f"{'all checks passed' if not failures else f'{len(failures)} checks failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
