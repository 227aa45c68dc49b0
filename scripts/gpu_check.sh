#!/usr/bin/env bash
# `just gpu-check`: builds with the `cuda` feature and trains a two-node swarm on this machine's
# GPU at the medium preset, then prints each node's tokens/s and model FLOPs utilisation
# (scripts/gpu_check.py). Run it whenever a GPU machine is lent; record its figures in
# BENCHMARKS.md. GPU_CHECK_FEATURES= GPU_CHECK_PRESET=tiny runs the same on the CPU (a smoke test
# of the script itself).
set -euo pipefail
cd "$(dirname "$0")/.."
features=${GPU_CHECK_FEATURES-cuda}
preset=${GPU_CHECK_PRESET:-medium}
rounds=${GPU_CHECK_ROUNDS:-4}
out=${GPU_CHECK_OUT:-gpu-check.json}
if [ "$features" = cuda ] && ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA driver here (nvidia-smi is missing); it needs a machine with a GPU" >&2
  exit 2
fi
cargo build --release -p nightshift-node ${features:+--features "$features"}
dir=$(mktemp -d)
target/release/nightshift demo --nodes 2 --preset "$preset" --rounds "$rounds" \
  --dir "$dir" --report "$dir/report.json"
python3 scripts/gpu_check.py "$dir" --features "$features" --preset "$preset" --out "$out"
