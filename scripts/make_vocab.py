"""Write pdctl/sim/data/vocab.txt: the simulated model's English vocabulary, one token a line (line i is token id
1000 + i, pdctl.sim.vocab), so that ordinary English text encodes with no unknown words.

Tokens are the words of SCOWL's American English list (Debian's `wamerican`: /usr/share/dict/american-english)
and of AIPerf's prompt corpus (Shakespeare, public domain; its `shakespeare.txt`), normalized as the tokenizer
normalizes text (lowercase; punctuation attached to a word dropped: "Don't," -> "dont"), then the numbers
0-9999, hyphenated numbers, a few abbreviations, and standalone punctuation. Modified from SCOWL as just said;
its notice is pdctl/sim/data/vocab-NOTICE.txt.

    apt-get install wamerican
    python scripts/make_vocab.py --corpus .../aiperf/dataset/generator/assets/shakespeare.txt
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

OUT = Path(__file__).parents[1] / "pdctl" / "sim" / "data" / "vocab.txt"
WORDS = Path("/usr/share/dict/american-english")
_ATTACHED = re.compile(r"(?<=\w)[^\w\s]+|[^\w\s]+(?=\w)")
_WORD = re.compile(r"\w+")
_GENERATED = re.compile(r"w\d{1,6}")  # the `w<i>` words name ids themselves
PUNCTUATION = [".", ",", ";", ":", "!", "?", "-", "--", "---", "...", "\u2026", "\u2014", "\u2013", "'", '"', "`",
               "(", ")", "[", "]", "{", "}",
               "<", ">", "/", "\\", "|", "&", "*", "#", "@", "%", "$", "+", "=", "^", "~", "_",
               "\u201c", "\u201d", "\u2018", "\u2019", "«", "»", "•", "·", "§", "°", "€", "£", "¥", "©", "®", "™"]


TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
ONES = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
# Hyphenated numbers ("forty-five" -> "fortyfive") and abbreviations whose dots the normalizer drops.
EXTRA = [t + o for t in TENS for o in ONES] + ["eg", "ie", "etc", "vs", "am", "pm", "phd", "usa", "uk", "eu"]


def normalize(word: str) -> str:
    return _ATTACHED.sub("", word).lower()


def words(lines: Iterable[str]) -> list[str]:
    out: dict[str, None] = {}
    for line in lines:
        for w in line.split():
            n = normalize(w)
            if _WORD.fullmatch(n) and not _GENERATED.fullmatch(n) and not n.isdigit():
                out[n] = None
    return list(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--corpus", type=Path, action="append", default=[], help="more text whose words to add")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    found = words(WORDS.read_text(encoding="utf-8").splitlines()) + EXTRA
    for corpus in args.corpus:
        found += words(corpus.read_text(encoding="utf-8").splitlines())
    tokens = list(dict.fromkeys([*PUNCTUATION, *(str(i) for i in range(10000)), *sorted(set(found))]))
    args.out.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {len(tokens)} tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
