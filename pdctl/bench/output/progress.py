"""The bench's progress on stderr: rich bars on a terminal; elsewhere (CI logs, pipes) plain lines, one per
finished conversation and at least one every 10 s, so a long leg never looks hung.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

from rich.console import Console

from pdctl.bench.output.render import RichProgress
from pdctl.bench.results.records import RequestRecord

HEARTBEAT_S = 10.0


class LineProgress:
    """Plain progress lines; a background timer adds a line whenever 10 s pass without one."""

    def __init__(self, console: Console, turns: int, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.console = console
        self.turns = turns
        self.heartbeat_s = heartbeat_s
        self.lock = threading.RLock()  # a Ctrl-C's note may come from a signal handler while a line prints
        self.stop = threading.Event()
        self.timer: threading.Thread | None = None
        self.leg = ""
        self.total = 0
        self.done = 0
        self.failed = 0
        self.conversations = 0
        self.started = time.monotonic()
        self.last_line = time.monotonic()

    def __enter__(self) -> LineProgress:
        self.timer = threading.Thread(target=self._beat, name="bench-progress", daemon=True)
        self.timer.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop.set()
        if self.timer is not None:
            self.timer.join()

    def leg_started(self, name: str, total: int) -> None:
        with self.lock:
            self.leg, self.total, self.done, self.failed, self.conversations = name, total, 0, 0, 0
            self.started = time.monotonic()
            self._print(f"leg {name}: {total} requests")

    def request_done(self, record: RequestRecord) -> None:
        with self.lock:
            self.done += 1
            self.failed += 0 if record.ok else 1
            if not record.ok or record.turn + 1 >= self.turns:
                self.conversations += 1
                self._print(f"leg {self.leg}: conversation {record.conversation_id} done ({self._counts()})")

    def note(self, text: str) -> None:
        with self.lock:
            self._print(text)

    def _counts(self) -> str:
        failed = f", {self.failed} failed" if self.failed else ""
        return f"{self.done}/{self.total} requests{failed}, {time.monotonic() - self.started:.0f} s"

    def _print(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False)
        self.last_line = time.monotonic()

    def _beat(self) -> None:
        while not self.stop.wait(1.0):
            with self.lock:
                quiet = time.monotonic() - self.last_line >= self.heartbeat_s
                if self.leg and self.done < self.total and quiet:
                    self._print(f"leg {self.leg}: {self._counts()}")


def make_progress(console: Console, turns: int) -> RichProgress | LineProgress:
    """Bars where a person watches a terminal, lines where the output is recorded."""
    return RichProgress(console) if console.is_terminal else LineProgress(console, turns)
