"""The responses the router keeps so that `previous_response_id` can be honoured: bounded, expiring, in memory.

An entry is the conversation so far as chat messages (input and output, without the instructions), the conversation
id its turn ran under, and its owner (turn/request.py's `owner`: the client's credentials and cache_salt). To anyone
else the id is unknown, so a response id never hands another client the history or the KV. An entry lives as long as
a decode handle does (`handle_lifetime`): past that the KV is gone too, and a follow-up gets a clear 400 telling the
client to resend its input. Entries and their total size are bounded; the least recently used go first.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pdctl.router import jsonx

MAX_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Kept:
    history: list[dict[str, Any]]
    conversation: str | None
    owner: str
    deadline: float
    size: int


class ResponseStore:
    def __init__(self, lifetime: float, max_entries: int, max_bytes: int = MAX_BYTES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lifetime = lifetime
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.clock = clock
        self.size = 0
        self._kept: OrderedDict[str, Kept] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def put(self, response_id: str, history: list[dict[str, Any]], conversation: str | None, owner: str) -> None:
        size = len(jsonx.dumps(history))
        if size > self.max_bytes:
            return
        self._kept[response_id] = Kept(history, conversation, owner, self.clock() + self.lifetime, size)
        self.size += size
        while len(self._kept) > self.max_entries or self.size > self.max_bytes:
            _, old = self._kept.popitem(last=False)
            self.size -= old.size

    def get(self, response_id: str, owner: str) -> Kept | None:
        """The kept response, or None when the router never had it, it expired, or it is not `owner`'s."""
        kept = self._kept.get(response_id)
        if kept is None or kept.owner != owner:
            return None
        if self.clock() >= kept.deadline:
            del self._kept[response_id]
            self.size -= kept.size
            return None
        self._kept.move_to_end(response_id)
        return kept
