"""`pdctl status` and `pdctl top` show the decode's KV held by retained blocks: every router's pins against the
decode's total, pins per router, and what each router released (under pressure, single-turn), and `top` the warm
turns' KV-source mix. One simulated 1P1D deployment with two routers (real processes, HTTP on loopback), each
router given its own multi-turn conversations, enough retained KV that the routers release under pressure
(retain_high_kv 0.3 of a 64k-token decode), and a turn marked single-turn on each."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.lifecycle import UpOptions, down, up
from pdctl.lifecycle.watch.top import Sampler
from pdctl.lifecycle.watch.top_render import render_top
from pdctl.plan import plan
from pdctl.topology import load
from tests.conftest import free_port
from tests.lifecycle.test_router_replicas import free_block
from tests.router.faults import eventually
from tests.support.sim_topology import sim_yaml

pytestmark = pytest.mark.slow

CAPACITY = 4000 * 16  # sim num_blocks x block_size: the decode's KV in tokens
WORDS = 2000  # a conversation's first prompt: one token a word in the simulator


def _chat(router: str, cid: str | None, messages: list[dict[str, str]], retain: bool = True) -> str:
    body: dict[str, Any] = {"model": "Qwen", "messages": messages, "max_tokens": 8}
    if cid is not None:
        body["conversation_id"] = cid
    headers = {} if retain else {"x-pd-retain": "no"}
    r = httpx.post(f"{router}/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    text: str = r.json()["choices"][0]["message"]["content"]
    return text


def _conversation(router: str, words: int) -> None:
    """A two-turn conversation whose first prompt is `words` tokens of its own: the second turn is warm."""
    cid = uuid.uuid4().hex
    msgs = [{"role": "user", "content": " ".join(f"{cid[:6]}{i}" for i in range(words))}]
    text = _chat(router, cid, msgs)
    _chat(router, cid, [*msgs, {"role": "assistant", "content": text}, {"role": "user", "content": "and?"}])


def _retention(router: str) -> dict[str, Any]:
    section: dict[str, Any] = httpx.get(f"{router}/stats", timeout=10).json()["retention"]
    return section


def _sent(router: str, reason: str) -> int:
    by_result = _retention(router)["releases"].get(reason, {})
    return int(by_result.get("sent", 0)) + int(by_result.get("carried", 0))  # alone or on a turn's prefill request


def test_status_and_top_show_retained_kv_per_router_and_releases(tmp_path: Path, pdctl_home: Path,
                                                                   console: Console) -> None:
    path = tmp_path / "topo.yaml"
    name = f"h39s-{uuid.uuid4().hex[:6]}"
    router = (f"port: {free_port()}, replicas: 2, replica_port: {free_block(2)}, retain_high_kv: 0.3, "
              "retain_target_kv: 0.25")
    path.write_text(sim_yaml(name, tmp_path / "work", [(free_port(), free_port())], [(free_port(), free_port())],
                             router))
    topo = load(path)
    routers = {s.name: s.url for s in plan(topo) if s.role == "router"}
    assert sorted(routers) == ["router-0", "router-1"]
    try:
        up(topo, console, UpOptions(smoke=False))
        urls = list(routers.values())
        for i in range(12):  # 12 x ~2000 tokens retained, the routers in turn: above 30 % of the decode's 64k
            _conversation(urls[i % 2], WORDS)
        assert eventually(lambda: sum(_sent(u, "pressure") for u in urls) > 0, within=30)
        for url in urls:  # then a conversation each below the pressure (each router pins something), and a turn
            _conversation(url, 300)  # that says it is its conversation's last (released at once)
            _chat(url, uuid.uuid4().hex, [{"role": "user", "content": "only this one question"}], retain=False)
        assert all(eventually(lambda u=u: _sent(u, "single_turn") >= 1) for u in routers.values())  # type: ignore[misc]
        assert all(eventually(lambda u=u: _retention(u)["release_queue"] == 0) for u in routers.values())  # type: ignore[misc]
        stats = {n: _retention(u) for n, u in routers.items()}
        pinned = {n: s["decodes"][0]["retained_tokens"] for n, s in stats.items()}
        assert all(t > 0 for t in pinned.values()), stats  # each router still pins some after the pressure

        # status --json: the decode's retained KV, every router's pins against its capacity, releases per router
        shown = CliRunner().invoke(app, ["status", "-t", str(path), "--json"])
        assert shown.exit_code == 0, shown.output
        report = json.loads(shown.stdout)
        [held] = report["retained"]
        assert held["name"] == "decode-0" and held["capacity_tokens"] == CAPACITY
        assert held["by_router"] == pinned, (held, stats)  # nothing new since: the same pins
        assert held["retained_tokens"] == sum(pinned.values())
        assert held["retained_share"] == round(held["retained_tokens"] / CAPACITY, 4)
        assert held["handles"] == sum(s["decodes"][0]["handles"] for s in stats.values()) > 0
        assert held["kv_usage"] > 0 and held["kv_blocks"] == 4000 and held["kept_blocks"] > 0
        by_router = {r["name"]: r["retention"] for r in report["routers"]}
        assert sorted(by_router) == ["router-0", "router-1"]
        assert sum(r["released_under_pressure"] for r in by_router.values()) > 0
        assert all(r["releases"]["single_turn"] >= 1 for r in by_router.values()), by_router
        assert all(r["high_kv"] == 0.3 and r["target_kv"] == 0.25 for r in by_router.values())

        # status for people: the retained KV table with the pins by router, each router's releases
        text = CliRunner(env={"COLUMNS": "100"}).invoke(app, ["status", "-t", str(path)]).stdout
        assert "retained KV" in text and "by router" in text, text
        row = next(line for line in text.splitlines() if line.split()[:1] == ["decode-0"] and "tok" in line)
        assert "router-0" in row and "router-1" in row and f"{held['retained_share']:.1%}" in row, text
        assert text.count("released under pressure:") == 2 and "single_turn" in text, text

        # top over an interval with a warm turn and a single-turn release on each router
        with Sampler(topo) as sampler:
            sampler.sample()
            for url in urls:
                _conversation(url, 300)
                _chat(url, uuid.uuid4().hex, [{"role": "user", "content": "one more question"}], retain=False)
            assert all(eventually(lambda u=u: _retention(u)["release_queue"] == 0) for u in urls)  # type: ignore[misc]
            view = sampler.sample()
        assert sum(view.kv_choice.values()) >= 2, view.kv_choice  # each conversation's second turn
        assert sum(view.kv_choice_share.values()) == pytest.approx(1.0, abs=1e-3)
        mix = [httpx.get(f"{u}/stats", timeout=10).json()["kv_choice"]["mix"] for u in urls]
        assert view.kv_choice_total == {k: sum(m[k] for m in mix) for k in mix[0]}, (view.kv_choice_total, mix)
        assert view.releases["single_turn"] == 2 and view.releases_total["single_turn"] == 4, view.releases
        assert view.releases_total["pressure"] == sum(_sent(u, "pressure") for u in urls) > 0
        assert view.release_queue == {"router-0": 0, "router-1": 0}
        stats = {n: _retention(u)["decodes"][0] for n, u in routers.items()}
        [top_held] = view.retained
        assert top_held.process == "decode-0" and top_held.capacity_blocks == 4000
        assert top_held.by_router == {n: d["retained_blocks"] for n, d in stats.items()}, (top_held, stats)
        assert top_held.handles == sum(d["handles"] for d in stats.values()) > 0
        assert top_held.retained_share == round(top_held.retained_blocks / 4000, 4) and top_held.kv_use
        assert top_held.kept_blocks is not None and top_held.kept_blocks >= top_held.retained_blocks
        wide = Console(width=120, record=True, color_system=None)
        render_top(view, wide)
        frame = wide.export_text()
        assert "retained KV" in frame and "by router" in frame and "KV source chosen (warm turns)" in frame, frame
        assert "single_turn 2 (total 4)" in frame, frame

        # top --json: the same sections, from the CLI
        once = CliRunner().invoke(app, ["top", "-t", str(path), "--once", "--interval", "0.5", "--json"])
        assert once.exit_code == 0, once.output
        doc = json.loads(once.stdout)
        assert doc["retained"][0]["by_router"] == top_held.by_router
        assert doc["kv_choice_total"] == view.kv_choice_total and doc["releases_total"]["single_turn"] == 4
        assert set(doc["kv_choice_ttft_s"]) == set(view.kv_choice_total) and "p90" in doc["kv_choice_error_s"]
    finally:
        down(topo, console)
