"""Where a warm turn runs: on the decode that holds its KV (conditional disaggregation) or through a prefill.

A local turn skips the prefill hop and both transfers, but its new tokens are a prefill chunk in the decode's
batch: every stream on that decode waits for it. Through a prefill it queues behind whatever the prefill is
computing (other conversations' cold prefills), then pays the read back and the pull. With what the router
knows (requests in flight per instance), the `load` policy runs the turn locally while the decode has fewer than
`busy_streams` requests in flight, and on a busy decode only when the prefill is busy too (anything in flight
there is a queue the turn would wait in); `always` is the size rule alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LocalPolicy = Literal["always", "load"]
POLICIES: tuple[LocalPolicy, ...] = ("always", "load")


@dataclass(frozen=True)
class Load:
    """Requests in flight on one instance, as the router counts them."""

    requests: int


def run_locally(policy: LocalPolicy, missing: int, limit: int, decode: Load, prefill: Load | None,
                busy_streams: int) -> bool:
    """A warm turn lacking `missing` tokens on its decode: run it there? `limit` is local_prefill_tokens,
    `busy_streams` the decode load from which the `load` policy prefers an idle prefill."""
    if limit <= 0 or missing > limit:
        return False
    if policy == "always" or prefill is None:
        return True
    if decode.requests < busy_streams:
        return True
    return prefill.requests > 0  # both busy: the prefill is no better a queue
