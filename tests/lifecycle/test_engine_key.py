"""The locked engine plane: engines refuse requests without the deployment's key, the router holds it, and the
key appears in none of the files and outputs pdctl writes."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import httpx
from rich.console import Console
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.lifecycle import UpOptions, up
from pdctl.lifecycle.hosts.engine_key import read_key
from pdctl.plan import engine_key_path, plan
from pdctl.remote.local import LocalTransport
from pdctl.state import StateStore
from tests.lifecycle.conftest import MakeTopo

BODY = {"model": "Qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_engines_refuse_all_but_the_router(make_topo: MakeTopo, console: Console, tmp_path: Path,
                                           pdctl_home: Path) -> None:
    topo = make_topo()
    dep = up(topo, console, UpOptions(provision=False))
    assert dep.smoke is not None and dep.smoke.turn2.outcome == "hit"  # the router's traffic carries the key

    key_file = Path(engine_key_path(topo, "local")).expanduser()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = read_key(LocalTransport(), topo, "local")
    assert key is not None and len(key) >= 32

    prefill = next(s for s in plan(topo) if s.role == "prefill")
    refused = httpx.post(f"{prefill.url}/v1/chat/completions", json=BODY)
    assert (refused.status_code, refused.json()) == (401, {"error": "Unauthorized"})
    wrong = httpx.post(f"{prefill.url}/v1/chat/completions", json=BODY, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert httpx.get(f"{prefill.url}/health").status_code == 200  # vLLM guards /v1 (and /v2 ...), not /health
    assert httpx.get(f"{prefill.url}/v1/models").status_code == 401
    allowed = httpx.get(f"{prefill.url}/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert allowed.status_code == 200

    topo_file = tmp_path / f"{topo.name}.yaml"
    runner = CliRunner()
    outputs = [runner.invoke(app, args) for args in (["plan", "-t", str(topo_file)],
                                                     ["plan", "--json", "-t", str(topo_file)],
                                                     ["status", "--json", "-t", str(topo_file)])]
    assert [r.exit_code for r in outputs] == [0, 0, 0], [r.output for r in outputs]
    assert json.loads(outputs[2].stdout)["healthy"] is True
    written = [p for root in (tmp_path / "work", pdctl_home) for p in root.rglob("*") if p.is_file()
               and p != key_file]
    assert any(p.suffix == ".log" for p in written) and StateStore(topo.name).path in written
    for text in [r.output for r in outputs] + [p.read_text(errors="replace") for p in written]:
        assert key not in text

