"""Golden cases for every fact: `facts/<module>.<Fact>/<case>.json` holds the arguments, the captured output
(real machines' formats, from the reference or captured on a GPU host), the expected value and, where pinned,
the exact command. One generic runner, as pyinfra's tests/test_facts.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pdctl.facts import efa, gpu, host, model, python
from pdctl.facts.base import Fact, HostLayout, gather, split
from pdctl.remote.local import LocalTransport

HERE = Path(__file__).parent / "facts"
FACTS: dict[str, type[Fact[Any]]] = {
    cls.name: cls
    for module in (efa, gpu, host, model, python)
    for cls in vars(module).values()
    if isinstance(cls, type) and issubclass(cls, Fact) and cls is not Fact and hasattr(cls, "name")
}
CASES = sorted(HERE.glob("*/*.json"))


@pytest.mark.parametrize("case", CASES, ids=[f"{c.parent.name}/{c.stem}" for c in CASES])
def test_fact_golden(case: Path) -> None:
    data = json.loads(case.read_text())
    fact = FACTS[case.parent.name](**data["args"])
    if "command" in data:
        assert fact.command(HostLayout()) == data["command"]
    value = fact.process(list(data["output"]))
    assert fact.to_json(value) == data["expected"]
    assert fact.to_json(fact.from_json(data["expected"])) == data["expected"]


def test_every_fact_has_a_golden_case() -> None:
    assert set(FACTS) == {c.parent.name for c in CASES}


def test_layout_root_moves_system_paths() -> None:
    layout = HostLayout(root="/tmp/host a")
    assert "'/tmp/host a/opt/amazon/efa_installed_packages'" in efa.InstallerVersion().command(layout)
    assert "'/tmp/host a/sys/module/efa/version'" in efa.EfaModule().command(layout)


def test_split_keeps_facts_apart_and_marks_lost_output() -> None:
    out = "@@pdctl-fact 0\na\nb\n@@pdctl-fact 1\n@@pdctl-fact 2\nc\n"
    assert split(out, 4) == [["a", "b"], [], ["c"], None]


def test_gather_runs_all_facts_in_one_script_on_a_real_shell(tmp_path: Path) -> None:
    (tmp_path / "opt/amazon").mkdir(parents=True)
    (tmp_path / "opt/amazon/efa_installed_packages").write_text("# EFA installer version: 1.47.0\n")
    facts: list[Fact[Any]] = [
        efa.InstallerVersion(),
        gpu.NvidiaSmi(),
        python.VenvState(str(tmp_path / "no-venv")),
        host.Arch(),
    ]
    layout = HostLayout(root=str(tmp_path), path=(str(tmp_path / "empty-bin"),))
    values = gather(LocalTransport(), facts, layout)
    assert values[facts[0].key()] == "1.47.0"
    assert values[facts[2].key()].exists is False
    assert values[facts[3].key()] != ""
