"""`pdctl observe` against a real Prometheus (the distribution's `prometheus`, started by pdctl on the router's node,
here this machine): it scrapes a simulated deployment, and every query of the shipped dashboard returns data."""

from __future__ import annotations

import json
import math
import shutil
import stat
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.lifecycle import UpOptions, down, up
from pdctl.lifecycle.hosts.engine_key import read_key
from pdctl.lifecycle.watch.dashboard import PANELS, dashboard, queries
from pdctl.lifecycle.watch.top import Sampler
from pdctl.lifecycle.watch.top_render import render_top
from pdctl.remote.local import LocalTransport
from pdctl.router.wire import Reuse
from tests.conftest import free_port
from tests.lifecycle.conftest import MakeTopo
from tests.support.netns import skip_or_fail

pytestmark = pytest.mark.slow

PROMETHEUS = shutil.which("prometheus") or ("/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)


def _needs_prometheus() -> str:
    if PROMETHEUS is None:
        skip_or_fail("prometheus is required in CI (scripts/test installs the Debian package)",
                     "no prometheus binary (apt-get install prometheus)")
    assert PROMETHEUS is not None
    return PROMETHEUS


def _chat(client: httpx.Client, url: str, cid: str, messages: list[dict[str, str]], stream: bool = True,
          ) -> tuple[Reuse, str]:
    body: dict[str, Any] = {"model": "Qwen", "messages": messages, "max_tokens": 8, "stream": stream,
                            "conversation_id": cid}
    if stream:
        with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            assert r.status_code == 200, r.read()
            text = ""
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunk = json.loads(line[6:])
                    text += "".join(c.get("delta", {}).get("content") or "" for c in chunk.get("choices", []))
            return Reuse.parse(r.headers.get("x-pd-kv-reuse")), text
    r = client.post(f"{url}/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return Reuse.parse(r.headers.get("x-pd-kv-reuse")), r.json()["choices"][0]["message"]["content"]


def _traffic(url: str) -> list[Reuse]:
    """Warm conversations (hits), a diverged one (a miss that says where), streamed and not."""
    seen = []
    with httpx.Client(timeout=30) as client:
        for n in range(3):
            cid = uuid.uuid4().hex
            msgs = [{"role": "user", "content": f"conversation {n}: " + "tell me about the sea " * 60}]
            for turn in range(3):
                reuse, text = _chat(client, url, cid, msgs, stream=turn != 1)
                seen.append(reuse)
                msgs = [*msgs, {"role": "assistant", "content": text}, {"role": "user", "content": f"more {turn}"}]
        single = {"model": "Qwen", "messages": [{"role": "user", "content": "one question"}], "max_tokens": 4,
                  "conversation_id": uuid.uuid4().hex}  # its conversation's last turn: released at once
        assert client.post(f"{url}/v1/chat/completions", json=single, headers={"x-pd-retain": "no"}).status_code == 200
        cid = uuid.uuid4().hex
        first = [{"role": "user", "content": "a long first question " + "about many things " * 100}]
        _, text = _chat(client, url, cid, first)
        edited = [{"role": "user", "content": "an edited first question " + "about many things " * 100},
                  {"role": "assistant", "content": text}, {"role": "user", "content": "and then?"}]
        reuse, _ = _chat(client, url, cid, edited)
        seen.append(reuse)
        deadline = time.monotonic() + 15  # the single turn's release is done (alone, or carried by a later turn)
        while client.get(f"{url}/stats").json()["retention"]["release_queue"] and time.monotonic() < deadline:
            time.sleep(0.05)
    return seen


def _query(prom: str, expr: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=10)
    assert r.status_code == 200, (expr, r.text)
    body = r.json()
    assert body["status"] == "success", (expr, body)
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _finite(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(s["value"][1])) for s in result)


def test_observe_renders_and_a_real_prometheus_scrapes_every_panel(make_topo: MakeTopo, console: Console,
                                                                   tmp_path: Path) -> None:
    binary = _needs_prometheus()
    topo = make_topo(router_extra=", local_prefill_tokens: 0, min_read_tokens: 0")
    up(topo, console, UpOptions(smoke=False))
    topo_file = tmp_path / f"{topo.name}.yaml"
    router_url = f"http://127.0.0.1:{topo.router.port}"
    key = read_key(LocalTransport(), topo, "local")
    assert key

    # Rendered here: the configuration names every process, the key is in a 0600 file and nowhere else.
    out_dir = tmp_path / "obs"
    rendered = CliRunner().invoke(app, ["observe", "-t", str(topo_file), "--out", str(out_dir)])
    assert rendered.exit_code == 0, rendered.output
    assert key not in rendered.output
    config_text = (out_dir / "prometheus.yml").read_text()
    assert key not in config_text
    config = yaml.safe_load(config_text)
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert set(jobs) == {"pdctl-router", "pdctl-engines"}
    processes = {c["labels"]["process"] for j in jobs.values() for c in j["static_configs"]}
    assert processes == {"router", "prefill-0", "decode-0"}
    key_file = Path(jobs["pdctl-engines"]["authorization"]["credentials_file"])
    assert key_file.read_text() == key and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    shipped = json.loads((out_dir / "pdctl-dashboard.json").read_text())
    assert shipped == dashboard()

    # Traffic, then a real Prometheus on the router's node (this machine), started by pdctl.
    replies = _traffic(router_url)
    assert any(r.outcome == "hit" for r in replies)
    diverged = replies[-1]
    assert (diverged.outcome, diverged.reason) == ("miss", "prefix_diverged") and diverged.block == 0, diverged
    port = free_port()
    started = CliRunner().invoke(app, ["observe", "-t", str(topo_file), "--start", "--port", str(port),
                                       "--scrape-interval", "1s", "--prometheus-bin", binary])
    assert started.exit_code == 0, started.output
    assert key not in started.output
    prom = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ups = _query(prom, f'up{{deployment="{topo.name}"}}')
        if len(ups) == 3 and all(s["value"][1] == "1" for s in ups):
            break
        time.sleep(1)
    else:
        pytest.fail(f"Prometheus did not scrape all three targets: {ups}")
    _traffic(router_url)  # again, now that Prometheus scrapes: the rates see it

    # Every panel's every query, exactly as the shipped JSON has them, with Grafana's variables filled in; asked
    # again until each has a finite value (a rate needs two scrapes after the traffic; 1 s apart) or 30 s passed.
    exprs = queries(shipped)
    assert len(exprs) == sum(len(p.queries) for p in PANELS)
    deadline = time.monotonic() + 30
    while True:
        empty = []
        for expr in exprs:
            filled = expr.replace("$deployment", topo.name).replace("$__rate_interval", "2m")
            result = _query(prom, filled)
            if not result or not _finite(result):
                empty.append((expr, result))
        if not empty or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not empty, empty
    sources = {s["metric"]["source"]: float(s["value"][1]) for s in
               _query(prom, f'sum by (source) (pdctl_router_turn_kv_source_total{{deployment="{topo.name}"}})')}
    assert sources["decode_read"] > 0 and sources["recomputed"] > 0
    reasons = _query(prom, f'pdctl_router_kv_reuse_total{{deployment="{topo.name}", reason="prefix_diverged"}}')
    assert sum(float(r["value"][1]) for r in reasons) >= 1  # partial and miss; each series is there from 0
    chosen = {s["metric"]["source"]: float(s["value"][1]) for s in
              _query(prom, f'sum by (source) (pdctl_router_kv_choice_total{{deployment="{topo.name}"}})')}
    assert chosen["decode_read"] > 0, chosen  # warm turns through the prefill (local_prefill_tokens 0)
    share = _query(prom, f'sum by (index) (pdctl_router_retained_blocks{{deployment="{topo.name}"}}) / max by '
                         f'(index) (pdctl_router_decode_kv_capacity_blocks{{deployment="{topo.name}"}})')
    assert share and 0 < float(share[0]["value"][1]) < 1, share  # the conversations' pins on the decode
    single = _query(prom, f'sum(pdctl_router_kv_releases_total{{deployment="{topo.name}", reason="single_turn", '
                          'result=~"sent|carried"})')
    assert single and float(single[0]["value"][1]) >= 1, single

    # The live view reads the same figures without Prometheus.
    with Sampler(topo) as sampler:
        sampler.sample()
        _traffic(router_url)
        view = sampler.sample()
    assert view.turns_per_s > 0 and view.hit_rate is not None and view.hit_rate > 0
    assert view.ttft_s["p50"] is not None and view.itl_s["p90"] is not None
    assert any(k.startswith("miss: prefix_diverged") for k in view.reasons)
    assert view.kv_source.get("decode_read", 0) > 0 and view.moved_tokens_per_turn.get("d_to_p", 0) > 0
    assert set(view.pinned) == {"0"} and view.admission["decode"][2] > 0
    assert view.kv_choice.get("decode_read", 0) > 0 and view.releases["single_turn"] == 1, view
    assert view.retained[0].process == "decode-0" and view.retained[0].retained_blocks > 0
    assert [i.process for i in view.instances if i.up] == ["decode-0", "prefill-0", "router"]
    wide = Console(width=100, record=True, color_system=None)
    render_top(view, wide)
    text = wide.export_text()
    assert "TTFT router" in text and "prefix_diverged" in text and "decode-0" in text
    assert "KV source chosen (warm turns)" in text and "retained KV" in text
    once = CliRunner().invoke(app, ["top", "-t", str(topo_file), "--once", "--interval", "0.5", "--json"])
    assert once.exit_code == 0, once.output
    assert json.loads(once.stdout)["deployment"] == topo.name

    # `down` stops Prometheus with the rest (it carries the deployment's marker).
    down(topo, console, timeout=5)
    assert LocalTransport().find_by_marker(topo.name) == []
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{prom}/-/ready", timeout=2)
