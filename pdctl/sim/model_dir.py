"""The simulated model's directory as Hugging Face tools read it: tokenizer.json, tokenizer_config.json, config.json.

`pdctl tokenizer --out DIR` writes it for benchmark clients (AIPerf's and GuideLLM's `--tokenizer DIR`), and
scripts/make_dummy_model.py writes the same tokenizer next to its random-weights Qwen3 for a real vLLM.

The tokenizer counts every text as the simulator does (pdctl.sim.tokenizer): added tokens (the ChatML markers,
`<think>`, `<tool_call>`, `<unk>`) split out first, then a normalizer (lowercase, punctuation attached to a word
dropped; pdctl.sim.vocab) and a split on whitespace: one token a word. Ids from 1000 are the English vocabulary
(data/vocab.txt), the specials keep Qwen3's ids, every other id i is the word `w<i>`: all 151,936 ids are tokens, and
any id sequence decodes to text that encodes back to the same ids. A word outside the vocabulary is `<unk>`, one
token, as the simulator counts it. Written as JSON here, so no `tokenizers` package is needed to write it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pdctl.sim import vocab
from pdctl.sim.tokenizer import SPECIALS, VOCAB_SIZE

UNK_TOKEN = "<unk>"
ENDOFTEXT, IM_END = "<|endoftext|>", "<|im_end|>"
# Qwen3 marks its ChatML and end-of-text tokens special; <think> and <tool_call> are added but not special.
SPECIAL = frozenset({"<|endoftext|>", "<|im_start|>", "<|im_end|>", UNK_TOKEN})

# Qwen/Qwen3-32B config.json, key for key.
CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": SPECIALS[ENDOFTEXT],
    "eos_token_id": SPECIALS[IM_END],
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

# ChatML without Qwen3's thinking block: the generation prompt is the start of the assistant message, so
# every rendered history is a prefix of the rendering of any longer history.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def vocabulary() -> dict[str, int]:
    """Token -> id for every id: the specials, the English words, `w<i>` for the rest."""
    named = {i: t for t, i in SPECIALS.items()}
    out: dict[str, int] = {}
    for i in range(VOCAB_SIZE):
        token = named.get(i) or vocab.word(i) or f"w{i}"
        out[token] = i
    return out


def _added(token: str, token_id: int) -> dict[str, Any]:
    return {"id": token_id, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": token in SPECIAL}


def tokenizer_json() -> dict[str, Any]:
    """tokenizer.json as the `tokenizers` library reads it (its 0.20+ serialization)."""
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_added(t, i) for t, i in sorted(SPECIALS.items(), key=lambda kv: kv[1])],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Replace", "pattern": {"Regex": vocab.ATTACHED}, "content": ""},
            {"type": "Lowercase"},
        ]},
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        # No token starts with "##", so this decoder only joins the words with single spaces.
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
        "model": {"type": "WordLevel", "vocab": vocabulary(), "unk_token": UNK_TOKEN},
    }


def tokenizer_config() -> dict[str, Any]:
    decoder = {str(i): {k: v for k, v in _added(t, i).items() if k != "id"} for t, i in SPECIALS.items()}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": UNK_TOKEN,
        "model_max_length": CONFIG["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_tokenizer(out: Path) -> None:
    """tokenizer.json and tokenizer_config.json into `out` (created if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "tokenizer_config.json", tokenizer_config())
    (out / "tokenizer.json").write_text(json.dumps(tokenizer_json(), ensure_ascii=False) + "\n", encoding="utf-8")


def write(out: Path, config: dict[str, Any] | None = None) -> list[Path]:
    """The tokenizer and config.json (the Qwen3-32B shape unless given): what AutoTokenizer.from_pretrained(out)
    loads offline. Returns the files written."""
    write_tokenizer(out)
    _write_json(out / "config.json", config or CONFIG)
    return [out / name for name in ("tokenizer.json", "tokenizer_config.json", "config.json")]
