"""`status` and `down` read the processes on the GPUs through the `gpu.GpuProcesses` fact (the fake nvidia-smi
of a test host), never a command string of their own."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdctl.facts.base import layout_for, layouts_from_env
from pdctl.lifecycle.changes.down import _gpu_holders
from pdctl.lifecycle.watch.status import _gpu_memory
from pdctl.markers import MARKER
from pdctl.remote.local import LocalTransport
from pdctl.remote.procs import HostProcess
from tests.provision.support import layout_host


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return layout_host(tmp_path, "gpu-host", monkeypatch)


@pytest.fixture
def engine() -> Iterator[int]:
    """A live process carrying the deployment's marker, as an engine would."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env={**os.environ, MARKER: "gpu-demo"})
    yield proc.pid
    proc.kill()
    proc.wait()


def test_status_sums_each_processes_gpu_memory_with_its_children(root: Path) -> None:
    (root / "fake/compute-apps.out").write_text("101, 60000\n102, 3000\n103, [N/A]\n999, 5000\n")
    live = {"decode-0": [HostProcess(101, 101, "S"), HostProcess(102, 101, "S")],
            "prefill-0": [HostProcess(103, 103, "S")]}
    assert _gpu_memory(LocalTransport("gpu-host"), "gpu-host", live) == {"decode-0": 63000}


def test_down_names_only_the_deployments_processes_still_on_a_gpu(root: Path, engine: int) -> None:
    layout = layout_for(layouts_from_env(), "gpu-host")
    transport = LocalTransport("gpu-host")
    assert _gpu_holders(transport, "gpu-demo", "gpu-host", layout) == []
    (root / "fake/compute-apps.out").write_text(f"{engine}, 63818\n{os.getpid()}, 100\n")
    assert _gpu_holders(transport, "gpu-demo", "gpu-host", layout) == [
        f"gpu-host: pid {engine} of gpu-demo still holds GPU memory"]
    assert _gpu_holders(transport, "other", "gpu-host", layout) == []
