"""The configuration reference, generated from the schema: every key of a topology file with its type, default
and description, as Markdown (docs/configuration.md; tests/topology/test_reference.py keeps it in sync).

    python -m pdctl.topology.reference > docs/configuration.md
"""

from __future__ import annotations

import json
import re
import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from pdctl.topology.model import Topology

HEADER = """# Topology reference

Every key of a topology file (`pdctl validate -t FILE` checks one). Generated from `pdctl/topology/` by
`python -m pdctl.topology.reference > docs/configuration.md`; a test fails when this page and the schema differ.
Unknown keys are refused (with a "did you mean"), values are not coerced (`port: "8000"` is an error), and any key
can be overridden for one run with `--set key.path=value` (`prefill[*].port=...` sets every instance).
`[]` in a key is a list item, `{}` a mapping's value.
"""


def _model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model(arg)
        if found is not None:
            return found
    return None


def type_name(annotation: Any) -> str:
    """A short, readable type: `int`, `str or null`, `list of prefill/decode instance`, `one of a, b`."""
    origin = get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(json.dumps(a) for a in get_args(annotation))
    if origin in (Union, types.UnionType):
        return " or ".join(type_name(a) for a in get_args(annotation))
    if origin is list or origin is tuple:
        args = [a for a in get_args(annotation) if a is not Ellipsis]
        return f"list of {type_name(args[0])}" if args else "list"
    if origin is dict:
        key, value = get_args(annotation)
        return f"mapping {type_name(key)} -> {type_name(value)}"
    if getattr(annotation, "__metadata__", None) is not None:  # Annotated: the base type
        return type_name(get_args(annotation)[0])
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return "(section defaults)"
        return f"`{json.dumps(value)}`"
    if field.default is PydanticUndefined:
        return ""
    if isinstance(field.default, BaseModel):
        return "(section defaults)"
    return f"`{json.dumps(field.default, default=str)}`"


def _describe(field: FieldInfo) -> str:
    text = " ".join((field.description or "").split())
    return re.sub(r"\|", r"\\|", text)


def rows(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) for every field of `model` and of the sections inside it."""
    out: list[tuple[str, str, str, str]] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        sub = _model(field.annotation)
        origin = get_origin(field.annotation)
        listed = origin is list or any(get_origin(a) is list for a in get_args(field.annotation))
        mapped = origin is dict
        text = _describe(field) or ("the keys below" if sub is not None else "")
        out.append((key, type_name(field.annotation), _default(field), text))
        if sub is not None:
            out += rows(sub, f"{key}[]." if listed else f"{key}{{}}." if mapped else f"{key}.")
    return out


def _filled(table: list[tuple[str, str, str, str]]) -> list[tuple[str, str, str, str]]:
    """An instance's own `model.*` / `connector.*` keys say what they override; `env.*` / `extra_args.*` whose."""
    known = {key: text for key, _, _, text in table}
    out = []
    for key, kind, default, text in table:
        if not text:
            shared = re.sub(r"^(prefill|decode)\[\]\.", "", key)
            parent, _, last = key.rpartition(".")
            if shared != key and known.get(shared):
                text = f"this instance's own `{shared}` (default: the shared one): {known[shared]}"
            elif parent in ("env", "extra_args"):
                text = f"the {last} processes' own, added to `{parent}.all`"
        out.append((key, kind, default, text))
    return out


def markdown() -> str:
    lines = [HEADER, "| key | type | default | what it changes |", "|---|---|---|---|"]
    for key, kind, default, text in _filled(rows(Topology)):
        lines.append(f"| `{key}` | {kind} | {default} | {text} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
