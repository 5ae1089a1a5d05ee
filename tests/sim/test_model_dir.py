"""The simulated model's tokenizer (pdctl.sim.model_dir, `pdctl tokenizer --out`): shipped in the package, it
knows ordinary English, counts every text as the simulator does, and loads with transformers offline."""

from __future__ import annotations

import random
import time
from pathlib import Path

import httpx
import pytest
from tokenizers import Tokenizer
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.sim import model_dir
from pdctl.sim.tokenizer import UNK, VOCAB_SIZE, decode, encode, generate, render_chat

PARAGRAPH = (
    "It was a bright cold day in April, and the clocks were striking thirteen. Winston Smith, his chin nuzzled "
    "into his breast in an effort to escape the vile wind, slipped quickly through the glass doors of Victory "
    "Mansions, though not quickly enough to prevent a swirl of gritty dust from entering along with him. The "
    "hallway smelt of boiled cabbage and old rag mats; at one end of it a coloured poster, too large for indoor "
    "display, had been tacked to the wall. It depicted simply an enormous face, more than a metre wide: the face "
    "of a man of about forty-five, with a heavy black moustache and ruggedly handsome features. We don't know "
    "why, but they'd said it's 1984 (or so) -- and 7 people agreed!"
)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tok")
    result = CliRunner().invoke(app, ["tokenizer", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"wrote {out}: tokenizer.json, tokenizer_config.json, config.json")
    return out


def test_a_paragraph_of_english_has_no_unknown_token(written: Path) -> None:
    tok = Tokenizer.from_file(str(written / "tokenizer.json"))
    enc = tok.encode(PARAGRAPH, add_special_tokens=False)
    assert "<unk>" not in enc.tokens, [w for w, t in zip(PARAGRAPH.split(), enc.tokens, strict=True) if t == "<unk>"]
    # One token a word, as the simulator counts, and the same ids the simulator gives them.
    assert enc.ids == encode(PARAGRAPH) and len(enc.ids) == len(PARAGRAPH.split())
    assert UNK not in encode(PARAGRAPH)


def test_it_loads_with_transformers_and_counts_chats_as_the_simulator(written: Path) -> None:
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(written), local_files_only=True)
    messages = [{"role": "user", "content": PARAGRAPH}, {"role": "assistant", "content": "Fine, thanks."},
                {"role": "user", "content": "qzxvkj and w5"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok.encode(text, add_special_tokens=False)
    sim = render_chat(messages)
    assert len(ids) == len(sim)  # what a client counts is what the simulator computes
    assert [i for i, s in zip(ids, sim, strict=True) if i != s] == [UNK]  # the one unknown word ("qzxvkj")
    assert (tok.eos_token_id, tok.pad_token_id, tok.unk_token_id, len(tok)) == (151645, 151643, UNK, VOCAB_SIZE)


def test_generated_text_is_known_words_that_encode_back(written: Path) -> None:
    tok = Tokenizer.from_file(str(written / "tokenizer.json"))
    out = generate(list(range(64)), 500)
    text = decode(out)
    assert tok.encode(text, add_special_tokens=False).ids == out == encode(text)
    rng = random.Random(1)
    ids = [rng.randrange(VOCAB_SIZE) for _ in range(2000)]
    assert tok.encode(tok.decode(ids, skip_special_tokens=False), add_special_tokens=False).ids == ids


def test_unknown_text_is_one_unk_per_word_and_counts_the_same() -> None:
    text = "qzxvkj, blorptastic! frumious"
    assert len(encode(text)) == 3  # the simulator: a CRC id per word
    vocab = model_dir.vocabulary()
    assert len(vocab) == VOCAB_SIZE and sorted(vocab.values()) == list(range(VOCAB_SIZE))


def test_out_must_be_a_directory(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    result = CliRunner().invoke(app, ["tokenizer", "--out", str(tmp_path / "f")])
    assert result.exit_code == 2 and "is a file" in result.output


def test_the_simulator_warns_of_prompts_of_unknown_tokens(tmp_path: Path) -> None:
    """A client whose tokenizer did not know its text sends `<unk> <unk> ...`: the simulator says so, loudly."""
    from tests.support.sim_procs import sim_process

    with sim_process(tmp_path, "decode", connector=False) as sim:
        ok = httpx.post(f"{sim.url}/v1/completions", timeout=10,
                        json={"model": "Qwen", "prompt": "An ordinary English sentence.", "max_tokens": 2})
        assert ok.status_code == 200 and "mostly `<unk>`" not in sim.log_text()
        unk = httpx.post(f"{sim.url}/v1/completions", timeout=10,
                         json={"model": "Qwen", "prompt": "<unk> <unk> <unk> word", "max_tokens": 2})
        assert unk.status_code == 200
        deadline = time.monotonic() + 10
        while "mostly `<unk>`" not in sim.log_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "1 prompt(s) mostly `<unk>` (this one 75% of 4 tokens)" in sim.log_text()
        assert "pdctl tokenizer --out DIR" in sim.log_text()
