#!/usr/bin/env python3
"""Writes BENCHMARKS.md from the result files in docs/bench/.

Every figure in a row that names a data file is computed here from that file; the setting,
baseline and command of each row are written below, beside the code that reads its data. Result
files that record their configuration and commit (the lab's newer ones: {"commit", "config", ...})
give the commit; older ones have it written here. Rows whose figures were never saved as JSON
(throughput, the demo, memory under a flood) say so and quote the figures recorded at the time.

    python3 scripts/benchmarks.py          # rewrite BENCHMARKS.md
    python3 scripts/benchmarks.py --check  # exit 1 when BENCHMARKS.md is not what this writes

Standard library only.
"""

import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "docs" / "bench"
GRID = BENCH / "grid"


def load(path):
    return json.loads((ROOT / path).read_text())


def runs(path):
    """The runs of a result file: a bare list, or {"runs": [...]}."""
    d = load(path)
    return d["runs"] if isinstance(d, dict) else d


def one(path):
    return runs(path)[0]


def commit_of(path, written):
    """The commit a result file records, else the one written here."""
    d = load(path)
    if isinstance(d, dict):
        c = d.get("commit") or d.get("config", {}).get("commit")
        if c:
            return c[:7]
    return written


def pct(x):
    return f"{x * 100:+.2f} %"


def rel(path):
    return f"`{path}`"


SEEDS = range(42, 47)


# --- Training: DiLoCo against one worker and synchronous training --------------------------------

def sync_baseline(s):
    """The sync baseline of a seed: the better of its two warm-up settings that were run."""
    files = [f"docs/bench/grid/thirteenth/sync-muon1-s{s}.json"]
    files.append(
        "docs/bench/grid/thirteenth/sync-muon1-3e-3-s42.json"
        if s == 42
        else f"docs/bench/grid/thirteenth/sync-muon1d-s{s}.json"
    )
    return min(one(f)["final_val_loss"] for f in files)


def training_rows():
    rows = []
    diloco = {s: one(f"docs/bench/grid/sixteenth/h25-m07-whole-diloco-s{s}.json") for s in SEEDS}
    ratios = [diloco[s]["final_val_loss"] / sync_baseline(s) for s in SEEDS]
    rows.append([
        "DiLoCo ends as low as synchronous training at equal tokens",
        "K = 4, T = 1000 per-worker steps, H = 25, momentum 0.7, every worker sampling the whole "
        "split, fp32 deltas, `--aggregator mean`",
        "sync K = 4 with Muon, the better of 2e-3/50 and 3e-3/200 warm-up per seed",
        "42–46",
        f"**{statistics.mean(ratios):.3f}×** on the mean ({min(ratios):.3f}–{max(ratios):.3f}×)",
        "① · cf26279–b58c91f · `docs/bench/grid/sixteenth/h25-m07-whole-diloco-s4*.json`, "
        "sync: `docs/bench/grid/thirteenth/`",
    ])
    reach = []
    for s in SEEDS:
        single = one(f"docs/bench/grid/thirteenth/single-muon1-s{s}.json")["final_val_loss"]
        reach.append(next(step for step, loss in diloco[s]["curve"] if loss <= single))
    rows.append([
        "DiLoCo K = 4 reaches one worker's final loss in ≤ T/2 per-worker steps",
        "as above", "single worker, T = 1000", "42–46",
        f"**{min(reach)}–{max(reach)}** of 1000 on every seed"
        + ("" if max(reach) <= 500 else " (not met on every seed)"),
        "① · as above · single: `docs/bench/grid/thirteenth/single-muon1-s4*.json`",
    ])
    drops = [
        one(f"docs/bench/grid/sixteenth/h25-m07-whole-drop-s{s}.json")["final_val_loss"]
        / diloco[s]["final_val_loss"] - 1
        for s in SEEDS
    ]
    rows.append([
        "dropping half of the contributions costs ≤ 3 %",
        "as above, each contribution dropped with p = 0.5, the short round's step shrunk by its "
        "noise (what nodes do)",
        "the same run without drops", "42–46",
        f"**{pct(statistics.mean(drops))}** on the mean ({pct(min(drops))} to {pct(max(drops))})",
        "② · as above · `h25-m07-whole-drop-s4*.json`",
    ])
    rows += sim_training_rows(diloco, drops)
    fp32 = {s: one(f"docs/bench/grid/sixteenth/h25-whole-diloco-s{s}.json") for s in (42, 43)}
    int4 = {s: one(f"docs/bench/grid/sixteenth/h25-int4-whole-diloco-s{s}.json") for s in (42, 43)}
    lowrank = {s: one(f"docs/bench/grid/sixteenth/h25-lowrank-whole-diloco-s{s}.json") for s in (42, 43)}
    d4 = [int4[s]["final_val_loss"] / fp32[s]["final_val_loss"] - 1 for s in (42, 43)]
    b4 = int4[42]["bytes_per_node_per_round"]
    b32 = fp32[42]["bytes_per_node_per_round"]
    rows.append([
        "the default codec is free",
        "`int4:64` against fp32, H = 25 (momentum 0.8)", "fp32", "42, 43",
        f"{pct(d4[0])} / {pct(d4[1])}; **{b32 / b4:.1f}×** fewer bytes ({b4 / 1e3:.0f} KB against "
        f"{b32 / 1e6:.2f} MB per node per round)",
        "① with `--codec int4:64 --outer-momentum 0.8` · b58c91f · "
        "`h25-int4-whole-diloco-s4{2,3}.json` against `h25-whole-diloco-s4{2,3}.json`",
    ])
    rows.append([
        "a ≥ 32× codec within 1 % of fp32",
        "`lowrank:23:256`, H = 10, outer 0.7 / 0.6, **AdamW** inner steps", "fp32 DiLoCo",
        "42–46", "+0.42 % on the mean, every seed within 1 %; 33.6× (as recorded in HISTORY)",
        "see HISTORY, twelfth pass · f9f08fb–dae2fd3 · `docs/bench/grid/twelfth/`",
    ])
    dl = [lowrank[s]["final_val_loss"] / fp32[s]["final_val_loss"] - 1 for s in (42, 43)]
    rows.append([
        "— with Muon (the default) it is not",
        "`lowrank`, H = 25, Muon", "fp32", "42, 43",
        f"**{pct(dl[0])} / {pct(dl[1])}**: not met; `int4:64` is the default",
        "① with `--codec lowrank` · b58c91f · `h25-lowrank-whole-diloco-s4{2,3}.json`",
    ])
    return rows


def sim_training_rows(loop, loop_drops):
    """The training table's first and third rows again, `convergence` driving its DiLoCo swarms
    through the simulator (every node running the round machine)."""
    def final(kind, s):
        return one(f"docs/bench/sim-convergence/h25-whole-{kind}-s{s}.json")["final_val_loss"]
    have = [s for s in SEEDS
            if (BENCH / f"sim-convergence/h25-whole-diloco-s{s}.json").exists()]
    if not have:
        return []
    sim = {s: final("diloco", s) for s in have}
    table = {s: loop[s]["final_val_loss"] for s in SEEDS}
    lo, hi = min(table.values()), max(table.values())
    same = [sim[s] / table[s] for s in have]
    sync = [sim[s] / sync_baseline(s) for s in have]
    inside = sum(lo <= v <= hi for v in sim.values())
    below = sum(v < lo for v in sim.values())
    commits = sorted({commit_of(f"docs/bench/sim-convergence/h25-whole-diloco-s{s}.json", "?")
                      for s in have})
    seeds = f"{min(have)}–{max(have)}" if len(have) > 1 else str(have[0])
    rows = [[
        "— the same through the simulator: every node running the round machine",
        "as above; 4 nodes of a private swarm, fully connected over the simulator's default "
        "links (20–80 ms, 50 / 200 Mbit/s), alike in speed, 40 rounds",
        "the table's loop (first row) on the same seed; sync as above",
        seeds,
        f"final loss {' / '.join(f'{sim[s]:.4f}' for s in have)} (mean "
        f"{statistics.mean(sim.values()):.4f}; the loop's {lo:.4f}–{hi:.4f}, mean "
        f"{statistics.mean(table.values()):.4f}): **{statistics.mean(same):.4f}×** the loop's "
        f"run of the same seed on the mean ({min(same):.4f}–{max(same):.4f}×); "
        f"{inside} of {len(have)} inside the loop's five-seed range"
        + (f", {below} below it (lower is better)" if below else "")
        + f"; **{statistics.mean(sync):.3f}×** sync on the mean ({min(sync):.3f}–{max(sync):.3f}×)",
        f"① · {', '.join(commits)} · `docs/bench/sim-convergence/h25-whole-diloco-s4*.json`",
    ]]
    both = [s for s in have
            if (BENCH / f"sim-convergence/h25-whole-drop-s{s}.json").exists()]
    if both:
        cost = [final("drop", s) / sim[s] - 1 for s in both]
        runs_ = {s: one(f"docs/bench/sim-convergence/h25-whole-drop-s{s}.json") for s in both}
        extra = [runs_[s]["tokens"] / one(
            f"docs/bench/sim-convergence/h25-whole-diloco-s{s}.json")["tokens"] - 1 for s in both]
        seeds = f"{min(both)}–{max(both)}" if len(both) > 1 else str(both[0])
        rows.append([
            "— dropping half of the contributions, as nodes lose them, costs ≤ 3 %",
            "as above, each contribution lost with p = 0.5: its node stops as its training ends "
            "and comes back once the round closed without it, replays the round's state and "
            "joins the next round late; a round that lost every contribution is trained again",
            "the same swarm without losses, same seed",
            seeds,
            f"**{pct(statistics.mean(cost))}** on the mean ({pct(min(cost))} to "
            f"{pct(max(cost))})" + ("; every seed ≤ 3 %" if max(cost) <= 0.03 else "") + "; "
            f"the loop's drops: {pct(statistics.mean(loop_drops))}. Tokens trained "
            f"{pct(min(extra))} to {pct(max(extra))} against the run without losses (rounds that "
            "lost every contribution are trained again; a late join trains a shorter round)",
            "② · as above · `docs/bench/sim-convergence/h25-whole-drop-s4*.json`",
        ])
    return rows


# --- Trust ------------------------------------------------------------------------------------------

def byzantine_ratio(data, aggregator, malicious):
    """Per attack, the mean over seeds of final / honest-only loss."""
    out = {}
    for r in data["runs"]:
        if r["aggregator"] == aggregator and r["malicious"] == malicious and r["attack"] != "none":
            out.setdefault(r["attack"], []).append(r["final_val_loss"] / r["honest_only_val_loss"])
    return {a: statistics.mean(v) for a, v in out.items()}


def no_attacker(data):
    by = {}
    for r in data["runs"]:
        if r["attack"] == "none":
            by.setdefault((r["malicious"], r["seed"]), {})[r["aggregator"]] = r["final_val_loss"]
    ratios = [v["cclip:1:3"] / v["mean"] for v in by.values() if "cclip:1:3" in v and "mean" in v]
    return statistics.mean(ratios)


def trust_rows():
    path = "docs/bench/byzantine/table-3seeds.json"
    data = load(path)
    commit = commit_of(path, "a039e05")
    rows = []
    for m, claim in [(2, "with 2 of 8 workers malicious, every attack ends within 1.05× of the "
                         "honest workers alone"), (3, "3 of 8 malicious (reported)")]:
        cc = byzantine_ratio(data, "cclip:1:3", m)
        mean = byzantine_ratio(data, "mean", m)
        worst = max(cc, key=cc.get)
        rows.append([
            claim,
            "8 workers, `tiny`, H = 25, 500 steps, `int4:64`; attacks " + ", ".join(sorted(cc))
            if m == 2 else "as above",
            "the same honest workers without the malicious ones (`honest_only_val_loss`)"
            if m == 2 else "as above",
            "42–44",
            f"`cclip:1:3` at most **{cc[worst]:.3f}×** ({worst}); the plain mean up to "
            f"{max(mean.values()):.0f}×",
            "`nightshift-lab byzantine --seeds 42,43,44 --malicious 2,3 --aggregators "
            f"mean,cclip:1:3` · {commit} · {rel(path)}" if m == 2 else "as above",
        ])
    small = [no_attacker(load(f"docs/bench/byzantine/small-k{k}.json")) for k in (3, 4)]
    rows.append([
        "no attacker: the robust aggregator costs nothing", "as above, `none`", "the plain mean",
        "42–44",
        f"**{no_attacker(data):.4f}×** ({small[0]:.4f}× at K = 3, {small[1]:.4f}× at K = 4)",
        "as above; `docs/bench/byzantine/small-k{3,4}.json`",
    ])
    path = "docs/bench/replay.json"
    rep = {(r["preset"], r["aggregator"]): r for r in runs(path)}
    ms = lambda p, a: rep[(p, a)]["replay_ms_median"]
    rows.append([
        "verifying a state by replay (8 contributions, `int4:64`)",
        "verify, decode, aggregate, outer step, hash; 2 cores; median of 5", "—", "—",
        f"small ({rep[('small', 'mean')]['params']:,} params): **{ms('small', 'mean'):.0f} ms** "
        f"mean / **{ms('small', 'cclip:1:3'):.0f} ms** cclip; large "
        f"({rep[('large', 'mean')]['params'] / 1e6:.1f} M): **{ms('large', 'mean') / 1e3:.1f} s / "
        f"{ms('large', 'cclip:1:3') / 1e3:.1f} s**",
        f"`nightshift-lab replay --json docs/bench/replay.json` · {commit_of(path, '2ae6b61')}",
    ])
    rows.append([
        "a node's memory under a request flood",
        "2 honest nodes (`tiny`) and a hostile member: 27,438 requests, 318 garbage frames",
        "the node before the flood", "—",
        "peak RSS 126 → **164–168 MiB**; training and agreement went on (as printed by the test)",
        "`tests/tests/trust/` (debug build) · 9e0f97f",
    ])
    fuzz = (BENCH / "fuzz-1m.txt").read_text()
    panics = re.findall(r"(\d+) panics?", fuzz)
    rows.append([
        "every decoder a peer reaches survives arbitrary input",
        "14 decoders, 1,000,000 inputs each", "—", "`0x6e69676874736869`",
        f"**{sum(map(int, panics)) if panics else 0} panics**, memory flat at 136 MiB",
        "`scripts/fuzz.sh 1000000 docs/bench/fuzz-1m.txt` · 811a4e7 (wire version 5)",
    ])
    return rows, rep


# --- Idle windows -----------------------------------------------------------------------------------

CHURN = ["churn-t2.json", "churn-t2-s8.json", "churn-t2-s9.json", "churn-t2-s10b.json",
         "churn-t2-s11.json"]


def churn_rows():
    t, k, lost, forks, p99 = [], [], 0, 0, []
    for f in CHURN:
        d = {r["name"]: r for r in runs(f"docs/bench/{f}")}
        s, c = d["stable-half"], d["churn"]
        t.append(c["time_to_target_secs"] / s["time_to_target_secs"])
        k.append(c["tokens_to_target"] / s["tokens_to_target"])
        lost += c["rounds_lost"]
        forks += c["rounds_disagreeing"]
        p99.append(c["yield_p99_ms"] or 0)
    within = sum(x <= 1.1 for x in t)
    return [[
        "a churning pool trains as fast as a stable one with the same compute",
        "4 nodes each idle 30 s of every 60 s (random phases), one killed and restarted, one "
        "joining late; 2 threads each",
        "2 always-on nodes, the same 2 cores", "phase seeds 7–11",
        f"**{statistics.median(t):.2f}×** the stable pair's time to its best loss (median; mean "
        f"{statistics.mean(t):.2f}×; {within} of {len(t)} ≤ 1.1×); "
        f"{statistics.median(k):.2f}× the tokens",
        "`nightshift-lab churn --max-secs 300 --threads-per-node 2 --phase-seed S --runs "
        "stable-half,churn` · 984d386 · `docs/bench/churn-t2*.json` (seed 10: `-s10b`, its rerun)",
    ], [
        "no round lost, no fork, yield < 1 s", "as above", "—", "7–11",
        f"{lost} rounds lost, {forks} forks, yield p99 ≤ {max(p99):.0f} ms", "as above",
    ]]


# --- The simulator ----------------------------------------------------------------------------------

def wall_rss(txt):
    m = re.search(r"([\d.]+) s wall, (\d+) KB peak RSS", (ROOT / txt).read_text())
    return float(m.group(1)), int(m.group(2)) / 1024


def sim_rows():
    path = "docs/bench/sim-1000.json"
    d = load(path)
    commit = commit_of(path, "b2d909d")
    wall, rss = wall_rss("docs/bench/sim-1000.txt")
    node_rounds = d["config"]["nodes"] * d["config"]["rounds"]
    rounds = d["rounds"]
    secs = [r["round_secs"] for r in rounds[1:-1]]
    rows = [[
        "1,000 nodes × 20 rounds within 10 minutes, every node running the machine",
        "the defaults: 1,000 nodes, 32 links each",
        f"**{wall:.0f} s** wall ({node_rounds / wall:.0f} node-rounds/s, "
        f"{d['summary']['inputs_handled'] / 1e6:.1f} M inputs), peak RSS **{rss:.0f} MiB**; the "
        "same seed writes the same file",
        f"`nightshift-lab sim --json F` · {commit} · {rel(path)}, `.txt`",
    ], [
        "— and what the round does at that size", "as above",
        f"the flat round does **not** converge: {rounds[0]['distinct_state_hashes']} distinct θ(1) "
        f"among 1,000 nodes, {rounds[-1]['distinct_state_hashes']} by θ({len(rounds)}); rounds of "
        f"{min(secs):.0f}–{max(secs):.0f} virtual s; {d['summary']['nodes_finished']} of 1,000 "
        "nodes finish",
        "as above",
    ]]
    full = {n: load(f"docs/bench/sim-full-{n}.json") for n in (50, 100, 200)}
    agree = all(r["distinct_state_hashes"] == 1 for f in full.values() for r in f["rounds"])
    rsecs = " / ".join(f"{statistics.mean(r['round_secs'] for r in f['rounds']):.1f}"
                       for f in full.values())
    up = " / ".join(f"{statistics.median(r['bytes_up_median'] for r in f['rounds']) / 1e6:.1f}"
                    for f in full.values())
    share = [statistics.median(r["status_bytes_up_median"] / r["bytes_up_median"]
                               for r in f["rounds"]) for f in full.values()]
    speed = []
    for n in full:
        w, m = wall_rss(f"docs/bench/sim-full-{n}.txt")
        speed.append((n * 5 / w, m))
    rows.append([
        "a fully connected swarm agrees on every round", "50 / 100 / 200 nodes, full mesh, 5 rounds",
        ("1 state per round at every size" if agree else "**not** one state per round")
        + f"; rounds of {rsecs} s (mean)",
        f"`nightshift-lab sim --nodes N --degree N --rounds 5` · "
        f"{commit_of('docs/bench/sim-full-50.json', 'b2d909d')} · "
        "`docs/bench/sim-full-{50,100,200}.json`",
    ])
    rows.append([
        "— but a node's upload grows with N²", "as above",
        f"median **{up} MB** per node per round, **{min(share) * 100:.0f}–{max(share) * 100:.0f} %** "
        "of it statuses (`status_bytes_up_median`): at that commit every status listed the round's "
        "contributions and went to every peer several times a round (statuses now count them and "
        "commit to them by roots: *Scale* below). Simulator speed "
        + " / ".join(f"{s:.0f}" for s, _ in speed) + " node-rounds/s, peak RSS "
        + " / ".join(f"{m:,.0f}" for _, m in speed) + " MiB",
        "as above",
    ])
    rows.append([
        "the rules hold under delays, loss, crashes and restarts",
        "64 swarms of 2–7 nodes drawn from a fixed seed, 8 rounds, private or open with one "
        "bootstrap: latency 1–150 ms + jitter, loss 0–5 %, a crash every 15–60 s "
        "for the first 20 s (down 1–12 s); all-to-all and with reducers",
        "every node finishes; every node completing a round holds the same state; "
        "the loss falls. Larger batches of the same draws (`scripts/sim_faults.py`, 600 each): "
        "0 bad of 600 all-to-all and 0 of 600 × 3 seeds with reducers on these links, 0 of 600 "
        "each way with open swarms losing messages too (`--open-loss`), since chains are compared "
        "(HISTORY, *Chains compared*); at 2 Mbit/s with reducers, 19 of 450 still end on two "
        "states or more (`docs/bench/chains/`)",
        "`cargo test -p nightshift-lab sim`",
    ])
    return rows


def scale_bulk(r):
    """A node's upload per round less its statuses."""
    return r["bytes_up_per_node_per_round"] - r["status_bytes_up_per_node_per_round"]


def scale_row(r, model=None, bulk=False):
    """One run of `nightshift-lab scale` as a table row (with the model and the upload less
    statuses when asked)."""
    unit = "s" if r["source"] == "processes" else "virtual s"
    kb = lambda v: f"{v / 1e3:,.0f} KB"
    return ([f"{r['nodes']:,}", r["source"]] + ([model] if model else []) +
            [kb(r["bytes_up_per_node_per_round"]), kb(r["bytes_down_per_node_per_round"]),
             kb(r["status_bytes_up_per_node_per_round"])] +
            ([kb(scale_bulk(r))] if bulk else []) +
            [f"{r['round_secs']:.1f} {unit}", str(r["distinct_final_states"])])


def scale_rows():
    path = "docs/bench/scale.json"
    if not (ROOT / path).exists():
        return []
    return [scale_row(r) for r in load(path)["runs"]]


def scale_reduce_rows():
    path = "docs/bench/scale-reduce.json"
    if not (ROOT / path).exists():
        return []
    d = load(path)
    width = d["config"].get("sim_params")
    model = lambda r: f"{width:,} values" if r["source"] == "simulator" and width else "`tiny`"
    return [scale_row(r, model(r), bulk=True) for r in d["runs"]]


def kb_of(r):
    """A run's status upload per node per round, in KB."""
    return f"{r['status_bytes_up_per_node_per_round'] / 1e3:,.0f} KB"


def sim_1000_reduce():
    """1,000 simulated nodes averaging slice by slice, against 4 under the same command."""
    big, small = "docs/bench/sim-reduce-1000.json", "docs/bench/sim-reduce-1000-base4.json"
    if not ((ROOT / big).exists() and (ROOT / small).exists()):
        return []
    med = lambda d, k: sorted(r[k] for r in d["rounds"])[len(d["rounds"]) // 2]
    b, a = load(big), load(small)
    up, down = med(b, "bytes_up_median") / med(a, "bytes_up_median"), med(b, "bytes_down_median") / med(a, "bytes_down_median")
    status = med(b, "status_bytes_up_median")
    bulk = med(b, "bytes_up_median") - status
    bulk4 = med(a, "bytes_up_median") - med(a, "status_bytes_up_median")
    states = max(r["distinct_state_hashes"] for r in b["rounds"])
    kind = lambda d, k: d["summary"]["traffic"][k]["bytes"] / (d["config"]["nodes"] * d["config"]["rounds"])
    wall, rss = wall_rss("docs/bench/sim-reduce-1000.txt")
    c = b["config"]
    return [f"**1,000 simulated nodes** (`sim --nodes 1000 --degree 999 --rounds {c['rounds']} "
            f"--params {c['params']} --wire-params {c['wire_params']} --reduce {c['reduce']}`, "
            f"{commit_of(big, '?')}, {wall / 60:.0f} min, {rss / 1024:.1f} GiB): a node sends "
            f"{med(b, 'bytes_up_median') / 1e6:.2f} MB a round, **{up:.2f}×** what it sends at 4 "
            f"nodes under the same command ({med(a, 'bytes_up_median') / 1e6:.2f} MB), and receives "
            f"**{down:.2f}×**; statuses are {status / 1e6:.2f} MB of it, and without them a node "
            f"sends {bulk / bulk4:.2f}× what it does at 4 — the rest of what grows is per "
            f"(contributor, reducer) pair, a request and a Merkle path with every slice (slice "
            f"traffic {kind(b, 'slice answer') / 1e6:.2f} MB a node a round against "
            f"{kind(a, 'slice answer') / 1e6:.2f} MB at 4), the two signatures on each peer's "
            f"reduced slice, and the lists ({kind(b, 'lists answer') / 1e6:.2f} MB); "
            f"{b['summary']['nodes_finished']:,} of 1,000 nodes finished, "
            f"{'one state' if states == 1 else f'{states} states'} at every round "
            f"(`{big}`, `.txt`; the 4-node run `{small}`)"]


def scale_reduce_note():
    path = "docs/bench/scale-reduce.json"
    if not (ROOT / path).exists():
        return ""
    d = load(path)
    runs = {(r["source"], r["nodes"]): r for r in d["runs"]}
    bulk = scale_bulk
    out = []
    p4, p16 = runs.get(("processes", 4)), runs.get(("processes", 16))
    if p4 and p16:
        up = p16["bytes_up_per_node_per_round"] / p4["bytes_up_per_node_per_round"]
        down = p16["bytes_down_per_node_per_round"] / p4["bytes_down_per_node_per_round"]
        out.append(f"At 16 processes a node sends **{up:.2f}×** and receives **{down:.2f}×** what it "
                   f"does at 4 (all-to-all: the table above; issue 26 asks for at most 1.5×); "
                   f"statuses aside, it sends **{bulk(p16) / bulk(p4):.2f}×**. What still grows "
                   "is what every peer gets a round whatever the model — a header, a reduced "
                   "slice's two signatures, statuses (≈ 250 B each, ≈ 8 a peer a round with the "
                   "look-ups), and per slice a request and its path: ≈ 2 KB a peer, against a "
                   "`tiny` contribution of ≈ 8 KB: at `tiny`'s size that overhead is the bulk")
    sims = sorted((r for r in d["runs"] if r["source"] == "simulator"), key=lambda r: r["nodes"])
    if len(sims) >= 2:
        a = sims[0]
        steps = ", ".join(f"{bulk(b) / 1e6:.2f} MB at {b['nodes']} (**{bulk(b) / bulk(a):.2f}×**)"
                          for b in sims[1:])
        out.append(f"simulated with a model of {d['config'].get('sim_params', 0):,} values, a "
                   f"node's upload statuses aside is {bulk(a) / 1e6:.2f} MB at {a['nodes']} "
                   f"nodes, {steps}")
    if len(sims) >= 2:
        a, b = sims[0], sims[-1]
        up = b["bytes_up_per_node_per_round"] / a["bytes_up_per_node_per_round"]
        out.append(f"statuses included, {b['nodes']} nodes send **{up:.2f}×** what "
                   f"{a['nodes']} do: statuses still go to every peer ({kb_of(b)} of the "
                   f"{b['nodes']}-node upload; `sim --nodes 256 --degree 255 --rounds 3 ...` "
                   "prints the traffic by kind). The lists behind them no longer grow as N² (≈ 7 "
                   "answers a node a round at 256 nodes, 61 before) and a slice no longer "
                   "carries its contributor's header (HISTORY, *Lists, refreshes and slice "
                   "answers*)")
    wall, rss = wall_rss("docs/bench/scale-reduce.txt")
    out.append(f"the command took {wall / 60:.0f} min, peak RSS {rss / 1024:.1f} GiB")
    txt = (ROOT / "docs/bench/scale-reduce.txt").read_text()
    if "ran beside" in txt:
        out.append("it ran beside a 1,000-node simulation on the other core, so the process "
                   "swarms' round seconds are longer than on an idle machine (bytes are not "
                   "affected)")
    out.extend(sim_1000_reduce())
    small = "docs/bench/scale-reduce-small.json"
    if (ROOT / small).exists():
        d2 = load(small)
        pr = {r["nodes"]: r for r in d2["runs"] if r["source"] == "processes"}
        if 4 in pr and 16 in pr:
            a, b = pr[4], pr[16]
            swall, _ = wall_rss("docs/bench/scale-reduce-small.txt")
            out.append(
                f"with `small` (426,496 parameters, the preset `swarm init` ships), real processes "
                f"meet issue 26's bound: 16 send **{b['bytes_up_per_node_per_round'] / a['bytes_up_per_node_per_round']:.2f}×** "
                f"and receive **{b['bytes_down_per_node_per_round'] / a['bytes_down_per_node_per_round']:.2f}×** what 4 do "
                f"({a['bytes_up_per_node_per_round'] / 1e3:,.0f} and "
                f"{b['bytes_up_per_node_per_round'] / 1e3:,.0f} KB up a round; states at the end: "
                f"{a['distinct_final_states']} and {b['distinct_final_states']}; averaging with "
                f"reducers, which is not the default: all-to-all is; "
                f"`nightshift-lab scale --averaging reduce --preset small --nodes 4,16 --sim-nodes 4 "
                f"--rounds {d2['config']['rounds']}`, {d2['commit'][:7]}, {swall / 60:.0f} min, `{small}`)")
    sim_nodes = ",".join(str(n) for n in d["config"].get("sim_nodes", []))
    return ("; ".join(out) + f". `nightshift-lab scale --averaging reduce --sim-nodes {sim_nodes} "
            f"--sim-params 1000000 --json F` (the simulator computes on 65,536 values and counts "
            f"its transfers at 1,000,000: `sim --wire-params`) · {commit_of(path, '?')} · "
            f"`{path}`, `.txt`.")


def scale_note():
    path = "docs/bench/scale.json"
    if not (ROOT / path).exists():
        return ""
    d = load(path)
    runs = {(r["source"], r["nodes"]): r for r in d["runs"]}
    out = []
    p4, p16 = runs.get(("processes", 4)), runs.get(("processes", 16))
    if p4 and p16:
        up = p16["bytes_up_per_node_per_round"] / p4["bytes_up_per_node_per_round"]
        down = p16["bytes_down_per_node_per_round"] / p4["bytes_down_per_node_per_round"]
        out.append(f"At 16 processes a node sends **{up:.1f}×** and receives **{down:.1f}×** what it "
                   "does at 4 (issue 26 asks for at most 1.5×)")
    big = max((r for r in d["runs"] if r["source"] == "simulator"), key=lambda r: r["nodes"],
              default=None)
    if big:
        out.append(f"the simulated {big['nodes']:,}-node swarm ends on "
                   f"{big['distinct_final_states']} distinct states (no gossip: a node hears only "
                   "its 32 neighbours' contributions)")
    wall, rss = wall_rss("docs/bench/scale.txt")
    out.append(f"the whole command took {wall / 60:.0f} min, peak RSS {rss / 1024:.1f} GiB (the "
               "1,000-node simulation)")
    return ("; ".join(out) + f". `nightshift-lab scale --json F` · {commit_of(path, '?')} · "
            f"`{path}`, `.txt`.") if out else ""


LINKS = "docs/bench/links/v3-overlap.json"
EXPORT = load("docs/bench/export/check.json")


def links_rows():
    path = LINKS
    if not (ROOT / path).exists():
        return []
    rows = []
    for r in load(path)["runs"]:
        stt = r["secs_to_target"]
        rows.append([
            f"{r['mbps']:g} Mbit/s", f"{r['rtt_ms']:g} ms", f"{r['loss_pct']:g} %",
            str(r["nodes"]), "on" if r["overlap"] else "off",
            f"**{r['utilization']:.2f}**", "—" if stt is None else f"{stt:.0f} s",
            f"{r['bytes_up_per_node_per_round'] / 1e3:,.0f} KB", f"{r['round_secs']:.1f} s",
            f"{r['final_val_loss']:.4f}",
        ])
    return rows


def links_note():
    path = LINKS
    if not (ROOT / path).exists():
        return ""
    d = load(path)
    c = d["config"]
    same = all(len({r["final_val_loss"] for r in d["runs"] if r["overlap"] == o}) == 1
               for o in (False, True))
    return (("With overlap and without, every run ends on the same loss: a round waits for its "
             "contributions, so the link changes the time, not the model; overlap changes the "
             "model (the average reaches a node's training a round late). " if same else "")
            + f"`{c['preset']}`, {c['inner_steps']} inner steps a round, {c['rounds']} rounds, "
            f"seed {c['seed']}, "
            f"{c['nodes']} nodes of one thread each and a bootstrap node (which fetches every "
            f"contribution to replay the round), target loss {c['target_loss_used']:.4f} (the "
            "highest final loss of the runs). `nightshift-lab links --json F --plot F.svg` · "
            f"{commit_of(path, '?')} · `{path}`, chart `{path[:-5]}.svg`.")


def overlap_rows():
    """Overlap's accuracy cost at equal tokens: each seed's run without and with it."""
    rows = []
    for f in sorted((ROOT / "docs/bench/overlap").glob("convergence-continue-s*.json")):
        path = str(f.relative_to(ROOT))
        d = load(path)
        by = {r["overlap"]: r for r in d["runs"]}
        if False not in by or True not in by:
            continue
        off, on = by[False]["final_val_loss"], by[True]["final_val_loss"]
        rows.append([str(d["config"]["recipe"]["seed"]), f"{off:.4f}", f"{on:.4f}",
                     f"**{(on / off - 1) * 100:+.1f} %**", commit_of(path, "?"), f"`{path}`"])
    return rows


def nat_rows():
    path = "docs/bench/nat/punch.json"
    if not (ROOT / path).exists():
        return []
    d = load(path)
    rows = []
    for kind, runs in (("port-preserving", d["port_preserving"]), ("symmetric", d["symmetric"])):
        ok = sum(1 for r in runs if r["passed"])
        punched = sum(1 for r in runs if r.get("punched", 0) > 0)
        relay = sorted(r["public_in"] + r["public_out"] for r in runs if r["passed"])
        med = relay[len(relay) // 2] / 1e3 if relay else 0
        rows.append([kind, f"{len(runs)}", f"{ok} of {len(runs)}",
                     f"{punched} of {len(runs)}", f"{med:,.0f} kB",
                     f"`scripts/nat-punch.sh {len(runs)}` · {d['commit']} · `{path}`"])
    return rows


# --- The page ---------------------------------------------------------------------------------------

SHARDS = BENCH / "shards"


def shard_rows():
    """Which node trains on what: DiLoCo's final loss against sync on a small and a large corpus."""
    corpora = [
        ("small", "small-rotate1", "0.8 MB: the first 799,998 bytes of the embedded Shakespeare"),
        ("large, files shuffled", "shuffled-rotate16",
         "50.0 MB: 2,335 Rust source files of the crate registry in a random order"),
        ("large, files in name order", "large-rotate1",
         "50.4 MB: 2,868 Rust source files of the crate registry in name order (the validation "
         "tail is the last crates: unlike the rest)"),
    ]
    names = {"rotate400": "**a rotating 4 KiB shard per window** (shipped: 400 a round)",
             "rotate16": "16 rotating 64 KiB shards a round",
             "rotate1": "1 rotating 1 MiB shard a round",
             "whole": "whole split", "contiguous": "contiguous quarters (the demo before)"}
    rows = []
    for corpus, base_name, about in corpora:
        base = f"docs/bench/shards/{base_name}-s42.json"
        if not (ROOT / base).exists():
            continue
        sync = next(r for r in runs(base) if r["name"].startswith("sync"))["final_val_loss"]
        prefix = base_name.split("-")[0]
        cells = []
        for mode in ["rotate400", "rotate16", "rotate1", "whole", "contiguous"]:
            path = f"docs/bench/shards/{prefix}-{mode}-s42.json"
            if not (ROOT / path).exists():
                continue
            d = next(r for r in runs(path) if r["name"].startswith("diloco"))
            loss = d["final_val_loss"]
            cells.append(f"{names[mode]}: {loss:.4f}, **{loss / sync:.3f}×**")
        if prefix == "small":
            cells.append("(the corpus is one 1 MiB shard: 1 rotating shard is the whole split)")
        rows.append([corpus, about, f"sync k=4: {sync:.4f}", "42", "; ".join(cells),
                     f"③ · {commit_of(base, '?')} · `docs/bench/shards/{prefix}-*-s42.json`"])
    return rows


def reduce_rows():
    """Averaging slice by slice: DiLoCo's final loss against all-to-all averaging, per seed."""
    files = sorted((BENCH / "reduce").glob("*-s*.json"))
    found = {}  # (spec, seed) -> (run, file); spec None: all-to-all
    for f in files:
        path = f"docs/bench/reduce/{f.name}"
        for r in runs(path):
            spec = r["name"].split("reduce=")[1] if "reduce=" in r["name"] else None
            found[(spec, r["seed"])] = (r, path)
    about = {
        None: "all-to-all (every node averages whole contributions)",
        "4:fp32": "4 slices, means sent as fp32 (block-wise clipping alone)",
        "4:int8:64": "**4 slices, means sent as int8:64**",
        "4:int4:64": "4 slices, means sent as int4:64 (half the bytes of int8)",
        "16:int8:64": "16 slices, means sent as int8:64",
        "0:int8:64": "**one slice per contributor, means sent as int8:64 (`--averaging reduce`)**",
    }
    order = list(about)
    specs = sorted({k[0] for k in found}, key=lambda x: order.index(x) if x in order else 99)
    rows = []
    for spec in specs:
        seeds = sorted(seed for (sp, seed) in found if sp == spec)
        losses, ratios, paths = [], [], []
        for seed in seeds:
            r, path = found[(spec, seed)]
            base = found.get((None, seed))
            losses.append(f"{r['final_val_loss']:.4f}")
            if spec is not None and base:
                ratios.append(f"**{r['final_val_loss'] / base[0]['final_val_loss']:.4f}×**")
            paths.append(path)
        ratio = " / ".join(ratios) if spec is not None else "1"
        commits = sorted({commit_of(p, '?') for p in paths})
        files_ = ", ".join(f"`{p}`" for p in sorted(set(paths)))
        rows.append([about.get(spec, spec), " / ".join(losses), ratio,
                     ", ".join(str(s) for s in seeds), f"④ · {', '.join(commits)} · {files_}"])
    return rows


def byz_mean(files, attack="signflip"):
    rs = [r for f in files for r in runs(f) if r["attack"] == attack]
    return f"{statistics.mean(r['final_val_loss'] / r['honest_only_val_loss'] for r in rs):.4f}×"


def byz_reduce():
    return byz_mean(["docs/bench/byzantine/reduce-8-int8-s42.json",
                     "docs/bench/byzantine/reduce-8-int8-s43-44.json"])


def byz_whole():
    return byz_mean(["docs/bench/byzantine/whole-s42-44.json"])


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def page():
    trust, rep = trust_rows()
    status_bytes = rep[("small", "mean")]["status_bytes"]
    lists_bytes = rep[("small", "mean")].get("status_lists_bytes", 0)
    scale_statuses = " / ".join(
        f"{r['status_bytes_up_per_node_per_round'] / 1e3:.1f}"
        for r in load("docs/bench/scale-reduce.json")["runs"] if r["source"] == "processes")
    parts = [
        "# Benchmarks — what holds today",
        "",
        "One page: for each claim the setting, the baseline, the seeds, the result, the command, "
        "the commit and the data file. Generated by `python3 scripts/benchmarks.py` from the "
        "result files each row names (edit the script, not this page). How each was reached, and "
        "everything tried and not kept, is in [`docs/bench/HISTORY.md`](docs/bench/HISTORY.md) "
        "(sixteen convergence passes and the rest, in order, and the research flags retired from "
        "`nightshift-lab convergence` with the commit that still runs them).",
        "",
        "Machine for every number: the project's 2-core x86_64 box (24 GiB, no GPU, shared and "
        "noisy), release builds, burn 0.21.0 on the burn-flex CPU backend. The benchmarks are "
        "`nightshift-lab` commands (`just lab COMMAND ...`); commits before 090552c spell them "
        "`nightshift bench COMMAND`, with the same flags. No GPU figures yet: no session has been "
        "lent one.",
        "",
        "Shipped defaults (`swarm init`, `demo`): the `small` preset for the demo (the issue-4 "
        "recipe model, d_model 128, 2 layers, seq 64, batch 16, for convergence), H = 25 inner "
        "steps, Muon for the blocks' matrices and AdamW for the rest at 3e-3 behind a 200-step "
        "warm-up, outer Nesterov 0.7 / 0.7, `int4:64` deltas with error feedback, aggregator "
        "`cclip:1:3`.",
        "",
        "## Training: DiLoCo against one worker and synchronous training",
        "",
        table(["claim", "setting", "baseline", "seeds", "result", "command · commit · data"],
              training_rows()),
        "",
        "① `RAYON_NUM_THREADS=1 nightshift-lab convergence --runs diloco --k 4 --h 25 --codec fp32 "
        "--shards whole --aggregator mean --seed S`  ",
        "② `RAYON_NUM_THREADS=1 nightshift-lab convergence --runs drop --drop 0.5 --codec fp32 "
        "--shards whole --aggregator mean --seed S`  ",
        "then `nightshift-lab report FILES` for the ratios. These runs predate `cclip` as the "
        "default aggregator, hence `--aggregator mean`; without an attacker `cclip:1:3` ends "
        "within 0.9999× of the mean (below), and the convergence table has not been re-run with "
        "it. Since 0e55142 `convergence` runs its DiLoCo swarms through the simulator, every "
        "node running the daemon's round machine (the rows *through the simulator*); the rows "
        "before them ran its earlier in-process loop, which applied the same aggregation and "
        "outer step but not the nodes' rules around them.",
        "",
        "## Which node trains on what: shards on a small and a large corpus",
        "",
        "Each round every node reads one shard of the training part per window it trains on "
        "(H × batch = 400 here, at most 1,024), each drawn from its key, the round and the draw; "
        "`swarm init` sizes them so that together they hold eight rounds of a node's text, at "
        "least 4 KiB each (4 KiB here). Against fewer, larger shards a round (16 of 64 KiB, 1 of "
        "1 MiB: measured first), every node sampling the whole training split (not possible once "
        "a dataset is streamed rather than loaded), and each node training on its own contiguous "
        "quarter every round (what the demo did before; it needs to know the swarm's size and "
        "the node's place in it, which an open swarm does not have). DiLoCo K = 4, H = 25, 1,000 steps a node, the "
        "shipped recipe, through the simulator; the ratio is to synchronous training of the same "
        "tokens on the same corpus. One seed each.",
        "",
        table(["corpus", "data", "baseline", "seed", "DiLoCo final loss, ratio to sync",
               "command · commit · data"], shard_rows()),
        "",
        "③ `RAYON_NUM_THREADS=1 nightshift-lab convergence --runs sync,diloco --k 4 --h 25 "
        "--shards rotate|whole|contiguous --data FILE --seed 42` (1 rotating shard: at "
        "e5b8293, before `--shards-per-round`; 16: d0321f6; 400: 7def8cd; two runs at a time on the 2 cores, one thread "
        "each). The corpora are not in the repository: `small` is "
        "`head -c 799998 model/data/shakespeare.txt`; the large ones concatenate the UTF-8 "
        "`*.rs` files under `~/.cargo/registry/src/*/*/src/` (sorted by path, or shuffled with "
        "Python's `random.Random(42)`) until 50 MB.",
        "",
        "## Throughput of the inner loop",
        "",
        "Not saved as result files; the figures as recorded in HISTORY.",
        "",
        table(["claim", "setting", "baseline", "result", "command · commit"], [
            ["≥ 0.5× PyTorch's tokens/s on the CPU",
             "the recipe model, AdamW, batch split over 2 threads",
             "PyTorch 39.5k tokens/s, 2 threads", "**25.9k, 0.66×** (median of 5)",
             "`RAYON_NUM_THREADS=2 nightshift-lab convergence --runs single --steps 200 "
             "--eval-every 200 --threads 2 --inner-optimizer adamw` · see HISTORY, \"inner-loop "
             "throughput, third pass\""],
            ["with Muon (the default)", "the same", "the same",
             "17.3k, 0.44× (Newton–Schulz adds ≈ 40 % multiply-adds)", "thirteenth pass"],
        ]),
        "",
        "## The demo and the wire",
        "",
        "The demo's reports are not kept in the repository; the figures as measured.",
        "",
        table(["claim", "result", "command · commit"], [
            ["`nightshift demo` (bootstrap + 3 nodes, 12 rounds of 25, embedded corpus)",
             "**37.5 s** (median of 2), val loss 4.4333 → **2.0553**, 12 of 12 rounds agreed, "
             "0 forks, peak RSS 304 MB. The daemon on the round machine (60d7422) against the "
             "driver before it (1f0bdf5), release builds, interleaved old/new/old/new on a busier "
             "box: **62.1 s** against 59.5 s (medians of 2; 64.1 / 60.1 against 61.0 / 58.0 s, "
             "1.04×), the same **2.0553**, 12 of 12 agreed, 0 forks, peak RSS 263–283 MiB "
             "against 291–296 MiB. At 930feca (the crates split, the rule fixes of 2026-12-06): "
             "58.6 s, the same 2.0553, 12 of 12 agreed, 0 forks, 295 MiB. At cfd6d6c (the head "
             "without a bias, GPT-2's layout): 61.6 s, 4.4333 → **2.0559** (2.2058 with "
             "`--inner-optimizer adamw`, 2.0562 with `--aggregator mean`), 12 of 12 agreed, "
             "0 forks, 286 MB. At 7def8cd (each node draws its shards every round instead of "
             "training on its own quarter): 58.3 s, 4.4333 → **2.0401**, 12 of 12 agreed, 0 forks",
             "`nightshift demo --dir D --report D/report.json` · 5d9a6a3; before/after: "
             "`docs/bench/demo-driver.txt`"],
            ["`nightshift export` loads in `transformers` with the same loss",
             "`GPT2LMHeadModel.from_pretrained` on the demo's round-12 export: loss "
             f"{EXPORT['hf_loss']:.6f} against nightshift's {EXPORT['nightshift_loss']:.6f} on the "
             f"same {EXPORT['windows']} validation windows (relative difference "
             f"{EXPORT['relative_difference']:.1e}); `PreTrainedTokenizerFast` encodes their text into "
             f"nightshift's ids ({EXPORT['tokenizer_mismatches']} mismatches); transformers "
             f"{EXPORT['transformers']}, torch {EXPORT['torch']}",
             "`python3 scripts/check_export.py` · cfd6d6c · `docs/bench/export/check.json`"],
            ["a contribution on the wire", "208.3 KiB at `int4:64` against 1.63 MiB as fp32 (8.0×)",
             "the demo's report"],
            ["signed statuses",
             f"**{status_bytes} B** whatever the swarm's size (counts and roots); the lists behind "
             f"one, sent only on request, {lists_bytes} B for 8 contributors; statuses sent a node "
             f"a round at 4 / 8 / 16 processes: **{scale_statuses} KB**",
             f"`nightshift-lab replay` (`status_bytes`, `status_lists_bytes`) · "
             f"{commit_of('docs/bench/replay.json', '?')} · `docs/bench/replay.json`; "
             "`nightshift-lab scale --averaging reduce` · "
             f"{commit_of('docs/bench/scale-reduce.json', '?')} · `docs/bench/scale-reduce.json`"],
        ]),
        "",
        "## Trust",
        "",
        table(["claim", "setting", "baseline", "seeds", "result", "command · commit · data"], trust),
        "",
        "## Idle windows",
        "",
        table(["claim", "setting", "baseline", "seeds", "result", "command · commit · data"],
              churn_rows()),
        "",
        "These churn figures were measured at the defaults of 2026-12-03 (H = 50, AdamW, `int8` "
        "then `int4`), before Muon, H = 25 and signed statuses; they have not been re-run at "
        "today's defaults.",
        "",
        "## The simulator (`nightshift-lab sim`)",
        "",
        "Every node runs the round machine (`node/daemon/src/machine/`), the rules the daemon runs: real "
        "contributions (`int4:64`, signed, verified), aggregation (`cclip:1:3`) and outer step; a "
        "stand-in model (SGD on a noisy quadratic, 1,024 parameters); links of 20–80 ms one way, "
        "50 Mbit/s up and 200 Mbit/s down per node, no loss; H = 25 steps of 200 ms (±50 %). "
        "Statuses are counted at their real size. Virtual time; wall time and memory on the "
        "2-core box. Re-run after the rule fixes of 2026-12-06; the figures before them "
        "(b2d909d: 188 s wall, 106 node-rounds/s, 932 MiB) are in HISTORY.",
        "",
        table(["claim", "setting", "result", "command · commit · data"], sim_rows()),
        "",
        "The simulator found seven faults in the round's rules, fixed in the machine "
        "(`docs/DESIGN-NOTES.md`, *The round machine and the simulator*): a round waited for "
        "peers on another state of its round; a replay that failed through a lost fetch was not "
        "retried for 30 s, so a small swarm forked for good; a replay refused for another base "
        "blamed the claim; a restarted node had no base to replay a preferred fork from; a "
        "restarted node fetched a contribution it already held, and forked when the fetch was "
        "lost; a restarted node knew no speeds and waited a whole round out instead of joining "
        "it late; a peer that died during a round was not expected, so the short round was not "
        "shrunk.",
        "",
        "## Scale: what a round costs each node as the swarm grows (`nightshift-lab scale`)",
        "",
        "The yardstick of issue 26 (gossip whose cost per node stays flat). Real `nightshift` "
        "processes on the 2-core box (`tiny`, one thread each, a private swarm with a bootstrap, "
        "every node connected to every other) and simulated swarms (the simulator's defaults: "
        "32 links per node, the stand-in model as wide as `tiny`, 15,092 parameters); medians "
        "over nodes and rounds (a process swarm's first round left out). Today every node pushes "
        "its contribution to every peer and every status lists the round's contributions: the "
        "cost is not flat.",
        "",
        table(["nodes", "source", "bytes up per node per round", "bytes down", "of the upload: "
               "statuses", "round", "states at the end"], scale_rows()),
        "",
        scale_note(),
        "",
        "With reducers (`swarm init --averaging reduce`: each round's contributors average one "
        "slice of every contribution each, a second checks it, every node gathers the co-signed "
        "slices; DESIGN-NOTES, *Averaging flat in N*). Processes as above; the simulator fully "
        "connected (every contributor's header reaches every node) with a wider stand-in model.",
        "",
        table(["nodes", "source", "model", "bytes up per node per round", "bytes down",
               "of the upload: statuses", "the rest", "round", "states at the end"],
              scale_reduce_rows()),
        "",
        scale_reduce_note(),
        "",
        "## Averaging slice by slice: what the reducers' step costs in accuracy",
        "",
        "Issue 26's flat averaging is a reduce-scatter (DESIGN-NOTES, *Averaging flat in N*): "
        "reducer j averages slice j of every contribution with the swarm's aggregator and sends "
        "the mean back re-encoded. Its step, set on the machines of a simulated swarm "
        "(`convergence --runs reduce`), against every node averaging whole contributions. With "
        "the mean aggregator and fp32 means the two are the same bit for bit (unit test); with "
        "the shipped centered clipping each slice is clipped by its own radius. DiLoCo K = 4, "
        "H = 25, 1,000 steps a node, the shipped recipe and corpus, through the simulator; "
        "figures per seed, each ratio against the all-to-all run of its seed.",
        "",
        table(["averaging", "final loss", "ratio to all-to-all", "seed", "command · commit · data"],
              reduce_rows()),
        "",
        "④ `RAYON_NUM_THREADS=1 nightshift-lab convergence --runs diloco,reduce --k 4 --h 25 "
        "--reduce S:CODEC,... --seed S` (two invocations at a time on the 2 cores, one thread "
        "each; seed 43: the all-to-all run and the int4 one, at 831359c). The bytes each node moves per round with int8 means, every message encoded as "
        "it travels (unit test `a_nodes_bytes_per_round_stay_flat_as_the_swarm_grows`, 200,000 "
        "values): 356 KB up and down at N = 4, 392 / 376 KB at N = 16 (1.10× / 1.06×); "
        "all-to-all: 329 KB at 4, 1.65 MB at 16. Attacks against slice-by-slice clipping "
        "(`nightshift-lab byzantine --seeds 42,43,44 --malicious 2 --aggregators cclip:1:3 "
        "--reduce 8:int8:64`, the Trust row's setting, a59778a, "
        "`docs/bench/byzantine/reduce-8-int8-s*.json` against `whole-s42-44.json`): the worst, "
        f"signflip, at **{byz_reduce()}** of the honest workers' loss, against {byz_whole()} "
        "clipping whole deltas in the same run. The swarm's round runs this step when its manifest "
        "says `averaging = reduce` (the Scale section).",
        "",
        "## Links: how fast a swarm trains as its links get slower (`nightshift-lab links`, V2)",
        "",
        "Real `nightshift` processes, each in its own network namespace; every namespace's only "
        "link is an emulated WAN link (a user-space carrier between TUN devices: rate, one-way "
        "delay, loss on the uplink, a half-second drop-tail buffer; this kernel has no `netem`). "
        "`utilization` is the share of a node's wall time spent in inner steps (median node). "
        "Overlap (`nightshift run --overlap`): a node trains the next round while the last "
        "round's contributions travel; off by default, since it costs accuracy (below).",
        "",
        table(["link", "RTT", "loss", "nodes", "overlap", "utilization", "time to target",
               "bytes up per node per round", "round", "final loss"], links_rows()),
        "",
        links_note(),
        "",
        "Overlap's accuracy cost at equal tokens: `RAYON_NUM_THREADS=1 nightshift-lab convergence "
        "--runs diloco --k 4 --h 25 --shards whole --overlap false,true --seed S` (the shipped "
        "recipe, 1,000 steps a node, through the simulator). More than the 1 % that would make it "
        "the default; the other starting points tried are in HISTORY.",
        "",
        table(["seed", "final loss without overlap", "with overlap", "cost", "commit", "file"],
              overlap_rows()),
        "",
        "## NAT traversal (`tests/tests/nat.rs`)",
        "",
        "Two home nodes, each behind its own NAT (a network namespace whose router masquerades "
        "and drops unsolicited packets), and a bootstrap node on a public address. "
        "Port-preserving NATs: the nodes meet through the bootstrap's relay, punch a hole "
        "(DCUtR over TCP) and train directly, 12 rounds. Symmetric NATs (a random port per "
        "connection): the hole punch cannot work and the nodes train 6 rounds through the "
        "relay (a `--private` swarm). Bytes: all that crossed the public host's link in the run "
        "(bootstrap traffic, relayed circuits, the bootstrap's replays).",
        "",
        table(["NATs", "runs", "test passed", "hole punched", "public host's bytes (median)",
               "command · commit · data"], nat_rows()),
        "",
        "## Not measured yet",
        "",
        "Anything on a GPU; a swarm over real internet links (issue 26).",
        "",
    ]
    return "\n".join(parts)


def main():
    text = page()
    out = ROOT / "BENCHMARKS.md"
    if "--check" in sys.argv[1:]:
        if out.read_text() != text:
            print("BENCHMARKS.md is not what scripts/benchmarks.py writes; run it", file=sys.stderr)
            sys.exit(1)
        return
    out.write_text(text)


if __name__ == "__main__":
    main()
