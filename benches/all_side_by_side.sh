#!/usr/bin/env bash
# Every speed measurement the README and docs/ quote, on this machine, one
# after another, each into a file of its own: what a session lent a new kind
# of CPU (an Intel Xeon, an AVX2-only EPYC) runs to fill its tables.
#
# usage: benches/all_side_by_side.sh --protomotions PATH [--python PY]
#            [--pmstate BIN] [--out DIR] [--quick] [--with-gpc]
#
#   --protomotions  a checkout of github:NVlabs/ProtoMotions (the MaskedMimic,
#                   deploy and GPC scripts build its own classes)
#   --python        a Python with testdata/policy/requirements-record.txt
#                   installed (default: python3)
#   --pmstate       the release binary (default: target/release/pmstate;
#                   build it first: cargo build --release -p pmstate-cli)
#   --out           where the files go (default: target/bench-<host>-<UTC time>)
#   --quick         one round, shortest times (the GPC prior at batch 1
#                   only): checks that every step runs, its numbers are not
#                   for the docs
#   --with-gpc      also the GPC prior at its published size (torch's
#                   generation at batch 256 alone takes minutes)
#
# Nothing else should run on the machine meanwhile (the scripts time wall
# clock; CPU time is printed beside it). A step that fails is reported and
# the others still run; the exit status is 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."

py=python3 pm="" bin=target/release/pmstate out="" quick=0 gpc=0
while [ $# -gt 0 ]; do
  case "$1" in
    --protomotions) pm=${2:?--protomotions takes a path}; shift 2 ;;
    --python) py=${2:?--python takes a path}; shift 2 ;;
    --pmstate) bin=${2:?--pmstate takes a path}; shift 2 ;;
    --out) out=${2:?--out takes a path}; shift 2 ;;
    --quick) quick=1; shift ;;
    --with-gpc) gpc=1; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "all_side_by_side.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$pm" ] || [ ! -d "$pm/protomotions" ]; then
  echo "all_side_by_side.sh: --protomotions must name a ProtoMotions checkout (a folder with protomotions/ in it)" >&2
  exit 2
fi
if [ ! -x "$bin" ]; then
  echo "all_side_by_side.sh: no pmstate binary at $bin (cargo build --release -p pmstate-cli, or --pmstate BIN)" >&2
  exit 2
fi
out=${out:-target/bench-$(hostname)-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out" || exit 2

if [ "$quick" = 1 ]; then
  rounds=1 min_time=0 steps=200 runs=1 seconds=0.5
else
  rounds=3 min_time=0.5 steps=10000 runs=9 seconds=3
fi

failed=()
# step NAME CMD...: runs CMD, its output into $out/NAME.txt, says how it went
step() {
  local name=$1; shift
  echo "== $name: $*"
  local t0=$SECONDS
  if "$@" >"$out/$name.txt" 2>&1; then
    echo "   ok ($((SECONDS - t0)) s): $out/$name.txt"
  else
    echo "   FAILED ($((SECONDS - t0)) s): the end of $out/$name.txt:"
    tail -5 "$out/$name.txt" | sed 's/^/     /'
    failed+=("$name")
  fi
}

{
  echo "date (UTC): $(date -u +%FT%TZ)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | grep -q . && echo '(uncommitted changes)')"
  echo "avx512f: $(grep -c -w avx512f /proc/cpuinfo) of $(grep -c ^processor /proc/cpuinfo) CPUs"
  grep -m1 -E '^model name' /proc/cpuinfo
  grep -m1 -E '^cpu family' /proc/cpuinfo
  grep -m1 -E '^model\s' /proc/cpuinfo
  command -v lscpu >/dev/null && lscpu | grep -E 'Hypervisor|L1d|L2|L3'
  "$py" -c 'import torch, onnxruntime; print("torch", torch.__version__, "onnxruntime", onnxruntime.__version__)' 2>&1
} >"$out/machine.txt"
cat "$out/machine.txt"

step bench-policy-check "$bin" bench-policy --threads 1 --min-time 0.3 --check
step policy "$py" benches/policy_side_by_side.py --threads 1 --rounds "$rounds" --min-time "$min_time" \
  --pmstate "$bin" --json "$out/policy.json"
step masked-mimic "$py" benches/masked_mimic_side_by_side.py --protomotions "$pm" --threads 1 \
  --rounds "$rounds" --min-time "$min_time" --pmstate "$bin"
step deploy "$py" benches/deploy_side_by_side.py --protomotions "$pm" --threads 1 --steps "$steps" \
  --pmstate "$bin" --json "$out/deploy.json"
step serve "$bin" bench-serve --encoding json --encoding binary --seconds "$seconds"
# what the issue's serving goals were measured on until 2026-12-05: clients asking for the value too
step serve-value "$bin" bench-serve --ask action-and-value --encoding binary --clients 256 --seconds "$seconds"
step ckpt "$py" benches/ckpt_side_by_side.py --pmstate "$bin" --runs "$runs" --json "$out/ckpt.json"
if [ "$gpc" = 1 ]; then
  gpc_batches=(--batch 1 --batch 256)
  [ "$quick" = 1 ] && gpc_batches=(--batch 1)
  step gpc "$py" benches/gpc_side_by_side.py --protomotions "$pm" --threads 1 --pmstate "$bin" "${gpc_batches[@]}"
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "all_side_by_side.sh: failed: ${failed[*]} (outputs in $out)" >&2
  exit 1
fi
echo "all_side_by_side.sh: every step ran; outputs in $out"
