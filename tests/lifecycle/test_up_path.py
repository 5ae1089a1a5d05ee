"""An `up`'s path: the pipeline (pdctl/lifecycle/bringup/pipeline.py) calls its stages in order, from the lock to
the smoke test (docs/architecture.md, "The path of an `up`"), on a simulated deployment on this machine.

Each stage the pipeline calls is replaced by a recorder that calls through, so the deployment really comes up;
a call counts only when the pipeline's own code made it (a stage calling another stage is not the pipeline's path).
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from rich.console import Console

from pdctl.lifecycle import down, up
from pdctl.lifecycle.bringup import nixl_check, pipeline, provision
from pdctl.lifecycle.changes import lb, live, routers_live
from pdctl.lifecycle.hosts import gpu_memory, launch
from tests.lifecycle.conftest import MakeTopo

pytestmark = pytest.mark.slow

PIPELINE = pipeline.__file__

# (module, attribute, the stage's name in the record): the pipeline's own names, then the stage modules it calls into
STAGES: tuple[tuple[ModuleType, str, str], ...] = (
    (pipeline, "deployment_lock", "lock"),
    (pipeline, "plan", "plan"),
    (pipeline, "connected", "connect"),
    (pipeline, "stop_all", "stop"),
    (launch, "running", "running"),
    (pipeline, "decide_or_refuse", "decide"),
    (gpu_memory, "used", "gpu memory"),
    (pipeline, "preflight", "preflight"),
    (lb, "check_binary", "lb binary"),
    (pipeline, "ensure_key", "engine key"),
    (provision, "provision", "provision"),
    (launch, "start", "start"),
    (pipeline, "wait_healthy", "wait"),
    (nixl_check, "check_launched", "transport"),
    (live, "write_members", "members"),
    (lb, "write_config", "lb config"),
    (routers_live, "apply", "routers"),
    (live, "converge", "converge"),
    (pipeline, "smoke_test", "smoke"),
    (nixl_check, "check_shared_gpu_rate", "shared gpu rate"),
)


def _detail(stage: str, args: tuple[Any, ...]) -> str:
    """What a call was about, where the order among several calls of one stage matters."""
    if stage == "start":
        return str(args[1].name)
    if stage == "wait":
        return ",".join(s.name for s in args[0])
    return ""


class UpCalls:
    """The stages the pipeline calls, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def wrap(self, stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            if sys._getframe(1).f_code.co_filename == PIPELINE:
                with self._lock:
                    self.calls.append((stage, _detail(stage, args)))
            return fn(*args, **kwargs)

        return recorded

    def take(self) -> list[tuple[str, str]]:
        calls, self.calls = self.calls, []
        return calls


@pytest.fixture
def up_calls(monkeypatch: pytest.MonkeyPatch) -> UpCalls:
    calls = UpCalls()
    for module, name, stage in STAGES:
        monkeypatch.setattr(module, name, calls.wrap(stage, getattr(module, name)))
    return calls


def test_up_calls_its_stages_in_order(make_topo: MakeTopo, console: Console, up_calls: UpCalls) -> None:
    topo = make_topo()
    dep = up(topo, console)
    assert dep.started == ["decode-0", "prefill-0", "router"]
    assert up_calls.take() == [
        ("lock", ""), ("plan", ""), ("connect", ""), ("running", ""), ("decide", ""),
        ("preflight", ""), ("engine key", ""), ("provision", ""),
        ("start", "decode-0"), ("start", "prefill-0"), ("wait", "decode-0,prefill-0"), ("transport", ""),
        ("members", ""), ("start", "router"), ("wait", "router"), ("routers", ""), ("converge", ""),
        ("smoke", ""), ("shared gpu rate", ""),
    ]

    # a second `up` verifies: nothing is prepared or started, the health waits and the smoke test run again
    again = up(topo, console)
    assert again.started == [] and again.kept == ["decode-0", "prefill-0", "router"]
    assert up_calls.take() == [
        ("lock", ""), ("plan", ""), ("connect", ""), ("running", ""), ("decide", ""),
        ("wait", "decode-0,prefill-0"), ("transport", ""),
        ("members", ""), ("wait", "router"), ("routers", ""), ("converge", ""),
        ("smoke", ""), ("shared gpu rate", ""),
    ]

    # `--restart`: everything stopped first, then the same path as the first `up`
    up(topo, console, pipeline.UpOptions(restart=True, smoke=False))
    calls = up_calls.take()
    assert calls[:5] == [("lock", ""), ("plan", ""), ("connect", ""), ("stop", ""), ("running", "")]
    assert [c for c in calls if c[0] == "start"] == [("start", "decode-0"), ("start", "prefill-0"),
                                                     ("start", "router")]
    assert "smoke" not in [stage for stage, _ in calls]
    down(topo, console)


def test_every_recorded_stage_is_the_pipelines() -> None:
    """The recorders above stand where the pipeline looks its stages up: a stage renamed or called another way
    fails here rather than silently dropping out of the recorded path."""
    for module, name, _ in STAGES:
        assert callable(getattr(module, name)), f"{module.__name__}.{name}"
    source = Path(PIPELINE).read_text(encoding="utf-8")
    for module, name, _ in STAGES:
        called = f"{name}(" if module is pipeline or module is provision else f".{name}("
        assert called in source, f"the pipeline no longer calls {module.__name__}.{name}"
