#!/usr/bin/env bash
# Reproduces the numbers in BENCHMARKS.md (release build; run on a quiet machine).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p nightshift-node -p nightshift-lab
bin=./target/release/nightshift
out=$(mktemp -d)
echo "== demo (default settings), 3 runs"
for i in 1 2 3; do
  /usr/bin/time -f "wall %e s, max rss %M KB" "$bin" demo --dir "$out/demo$i" --report "$out/demo$i.json" | tail -8
done
echo "== bytes per delta by codec (tiny model)"
for c in fp32 fp16 int8:64 int4:64 topk:30; do
  "$bin" demo --preset tiny --inner-steps 30 --rounds 2 --codec "$c" --dir "$out/$c" --report "$out/$c.json" > /dev/null
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], r['dense_delta_bytes'], r['wire_delta_bytes'], round(r['compression_ratio'],2), round(r['final_val_loss'],4))" "$out/$c.json" "$c"
done
echo "== convergence (reduced, T=500; ~45 min on 2 cores)"
./target/release/nightshift-lab convergence --runs single,sync,codecs,drop --steps 500 --codecs fp32,int8:64,topk:20 \
  --drop 0.5 --codec fp32 --json "$out/convergence.json" --plot "$out/convergence.svg"
echo "reports in $out"
