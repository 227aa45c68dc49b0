#!/usr/bin/env python3
"""Figures of a `just gpu-check` run: tokens/s per node and model FLOPs utilisation (MFU).

Reads a demo directory (`nightshift demo --dir D`): each node's events and the manifest. Model
FLOPs per token are 6 × parameters + 12 × layers × width × context (forward and backward, the
attention scores included); MFU divides the achieved FLOPs/s by the GPU's dense peak, looked up
by the name nvidia-smi reports (FP32 and TF32 tensor-core peaks; burn-cuda trains in f32).
Writes the figures, the configuration, the commit and the device as JSON (--out).
"""

import argparse
import json
import pathlib
import statistics
import subprocess

# Dense peaks in TFLOP/s (vendor datasheets, SXM parts where there are two): FP32, TF32 tensor.
PEAKS = {
    "H200": (67.0, 494.7),
    "H100": (67.0, 494.7),
    "A100": (19.5, 156.0),
    "L40S": (91.6, 183.0),
    "A10": (31.2, 62.5),
    "L4": (30.3, 60.0),
    "RTX 4090": (82.6, 82.6),
}


def gpu():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True, check=True)
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--features", default="cuda")
    ap.add_argument("--preset", default="medium")
    ap.add_argument("--out", default="gpu-check.json")
    a = ap.parse_args()
    d = pathlib.Path(a.dir)
    manifest = json.loads((d / "manifest.json").read_text())
    m = manifest.get("manifest", manifest)["model"]
    nodes = []
    for ev in sorted(d.glob("node*.events.jsonl")):
        events = [json.loads(l) for l in ev.read_text().splitlines() if l.strip()]
        params = next(e["num_params"] for e in events if e["event"] == "started")
        rounds = [e for e in events if e["event"] == "round_completed"][1:]  # first: warm-up
        if not rounds:
            continue
        tps = statistics.median(r["tokens_per_sec"] for r in rounds)
        nodes.append({"node": ev.name.split(".")[0], "tokens_per_sec": tps, "rounds": len(rounds)})
    flops_per_token = 6 * params + 12 * m["n_layers"] * m["d_model"] * m["seq_len"]
    name = gpu()
    peak = next((p for k, p in PEAKS.items() if name and k in name), None)
    for n in nodes:
        n["model_tflops"] = n["tokens_per_sec"] * flops_per_token / 1e12
        if peak:
            n["mfu_fp32"] = n["model_tflops"] / peak[0]
            n["mfu_tf32"] = n["model_tflops"] / peak[1]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    result = {
        "command": f"just gpu-check (features {a.features or 'none'}, preset {a.preset})",
        "commit": commit,
        "device": name or "no NVIDIA GPU (CPU run)",
        "peak_tflops_fp32_tf32": peak,
        "parameters": params,
        "model": m,
        "flops_per_token": flops_per_token,
        "seed": 42,
        "nodes": nodes,
    }
    pathlib.Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    for n in nodes:
        mfu = (f", MFU {100 * n['mfu_fp32']:.1f} % of FP32 peak / {100 * n['mfu_tf32']:.1f} % of "
               "TF32" if "mfu_fp32" in n else "")
        print(f"{n['node']}: {n['tokens_per_sec']:.0f} tokens/s, "
              f"{n['model_tflops']:.2f} model TFLOP/s{mfu}")
    print(f"device: {result['device']}; written to {a.out}")


if __name__ == "__main__":
    main()
