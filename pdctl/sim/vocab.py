"""The simulated model's English vocabulary (data/vocab.txt, made by scripts/make_vocab.py): token id FIRST + i is
line i, so that ordinary English text is made of known tokens, in the simulator and in the Hugging Face tokenizer
pdctl writes for clients (pdctl.sim.model_dir) alike.

A word is looked up normalized, as that tokenizer's normalizer does: lowercased, with punctuation attached to word
characters dropped ("Don't," -> "dont", "(e.g." -> "eg"); a word of punctuation alone stays as it is. Normalizing
never removes a whole word, so a text is as many tokens as it has words either way.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

FIRST = 1000  # the first English id: the ids the simulator generates (1000-150000) are mostly English words
PATH = Path(__file__).parent / "data" / "vocab.txt"
# The normalizer's pattern (Oniguruma in `tokenizers`, `re` here: the same for \w and \s of ordinary text).
ATTACHED = r"(?<=\w)[^\w\s]+|[^\w\s]+(?=\w)"
_ATTACHED = re.compile(ATTACHED)


def normalize(word: str) -> str:
    return _ATTACHED.sub("", word).lower()


@functools.cache
def words() -> tuple[str, ...]:
    return tuple(PATH.read_text(encoding="utf-8").split("\n")[:-1])


@functools.cache
def ids() -> dict[str, int]:
    return {w: FIRST + i for i, w in enumerate(words())}


def lookup(word: str) -> int | None:
    """The id of a word of the vocabulary (normalized first), else None."""
    return ids().get(normalize(word))


def word(token_id: int) -> str | None:
    """The vocabulary's word for an id, None outside its range."""
    i = token_id - FIRST
    ws = words()
    return ws[i] if 0 <= i < len(ws) else None
