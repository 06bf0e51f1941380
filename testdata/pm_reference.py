"""Loading ProtoMotions' normalization.py from a checkout, for the recording
and benchmark scripts (nothing of it is copied into this repository)."""
import importlib.util
import os
import subprocess


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
