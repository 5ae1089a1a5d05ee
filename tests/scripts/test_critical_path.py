"""scripts/critical_path.py against engines that are already running (the real-GPU mode): simulators that want an
API key, pdctl's router, the script's own unverified proxy and an aggregated stand-in."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.router.conftest import router_process
from tests.support.sim_procs import SimPair, SimProc, sim_pair, sim_process

SCRIPT = Path(__file__).parents[2] / "scripts" / "critical_path.py"
KEY = "cp-test-key"
Deployment = tuple[SimPair, str, SimProc, Path]  # engines, the router's URL, the aggregated stand-in, the key file


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    logs = tmp_path_factory.mktemp("critical-path")
    key_file = logs / "engine.key"
    key_file.write_text(KEY + "\n")
    auth = ("--api-key", KEY)
    with (
        sim_pair(logs, speed=1000, prefill_args=auth, decode_args=auth) as pd,
        router_process(logs, [pd.prefill.url], [pd.decode.url], "--engine-key-file", str(key_file)) as router,
        sim_process(logs, "decode", name="aggregated", speed=1000) as agg,
    ):
        yield pd, router.url, agg, key_file


def run(deployment: Deployment, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    pd, router, agg, _ = deployment
    argv = [sys.executable, str(SCRIPT), "--router", router, "--prefill", pd.prefill.url, "--decode", pd.decode.url,
            "--aggregated", agg.url, "--lengths", "300", "--conversations", "1", "--turns", "3", "--api",
            "completions", "--json", str(tmp_path / "cp.json"), *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)


def records(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "cp.records.jsonl").read_text().splitlines()]


def test_plays_router_proxy_and_aggregated_legs_on_running_engines(deployment: Deployment, tmp_path: Path) -> None:
    out = run(deployment, tmp_path, "--engine-key-file", str(deployment[3]))

    assert out.returncode == 0, out.stderr
    warm = [(r["leg"], r["reuse"], r["reuse_reason"]) for r in records(tmp_path) if r["turn"] >= 1]
    assert warm == [("pdctl", "hit", "verified")] * 2 + [("proxy", "hit", "unverified")] * 2 + [
        ("aggregated", None, None)] * 2
    assert "target pdctl <= proxy + 5 ms at every length:" in out.stdout
    floor = next(line for line in out.stdout.splitlines() if line.startswith("| 300 |") and "/" in line.split("|")[2])
    assert floor.split("|")[6].strip() == "2/0/0"  # pdctl's warm turns: hit / partial / miss


def test_proxy_without_the_engine_key_is_refused(deployment: Deployment, tmp_path: Path) -> None:
    out = run(deployment, tmp_path)

    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == "proxy at 300 tokens: HTTP 401: Unauthorized"
