"""Per-node `venv` and `work_dir`: the processes of that node run from its venv and log under its directory;
every other node keeps the topology-wide values."""

from __future__ import annotations

from typing import Any

from pdctl.plan import plan, python_for, run_dir
from pdctl.topology import Topology


def _topo(engine: str, venv: str | None = "~/.pdctl/venv") -> Topology:
    data: dict[str, Any] = {
        "name": "ovr",
        "engine": engine,
        "nodes": [
            {"name": "a", "address": "10.0.0.1", "venv": "/srv/a/venv/", "work_dir": "/srv/a/work"},
            {"name": "b", "address": "10.0.0.2"},
        ],
        "model": {"id": "Qwen/Qwen3-32B"},
        "prefill": [{"node": "a", "port": 8100}],
        "decode": [{"node": "b", "port": 8200}],
        "router": {"node": "a", "port": 8000},
        "python": {"venv": venv},
    }
    return Topology.model_validate(data)


def test_sim_processes_use_their_nodes_venv_and_work_dir() -> None:
    decode, prefill, router = plan(_topo("sim"), "/usr/bin/python3")
    assert prefill.argv[0] == "/srv/a/venv/bin/python" and router.argv[0] == "/srv/a/venv/bin/python"
    assert decode.argv[0] == "~/.pdctl/venv/bin/python"
    assert prefill.log_path == "/srv/a/work/ovr/logs/prefill-0.log" and prefill.workdir == "/srv/a/work/ovr"
    assert router.log_path == "/srv/a/work/ovr/logs/router.log"
    assert decode.log_path == "~/.pdctl/ovr/logs/decode-0.log"


def test_vllm_engine_runs_its_nodes_vllm() -> None:
    decode, prefill, _ = plan(_topo("vllm"), "/usr/bin/python3")
    assert prefill.argv[:2] == ("/srv/a/venv/bin/vllm", "serve")
    assert decode.argv[:2] == ("~/.pdctl/venv/bin/vllm", "serve")


def test_a_node_venv_stands_in_for_a_null_topology_venv() -> None:
    topo = _topo("sim", venv=None)
    assert python_for(topo, "/usr/bin/python3", "a") == "/srv/a/venv/bin/python"
    assert python_for(topo, "/usr/bin/python3", "b") == "/usr/bin/python3"
    assert python_for(topo, "/usr/bin/python3") == "/usr/bin/python3"
    assert run_dir(topo) == "~/.pdctl/ovr" and run_dir(topo, "a") == "/srv/a/work/ovr"
