#!/usr/bin/env bash
# Runs every fuzz target briefly (default 30 s each; FUZZ_SECONDS overrides),
# seeded from the test data. Fails on the first crash, leak, timeout or
# out-of-memory: libFuzzer then writes the input to fuzz/artifacts/<target>/.
# Needs cargo-fuzz (`cargo install cargo-fuzz`); stable Rust with
# RUSTC_BOOTSTRAP=1 stands in for nightly.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-30}
export RUSTC_BOOTSTRAP=1
bash fuzz/seed.sh
(cd fuzz && cargo fuzz build -O)
for t in pickle_reader torch_zip torch_legacy safetensors_bridge trace_reader infer_request tracker_step hydra_config; do
  echo "== fuzz $t for ${seconds}s"
  # -timeout: one input taking over 10 s is a hang; -rss_limit_mb and
  # -malloc_limit_mb: memory is bounded by a small multiple of the input
  # (max_len), far below these; an allocation past them is a finding.
  log=$(mktemp)
  if ! (cd fuzz && cargo fuzz run -O "$t" -- -max_total_time="$seconds" -timeout=10 \
          -rss_limit_mb=1024 -malloc_limit_mb=512 -max_len=65536 -print_final_stats=1) > "$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "fuzz $t: FAILED (the input is in fuzz/artifacts/$t/)" >&2
    exit 1
  fi
  grep -E "^(Done|stat::number_of_executed_units|stat::peak_rss_mb)" "$log" || true
  rm -f "$log"
done
echo "== fuzz smoke: no crash"
