"""docs/configuration.md is the schema's reference: generated from it, every field listed, kept in sync."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from pdctl.topology.model import Topology
from pdctl.topology.reference import markdown, rows, type_name

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_committed_reference_is_the_generated_one() -> None:
    assert DOC.read_text() == markdown(), (
        "docs/configuration.md is stale: run `python -m pdctl.topology.reference > docs/configuration.md`")


def test_every_field_of_every_section_is_listed_with_what_it_changes() -> None:
    listed = markdown()

    def walk(model: type[BaseModel]) -> int:
        count = 0
        for name, field in model.model_fields.items():
            count += 1
            assert f".{name}` |" in listed or f"| `{name}` |" in listed, name
            for arg in (field.annotation, *getattr(field.annotation, "__args__", ())):
                for inner in (arg, *getattr(arg, "__args__", ())):
                    if isinstance(inner, type) and issubclass(inner, BaseModel):
                        count += walk(inner)
                        break
        return count

    assert walk(Topology) > 100
    for key, _, _, text in rows(Topology):
        if "." not in key and key not in ("nodes", "model", "prefill", "decode", "router"):
            assert text, f"{key} has no description"
    for line in listed.splitlines()[10:]:
        assert line.count(" | ") >= 3 and not line.endswith("|  |"), line  # no empty cell, table intact


def test_type_names() -> None:
    assert type_name(int | None) == "int or null"
    assert type_name(list[str]) == "list of str"
    line = next(x for x in markdown().splitlines() if x.startswith("| `router.port` |"))
    assert line.startswith("| `router.port` | int | ")
