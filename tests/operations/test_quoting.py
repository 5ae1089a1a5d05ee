"""Forced past validation, a hostile topology value stays one quoted word: running the commands pdctl builds
from it does not run the payload (each test runs them for real and looks for the payload's marker file)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pdctl.facts.base import HostLayout
from pdctl.operations import efa, model
from pdctl.operations.base import Context, Facts, Run
from pdctl.remote.local import LocalTransport
from pdctl.topology import Topology, parse

TOPO = """\
name: demo
engine: vllm
nodes:
  - {name: a, transport: local, gpus: 2}
model:
  id: Qwen/Qwen3-32B
prefill:
  - {node: a, port: 8100, side_channel_port: 5600, gpus: [0]}
decode:
  - {node: a, port: 8200, side_channel_port: 5601, gpus: [1]}
router:
  node: a
python:
  venv: null
"""


def forced(tmp_path: Path, **sections: dict[str, Any]) -> Topology:
    """A valid topology with `sections` changed without validation, as a model_copy would let code do."""
    topo = parse(TOPO, "topo.yaml").model_copy(update={"work_dir": str(tmp_path / "work")})
    for name, values in sections.items():
        topo = topo.model_copy(update={name: getattr(topo, name).model_copy(update=values)})
    return topo


def run_all(op: Any, tmp_path: Path) -> list[str]:
    """Drive an operation, running each Run step with `sh -c` (curl and hf are stand-ins in tmp_path/bin)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("curl", "hf"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / tool).chmod(0o755)
    transport = LocalTransport("a")
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    ran: list[str] = []
    result = None
    try:
        while True:
            step = op.send(result)
            result = None
            if isinstance(step, Run):
                ran.append(step.command)
                result = transport.run(step.command, env=env, timeout=30)
    except StopIteration:
        pass
    except Exception:  # the operation gives up once a command fails; what ran is what counts
        pass
    return ran


def context(topo: Topology) -> Context:
    facts = Facts(lambda wanted: {f.key(): f.default() for f in wanted})
    return Context(topo, topo.nodes[0], facts, HostLayout(), runs_engine=True)


def test_installer_version_payload_is_not_run(tmp_path: Path) -> None:
    marker = tmp_path / "pwned-efa"
    payload = f"1.47.0;touch {marker};"
    topo = forced(tmp_path, efa={"required": True, "installer_version": payload, "sha256": "0" * 64})
    ran = run_all(efa._install(context(topo), payload), tmp_path)
    assert len(ran) >= 2, ran  # the download and the verify-and-unpack commands both ran
    assert any(f"aws-efa-installer-{payload}.tar.gz" in c.replace("'", "") for c in ran)
    assert not marker.exists(), ran


def test_installer_url_and_sha_payloads_are_not_run(tmp_path: Path) -> None:
    marker = tmp_path / "pwned-url"
    topo = forced(tmp_path, efa={
        "required": True, "installer_version": "1.47.0",
        "installer": f"https://example.invalid/x.tgz;touch {marker}",
        "sha256": f"$(touch {marker})",
    })
    ran = run_all(efa._install(context(topo), "1.47.0"), tmp_path)
    assert len(ran) >= 2, ran
    assert not marker.exists(), ran


def test_model_id_and_revision_payloads_are_not_run(tmp_path: Path) -> None:
    marker = tmp_path / "pwned-model"
    topo = forced(tmp_path, model={"id": f"x/y;touch {marker}", "revision": f"$(touch {marker})"})
    topo = topo.model_copy(update={"hf_home": f"{tmp_path}/hf`touch {marker}`"})
    ran = run_all(model.download(context(topo)), tmp_path)
    assert ran and "hf download" in ran[0], ran
    assert not marker.exists(), ran
