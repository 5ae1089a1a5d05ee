"""Ctrl-C for a command that must finish some steps whatever happens (write a report, end a step on a host, leave a
deployment in a state it can name): while work that may stop runs, the first Ctrl-C stops it (KeyboardInterrupt,
or a cancel the work registered); from then on, and while a step that must finish runs, each Ctrl-C is said at
once ("interrupt received: finishing <step>") and counted, never raised. Main thread only: elsewhere, and with no
`Interrupts` installed, Ctrl-C is Python's own.

    ctrl_c = Interrupts(say)
    with ctrl_c.installed():
        with ctrl_c.stops("writing the report"):      # the first Ctrl-C raises KeyboardInterrupt in here
            play()
        with ctrl_c.finishing("writing the report"):  # held: said and counted
            write()
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from types import FrameType

_current: list[Interrupts] = []
Step = str | Callable[[], str]  # what is being finished, or how to say it at the moment of the Ctrl-C


def current() -> Interrupts | None:
    """The `Interrupts` installed on the main thread now, if any."""
    return _current[-1] if _current else None


class Interrupts:
    """Counts and says Ctrl-C; `count` is how many arrived while installed."""

    def __init__(self, say: Callable[[str], None], step: Step = "what it is doing") -> None:
        self.say = say
        self.count = 0
        self._step: Step | None = step  # None: the next Ctrl-C stops the work
        self._then: Step = step
        self._said: str | None = None
        self._cancel: Callable[[], None] | None = None
        self._in_stops = False
        self._previous: object = None

    @contextmanager
    def installed(self) -> Iterator[Interrupts]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        self._previous = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, self._handle)
        _current.append(self)
        try:
            yield self
        finally:
            _current.remove(self)
            signal.signal(signal.SIGINT, self._previous)

    @contextmanager
    def stops(self, then: str, said: str | None = None, cancel: Callable[[], None] | None = None) -> Iterator[None]:
        """Within: the first Ctrl-C stops the work (`cancel()` when given, else KeyboardInterrupt), saying `said`
        when given; the ones after it are said as finishing `then`. Inside another `stops`, only `cancel` changes:
        the enclosing block's first Ctrl-C is the one that stops."""
        if self._in_stops:
            outer = self._cancel
            self._cancel = cancel or outer
            try:
                yield
            finally:
                self._cancel = outer
            return
        saved = self._step
        self._in_stops, self._step, self._then, self._said, self._cancel = True, None, then, said, cancel
        try:
            yield
        finally:
            self._in_stops, self._step, self._cancel = False, saved, None

    @contextmanager
    def finishing(self, step: Step) -> Iterator[None]:
        """Within: each Ctrl-C is said as finishing `step`, and counted."""
        saved = self._step
        self._step = step
        try:
            yield
        finally:
            self._step = saved

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        self._tell_previous(signum, frame)
        if self._step is None:
            self._step = self._then
            if self._said:
                self._say(self._said)
            if self._cancel is not None:
                self._cancel()
                return
            raise KeyboardInterrupt
        step = self._step() if callable(self._step) else self._step
        self._say(f"interrupt received: finishing {step}")

    def _say(self, text: str) -> None:
        """Say `text` from the signal handler. The handler runs between two bytecodes of the main thread, which may be
        inside a write to the same stream: Python's buffered writer refuses that reentrant call (RuntimeError), which
        would end the command with an internal error at the moment it must finish its steps. Then the line goes
        straight to the terminal's file descriptor (stderr), beside whatever the interrupted write was printing."""
        try:
            self.say(text)
        except RuntimeError as exc:
            if "reentrant call" not in str(exc):
                raise
            with suppress(OSError):
                os.write(2, f"{text}\n".encode())

    def _tell_previous(self, signum: int, frame: FrameType | None) -> None:
        """The handler this one replaced also hears of the Ctrl-C (the CLI's records it, to end the process at once
        when the command returns); what it raises is the caller's to decide, so it is dropped here."""
        previous = self._previous
        if callable(previous) and previous is not signal.default_int_handler:
            with suppress(KeyboardInterrupt):
                previous(signum, frame)
