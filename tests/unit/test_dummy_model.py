from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

SCRIPT = Path(__file__).parents[2] / "scripts" / "make_dummy_model.py"
VOCAB_SIZE = 151936
SPECIAL_IDS = {151643, 151644, 151645, 151646}  # <unk> is a special token too (skipped when decoding skips them)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("qwen3-32b-dummy")
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def _json(path: Path) -> dict[str, object]:
    data = json.loads(path.read_text())
    assert isinstance(data, dict)
    return data


def test_config_has_the_qwen3_32b_architecture(model_dir: Path) -> None:
    config = _json(model_dir / "config.json")

    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert {k: config[k] for k in ["model_type", "torch_dtype", "tie_word_embeddings"]} == {
        "model_type": "qwen3",
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }
    assert {
        k: config[k]
        for k in [
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "vocab_size",
            "max_position_embeddings",
        ]
    } == {
        "hidden_size": 5120,
        "intermediate_size": 25600,
        "num_hidden_layers": 64,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": 40960,
    }
    assert config["rope_theta"] == 1000000
    assert config["rms_norm_eps"] == 1e-6
    assert _json(model_dir / "generation_config.json")["eos_token_id"] == [151645, 151643]


def test_qwen3_8b_shape_fits_twice_on_one_h200(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(SCRIPT), "--arch", "qwen3-8b", "--out", str(tmp_path)], check=True,
                   capture_output=True)
    config = _json(tmp_path / "config.json")
    shape = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "head_dim", "vocab_size"]
    assert {k: config[k] for k in shape} == {
        "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": VOCAB_SIZE,
    }
    assert (tmp_path / "tokenizer.json").exists()


def test_every_id_is_a_token(tokenizer: Tokenizer) -> None:
    assert tokenizer.get_vocab_size() == VOCAB_SIZE
    assert sorted(tokenizer.get_vocab().values()) == list(range(VOCAB_SIZE))
    assert [tokenizer.id_to_token(i) for i in [0, 151643, 151644, 151645, 151646, VOCAB_SIZE - 1]] == [
        "w0",
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<unk>",
        f"w{VOCAB_SIZE - 1}",
    ]


def test_random_ids_round_trip(tokenizer: Tokenizer) -> None:
    rng = random.Random(0)
    ids = [rng.randrange(VOCAB_SIZE) for _ in range(5000)] + sorted(SPECIAL_IDS)
    rng.shuffle(ids)

    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert tokenizer.encode(text, add_special_tokens=False).ids == ids

    plain = [i for i in ids if i not in SPECIAL_IDS]
    text = tokenizer.decode(plain)
    assert tokenizer.encode(text, add_special_tokens=False).ids == plain


def test_english_words_are_known_and_unknown_words_map_to_unk(tokenizer: Tokenizer) -> None:
    # The tokenizer is the simulator's (pdctl.sim.model_dir): English words are in its vocabulary, one token each.
    hello, world = tokenizer.encode("Hello, world!", add_special_tokens=False).ids
    assert 1000 <= hello < 151643 and 1000 <= world < 151643 and tokenizer.id_to_token(hello) == "hello"
    assert tokenizer.encode("qzxvkj w7\n w8", add_special_tokens=False).ids == [151646, 7, 8]


def test_chat_template_renders_histories_as_prefixes(model_dir: Path) -> None:
    import transformers  # in the dev extra; slow to import, so only here

    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    turn1 = [{"role": "user", "content": "w1 w2 hello"}, {"role": "assistant", "content": "w3 w4"}]
    turn2 = [*turn1, {"role": "user", "content": "w5"}, {"role": "assistant", "content": "w6 w7"}]

    short = tok.apply_chat_template(turn1, tokenize=False)
    long = tok.apply_chat_template(turn2, tokenize=False)
    prompt = tok.apply_chat_template(turn1[:1], tokenize=False, add_generation_prompt=True)

    assert long.startswith(short)
    assert short.startswith(prompt)
    assert (tok.eos_token_id, tok.pad_token_id, len(tok)) == (151645, 151643, VOCAB_SIZE)
    short_ids = tok.encode(short, add_special_tokens=False)
    assert tok.encode(long, add_special_tokens=False)[: len(short_ids)] == short_ids
