"""The topologies shipped inside the package (`pdctl/configs/*.yaml`; `configs/` in a checkout links here), so an
installed wheel can start from one: `pdctl init` lists and writes them, `pdctl demo` runs `local-sim`.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from pdctl.errors import UsageError

# Shipped topologies (by topology name) written for pdctl's own GPU host (docs/gpu-run.md): the fields a user must
# set for theirs, with the values they carry there. `validate` names the ones still at that value.
OWN_HOST: dict[str, dict[str, str]] = {
    "h200-1gpu": {"model.local_dir": "/root/models/qwen3-8b-dummy", "python.venv": "/opt/torch/.venv",
                  "python.wheelhouse": ".gpu/wh/wheels"},
    "h200x2": {"model.local_dir": "/root/models/qwen3-32b-dummy", "python.venv": "/opt/torch/.venv",
               "python.wheelhouse": ".gpu/wh/wheels"},
}


def own_host_fields(name: str, topology: object) -> list[str]:
    """The fields of `topology` (named `name`) that still carry pdctl's own GPU host's values."""
    fields = []
    for path, value in OWN_HOST.get(name, {}).items():
        obj: object = topology
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if obj is not None and str(obj) == value:
            fields.append(path)
    return fields


@dataclass(frozen=True)
class Example:
    name: str
    summary: str
    text: str


def examples() -> list[Example]:
    """Every shipped topology, by name, with the first phrase of its header comment as the summary."""
    found = []
    for item in resources.files("pdctl").joinpath("configs").iterdir():
        if item.name.endswith(".yaml"):
            text = item.read_text(encoding="utf-8")
            found.append(Example(item.name.removesuffix(".yaml"), _summary(text), text))
    return sorted(found, key=lambda e: e.name)


def example(name: str) -> Example:
    known = {e.name: e for e in examples()}
    if name in known:
        return known[name]
    close = difflib.get_close_matches(name, list(known), n=1)
    guess = f" (did you mean {close[0]!r}?)" if close else ""
    raise UsageError(
        f"unknown example {name!r}{guess}",
        hint=f"the examples are {', '.join(sorted(known))}; `pdctl init` lists them",
    )


def write_example(name: str, dest: Path, force: bool = False) -> Example:
    """Write example NAME to DEST; an existing file is kept unless `force`."""
    chosen = example(name)
    if dest.exists() and not force:
        raise UsageError(f"{dest} already exists", hint="pass --force to overwrite it, or -o FILE to write elsewhere")
    if dest.is_dir():
        raise UsageError(f"{dest} is a directory", hint="pass -o FILE with a file name")
    try:
        dest.write_text(chosen.text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {dest}: {exc.strerror}", hint="pass -o FILE in a writable place") from None
    return chosen


def _summary(text: str) -> str:
    first = next((line for line in text.splitlines() if line.startswith("#")), "#")
    phrase = re.split(r" \(|\. |;", first.lstrip("# ").strip(), maxsplit=1)[0]
    return phrase.rstrip(".,:")
