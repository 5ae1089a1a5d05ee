"""A router that `up` starts again after it was killed releases what the killed one pinned on the decode (its pin
journal under the deployment's directory), and `down` (SIGTERM) leaves no pin behind."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from pdctl.lifecycle import UpOptions, down, up
from pdctl.plan import run_dir
from pdctl.state import StateStore
from tests.lifecycle.conftest import MakeTopo
from tests.router.faults import eventually

pytestmark = pytest.mark.slow


def decode_usage(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("vllm:kv_cache_usage_perc"))


def chat(router: str, cid: str) -> int:
    body = {"model": "Qwen", "max_tokens": 8, "conversation_id": cid,
            "messages": [{"role": "user", "content": " ".join(f"{cid}-{i}" for i in range(60))}]}
    return httpx.post(f"{router}/v1/chat/completions", json=body, timeout=60).status_code


def test_a_killed_router_restarted_by_up_releases_its_pins(make_topo: MakeTopo, console: Console) -> None:
    topo = make_topo()
    dep = up(topo, console, UpOptions(smoke=False))
    decode = f"http://127.0.0.1:{topo.decode[0].port}"
    assert decode_usage(decode) == 0
    for _ in range(6):
        assert chat(dep.router_url, uuid.uuid4().hex) == 200
    assert decode_usage(decode) > 0
    stats = httpx.get(f"{dep.router_url}/stats", timeout=10).json()["retention"]
    assert stats["journal"]["path"].startswith(run_dir(topo, topo.router.node))
    assert eventually(lambda: httpx.get(f"{dep.router_url}/stats", timeout=10).json()["retention"]["journal"]
                      ["written"] == 6)
    state = StateStore(topo.name).load()
    assert state is not None
    os.killpg(state.processes["router"].pid, signal.SIGKILL)

    again = up(topo, console, UpOptions(smoke=False))
    assert again.started == ["router"]
    assert eventually(lambda: decode_usage(decode) == 0), decode_usage(decode)
    releases = httpx.get(f"{again.router_url}/stats", timeout=10).json()["retention"]["releases"]
    done = releases["reclaimed_at_start"]  # sent alone or carried on a turn's prefill request
    assert done.get("sent", 0) + done.get("carried", 0) == 6, done

    for _ in range(3):
        assert chat(again.router_url, uuid.uuid4().hex) == 200
    assert decode_usage(decode) > 0
    down(topo, console)  # the router first, while the prefill that carries its releases is still up
    log = Path(run_dir(topo, topo.router.node), "logs", "router.log").read_text(encoding="utf-8")
    assert "stopping: releasing 3 retained handle(s)" in log
    assert "release of a shutdown handle" not in log  # none failed
    journal = os.path.join(run_dir(topo, topo.router.node), "kv-journal")
    assert os.listdir(journal) == []
