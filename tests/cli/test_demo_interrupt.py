"""Ctrl-C during `pdctl demo` (a real SIGINT to a real process): exit 130 and "demo interrupted", never "demo
finished"; what it started is down, and every port it listened on came from --ports."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from pdctl.topology import load
from tests.conftest import free_port


def _marked(marker: str) -> list[int]:
    """Processes whose environment carries `marker` (pdctl marks each process it starts with its deployment)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker.encode() in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_ctrl_c_exits_130_says_interrupted_and_leaves_nothing_running(tmp_path: Path) -> None:
    base = min(free_port(), 65535 - 60)
    out = tmp_path / "demo"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdctl", "demo", "--lengths", "2000", "--turns", "3", "--conversations", "40",
         "--out", str(out), "--ports", f"{base}-{base + 60}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PDCTL_HOME": str(tmp_path / "home"), "COLUMNS": "200"},
    )
    seen: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # a line per finished conversation (not a terminal)
            seen.append(line)
            if "conversation" in line and "done" in line:
                break
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = "".join(seen) + stderr
    assert proc.returncode == 130, stdout + stderr
    assert "demo interrupted after " in stderr and f"partial output in {out}" in stderr, stderr
    assert "demo finished" not in stdout + stderr
    assert "Traceback" not in stderr, stderr
    topo = load(out / "topology.yaml")
    ports = [p for i in (*topo.prefill, *topo.decode) for p in (i.port, i.side_channel_port)] + [topo.router.port]
    assert all(base <= p <= base + 60 for p in ports), ports
    assert not [p for p in ports if _listening(p)]
    assert _marked(f"PDCTL_DEPLOYMENT={topo.name}") == []
