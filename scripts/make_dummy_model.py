"""Write a model directory with the Qwen3-32B (or Qwen3-8B) architecture for `vllm serve DIR --load-format dummy`.

The weights never exist (vLLM fills them at random), so only config.json, generation_config.json and a
tokenizer are written. The tokenizer is the simulator's (pdctl.sim.model_dir, what `pdctl tokenizer --out`
writes): word-level, one token a word, ids from 1000 an English vocabulary (so benchmark clients' prompt text
is known words, not `<unk>`), Qwen3's special ids, `<unk>` 151646, and the word `w<i>` for every other id i; any
id sequence decodes to text that encodes back to the same ids (the special ones only when decoding keeps special
tokens), so a multi-turn conversation can be checked token for token. Needs pdctl importable (this checkout).

    python scripts/make_dummy_model.py --out /tmp/qwen3-32b-dummy
    python scripts/make_dummy_model.py --arch qwen3-8b --out /tmp/qwen3-8b-dummy   # fits twice on one H200
    vllm serve /tmp/qwen3-32b-dummy --load-format dummy
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # pdctl from this checkout where not installed

from pdctl.sim import model_dir
from pdctl.sim.tokenizer import VOCAB_SIZE

ENDOFTEXT, IM_START, IM_END, UNK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"
SPECIAL_IDS = {ENDOFTEXT: 151643, IM_START: 151644, IM_END: 151645}
UNK_ID = 151646

# Qwen/Qwen3-32B config.json, key for key.
CONFIG: dict[str, Any] = model_dir.CONFIG

# Qwen/Qwen3-8B's config.json differs from the 32B's in these keys only.
QWEN3_8B = {
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "max_window_layers": 36,
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
}
ARCHS: dict[str, dict[str, Any]] = {"qwen3-32b": CONFIG, "qwen3-8b": {**CONFIG, **QWEN3_8B}}

GENERATION_CONFIG: dict[str, Any] = {
    "bos_token_id": SPECIAL_IDS[ENDOFTEXT],
    "do_sample": True,
    "eos_token_id": [SPECIAL_IDS[IM_END], SPECIAL_IDS[ENDOFTEXT]],
    "pad_token_id": SPECIAL_IDS[ENDOFTEXT],
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
    "transformers_version": "4.51.0",
}

CHAT_TEMPLATE = model_dir.CHAT_TEMPLATE


def tokenizer_config() -> dict[str, Any]:
    return model_dir.tokenizer_config()


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def write_model(out: Path, arch: str = "qwen3-32b") -> None:
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "config.json", ARCHS[arch])
    _write_json(out / "generation_config.json", GENERATION_CONFIG)
    model_dir.write_tokenizer(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True, help="directory to write (created if missing)")
    parser.add_argument("--arch", choices=sorted(ARCHS), default="qwen3-32b", help="the model shape")
    args = parser.parse_args(argv)
    write_model(args.out, args.arch)
    print(f"wrote {args.out} ({args.arch} architecture, vocab {VOCAB_SIZE}, for --load-format dummy)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
