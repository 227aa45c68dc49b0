#!/usr/bin/env python3
"""Checks `nightshift export` against Hugging Face `transformers`.

Trains a short local swarm (`nightshift demo`), exports node 0's model, then, in a virtual
environment with `torch` and `transformers` installed from PyPI, checks that

- `transformers.GPT2LMHeadModel.from_pretrained(EXPORT)` loads it,
- its mean cross-entropy on the validation windows recorded in `nightshift.json` is within 1 % of
  the loss nightshift computed on the same token ids,
- `PreTrainedTokenizerFast(tokenizer_file=EXPORT/tokenizer.json)` encodes the text of those
  windows into exactly nightshift's token ids, and decodes them back to the same text.

Usage:
    python3 scripts/check_export.py                  # demo, export, check (a few minutes)
    python3 scripts/check_export.py --export DIR     # check an existing export
    python3 scripts/check_export.py --data-dir DIR   # export a stopped node's model, check it

Prints one JSON object with the figures; exits 1 when a check fails. CI does not run it (torch is
a large download); run it after changing the model or the export.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, "target", "export-check-venv")
TOLERANCE = 0.01

CHECK = r"""
import json, sys, torch, transformers
from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast
export = sys.argv[1]
about = json.load(open(f"{export}/nightshift.json"))
check = about["check"]
model = GPT2LMHeadModel.from_pretrained(export).eval()
inputs = torch.tensor(check["inputs"])
targets = torch.tensor(check["targets"])
with torch.no_grad():
    logits = model(input_ids=inputs).logits
loss = torch.nn.functional.cross_entropy(
    logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).item()
tok = PreTrainedTokenizerFast(tokenizer_file=f"{export}/tokenizer.json")
vocab = about["vocab"]
mismatched = skipped = 0
for row in check["inputs"]:
    try:
        text = bytes(vocab[i] for i in row).decode("utf-8")
    except UnicodeDecodeError:  # a window that starts or ends inside a character
        skipped += 1
        continue
    ids = tok.encode(text)
    back = tok.decode(ids)
    if ids != row or back != text:
        mismatched += 1
print(json.dumps({
    "transformers": transformers.__version__,
    "torch": torch.__version__,
    "hf_loss": loss,
    "windows": len(check["inputs"]),
    "tokenizer_mismatches": mismatched,
    "tokenizer_windows_skipped": skipped,
}))
"""


def run(cmd, **kw):
    print("+ " + " ".join(cmd), file=sys.stderr)
    return subprocess.run(cmd, check=True, **kw)


def venv_python():
    py = os.path.join(VENV, "bin", "python")
    if not os.path.exists(py):
        run([sys.executable, "-m", "venv", VENV])
    probe = subprocess.run([py, "-c", "import torch, transformers"], capture_output=True)
    if probe.returncode != 0:
        run([py, "-m", "pip", "install", "--quiet", "torch", "transformers"])
    return py


def nightshift_bin():
    path = os.path.join(ROOT, "target", "release", "nightshift")
    run(["cargo", "build", "--release", "-q", "-p", "nightshift-node"], cwd=ROOT)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--export", help="an existing export to check")
    ap.add_argument("--data-dir", help="a stopped node's data directory to export and check")
    ap.add_argument("--preset", default="small", help="the demo's model preset")
    ap.add_argument("--rounds", type=int, default=4, help="the demo's rounds")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="nightshift-export-check-")
    export = args.export
    if export is None:
        bin_ = nightshift_bin()
        data_dir = args.data_dir
        if data_dir is None:
            demo = os.path.join(work, "demo")
            run([bin_, "demo", "--dir", demo, "--nodes", "2", "--rounds", str(args.rounds),
                 "--preset", args.preset], stdout=subprocess.DEVNULL)
            data_dir = os.path.join(demo, "node0")
        export = os.path.join(work, "export")
        run([bin_, "export", "--data-dir", data_dir, "--out", export])
    about = json.load(open(os.path.join(export, "nightshift.json")))
    if not about.get("check"):
        sys.exit("the export has no reference loss (nightshift.json: check is null)")
    py = venv_python()
    out = subprocess.run([py, "-c", CHECK, export], check=True, capture_output=True, text=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    ours = about["check"]["loss"]
    rel = abs(got["hf_loss"] - ours) / ours
    result = {
        "export": export,
        "round": about["round"],
        "state_hash": about["state_hash"],
        "nightshift_loss": ours,
        **got,
        "relative_difference": rel,
        "loss_ok": rel <= TOLERANCE,
        "tokenizer_ok": got["tokenizer_mismatches"] == 0,
    }
    print(json.dumps(result, indent=2))
    if not (result["loss_ok"] and result["tokenizer_ok"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
