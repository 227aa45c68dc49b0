#!/usr/bin/env bash
# Runs the NAT tests (tests/tests/nat.rs) N times (default 10) and writes how often each passed,
# whether the hole punch succeeded, and the bytes that crossed the public host's link, to
# docs/bench/nat/punch.json. Needs root, iproute2 and iptables.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-10}
out=docs/bench/nat/punch.json
mkdir -p "$(dirname "$out")"
cargo test -p nightshift-tests --test nat --no-run >/dev/null 2>&1
log=$(mktemp)
for i in $(seq 1 "$n"); do
  echo "== run $i of $n" >&2
  if cargo test -q -p nightshift-tests --test nat -- --nocapture --test-threads 1 >"$log.$i" 2>&1; then
    echo "ok" >>"$log.$i"
  fi
done
python3 - "$n" "$log" "$out" <<'PY'
import json, re, subprocess, sys
n, log, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True,
                        text=True).stdout.strip()
pp, sym = [], []
for i in range(1, n + 1):
    text = open(f"{log}.{i}").read()
    m = re.search(r"NAT \(port-preserving\): (\d+) hole punches succeeded; the public host moved "
                  r"(\d+) B in, (\d+) B out", text)
    # A test prints its line only once every assertion has held.
    pp.append({"passed": bool(m),
               "punched": int(m.group(1)) if m else 0,
               "public_in": int(m.group(2)) if m else 0, "public_out": int(m.group(3)) if m else 0})
    m = re.search(r"NAT \(symmetric\): (\d+) hole punches failed; the relay moved (\d+) B in, "
                  r"(\d+) B out", text)
    sym.append({"passed": bool(m), "punch_failures": int(m.group(1)) if m else 0,
                "public_in": int(m.group(2)) if m else 0, "public_out": int(m.group(3)) if m else 0})
json.dump({"commit": commit, "config": {"runs": n, "command":
           "cargo test -p nightshift-tests --test nat -- --nocapture --test-threads 1"},
           "port_preserving": pp, "symmetric": sym}, open(out, "w"), indent=2)
print(f"wrote {out}")
PY
