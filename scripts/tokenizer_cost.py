#!/usr/bin/env python3
"""What tokenizing a long prompt costs on this CPU: the basis of the simulator's tokenizer model (sim/timing.py).

No model tokenizer is reachable offline, so this trains a 50k-vocab byte-level BPE (HF `tokenizers`, the Rust
library vLLM's fast tokenizers are) on this machine's Python sources, then times encoding 2k-24k tokens of them
and the stdlib-JSON answer with the ids, median of 15.

With --model-dir it also writes a model directory for `vllm serve DIR --load-format dummy` (the Qwen3 shape of
scripts/make_dummy_model.py) whose tokenizer is that BPE with a ChatML template, so a real vLLM's `/tokenize` and
chat rendering cost what a real BPE costs (the dummy model's word-level tokenizer is far cheaper). Its vocabulary
is padded to the model's 151936 ids (`<|pad_N|>` tokens no merge produces, Qwen3's special ids 151643-151645 as
added tokens), so the random ids a dummy model generates stay inside the vocabulary.

    .venv/bin/python scripts/tokenizer_cost.py
    .venv/bin/python scripts/tokenizer_cost.py --model-dir /tmp/qwen3-8b-bpe --arch qwen3-8b --no-time
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.make_dummy_model import ARCHS, GENERATION_CONFIG, SPECIAL_IDS, VOCAB_SIZE, tokenizer_config

BPE_VOCAB = 50000


def corpus(limit: int = 3000) -> list[str]:
    text = []
    stdlib = os.path.dirname(os.path.dirname(json.__file__))
    for path in sorted(glob.glob(f"{stdlib}/**/*.py", recursive=True))[:limit]:
        try:
            with open(path, encoding="utf-8") as f:
                text.append(f.read())
        except (OSError, UnicodeDecodeError):
            continue
    return text


def train(text: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text, trainer)
    return tok


def padded(tok: Tokenizer) -> dict[str, Any]:
    """The tokenizer's JSON with every id below VOCAB_SIZE taken: pads in the BPE vocab, Qwen3's specials added."""
    data: dict[str, Any] = json.loads(tok.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    vocab.update(SPECIAL_IDS)  # in the model's vocab too, or loading gives them ids after its last one
    taken = set(vocab.values())
    for i in range(VOCAB_SIZE):
        if i not in taken:
            vocab[f"<|pad_{i}|>"] = i
    data["added_tokens"] = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": True} for t, i in SPECIAL_IDS.items()
    ]
    return data


def write_model(out: Path, arch: str, tok: Tokenizer) -> None:
    out.mkdir(parents=True, exist_ok=True)
    files = {"config.json": ARCHS[arch], "generation_config.json": GENERATION_CONFIG,
             "tokenizer_config.json": tokenizer_config(), "tokenizer.json": padded(tok)}
    for name, data in files.items():
        (out / name).write_text(json.dumps(data, ensure_ascii=False) + "\n", encoding="utf-8")


def time_encoding(tok: Tokenizer, text: list[str]) -> None:
    doc = "\n".join(sorted(text, key=len)[-60:])  # long modules: 24k tokens of one kind of text
    print("| tokens | chars | encode ms | us/token | ids JSON ms |")
    print("|---|---|---|---|---|")
    for n in (2000, 8000, 16000, 24000):
        s = tok.decode(tok.encode(doc).ids[:n])
        enc, js = [], []
        for _ in range(15):
            t = time.perf_counter()
            ids = tok.encode(s).ids
            enc.append(time.perf_counter() - t)
            t = time.perf_counter()
            json.dumps({"count": len(ids), "tokens": ids, "token_strs": None})
            js.append(time.perf_counter() - t)
        e, j = statistics.median(enc) * 1000, statistics.median(js) * 1000
        print(f"| {n} | {len(s)} | {e:.2f} | {e * 1000 / n:.2f} | {j:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, help="also write a dummy-weights model directory with this tokenizer")
    ap.add_argument("--arch", choices=sorted(ARCHS), default="qwen3-8b")
    ap.add_argument("--no-time", action="store_true", help="skip the timing table")
    ap.add_argument("--files", type=int, default=3000, help="standard-library modules to train on")
    args = ap.parse_args()
    text = corpus(args.files)
    tok = train(text)
    if args.model_dir:
        write_model(args.model_dir, args.arch, tok)
        print(f"wrote {args.model_dir} ({args.arch}, byte-level BPE {BPE_VOCAB} + pads to {VOCAB_SIZE}, ChatML)")
    if not args.no_time:
        time_encoding(tok, text)


if __name__ == "__main__":
    main()
