"""Ctrl-C during `pdctl bench` keeps the requests that finished: the report is written from them first, exit 130;
the deployment is then put back as found, or, at one more Ctrl-C, taken all the way down, and the output says
which."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from rich.console import Console

from pdctl.bench.leg.legs import endpoints
from pdctl.bench.runner import probe
from pdctl.lifecycle import UpOptions, up
from pdctl.remote.local import LocalTransport
from pdctl.topology import load


def test_ctrl_c_writes_the_report_of_what_finished(sim_topology: Path, tmp_path: Path) -> None:
    up(load(sim_topology), Console(stderr=True, color_system=None), UpOptions(smoke=False))
    out = tmp_path / "bench"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdctl", "bench", "-t", str(sim_topology), "--no-redeploy", "--no-warmup",
         "--lengths", "256", "--conversations", "200", "--turns", "3", "--user-tokens", "16", "--output-tokens", "4",
         "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "200"}, text=True,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # a line per finished conversation (not a terminal)
            if "conversation" in line and "done" in line:
                break
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    records = json.loads((out / "requests.json").read_text())
    assert 3 <= len(records) < 600  # at least the conversation seen done, not the whole bench
    legs = json.loads((out / "legs.json").read_text())
    assert legs["interrupted"] is True and legs["passed"] is False
    assert legs["legs"][0]["failures"] == [f"interrupted (Ctrl-C) after {len(records)} requests"]
    assert (out / "report.md").read_text().splitlines()[2].startswith("INTERRUPTED (Ctrl-C): partial results.")
    assert "bench interrupted after " in stdout
    assert f"the report holds the {len(records)} requests that finished" in stdout
    assert "Traceback" not in stderr, stderr


def _bench(topology: Path, out: Path) -> subprocess.Popen[str]:
    """A redeploying bench (legs off and on) long enough to be interrupted in its first leg."""
    return subprocess.Popen(
        [sys.executable, "-m", "pdctl", "bench", "-t", str(topology), "--no-warmup", "--lengths", "256",
         "--conversations", "200", "--turns", "3", "--user-tokens", "16", "--output-tokens", "4", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "200"}, text=True,
    )


def _until(proc: subprocess.Popen[str], *words: str) -> list[str]:
    """stderr lines up to the first holding every word (the rest stays in the pipe)."""
    assert proc.stderr is not None
    seen: list[str] = []
    for line in proc.stderr:
        seen.append(line)
        if all(w in line for w in words):
            return seen
    raise AssertionError(f"no line with {words} in:\n{''.join(seen)}")


def _finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[str, str]:
    """stdout, and the rest of stderr, read through the buffered pipes `_until` reads (communicate() would skip
    what they hold already); the process is killed if it outlives `timeout`."""
    assert proc.stdout is not None and proc.stderr is not None
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    try:
        stderr = proc.stderr.read()
        stdout = proc.stdout.read()
        proc.wait()
    finally:
        killer.cancel()
    return stdout, stderr


def _left(topology: Path, stdout: str) -> str:
    """Where the bench says it left the deployment, checked against what runs."""
    topo = load(topology)
    running = LocalTransport().find_by_marker(topo.name)
    [line] = [x for x in stdout.splitlines() if x.startswith("deployment:")]
    if "restored: running as it was found" in line:
        assert {p.process for p in running} == {"router", "prefill-0", "decode-0"}, running
        assert probe.healthy(LocalTransport(), endpoints(topo).router_url)
        return "as found"
    assert f"{topo.name} is down (it was running before the bench): `pdctl up -t {topology}` starts it" in line
    assert running == [], running
    return "down"


def _ctrl_c_twice(topology: Path, out: Path, *second_after: str) -> tuple[int | None, list[str], str, str]:
    """Up, a bench, Ctrl-C in its first leg, and Ctrl-C again once a stderr line holds every word of
    `second_after`: (exit code, the stderr lines up to that one, stdout, the rest of stderr)."""
    up(load(topology), Console(stderr=True, color_system=None), UpOptions(smoke=False))
    proc = _bench(topology, out)
    try:
        _until(proc, "conversation", "done")
        proc.send_signal(signal.SIGINT)
        before = _until(proc, *second_after)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = _finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, before, stdout, stderr


def test_ctrl_c_twice_keeps_the_report_and_says_where_the_deployment_was_left(
    sim_topology: Path, tmp_path: Path
) -> None:
    out = tmp_path / "bench"
    # twice in a row, as an impatient hand does: the second once the first was taken (two signals sent at once are
    # merged into one by the kernel)
    returncode, _, stdout, stderr = _ctrl_c_twice(sim_topology, out, "interrupted: writing the report")
    assert returncode == 130, stderr
    records = json.loads((out / "requests.json").read_text())
    assert records and json.loads((out / "legs.json").read_text())["interrupted"] is True
    assert f"the report holds the {len(records)} requests that finished" in stdout
    assert _left(sim_topology, stdout) in ("as found", "down")
    assert "interrupt received: " in stderr  # the second Ctrl-C was heard and said
    assert "Traceback" not in stderr, stderr


def test_ctrl_c_during_the_restore_takes_the_deployment_down_and_says_so(sim_topology: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    returncode, before, stdout, stderr = _ctrl_c_twice(sim_topology, out, "restoring", "as it was found (running)")
    assert returncode == 130, stderr
    # the report was written before the restore began
    assert any("interrupted: writing the report of the" in line for line in before), before
    assert (out / "report.md").is_file() and json.loads((out / "requests.json").read_text())
    assert "interrupt received: stopping the restore; taking all of" in stderr
    assert _left(sim_topology, stdout) == "down"
    assert "Traceback" not in stderr, stderr
