#!/usr/bin/env bash
# Fuzzes every decoder a peer can reach (protocol/tests/fuzz/) with N inputs per target in a
# release build of the protocol crate alone, and prints one line per target.
#
#   scripts/fuzz.sh [N] [SUMMARY_FILE]
#
# N defaults to 1000000. With SUMMARY_FILE, the lines are also written there with the date, the
# commit and the seed. NIGHTSHIFT_FUZZ_SEED picks another seed; NIGHTSHIFT_FUZZ_REASONS=1 also
# lists every target's refusals by reason.
set -euo pipefail
cd "$(dirname "$0")/.."

cases=${1:-1000000}
summary=${2:-}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

start=$(date +%s)
status=0
NIGHTSHIFT_FUZZ_CASES=$cases cargo test --release -p nightshift-protocol --test fuzz -- \
  --nocapture --test-threads=1 2>&1 | tee "$log" || status=$?
wall=$(( $(date +%s) - start ))

# The harness prints its lines after the test harness's "test fuzz_x ... ", on the same line.
lines=$(grep -oE 'fuzz [a-z0-9-]+: ([0-9]+ inputs, |first panicking input: ).*' "$log" || true)
seed=$(grep -oE 'seed 0x[0-9a-f]+' "$log" | head -n 1 | cut -d' ' -f2 || true)
echo
echo "== fuzz summary ($cases inputs per target, seed ${seed:-unknown}, ${wall} s)"
echo "$lines"

if [ -n "$summary" ]; then
  mkdir -p "$(dirname "$summary")"
  {
    echo "# scripts/fuzz.sh $cases"
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- protocol 2>/dev/null || echo ' (protocol/ modified)')"
    echo "seed: ${seed:-unknown}"
    echo "cases per target: $cases"
    echo "wall: ${wall} s (release build included)"
    echo "$lines"
  } > "$summary"
  echo "written to $summary"
fi

if [ "$status" -ne 0 ] || grep -qE 'test result: FAILED|panicked' "$log"; then
  echo "fuzz: FAILED (see above)" >&2
  exit 1
fi
