#!/usr/bin/env bash
# Fills fuzz/corpus/<target>/ with seeds from the repository's test data
# (and fuzz/seeds/<target>/, the minimized corpora kept from long runs).
# Idempotent; run from anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."
c=fuzz/corpus
mkdir -p $c/pickle_reader $c/torch_zip $c/torch_legacy $c/safetensors_bridge $c/trace_reader $c/infer_request
# Pickles: CPython's vectors (protocols 0-5), the hostile pickles, and every
# zip fixture's data.pkl (extracted with Python's zipfile: nothing is unpickled).
find crates/pickle/tests/data/vectors -name '*.pkl' -exec cp {} $c/pickle_reader/ \;
cp testdata/hostile/*.pkl $c/pickle_reader/
python3 - "$c/pickle_reader" <<'PY'
import glob, os, sys, zipfile
for f in glob.glob("testdata/checkpoints/*.pt") + glob.glob("testdata/checkpoints/*.ckpt") + glob.glob("testdata/hostile/*.pt"):
    try:
        z = zipfile.ZipFile(f)
        for n in z.namelist():
            if n.endswith("data.pkl"):
                open(os.path.join(sys.argv[1], os.path.basename(f) + ".data.pkl"), "wb").write(z.read(n))
    except Exception:
        pass
PY
for f in testdata/checkpoints/*.pt testdata/checkpoints/*.ckpt testdata/hostile/*.pt; do
  case $f in
    *legacy*) cp "$f" $c/torch_legacy/ ;;
    *zip_bomb*) ;;  # 100 KiB that inflates to 96 MiB: slows every run for nothing
    *) cp "$f" $c/torch_zip/ ;;
  esac
done
cp testdata/hostile/*.safetensors $c/safetensors_bridge/
cp testdata/traces/*.safetensors $c/trace_reader/
# v2.3's Hydra configs: our own OmegaConf cases and the recorded v2.3 models' config.yaml
mkdir -p $c/hydra_config
cp testdata/hydra/*.yaml $c/hydra_config/
for d in testdata/policy/v23_*/; do cp "$d/config.yaml" "$c/hydra_config/$(basename "$d").yaml"; done
for t in pickle_reader torch_zip torch_legacy safetensors_bridge trace_reader infer_request; do
  if [ -d fuzz/seeds/$t ]; then cp fuzz/seeds/$t/* $c/$t/ 2>/dev/null || true; fi
done
echo "seeded: $(for t in $c/*; do printf '%s=%s ' "$(basename $t)" "$(ls $t | wc -l)"; done)"
# The tracker's step: the recorded g1 sensor stream as the target reads it
# (per step: dof_pos, dof_vel, anchor_rot, root_local_ang_vel, a stamp's age
# of 0), whole and in short runs; the fuzzer mutates good readings into bad.
mkdir -p $c/tracker_step
python3 - "$c/tracker_step" <<'PY'
import json, os, struct, sys
raw = open("testdata/deploy/g1_amp_deploy/sensors.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
def col(k):
    a, b = head[k]["data_offsets"]
    v = struct.unpack("<%df" % ((b - a) // 4), raw[8 + n + a:8 + n + b])
    return v, head[k]["shape"]
cols = [col(k) for k in ("dof_pos", "dof_vel", "anchor_rot", "root_local_ang_vel")]
steps = cols[0][1][0]
rows = []
for t in range(steps):
    r = []
    for v, shape in cols:
        w = len(v) // steps
        r.extend(v[t * w:(t + 1) * w])
    r.append(0.0)
    rows.append(struct.pack("<%df" % len(r), *r))
for start, count in ((0, 64), (0, 4), (100, 8), (150, 11)):
    open(os.path.join(sys.argv[1], "g1_steps_%d_%d" % (start, count)), "wb").write(b"".join(rows[start:start + count]))
PY
