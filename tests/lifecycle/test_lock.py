"""Two pdctl processes on one deployment: the second fails at once, naming the first, and starts nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from pdctl.lifecycle import UpOptions, down, up
from pdctl.remote.local import LocalTransport
from tests.lifecycle.conftest import MakeTopo

HOLD = """
import sys
from pdctl.lifecycle.hosts.lock import deployment_lock
with deployment_lock(sys.argv[1], "up"):
    print("held", flush=True)
    sys.stdin.readline()
"""


def pdctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pdctl", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})


def test_second_up_fails_fast_naming_the_holder(make_topo: MakeTopo, tmp_path: Path, console: Console) -> None:
    topo = make_topo()
    path = tmp_path / f"{topo.name}.yaml"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, topo.name], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        lost = pdctl("up", "-t", str(path), "--no-smoke-test")
        assert lost.returncode == 1, lost.stderr
        message = " ".join(lost.stderr.split())
        assert f"Error: {topo.name}: pdctl up (pid {holder.pid}) is already working on this deployment; this up " \
            "changed nothing" in message
        assert f"hint: wait for it to finish, or stop it (kill {holder.pid})" in message
        assert LocalTransport().find_by_marker(topo.name) == []
        lost_down = pdctl("down", "-t", str(path))
        assert lost_down.returncode == 1
        assert f"pdctl up (pid {holder.pid}) is already working on this deployment; this down changed nothing" \
            in " ".join(lost_down.stderr.split())
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(timeout=30)
    dep = up(topo, console, UpOptions(smoke=False))  # the lock died with its holder
    assert sorted(dep.started) == ["decode-0", "prefill-0", "router"]
    down(topo, console)


def test_two_ups_at_once_start_one_deployment(make_topo: MakeTopo, tmp_path: Path) -> None:
    topo = make_topo()
    path = tmp_path / f"{topo.name}.yaml"
    procs = [subprocess.Popen([sys.executable, "-m", "pdctl", "up", "-t", str(path), "--no-smoke-test"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    results = [(p.returncode, out) for p, out in zip(procs, outputs, strict=True)]
    started = [out for code, (out, _) in results if code == 0 and "started" in out]
    assert len(started) == 1, results  # the other one lost the lock, or came after and found it running
    for code, (out, err) in results:
        won = code == 0 and ("started" in out or "no changes" in out)
        lost = code == 1 and "is already working on this deployment" in " ".join(err.split())
        assert won or lost, (code, out, err)
    leaders = sorted(p.process for p in LocalTransport().find_by_marker(topo.name) if p.pid == p.pgid)
    assert leaders == ["decode-0", "prefill-0", "router"]
