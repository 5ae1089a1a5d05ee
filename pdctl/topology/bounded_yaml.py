"""Reading a topology's YAML within bounds: size, nesting, alias expansion, number length, encoding, duplicates.

A topology is a few hundred lines; anything far past that is a mistake or an attack (billion laughs, a
recursive alias, 10,000 nested lists, a 5,000-digit number), and each is refused with its line, fast, before
PyYAML builds a value from it. The events are checked first (PyYAML's parser is iterative); only then is the
node graph composed and constructed.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from pdctl.errors import Problem, TopologyError

Loc = tuple[str | int, ...]

MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_NODES = 100_000
MAX_NUMBER_CHARS = 40
_NUMBER = re.compile(r"[-+]?(0[xob])?[0-9_.:eE+-]+")


def decode(raw: bytes, shown: str) -> str:
    """The file's text: UTF-8 (a BOM is allowed); UTF-16 and other encodings are refused with a way out."""
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in raw[:4096]:
        raise _error(shown, 1, "the file is UTF-16 (or holds NUL bytes), not UTF-8",
                     "save it as UTF-8, e.g. `iconv -f UTF-16 -t UTF-8 FILE > topo.yaml`")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise _error(shown, line, f"the file is not UTF-8 (byte 0x{raw[exc.start]:02x})",
                     "save it as UTF-8, e.g. `iconv -f LATIN1 -t UTF-8 FILE > topo.yaml`") from None


def read(text: str, shown: str, *, inline: bool = False) -> tuple[Any, dict[Loc, int]]:
    """Parse one YAML document within the bounds; returns (value, line of every key path).

    `inline`: the text is a `--set` value, not the file, so messages carry no line.
    """
    what = "the value: " if inline else ""
    if len(text.encode()) > MAX_BYTES:
        raise _error(shown, None, f"{'the value' if inline else 'the file'} is larger than {MAX_BYTES >> 20} MiB",
                     "a topology is a few hundred lines; is this the right file?")
    try:
        _check_events(text, shown, what)
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            lines: dict[Loc, int] = {}
            if node is not None:  # before construction, which flattens merge keys (`<<`) in place
                _index(node, (), lines, shown, set())
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None and not what else None
        reason = getattr(exc, "problem", None) or str(exc)
        raise _error(shown, line, f"{what}YAML syntax error: {reason}", "check indentation and quoting") from None
    except TopologyError:
        raise
    except (ValueError, RecursionError, MemoryError) as exc:
        raise _error(shown, None, f"{what}cannot build a value from the YAML: {type(exc).__name__}: {exc}",
                     "simplify the document") from None
    return data, lines


def _error(shown: str, line: int | None, message: str, hint: str) -> TopologyError:
    return TopologyError([Problem(shown, line, "", message, hint)])


def _check_events(text: str, shown: str, what: str) -> None:
    """Depth, expanded size, recursive aliases and number length, from the event stream (no recursion)."""
    sizes: dict[str, int] = {}
    stack: list[list[Any]] = []  # [node count, anchor or None] per open collection
    total = 0

    def where(event: yaml.Event) -> int | None:
        mark = event.start_mark
        return None if what or mark is None else mark.line + 1

    def add(count: int, event: yaml.Event) -> None:
        nonlocal total
        if stack:
            stack[-1][0] += count
        else:
            total += count
        if total + sum(s[0] for s in stack) > MAX_NODES:
            raise _error(shown, where(event), f"{what}more than {MAX_NODES:,} values (aliases counted expanded)",
                         "anchors and aliases (&a / *a) may share settings, not multiply them")

    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            if len(stack) >= MAX_DEPTH:
                raise _error(shown, where(event), f"{what}nested deeper than {MAX_DEPTH} levels",
                             "a topology needs a handful of levels; flatten it")
            stack.append([1, event.anchor])
        elif isinstance(event, yaml.CollectionEndEvent):
            count, anchor = stack.pop()
            if anchor is not None:
                sizes[anchor] = count
            add(count, event)
        elif isinstance(event, yaml.ScalarEvent):
            if event.style is None and len(event.value) > MAX_NUMBER_CHARS and _NUMBER.fullmatch(event.value):
                raise _error(shown, where(event), f"{what}a number of {len(event.value)} characters",
                             "ports, counts and seconds are small numbers; quote it if it is text")
            if event.anchor is not None:
                sizes[event.anchor] = 1
            add(1, event)
        elif isinstance(event, yaml.AliasEvent):
            if any(s[1] == event.anchor for s in stack):
                raise _error(shown, where(event), f"{what}alias *{event.anchor} refers to itself",
                             "a value cannot contain itself; copy the settings instead")
            if event.anchor not in sizes:
                continue  # an undefined alias: the composer reports it with its line
            add(sizes[event.anchor], event)


def _index(node: yaml.Node, loc: Loc, lines: dict[Loc, int], shown: str, seen: set[int]) -> None:
    lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        check_duplicates = id(node) not in seen
        seen.add(id(node))
        first: dict[Any, int] = {}
        for key, value in node.value:
            line = key.start_mark.line + 1
            if check_duplicates and isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if key.value in first:
                    raise TopologyError([Problem(
                        shown, line, dotted((*loc, key.value)),
                        f"duplicate key (first set at line {first[key.value]})",
                        "keep one of the two; YAML would silently use the last",
                    )])
                first[key.value] = line
            child = (*loc, key.value)
            _index(value, child, lines, shown, seen)
            lines[child] = line
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index(item, (*loc, i), lines, shown, seen)


def dotted(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
