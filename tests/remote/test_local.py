from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

from pdctl.errors import RemoteCommandError
from pdctl.lifecycle.hosts.launch import running, stop
from pdctl.remote.local import LocalTransport
from pdctl.remote.procs import DetachedJob


def _job(tmp: Path, deployment: str, node: str, name: str, script: str) -> DetachedJob:
    return DetachedJob(
        unit=f"pdctl-{deployment}-{name}",
        argv=(sys.executable, "-c", script),
        env={"PDCTL_DEPLOYMENT": deployment, "PDCTL_NODE": node, "PDCTL_PROCESS": name},
        workdir=str(tmp / "run"),
        log_path=str(tmp / "run" / "logs" / f"{name}.log"),
    )


SLEEPER = "import subprocess, time; print('up', flush=True); subprocess.Popen(['sleep', '300']); time.sleep(300)"


def test_run_returns_exit_code_and_both_streams() -> None:
    res = LocalTransport().run("echo out; echo err >&2; exit 3")
    assert (res.exit_code, res.stdout, res.stderr) == (3, "out\n", "err\n")
    assert LocalTransport().run(["printf", "%s", "a b"], env={"Z": "1"}).stdout == "a b"
    assert LocalTransport().run(["cat"], stdin=b"in").stdout == "in"


def test_check_names_host_command_and_stderr() -> None:
    with pytest.raises(RemoteCommandError) as info:
        LocalTransport("box").check("echo nope >&2; exit 4")
    assert str(info.value) == "box: `echo nope >&2; exit 4` exited 4\nnope"


def test_timeout_is_an_error_naming_the_limit() -> None:
    with pytest.raises(RemoteCommandError, match="exited 124") as info:
        LocalTransport().run("sleep 5", timeout=0.2)
    assert "0.2s" in info.value.hint


def test_put_copies_with_progress(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * 3_000_000)
    seen: list[tuple[int, int]] = []
    LocalTransport().put(src, str(tmp_path / "a" / "b" / "dst.bin"), progress=lambda d, t: seen.append((d, t)))
    assert (tmp_path / "a" / "b" / "dst.bin").read_bytes() == src.read_bytes()
    assert seen[-1] == (3_000_000, 3_000_000) and len(seen) == 3


def test_detached_process_is_found_by_marker_and_stopped_per_node(tmp_path: Path) -> None:
    dep = f"t-{uuid.uuid4().hex[:8]}"
    t = LocalTransport()
    try:
        a = t.start_detached(_job(tmp_path, dep, "node-a", "decode-0", SLEEPER))
        b = t.start_detached(_job(tmp_path, dep, "node-b", "decode-0", SLEEPER))
        found = _wait_for(lambda: running(t, dep, "node-a"), lambda r: len(r.get("decode-0", [])) == 2)
        assert {p.pid for p in found["decode-0"]} >= {a.pid}
        assert all(p.pgid == a.pid for p in found["decode-0"])
        stopped = stop(t, dep, "node-a")
        assert a.pid in stopped and b.pid not in stopped
        assert running(t, dep, "node-a") == {}
        assert next(p.pid for p in running(t, dep, "node-b")["decode-0"]) == b.pid
        assert "up" in (t.read_text(str(tmp_path / "run" / "logs" / "decode-0.log")) or "")
    finally:
        stop(t, dep, "node-a")
        stop(t, dep, "node-b")
    assert t.find_by_marker(dep) == []


def test_stop_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    dep = f"t-{uuid.uuid4().hex[:8]}"
    t = LocalTransport()
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ok', flush=True); " \
        "time.sleep(300)"
    try:
        t.start_detached(_job(tmp_path, dep, "n", "router", stubborn))
        _wait_for(lambda: t.read_text(str(tmp_path / "run" / "logs" / "router.log")) or "", lambda s: "ok" in s)
        assert stop(t, dep, "n", timeout=0.5)
        assert t.find_by_marker(dep) == []
    finally:
        stop(t, dep, "n", timeout=0.5)


def _wait_for(get, ok, tries: int = 100):  # type: ignore[no-untyped-def]
    import time

    for _ in range(tries):
        value = get()
        if ok(value):
            return value
        time.sleep(0.1)
    raise AssertionError(f"condition not reached; last value {value!r}")
