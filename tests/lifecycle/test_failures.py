"""`up` interrupted or failing during the health wait: the error says why, and `down` leaves nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from pdctl.errors import LaunchError, SmokeTestError
from pdctl.lifecycle import UpOptions, down, up
from pdctl.remote.local import LocalTransport
from pdctl.state import StateStore
from tests.lifecycle.conftest import MakeTopo
from tests.support.venvs import script_venv

pytestmark = pytest.mark.slow


def test_engine_that_dies_fails_up_with_its_log_and_leaves_nothing(
    make_topo: MakeTopo, console: Console, tmp_path: Path
) -> None:
    venv = script_venv(tmp_path / "venv", 'echo "boom: CUDA out of memory while loading $5"; exit 1')
    topo = make_topo(python_venv=venv)
    with pytest.raises(LaunchError) as info:
        up(topo, console, UpOptions(provision=False, timeout=60))
    message = str(info.value)
    assert "exited before it served" in message and "boom: CUDA out of memory while loading" in message
    assert "pdctl logs" in info.value.hint
    assert LocalTransport().find_by_marker(topo.name) == []
    state = StateStore(topo.name).load()
    assert state is not None and state.processes == {}


def test_sigint_during_health_wait_stops_what_up_started(
    make_topo: MakeTopo, console: Console, tmp_path: Path
) -> None:
    venv = script_venv(tmp_path / "venv", "exec sleep 300")
    topo = make_topo(python_venv=venv)
    topo_file = tmp_path / f"{topo.name}.yaml"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdctl", "up", "-t", str(topo_file), "--skip-provision", "--timeout", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ},
    )
    store = StateStore(topo.name)
    try:
        for _ in range(300):
            state = store.load()
            if state is not None and {"decode-0", "prefill-0"} <= set(state.processes):
                break
            time.sleep(0.1)
        else:
            raise AssertionError("up never recorded its engines")
        assert len(LocalTransport().find_by_marker(topo.name)) == 2
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err.decode()
    lines = err.decode().splitlines()
    assert lines[-2:] == [
        f"interrupted: stopped what this `up` started; `pdctl up -t {topo_file}` starts it again",
        "interrupted",
    ]
    assert LocalTransport().find_by_marker(topo.name) == []  # Ctrl-C left no engine running
    state = store.load()
    assert state is not None and state.processes == {}
    assert down(topo, console).nothing_was_running
    assert not store.path.exists()


def test_smoke_test_fails_loudly_when_turn_two_does_not_reuse(make_topo: MakeTopo, console: Console) -> None:
    # The decode streams no kv_transfer_params (vLLM < 0.33 unpatched), so turn 2 cannot be a hit although
    # bidirectional is on. (A router handle_ttl of 1 ms was not deterministic: turn 2 can come within 1 ms.)
    topo = make_topo(extra_yaml="extra_args: {decode: [--no-stream-kv-params]}\n")
    with pytest.raises(SmokeTestError) as info:
        up(topo, console, UpOptions(provision=False))
    message = str(info.value)
    assert "not a reuse hit, although connector.bidirectional_kv_xfer is on" in message
    assert "Most likely: decode returned no kv_transfer_params" in message
    for cause in ("flags differ between prefill and decode", "no kv_transfer_params in streaming",
                  "side channel is unreachable"):
        assert cause in message
    assert info.value.hint == (
        f"what this `up` started is stopped again; the logs stay (`pdctl logs -t {topo.file} decode-0`); "
        "`pdctl up --no-smoke-test` starts it without the check, to inspect it running"
    )
    # nothing is left for the next `up` to call converged: it starts everything again, and checks again
    assert LocalTransport().find_by_marker(topo.name) == []
    state = StateStore(topo.name).load()
    assert state is not None and state.processes == {}


def test_smoke_failure_on_a_running_deployment_leaves_it_running(make_topo: MakeTopo, console: Console) -> None:
    topo = make_topo(extra_yaml="extra_args: {decode: [--no-stream-kv-params]}\n")
    up(topo, console, UpOptions(provision=False, smoke=False))
    with pytest.raises(SmokeTestError) as info:
        up(topo, console, UpOptions(provision=False))
    assert "`pdctl down` stops it" in info.value.hint  # this `up` started nothing, so it stops nothing
    assert len(LocalTransport().find_by_marker(topo.name)) >= 3


def test_smoke_test_does_not_require_a_hit_without_bidirectional(make_topo: MakeTopo, console: Console) -> None:
    topo = make_topo(extra_yaml="connector: {bidirectional_kv_xfer: false}\n")
    dep = up(topo, console, UpOptions(provision=False))
    assert dep.smoke is not None and not dep.smoke.required_hit and dep.smoke.turn2.outcome != "hit"


def test_preflight_refuses_a_busy_port_before_starting_anything(make_topo: MakeTopo, console: Console) -> None:
    import socket

    topo = make_topo()
    decode_port = topo.decode[0].port
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", decode_port))
        busy.listen()
        with pytest.raises(LaunchError) as info:
            up(topo, console, UpOptions(provision=False))
    assert f"local: port {decode_port} needed by decode-0 is in use" in str(info.value)
    # held by a process of no deployment: stop that pid or move the port (`pdctl down` is for a deployment's own)
    assert f"stop pid {os.getpid()} on local" in info.value.hint and "another port" in info.value.hint
    assert "pdctl down" not in info.value.hint
    assert LocalTransport().find_by_marker(topo.name) == []
