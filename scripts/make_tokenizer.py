#!/usr/bin/env python3
"""Trains the small byte-level BPE tokenizer the tests use (tests/data/bpe-512.json) on the
embedded Shakespeare corpus, with Hugging Face's `tokenizers` (pip install tokenizers).

    python3 scripts/make_tokenizer.py [--vocab 512] [--out tests/data/bpe-512.json]
"""
import argparse
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--out", default=str(ROOT / "tests/data/bpe-512.json"))
    ap.add_argument("--corpus", default=str(ROOT / "model/data/shakespeare.txt"))
    a = ap.parse_args()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=a.vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([a.corpus], trainer)
    tok.save(a.out)
    print(f"wrote {a.out}: {tok.get_vocab_size()} tokens")


if __name__ == "__main__":
    main()
