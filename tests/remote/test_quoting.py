"""Env keys that are not names, forced past validation, never become options of `env` or shell syntax."""

from __future__ import annotations

import shlex
import time
from pathlib import Path

from pdctl.facts.base import HostLayout
from pdctl.remote.local import LocalTransport
from pdctl.remote.procs import DetachedJob, systemd_script


def test_env_key_payload_is_not_run_by_the_start_script(tmp_path: Path) -> None:
    marker = tmp_path / "pwned-env"
    key = f'-S sh -c "touch {marker}" #'
    job = DetachedJob(
        unit="pdctl-demo-decode-0",
        argv=("sh", "-c", f"echo started > {tmp_path}/ran"),
        env={key: "1", "GOOD": "yes"},
        workdir=str(tmp_path / "wd"),
        log_path=str(tmp_path / "log" / "decode-0.log"),
    )
    LocalTransport().start_detached(job)
    deadline = time.monotonic() + 10
    while not (tmp_path / "ran").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "ran").read_text() == "started\n"  # the real command ran, the key did not
    assert not marker.exists()


def test_export_of_a_bad_key_is_an_error_not_a_command(tmp_path: Path) -> None:
    marker = tmp_path / "pwned-export"
    result = LocalTransport().run("echo ran", env={f"X;touch {marker};Y": "1"})
    assert not marker.exists()
    assert result.exit_code != 0  # sh refuses the name


def test_host_layout_env_is_quoted(tmp_path: Path) -> None:
    marker = tmp_path / "pwned-layout"
    prologue = HostLayout(env={f"A=$(touch {marker})": "1"}).prologue()
    LocalTransport().run(prologue + "true")
    assert not marker.exists()


def test_systemd_branch_keeps_each_assignment_one_word() -> None:
    script = systemd_script("pdctl-demo-x;id", {'-S sh -c "id" #': "1"}, "true")
    run_line = next(line for line in script.splitlines() if "systemd-run" in line)
    words = shlex.split(run_line.replace("$S", ""))
    assert '--setenv=-S sh -c "id" #=1' in words
    assert "--unit 'pdctl-demo-x;id' " in run_line
