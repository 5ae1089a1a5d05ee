"""Write a model directory with the Qwen3-32B (or Qwen3-8B) architecture for `vllm serve DIR --load-format dummy`.

The weights never exist (vLLM fills them at random), so only config.json, generation_config.json and a
tokenizer are written. The tokenizer is word-level: id i is the word `w<i>`, except Qwen3's special ids
151643-151645 and `<unk>` (151646, any unknown word), so any id sequence decodes to text that encodes back
to the same ids (the special ones only when decoding keeps special tokens), and a multi-turn conversation
can be checked token for token. Needs only the `tokenizers` package.

    python scripts/make_dummy_model.py --out /tmp/qwen3-32b-dummy
    python scripts/make_dummy_model.py --arch qwen3-8b --out /tmp/qwen3-8b-dummy   # fits twice on one H200
    vllm serve /tmp/qwen3-32b-dummy --load-format dummy
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

VOCAB_SIZE = 151936
ENDOFTEXT, IM_START, IM_END, UNK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"
SPECIAL_IDS = {ENDOFTEXT: 151643, IM_START: 151644, IM_END: 151645}
UNK_ID = 151646

# Qwen/Qwen3-32B config.json, key for key.
CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": SPECIAL_IDS[ENDOFTEXT],
    "eos_token_id": SPECIAL_IDS[IM_END],
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "initializer_range": 0.02,
    "intermediate_size": 25600,
    "max_position_embeddings": 40960,
    "max_window_layers": 64,
    "model_type": "qwen3",
    "num_attention_heads": 64,
    "num_hidden_layers": 64,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": VOCAB_SIZE,
}

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

# ChatML without Qwen3's thinking block: the generation prompt is the start of the assistant message, so
# every rendered history is a prefix of the rendering of any longer history.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def vocabulary() -> dict[str, int]:
    named = {token_id: token for token, token_id in SPECIAL_IDS.items()} | {UNK_ID: UNK}
    return {named.get(i, f"w{i}"): i for i in range(VOCAB_SIZE)}


def build_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.WordLevel(vocab=vocabulary(), unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # No token starts with "##", so this decoder only joins the words with single spaces.
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_IDS])
    return tokenizer


def tokenizer_config() -> dict[str, Any]:
    added = {
        str(token_id): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token, token_id in SPECIAL_IDS.items()
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "model_max_length": CONFIG["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def write_model(out: Path, arch: str = "qwen3-32b") -> None:
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "config.json", ARCHS[arch])
    _write_json(out / "generation_config.json", GENERATION_CONFIG)
    _write_json(out / "tokenizer_config.json", tokenizer_config())
    build_tokenizer().save(str(out / "tokenizer.json"))


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
