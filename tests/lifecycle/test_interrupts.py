"""Interrupts' signal handler, in this process: a real SIGINT to the main thread while a step must finish."""

from __future__ import annotations

import os
import signal

import pytest

from pdctl.lifecycle.hosts.interrupts import Interrupts

REENTRANT = "reentrant call inside <_io.BufferedWriter name='<stderr>'>"


def _ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)  # the handler runs at the next bytecode of the main thread


def test_a_ctrl_c_that_lands_inside_a_write_to_stderr_is_still_said_and_counted(
        capfd: pytest.CaptureFixture[str]) -> None:
    # The second Ctrl-C of `pdctl bench` arrived while rich was writing the first one's note to stderr: the
    # handler's own line then hit Python's buffered writer mid-write, whose RuntimeError ended the command with an
    # internal error and exit 1 instead of finishing the report (a fresh-clone run of tests/bench/test_interrupt.py).
    def busy_stderr(text: str) -> None:
        raise RuntimeError(REENTRANT)

    ctrl_c = Interrupts(busy_stderr)
    with ctrl_c.installed(), ctrl_c.finishing("writing the report"):
        _ctrl_c()
    assert ctrl_c.count == 1
    assert "interrupt received: finishing writing the report" in capfd.readouterr().err


def test_a_say_that_fails_otherwise_is_not_hidden() -> None:
    def broken(text: str) -> None:
        raise RuntimeError("something else")

    ctrl_c = Interrupts(broken)
    with pytest.raises(RuntimeError, match="something else"), ctrl_c.installed(), ctrl_c.finishing("a step"):
        _ctrl_c()


def test_a_said_ctrl_c_goes_through_say_when_it_can() -> None:
    said: list[str] = []
    ctrl_c = Interrupts(said.append)
    with ctrl_c.installed(), ctrl_c.finishing(lambda: "the step named now"):
        _ctrl_c()
    assert said == ["interrupt received: finishing the step named now"]
