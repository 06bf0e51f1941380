#!/usr/bin/env python3
"""Record OmegaConf's resolution of our Hydra test configs, for pmstate-ckpt's
`hydra` reader to be checked against.

    /work/venv/bin/python testdata/hydra/record_hydra.py PROTOMOTIONS_V23 [DIR]

PROTOMOTIONS_V23 is a checkout (or `git archive`) of ProtoMotions at tag
v2.3; its `protomotions/utils/config_utils.py` is imported from there at run
time so that exactly the resolvers ProtoMotions registers (eval, if, eq,
sqrt, sum, ceil, int, len, sum_list) are the ones OmegaConf uses. Importing
it registers them; nothing of it is copied here.

For every `*.yaml` in DIR (default: this script's folder) it writes
`NAME.resolved.json`, `OmegaConf.to_container(cfg, resolve=True)`, or, when
OmegaConf raises, `NAME.error.json` naming the exception and the full key.
The output depends only on the inputs (key order is the file's, floats are
written with Python's repr), so reruns are byte-identical.
"""

import importlib.util
import json
import pathlib
import sys


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    checkout = pathlib.Path(sys.argv[1])
    folder = pathlib.Path(sys.argv[2]) if len(sys.argv) == 3 else pathlib.Path(__file__).parent
    utils = checkout / "protomotions" / "utils" / "config_utils.py"
    spec = importlib.util.spec_from_file_location("pm_v23_config_utils", utils)
    if spec is None or spec.loader is None:
        print(f"cannot import {utils}", file=sys.stderr)
        return 2
    spec.loader.exec_module(importlib.util.module_from_spec(spec))

    from omegaconf import OmegaConf

    for path in sorted(folder.glob("*.yaml")):
        stem = path.name[: -len(".yaml")]
        for old in (folder / f"{stem}.resolved.json", folder / f"{stem}.error.json"):
            old.unlink(missing_ok=True)
        try:
            cfg = OmegaConf.load(path)
            tree = OmegaConf.to_container(cfg, resolve=True)
            # JSON has no inf or nan: such a tree is recorded as an error.
            out, text = folder / f"{stem}.resolved.json", json.dumps(tree, indent=1, allow_nan=False)
        except Exception as e:  # recorded, so the Rust side can match it
            key = getattr(e, "full_key", None)
            error = {"error": type(e).__name__, "full_key": key}
            out, text = folder / f"{stem}.error.json", json.dumps(error, indent=1)
        out.write_text(text + "\n")
        print(f"{out.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
