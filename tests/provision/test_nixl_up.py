"""`pdctl up` on an EFA topology reads the engines' NIXL lines once they are healthy: a TCP fallback fails `up`
with the check's message and stops what it started; only lines since the engine's latest start count."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from rich.console import Console

from pdctl.errors import LaunchError
from pdctl.lifecycle import UpOptions, down, up
from pdctl.remote.local import LocalTransport
from pdctl.topology import load
from tests.lifecycle.conftest import topology_yaml
from tests.support.venvs import script_venv

pytestmark = pytest.mark.slow

EFA_OK = "I1130 17:02:11.402118 2101 libfabric_rail_manager.cpp:141] Created 16 rails using provider=efa\n"
TCP = (
    "I1130 17:02:11.231002 2101 libfabric_topology.cpp:71] Discovered 1 tcp devices (TCP fallback)\n"
    "I1130 17:02:11.402118 2101 libfabric_rail_manager.cpp:141] Created 1 rails using provider=tcp\n"
)


def _engine_venv(root: Path, lines: Path) -> str:
    """A venv whose python first prints `<lines>/<role>.nixl` (as NIXL would on stderr), then runs the simulator."""
    # argv: -m pdctl.sim serve MODEL --role ROLE ...
    return script_venv(root, f'cat "{lines}/$6.nixl" >&2 2>/dev/null\nexec {sys.executable} "$@"')


def test_tcp_fallback_in_an_engine_log_fails_up_when_efa_is_required(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PDCTL_HOME", str(tmp_path / "home"))
    lines = tmp_path / "nixl"
    lines.mkdir()
    (lines / "decode.nixl").write_text(EFA_OK)
    (lines / "prefill.nixl").write_text(TCP)
    venv = _engine_venv(tmp_path / "venv", lines)
    path = tmp_path / "efa.yaml"
    path.write_text(topology_yaml("nixl-up", tmp_path / "work", python_venv=venv, extra_yaml="efa: {required: true}\n"))
    topo = load(path)
    console = Console(stderr=True, width=120, color_system=None)
    opts = UpOptions(provision=False, smoke=False, timeout=60)
    try:
        with pytest.raises(LaunchError) as info:
            up(topo, console, opts)
        assert str(info.value).startswith("KV transfer is not on EFA:\n")
        assert "prefill-0: NIXL fell back to TCP: libfabric found no EFA device; NIXL rails use provider=tcp" in (
            str(info.value)
        )
        assert "decode-0" not in str(info.value)
        assert "efa.required: false" in info.value.hint
        assert LocalTransport().find_by_marker(topo.name) == [], "what up started is stopped"

        (lines / "prefill.nixl").write_text(EFA_OK)  # the old TCP lines stay in the log, before the new start
        deployment = up(topo, console, opts)
        assert set(deployment.started) == {"decode-0", "prefill-0", "router"}
    finally:
        down(topo, console, timeout=5)
