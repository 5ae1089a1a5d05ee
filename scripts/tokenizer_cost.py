#!/usr/bin/env python3
"""What tokenizing a long prompt costs on this CPU: the basis of the simulator's tokenizer model (sim/timing.py).

No model tokenizer is reachable offline, so this trains a 50k-vocab byte-level BPE (HF `tokenizers`, the Rust
library vLLM's fast tokenizers are) on this machine's Python sources, then times encoding 2k-24k tokens of them
and the stdlib-JSON answer with the ids, median of 15.

    .venv/bin/python scripts/tokenizer_cost.py
"""

from __future__ import annotations

import glob
import json
import os
import statistics
import time

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers


def main() -> None:
    text = []
    stdlib = os.path.dirname(os.path.dirname(json.__file__))
    for path in sorted(glob.glob(f"{stdlib}/**/*.py", recursive=True))[:3000]:
        try:
            with open(path, encoding="utf-8") as f:
                text.append(f.read())
        except (OSError, UnicodeDecodeError):
            continue
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=50000, show_progress=False))
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


if __name__ == "__main__":
    main()
