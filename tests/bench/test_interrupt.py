"""Ctrl-C during `pdctl bench` keeps the requests that finished: the report is written from them, exit 130."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from pdctl.lifecycle import UpOptions, up
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
