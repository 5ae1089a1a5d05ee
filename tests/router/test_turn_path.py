"""A warm turn's path: the pipeline (pdctl/router/turn/pipeline.py) calls each of its stages once, in order, from the
route to the kept handle (docs/architecture.md, "A warm turn's path").

The router runs in this process (uvicorn in a thread, against real simulator engines) with a profiler on its
thread that records every stage module the pipeline's own frames call into. A coroutine fires a `call` event each
time it resumes, so a frame counts once.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from pdctl.router.config import RouterConfig
from pdctl.router.server.app import create_app
from pdctl.router.turn import pipeline
from pdctl.router.turn.state import RouterState
from tests.conftest import free_port
from tests.router.conftest import BLOCK
from tests.support.sim_procs import SERVED, SimPair

STAGES = ("request", "overflow", "local", "verification", "prefill", "decode", "keep")
PIPELINE = pipeline.__file__


class StageCalls:
    """The stages the pipeline's frames call into, in order, while `recording`."""

    def __init__(self, state: RouterState | None = None) -> None:
        self.state = state
        self.recording = False
        self.calls: list[tuple[str, str]] = []
        self._frames: list[types.FrameType] = []  # held, so that no frame's identity is reused while recording

    def profile(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event != "call" or not self.recording:
            return
        caller = frame.f_back
        if caller is None or caller.f_code.co_filename != PIPELINE:
            return
        module = str(frame.f_globals.get("__name__", ""))
        package, _, stage = module.rpartition(".")
        if package != "pdctl.router.turn" or stage not in STAGES or any(f is frame for f in self._frames):
            return
        self._frames.append(frame)
        self.calls.append((stage, frame.f_code.co_name))

    def stop(self) -> None:
        """Stop recording once the router has finished the turn (the client may read its end a moment before the
        turn's last stage gives back its slot)."""
        deadline = time.monotonic() + 10
        while self.state is not None and self.state.decode_gate.inflight and time.monotonic() < deadline:
            time.sleep(0.01)
        self.recording = False

    def take(self) -> list[tuple[str, str]]:
        calls, self.calls, self._frames = self.calls, [], []
        return calls


@pytest.fixture()
def traced_router(pd: SimPair, request: pytest.FixtureRequest) -> Iterator[tuple[str, StageCalls]]:
    local_tokens = request.param
    config = RouterConfig(prefill=(pd.prefill_url,), decode=(pd.decode_url,), model=SERVED, block_size=BLOCK,
                          local_prefill_tokens=local_tokens, min_read_tokens=0, health_interval=30.0)
    port = free_port()
    app = create_app(config)
    stages = StageCalls(app.state)  # type: ignore[attr-defined]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on", loop="asyncio"))
    threading.setprofile(stages.profile)
    try:
        thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
        thread.start()
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the in-process router did not start"
        time.sleep(0.05)
    try:
        yield url, stages
    finally:
        server.should_exit = True
        thread.join(10)


def _conversation(url: str, stages: StageCalls) -> tuple[list[tuple[str, str]], httpx.Response]:
    """A cold turn, then a warm one; the warm turn's stage calls and response."""
    cid = f"path-{time.monotonic_ns()}"
    first = [{"role": "user", "content": "list the files in the repository " * 20}]
    headers = {"x-conversation-id": cid}
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": SERVED, "messages": first, "max_tokens": 4},
                   headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    stages.stop()
    stages.take()
    reply = r.json()["choices"][0]["message"]["content"]
    warm = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "now open the first one"}]
    stages.recording = True
    try:
        r = httpx.post(f"{url}/v1/chat/completions", json={"model": SERVED, "messages": warm, "max_tokens": 4},
                       headers=headers, timeout=30)
    finally:
        stages.stop()
    assert r.status_code == 200, r.text
    return stages.take(), r


@pytest.mark.parametrize("traced_router", [0], indirect=True)
def test_a_warm_turn_through_the_prefill_calls_each_stage_once_in_order(
        traced_router: tuple[str, StageCalls]) -> None:
    url, stages = traced_router
    calls, r = _conversation(url, stages)
    assert r.headers["x-pd-kv-reuse"].startswith("hit"), r.headers["x-pd-kv-reuse"]
    assert calls == [("request", "resolve"), ("overflow", "choose"), ("local", "decide"),
                     ("verification", "check"), ("prefill", "run"), ("decode", "run"), ("keep", "release_unread")]


@pytest.mark.parametrize("traced_router", [4096], indirect=True)
def test_a_warm_turn_on_its_decode_alone_skips_verification_and_the_prefill(
        traced_router: tuple[str, StageCalls]) -> None:
    url, stages = traced_router
    calls, r = _conversation(url, stages)
    assert r.headers["x-pd-kv-reuse"].endswith("decode_local"), r.headers["x-pd-kv-reuse"]
    assert calls == [("request", "resolve"), ("overflow", "choose"), ("local", "decide"), ("decode", "run"),
                     ("keep", "release_unread")]


def test_the_recorder_sees_a_stage_called_twice() -> None:
    """The assertions above pass vacuously if the profiler records nothing; it records a pipeline frame's calls,
    each frame once, and nothing called from elsewhere."""
    stages = StageCalls()
    stages.recording = True
    code = compile("def caller(f):\n    f()\n    f()\n", PIPELINE, "exec")
    scope: dict[str, Any] = {}
    exec(code, scope)
    target: dict[str, Any] = {"__name__": "pdctl.router.turn.keep"}
    exec("def release_unread():\n    pass\n", target)
    sys.setprofile(stages.profile)
    try:
        scope["caller"](target["release_unread"])
        target["release_unread"]()  # not from the pipeline: not recorded
    finally:
        sys.setprofile(None)
    assert stages.take() == [("keep", "release_unread"), ("keep", "release_unread")]
