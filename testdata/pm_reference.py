"""Loading ProtoMotions' normalization.py from a checkout, for the recording
and benchmark scripts (nothing of it is copied into this repository)."""
import importlib.util
import os
import subprocess
import sys


class Fabric1:
    """The single-process stand-in the reference's own tests use."""
    world_size = 1
    global_rank = 0


def load_reference(root):
    """The module object of PATH/protomotions/agents/utils/normalization.py."""
    path = os.path.join(root, "protomotions", "agents", "utils", "normalization.py")
    if not os.path.exists(path):
        raise SystemExit(f"{path}: not found; pass a checkout of github:NVlabs/ProtoMotions")
    spec = importlib.util.spec_from_file_location("pm_normalization", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def reference_commit(root, given=None):
    """The checkout's commit, or `given` when it is not a git work tree."""
    if given:
        return given
    try:
        return subprocess.check_output(["git", "-C", root, "rev-parse", "HEAD"], text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except Exception:
        raise SystemExit(f"{root} is not a git work tree: pass --reference-commit")


ST_DTYPES = {"torch.float32": "F32", "torch.float64": "F64", "torch.int64": "I64", "torch.int32": "I32",
             "torch.uint8": "U8", "torch.bool": "BOOL"}


def write_safetensors(torch, path, tensors):
    """Deterministic safetensors: no __metadata__, tensors sorted by element
    size (largest first, so every tensor is aligned) then name, header padded
    with spaces to a multiple of 8."""
    import json
    names = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    header, blobs, offset = {}, [], 0
    for k in names:
        t = tensors[k].detach().cpu().contiguous()
        flat = t.reshape(-1)
        if t.dtype == torch.bool:
            flat = flat.to(torch.uint8)
        data = flat.view(torch.uint8).numpy().tobytes()
        header[k] = {"dtype": ST_DTYPES[str(t.dtype)], "shape": list(t.shape),
                     "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def reexec_deterministic():
    """Re-executes the script with one thread and a fixed hash seed (what
    makes a recording reproducible), unless already so."""
    want = {"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if all(os.environ.get(k) == v for k, v in want.items()):
        return
    env = dict(os.environ)
    env.update(want)
    os.execve(sys.executable, [sys.executable] + sys.argv, env)
