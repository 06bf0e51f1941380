#!/usr/bin/env bash
# Puts MuJoCo 3.17.0's shared library (the one mujoco-rs 7.0 binds) in DIR
# (default target/mujoco) and prints the exports a build and a run need:
#   eval "$(scripts/mujoco-lib.sh)"
#   cargo build --release -p pmstate-cli --features mujoco
# The library comes from PyPI's `mujoco==3.17.0` wheel (pip download, no
# install: nothing of Python is needed to run it), so it is the same
# library ProtoMotions' own MuJoCo loop runs with that version installed.
set -euo pipefail
dir=${1:-target/mujoco}
version=3.17.0
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
if [ ! -e "$dir/libmujoco.so.$version" ]; then
  wheels=$(mktemp -d)
  trap 'rm -rf "$wheels"' EXIT
  python3 -m pip download -q --no-deps --only-binary :all: --dest "$wheels" "mujoco==$version" >&2
  wheel=$(ls "$wheels"/mujoco-"$version"-*.whl | head -n 1)
  python3 - "$wheel" "$dir" "$version" <<'PY'
import sys, zipfile
wheel, out, version = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    name = f"mujoco/libmujoco.so.{version}"
    with z.open(name) as src, open(f"{out}/libmujoco.so.{version}", "wb") as dst:
        dst.write(src.read())
PY
fi
ln -sf "libmujoco.so.$version" "$dir/libmujoco.so"
echo "export MUJOCO_DYNAMIC_LINK_DIR=$dir"
echo "export LD_LIBRARY_PATH=$dir\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
