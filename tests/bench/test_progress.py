"""The bench says what it will do before it starts, and shows progress on stderr where no terminal watches."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from pdctl.bench.output.progress import LineProgress
from pdctl.bench.results.records import RequestRecord
from pdctl.bench.runner.estimate import estimate
from pdctl.bench.traffic.workload import WorkloadSpec
from pdctl.cli import app


def test_estimate_counts_requests_and_prices_them() -> None:
    spec = WorkloadSpec(lengths=(2000, 8000), conversations=2, turns=3, user_tokens=100, output_tokens=10)
    sim = estimate(spec, legs=2, clients=1, engine="sim", speed=10.0, redeploy=True)
    assert (sim.requests_per_leg, sim.requests) == (12, 24)
    slower = estimate(spec, legs=2, clients=1, engine="sim", speed=1.0, redeploy=True)
    parallel = estimate(spec, legs=2, clients=2, engine="sim", speed=1.0, redeploy=True)
    assert sim.seconds < slower.seconds and parallel.seconds < slower.seconds
    assert sim.line(True).startswith(
        "bench: 24 requests (2 leg(s) x 12, plus a short warm-up per leg); rough estimate ~"
    )
    assert sim.line(True).endswith("(simulated engines)")


def test_a_line_per_finished_conversation_and_a_heartbeat_when_quiet() -> None:
    buf = io.StringIO()
    console = Console(file=buf, width=200, color_system=None)
    progress = LineProgress(console, turns=2, heartbeat_s=0.0)
    progress.leg_started("on", 4)
    progress.request_done(RequestRecord("on", 128, "on-L128-c0", 0, "chat", status=200))
    progress.request_done(RequestRecord("on", 128, "on-L128-c0", 1, "chat", status=200))
    progress.request_done(RequestRecord("on", 128, "on-L128-c1", 0, "chat", status=500, error="HTTP 500"))
    with progress:  # starts the heartbeat timer
        deadline = time.monotonic() + 30
        while len(buf.getvalue().splitlines()) < 4 and time.monotonic() < deadline:
            time.sleep(0.2)
    lines = buf.getvalue().splitlines()
    assert lines[0] == "leg on: 4 requests"
    assert re.fullmatch(r"leg on: conversation on-L128-c0 done \(2/4 requests, \d+ s\)", lines[1])
    assert re.fullmatch(r"leg on: conversation on-L128-c1 done \(3/4 requests, 1 failed, \d+ s\)", lines[2])
    assert re.fullmatch(r"leg on: 3/4 requests, 1 failed, \d+ s", lines[-1])


@pytest.mark.slow
def test_a_bench_without_a_terminal_prints_the_estimate_then_progress_lines(
    sim_topology: Path, tmp_path: Path
) -> None:
    args = ["bench", "-t", str(sim_topology), "--lengths", "128,256", "--conversations", "2", "--turns", "2",
            "--user-tokens", "8", "--output-tokens", "2", "--api", "completions", "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert re.fullmatch(r"bench: 16 requests \(2 leg\(s\) x 8, plus a short warm-up per leg\); "
                        r"rough estimate ~\d+ (s|min) \(simulated engines\)", lines[0])
    for leg in ("off", "on"):
        assert f"leg {leg}: 8 requests" in lines
        done = [x for x in lines if x.startswith(f"leg {leg}: conversation ")]
        assert sorted(x.split(" done ")[0] for x in done) == [  # two clients: in any order
            f"leg {leg}: conversation {leg}-L{n}-c{i}" for n in (128, 256) for i in (0, 1)
        ]
        assert " done (8/8 requests, " in done[-1]
    assert "bench passed" in result.stdout and "bench passed" not in result.stderr


def test_the_estimate_is_its_terms_per_leg_plus_once_per_bench() -> None:
    """Per leg: the conversations (clients at a time), two warm-up turns, the redeploy; once: start and report."""
    from pdctl.bench.runner.estimate import (
        BENCH_OVERHEAD_S,
        LEG_OVERHEAD_S,
        REQUEST_OVERHEAD_MS,
        play_s,
        turn_ms,
        warmup_s,
    )

    spec = WorkloadSpec(lengths=(2000, 8000), conversations=2, turns=3, user_tokens=100, output_tokens=10)
    # an infinitely fast simulator leaves only the fixed cost of each request
    assert turn_ms(5000, 10, 0.0) == REQUEST_OVERHEAD_MS
    assert play_s(spec, 1, "sim", float("inf")) == 12 * REQUEST_OVERHEAD_MS / 1e3
    # turn t of a conversation of length L prefills L + t * (user + output) tokens
    assert play_s(spec, 1, "sim", 1.0) * 1e3 == sum(turn_ms(n + t * 110, 10, 1.0) for n in (2000, 8000)
                                                    for t in range(3)) * 2
    # two clients play the two conversations of each length side by side: half the time, not more clients' worth
    assert play_s(spec, 2, "sim", 1.0) == play_s(spec, 1, "sim", 1.0) / 2
    assert play_s(spec, 8, "sim", 1.0) == play_s(spec, 2, "sim", 1.0)
    assert warmup_s(spec, "sim", 1.0) * 1e3 == turn_ms(2000, 10, 1.0) + turn_ms(2110, 10, 1.0)
    per_leg = play_s(spec, 2, "sim", 10.0) + warmup_s(spec, "sim", 10.0)
    redeployed = estimate(spec, legs=2, clients=2, engine="sim", speed=10.0, redeploy=True)
    assert redeployed.seconds == 2 * (per_leg + LEG_OVERHEAD_S["sim"]) + BENCH_OVERHEAD_S
    kept = estimate(spec, legs=1, clients=2, engine="sim", speed=10.0, redeploy=False)
    assert kept.seconds == per_leg + BENCH_OVERHEAD_S
