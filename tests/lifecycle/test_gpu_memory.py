"""`up` reads the GPUs' memory before it starts anything; `down` waits for them to hold no more than that."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from pdctl.errors import LaunchError
from pdctl.lifecycle.hosts import gpu_memory
from pdctl.plan import plan
from pdctl.remote.local import LocalTransport
from pdctl.topology import load
from tests.provision.support import layout_host

ROOT = Path(__file__).parents[2]


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """gpu-host with the fake nvidia-smi: one H200's memory readings from `fake/gpu-memory.out`."""
    root = layout_host(tmp_path, "gpu-host", monkeypatch)
    monkeypatch.setattr(gpu_memory, "WAIT_S", 0.0)
    (root / "fake/gpu-memory.out").write_text("0, 143771, 17, 143235\n")
    return root


def test_up_reads_only_the_gpus_the_engines_are_given(host: Path) -> None:
    topo = load(ROOT / "configs/h200-1gpu.yaml")
    hosts = {"gpu-host": LocalTransport("gpu-host")}
    (host / "fake/gpu-memory.out").write_text("0, 143771, 17, 143235\n1, 143771, 9000, 134771\n")
    assert gpu_memory.used(topo, plan(topo), hosts) == {"gpu-host": {"0": 17}}


def test_down_fails_while_a_gpu_holds_more_than_before_up(host: Path) -> None:
    topo = load(ROOT / "configs/h200-1gpu.yaml")
    hosts = {"gpu-host": LocalTransport("gpu-host")}
    out = io.StringIO()
    console = Console(file=out, width=200, color_system=None)
    gpu_memory.check_back(topo, hosts, {"gpu-host": {"0": 0}}, console)
    assert out.getvalue() == "gpu-host: GPU memory back: GPU 0 17 MiB (before up: 0)\n"
    (host / "fake/gpu-memory.out").write_text("0, 143771, 63818, 79953\n")
    with pytest.raises(LaunchError) as err:
        gpu_memory.check_back(topo, hosts, {"gpu-host": {"0": 0}}, console)
    assert err.value.message == ("h200-1gpu: GPU memory is not back to what it was before `up`:\n"
                                 "  gpu-host: GPU 0 holds 63818 MiB, 0 MiB before `up`")
