"""Whole server-sent events out of a byte stream that arrives in arbitrary chunks.

Events end at a blank line (`\n\n`); a partial one waits in the buffer for the next chunk. Used wherever the
router reads an upstream's SSE answer and re-emits it (decode capture, batched prompts, agent-API translation).
"""

from __future__ import annotations


class SseEvents:
    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        """The events this chunk completes, without their terminating blank line."""
        buf = self._buf + data
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            self._buf = buf
            return []
        self._buf = buf[cut + 2 :]
        return buf[:cut].split(b"\n\n")

    def rest(self) -> list[bytes]:
        """At the stream's end: what is left, as one last event unless it is blank."""
        rest, self._buf = self._buf, b""
        return [rest] if rest.strip() else []
