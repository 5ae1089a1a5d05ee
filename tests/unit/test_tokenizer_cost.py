from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

SCRIPT = Path(__file__).parents[2] / "scripts" / "tokenizer_cost.py"
VOCAB_SIZE = 151936
SPECIALS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("qwen3-8b-bpe")
    subprocess.run([sys.executable, str(SCRIPT), "--model-dir", str(out), "--no-time", "--files", "40"], check=True,
                   capture_output=True)
    return out


def test_every_model_id_is_one_distinct_token(model_dir: Path) -> None:
    vocab = Tokenizer.from_file(str(model_dir / "tokenizer.json")).get_vocab(with_added_tokens=True)

    assert sorted(vocab.values()) == list(range(VOCAB_SIZE))
    assert {t: vocab[t] for t in SPECIALS} == SPECIALS


def test_chat_markers_are_single_special_ids_and_text_is_byte_level_bpe(model_dir: Path) -> None:
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))

    enc = tok.encode("<|im_start|>user\ndef f(x):\n    return x<|im_end|>\n")

    assert enc.ids[0] == SPECIALS["<|im_start|>"] and SPECIALS["<|im_end|>"] in enc.ids
    assert "Ġreturn" in enc.tokens  # a merge learnt from the training text
    assert tok.decode(enc.ids) == "user\ndef f(x):\n    return x\n"


def test_model_dir_is_the_qwen3_8b_shape_with_a_chatml_template(model_dir: Path) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    tok_config = json.loads((model_dir / "tokenizer_config.json").read_text())

    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (36, 4096, VOCAB_SIZE)
    assert "<|im_start|>" in tok_config["chat_template"] and tok_config["eos_token"] == "<|im_end|>"
