"""Each preflight problem comes with its own fix: a GPU that is not there is not a port to free."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdctl.errors import LaunchError
from pdctl.facts.host import PortHolder
from pdctl.lifecycle.bringup.preflight import port_hint, preflight
from pdctl.plan import plan
from pdctl.remote.local import LocalTransport
from pdctl.topology import Topology
from tests.conftest import free_port
from tests.provision.support import layout_host, topology


def _vllm(gpus: list[int]) -> Topology:
    return topology(
        engine="vllm",
        nodes=[{"name": "a", "transport": "local", "gpus": 8}],
        prefill=[{"node": "a", "gpus": [0], "port": free_port(), "side_channel_port": free_port()}],
        decode=[{"node": "a", "gpus": gpus, "port": free_port(), "side_channel_port": free_port()}],
        router={"node": "a", "port": free_port()},
    )


def _refused(topo: Topology) -> LaunchError:
    with pytest.raises(LaunchError) as err:
        preflight(topo, plan(topo), {"a": LocalTransport("a")})
    return err.value


def test_a_missing_gpu_gets_the_gpu_fix_not_the_ports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layout_host(tmp_path, "a", monkeypatch)  # a fake nvidia-smi: GPUs 0-7
    err = _refused(_vllm([9]))
    assert "a: GPU 9 for decode-0 not found (the node has [0, 1, 2, 3, 4, 5, 6, 7])" in err.message
    assert err.hint == ("set the gpus of decode-0 to indices a has (0, 1, 2, 3, 4, 5, 6, 7; `nvidia-smi -L` there "
                        "lists them)")
    assert "port" not in (err.hint or "")


def test_a_failing_nvidia_smi_points_at_the_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = layout_host(tmp_path, "a", monkeypatch)
    (root / "fake/nvidia-smi.out").write_text("NVIDIA-SMI has failed because it couldn't communicate with the "
                                             "NVIDIA driver.\n")
    (root / "fake/nvidia-smi.rc").write_text("9\n")
    err = _refused(_vllm([1]))
    assert "for decode-0 not found" in err.message and "for prefill-0 not found" in err.message
    # one hint for the two problems of one kind
    assert err.hint == "`nvidia-smi` fails on a: install or repair the NVIDIA driver there, then `pdctl doctor`"


def test_port_hints_name_who_must_stop() -> None:
    topo = _vllm([1])  # not read from a file: its hints name `<topology>`
    decode = next(s for s in plan(topo) if s.name == "decode-0")
    port = decode.ports[0]
    other = [PortHolder(port, pid=11, command="python3", deployment="other-dep")]
    assert port_hint(topo, decode, port, other) == (
        f"stop deployment `other-dep` (`pdctl down -t <its topology file>`) or give decode-0 another port in "
        f"{topo.file}")
    mine = [PortHolder(port, pid=12, command="python3", deployment=topo.name)]
    assert port_hint(topo, decode, port, mine) == (
        f"`pdctl down -t {topo.file}` stops what is left of {topo.name}, then `pdctl up` starts it afresh")
    assert port_hint(topo, decode, port, None) == (
        f"stop what listens on it on a or give decode-0 another port in {topo.file}")
