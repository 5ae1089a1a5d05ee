"""Parsing a topology file into a `Topology`, with every problem located at file:line and key."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from pdctl.errors import Problem, TopologyError
from pdctl.topology.bounded_yaml import MAX_BYTES, decode, read
from pdctl.topology.bounded_yaml import dotted as _dotted
from pdctl.topology.checks import check
from pdctl.topology.model import Topology

Loc = tuple[str | int, ...]


def load_file(path: Path, overrides: list[str]) -> Topology:
    shown = str(path)
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise TopologyError([Problem(shown, None, "", "file not found", "pass an existing file with -t")]) from None
    except OSError as exc:
        raise TopologyError([Problem(shown, None, "", f"cannot read: {exc.strerror}")]) from None
    topo = parse(decode(raw, shown), shown, overrides)
    topo._source = shown
    return topo


def parse(text: str, shown: str, overrides: list[str] | None = None) -> Topology:
    try:
        return _parse(text, shown, overrides)
    except TopologyError as exc:
        if not overrides:
            raise
        raise TopologyError([_blame_caused(p, text, shown, overrides) for p in exc.problems]) from None


def _parse(text: str, shown: str, overrides: list[str] | None) -> Topology:
    data, lines = _read_yaml(text, shown)
    for override in overrides or []:
        _apply_override(data, override)
    try:
        topo = Topology.model_validate(data)
    except ValidationError as exc:
        raise TopologyError([_blame(_problem(err, lines, shown), _err_loc(err), overrides) for err in exc.errors()]
                            ) from None
    problems = [_blame(Problem(shown, _line(lines, loc), _dotted(loc), msg, hint), loc, overrides)
                for loc, msg, hint in check(topo)]
    if problems:
        raise TopologyError(problems)
    return topo


def _found(text: str, shown: str, overrides: list[str]) -> set[tuple[str, str]]:
    """The problems (key, message) of the file with these overrides."""
    try:
        _parse(text, shown, overrides)
    except TopologyError as exc:
        return {(p.key, p.message) for p in exc.problems}
    return set()


def _blame_caused(problem: Problem, text: str, shown: str, overrides: list[str]) -> Problem:
    """A problem located elsewhere that a `--set` caused (`--set nodes[0].name=x` orphans every `node: local`) is
    the command line's too: the file alone does not have it. Blamed on the overrides without which it goes."""
    seen = (problem.key, problem.message)
    if problem.path.startswith("--set ") or seen in _found(text, shown, []):
        return problem
    culprits = [o for o in overrides if seen not in _found(text, shown, [x for x in overrides if x != o])]
    shown_sets = " ".join(_source(o) for o in culprits or overrides)
    return Problem(shown_sets, None, problem.key, problem.message, problem.hint)


def _err_loc(err: Any) -> Loc:
    return tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))


def _blame(problem: Problem, loc: Loc, overrides: list[str] | None) -> Problem:
    """A problem in a value `--set` gave is the command line's, not a line of the file."""
    for override in reversed(overrides or []):
        key = override.partition("=")[0]
        parts = [p for piece in key.replace("]", "").split(".") for p in piece.split("[")]
        if len(parts) <= len(loc) and all(p == "*" or p == str(x) for p, x in zip(parts, loc, strict=False)):
            return Problem(_source(override), None, problem.key, problem.message, problem.hint)
    return problem


def _source(override: str, width: int = 60) -> str:
    """Where a problem of an override is: `--set KEY=VALUE`, a long value cut."""
    return f"--set {override if len(override) <= width else override[:width] + '...'}"


def _read_yaml(text: str, shown: str) -> tuple[dict[str, Any], dict[Loc, int]]:
    data, lines = read(text, shown)
    if data is None:
        raise TopologyError(
            [Problem(shown, None, "", "the file is empty", "start from configs/local-sim.yaml")]
        )
    if not isinstance(data, dict):
        raise TopologyError(
            [Problem(shown, lines.get((), 1), "", "expected a mapping of keys at the top level")]
        )
    return data, lines


def _line(lines: dict[Loc, int], loc: Loc) -> int | None:
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


def _problem(err: Any, lines: dict[Loc, int], shown: str) -> Problem:
    loc = _err_loc(err)
    kind = err["type"]
    if kind == "extra_forbidden":
        key = str(loc[-1])
        known = _fields_at(loc[:-1])
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hint = f"did you mean `{close[0]}`?" if close else f"known keys: {', '.join(sorted(known))}"
        return Problem(shown, _line(lines, loc), _dotted(loc), "unknown key", hint)
    if kind == "missing":
        return Problem(shown, _line(lines, loc[:-1]), _dotted(loc), "required key is missing", "add it")
    if loc and loc[-1] == "[key]":  # a bad key of a mapping (env names): name the mapping, show the key
        loc = loc[:-1]
        message = err["msg"].removeprefix("Value error, ")
        return Problem(shown, _line(lines, loc), _dotted(loc[:-1]), f"key {str(loc[-1])!r} {message}")
    got = err.get("input")
    shown_value = "" if isinstance(got, dict | list) else f" (got {got!r})"
    message = err["msg"].removeprefix("Value error, ")
    return Problem(shown, _line(lines, loc), _dotted(loc), f"{message}{shown_value}")


def _fields_at(loc: Loc) -> list[str]:
    """Field names of the model found at `loc` inside a Topology, for "did you mean"."""
    model: type[BaseModel] | None = Topology
    for part in loc:
        if model is None:
            return []
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        model = _model_of(field.annotation) if field else None
    return list(model.model_fields) if model else []


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found:
            return found
    return None


def _apply_override(data: dict[str, Any], override: str) -> None:
    """Set `a.b[0].c=value` (value parsed as YAML) in the raw document; `prefill[*].x` sets every item.
    Its mistakes are blamed on `--set KEY=VALUE`, never on the file."""
    source = _source(override)
    key, sep, raw = override.partition("=")
    if not sep or not key:
        raise TopologyError([Problem(source, None, "", "an override must look like key.path=value",
                                     "e.g. --set model.max_num_seqs=8")])
    try:
        value, _ = read(raw, source, inline=True)
    except TopologyError as exc:
        reason = exc.problems[0].message.removeprefix("the value: ")
        raise TopologyError([Problem(
            source, None, key, f"the value {raw!r} is not valid YAML ({reason})",
            f"quote a text value: --set '{key}=\"...\"'",
        )]) from None
    parts: list[str] = []
    for piece in key.replace("]", "").split("."):
        parts.extend(piece.split("["))
    targets: list[Any] = [data]
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        nxt: list[Any] = []
        for target in targets:
            if isinstance(target, list):
                indices = range(len(target)) if part == "*" else [int(part)] if part.isdigit() else []
                if not indices or max(indices) >= len(target):
                    raise TopologyError([Problem(source, None, key, f"no list item `{part}` to override")])
                for idx in indices:
                    if last:
                        target[idx] = value
                    else:
                        nxt.append(target[idx])
            elif isinstance(target, dict):
                if last:
                    target[part] = value
                else:
                    nxt.append(target.setdefault(part, {}))
            else:
                raise TopologyError([Problem(source, None, key, f"cannot override inside `{part}`")])
        targets = nxt
