#!/usr/bin/env python3
"""Drives `pmstate serve` with NVIDIA's own client, `tritonclient.http`, in
JSON and with the binary tensor extension, and checks every answer against
`pmstate policy run` on the same rows.

usage: python benches/serve_tritonclient.py [--pmstate PATH]
           [--checkpoint testdata/policy/smpl_tracker/last.ckpt] [--obs OBS.safetensors]
           [--url HOST:PORT] [--allow-skip]

Without --pmstate it runs the `pmstate` on PATH, else this checkout's
target/release/pmstate, else target/debug/pmstate.

Without --url it starts `pmstate --json serve CHECKPOINT --addr 127.0.0.1:0`
itself, reads the address from its first line, and stops it with SIGTERM at
the end (the server must drain and exit 0). With --url it talks to a server
already running that serves CHECKPOINT as `policy`.

Checks: live/ready, server and model metadata, the model configuration,
then the recorded observation rows (testdata: written by ProtoMotions' own
code) through `infer` as JSON (binary_data=False) and as binary
(binary_data=True) for inputs and outputs: mean_action, value and std
bitwise equal to `pmstate policy run`; with the request parameters
{"sample": true, "seed": 7}, action and neglogp bitwise equal to
`pmstate policy run --sample --seed 7`.

Exit status: 0 all equal, 1 a difference, 2 a setup error (tritonclient or
numpy absent included: nothing was tested). With --allow-skip, a missing
tritonclient or numpy prints "SKIPPED: <reason>" and exits 0 instead (CI,
where the packages may not be installable).
"""
import argparse
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

np = None  # numpy and tritonclient.http, imported by import_clients()
httpclient = None


def import_clients():
    """Imports numpy and tritonclient.http; the name of the missing one, or None."""
    global np, httpclient
    try:
        import numpy as np
        import tritonclient.http as httpclient
    except ImportError as e:
        return e.name or str(e)
    return None


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


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pmstate", default=None)
    p.add_argument("--checkpoint", default=os.path.join(ROOT, "testdata/policy/smpl_tracker/last.ckpt"))
    p.add_argument("--obs", default=None, help="default: obs.safetensors next to the checkpoint")
    p.add_argument("--url", default=None, help="a running server (host:port); default: start one")
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
    url = a.url
    if url is None:
        server = subprocess.Popen(
            [pmstate, "--json", "serve", a.checkpoint, "--addr", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True
        )
        first = json.loads(server.stdout.readline())
        assert first["event"] == "listening", first
        url = first["addr"]
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
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            code = server.wait(timeout=60)
            check(f"server drained and exited {code} on SIGTERM", code == 0)
    print(f"{'all checks passed' if not failures else f'{len(failures)} checks failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
