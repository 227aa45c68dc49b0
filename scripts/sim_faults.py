#!/usr/bin/env python3
"""Random fault batches for the simulator: the lab's property test, more cases and other seeds.

Draws swarms the way `under_delays_losses_and_crashes_every_node_agrees_and_finishes` does
(lab/src/sim/tests.rs: 2–7 nodes, latency, jitter, loss, kill -9 crashes, private or open,
overlap or not), runs each with `nightshift-lab sim`, and counts the swarms where a node did not
finish, two nodes kept different states of a round, the loss did not fall, or the run reported a
failure. Extra flags (slow links, a wider model) are added to every swarm.

    python3 scripts/sim_faults.py --seed 7007 --cases 300 --extra "--reduce 0:int8:64"
    python3 scripts/sim_faults.py --seed 3131 --cases 150 \\
        --extra "--reduce 0:int8:64 --params 65536 --wire-params 1000000 --up-mbps 2 --down-mbps 2"

Writes one JSON line per swarm with its flags and outcome to --out (if given) and prints the
failing ones. Standard library only; uses target/release/nightshift-lab unless --lab names
another binary.
"""

import argparse
import json
import random
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def draw(rng, open_loss=False):
    private = rng.random() < 0.5
    return {
        "nodes": rng.randint(2, 7),
        "latency": rng.randint(1, 149),
        "jitter": rng.randint(0, 149),
        "loss": rng.uniform(0.0, 0.05) if private or open_loss else 0.0,
        "crash": 0.0 if rng.random() < 0.5 else rng.uniform(15.0, 60.0),
        "down": rng.uniform(1.0, 12.0),
        "seed": rng.randint(0, 999_999),
        "private": private,
        "overlap": rng.random() < 0.5,
    }


def flags(case, extra):
    f = [
        "--nodes", str(case["nodes"]), "--rounds", "8",
        "--latency-ms", str(case["latency"]), "--jitter-ms", str(case["jitter"]),
        "--loss", f"{case['loss']}", "--crash-every-secs", f"{case['crash']}",
        "--down-secs", f"{case['down']}", "--crashes-until-secs", "20",
        "--seed", str(case["seed"]),
    ]
    f += ["--private"] if case["private"] else ["--bootstraps", "1"]
    if case["overlap"]:
        f.append("--overlap")
    return f + extra


def judge(result, nodes):
    s = result["summary"]
    bad = []
    if s["failures"]:
        bad.append(f"failures: {s['failures'][:2]}")
    if s["nodes_finished"] != nodes:
        bad.append(f"{s['nodes_finished']} of {nodes} finished")
    for row in result["rounds"]:
        if row["distinct_state_hashes"] != 1:
            bad.append(f"round {row['round']}: {row['distinct_state_hashes']} states")
    last = result["rounds"][-1].get("val_loss") if result["rounds"] else None
    if last is None or last >= 0.1:
        bad.append(f"last loss {last}")
    return bad


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, required=True, help="draws the swarms")
    p.add_argument("--cases", type=int, default=100)
    p.add_argument("--extra", default="", help="flags added to every swarm")
    p.add_argument("--lab", default=str(ROOT / "target" / "release" / "nightshift-lab"))
    p.add_argument("--out", help="one JSON line per swarm")
    p.add_argument(
        "--open-loss",
        action="store_true",
        help="open swarms lose messages too (the property test gives them none)",
    )
    a = p.parse_args()
    rng = random.Random(a.seed)
    extra = shlex.split(a.extra)
    bad_cases = 0
    out = open(a.out, "w") if a.out else None
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.cases):
            case = draw(rng, a.open_loss)
            f = flags(case, extra)
            path = Path(tmp) / "r.json"
            run = subprocess.run([a.lab, "sim", *f, "--json", str(path)],
                                 capture_output=True, text=True)
            if run.returncode != 0:
                bad = [f"exit {run.returncode}: {run.stderr.strip()[-300:]}"]
            else:
                bad = judge(json.loads(path.read_text()), case["nodes"])
            if bad:
                bad_cases += 1
                print(f"case {i}: {shlex.join(f)}\n    {'; '.join(bad)}", flush=True)
            if out:
                out.write(json.dumps({"case": i, "flags": f, "bad": bad}) + "\n")
    print(f"{bad_cases} of {a.cases} swarms bad (seed {a.seed}, extra {a.extra!r})")
    return 1 if bad_cases else 0


if __name__ == "__main__":
    sys.exit(main())
