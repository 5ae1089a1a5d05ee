"""`pdctl.lifecycle.watch.logs`: the end of the logs through the node's transport, and `follow` writing what is appended
until it is stopped."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from pdctl.errors import UsageError
from pdctl.lifecycle.watch.logs import logs
from pdctl.plan import ProcessSpec, plan
from tests.lifecycle.conftest import MakeTopo


class Sink:
    def __init__(self) -> None:
        self.parts: list[str] = []
        self.lock = threading.Lock()

    def section(self, spec: ProcessSpec) -> None:
        with self.lock:
            self.parts.append(f"[{spec.name}]")

    def write(self, text: str) -> None:
        with self.lock:
            self.parts.append(text)

    def text(self) -> str:
        with self.lock:
            return "".join(self.parts)


def _write_logs(specs: list[ProcessSpec]) -> dict[str, Path]:
    paths = {}
    for spec in specs:
        path = Path(spec.log_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{spec.name} line {i}\n" for i in range(5)))
        paths[spec.name] = path
    return paths


def test_the_last_lines_of_one_log_and_of_every_log(make_topo: MakeTopo) -> None:
    topo = make_topo()
    _write_logs(plan(topo))
    one = Sink()
    logs(topo, one, process="router", lines=2)
    assert one.parts == ["router line 3\nrouter line 4\n"]
    every = Sink()
    logs(topo, every, lines=1)
    assert every.text() == (
        "[decode-0]decode-0 line 4\n[prefill-0]prefill-0 line 4\n[router]router line 4\n"
    )


def test_an_unknown_process_names_the_known_ones(make_topo: MakeTopo) -> None:
    topo = make_topo()
    with pytest.raises(UsageError) as info:
        logs(topo, Sink(), process="nope")
    assert info.value.message == f"no process 'nope' in {topo.name}"
    assert info.value.hint == "choose one of: decode-0, prefill-0, router"


def test_follow_writes_what_is_appended_until_stopped(make_topo: MakeTopo) -> None:
    topo = make_topo()
    path = _write_logs(plan(topo))["router"]
    sink, stop = Sink(), threading.Event()
    worker = threading.Thread(
        target=logs, args=(topo, sink), kwargs={"process": "router", "lines": 1, "follow": True, "stop": stop,
                                                "poll_s": 0.05},
    )
    worker.start()
    try:
        _wait_for(lambda: sink.text() == "router line 4\n")
        with path.open("a") as fh:
            fh.write("appended après\n")
        _wait_for(lambda: sink.text() == "router line 4\nappended après\n")
    finally:
        stop.set()
        worker.join(10)
    assert not worker.is_alive()
    assert sink.text() == "router line 4\nappended après\n"


def _wait_for(done: object, limit_s: float = 10.0) -> None:
    assert callable(done)
    deadline = time.monotonic() + limit_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert done()
