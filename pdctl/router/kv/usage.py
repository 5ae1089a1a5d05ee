"""Each engine's KV in use, as the router sees it without asking on a turn's path: the engine's own
`vllm:kv_cache_usage_perc`, polled from its /metrics in the background a few times a second, plus the tokens the
router has sent it since that poll began (a burst of turns between two polls does not overshoot).

The overflow rule (overflow.py) reads it. An engine whose /metrics does not report its usage has none (None):
the rule never sends a turn on its account. Its capacity (`vllm:cache_config_info`, pins.kv_capacity) turns the
tokens sent into a fraction; without it the sent tokens are not counted.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from dataclasses import dataclass

import httpx

from pdctl.router.kv.pins import kv_capacity
from pdctl.router.upstream.pools import Pool, Upstream

POLL_S = 0.25
_USAGE = re.compile(r"^vllm:kv_cache_usage_perc(?:\{[^}]*\})?\s+(\S+)", re.M)


def kv_usage(metrics: str) -> float | None:
    """The engine's KV use (0..1) from its /metrics text (the fullest of its label sets), or None."""
    found = [float(v) for v in _USAGE.findall(metrics) if _number(v)]
    return max(found) if found else None


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Seen:
    usage: float
    capacity: int | None  # tokens


class KvUse:
    def __init__(self) -> None:
        self._seen: dict[str, Seen] = {}
        self._sent: dict[str, int] = {}  # url -> tokens sent since the last poll began

    def sent(self, u: Upstream, tokens: int) -> None:
        self._sent[u.url] = self._sent.get(u.url, 0) + max(tokens, 0)

    def use(self, u: Upstream, extra_tokens: int = 0) -> float | None:
        """The engine's KV use with what was sent since its last poll and `extra_tokens` more; None: unknown."""
        seen = self._seen.get(u.url)
        if seen is None:
            return None
        if not seen.capacity:
            return seen.usage
        return seen.usage + (self._sent.get(u.url, 0) + max(extra_tokens, 0)) / seen.capacity

    def snapshot(self, pools: Iterable[Pool]) -> dict[str, float]:
        """What /stats shows: each engine's KV use as the rule sees it now (4 decimals)."""
        out = {}
        for pool in pools:
            for u in pool.members:
                v = self.use(u)
                if v is not None:
                    out[u.url] = round(v, 4)
        return out

    async def poll(self, u: Upstream, client: httpx.AsyncClient, timeout: float) -> None:
        mark = self._sent.get(u.url, 0)
        try:
            resp = await client.get(f"{u.url}/metrics", timeout=timeout)
        except httpx.HTTPError:
            return
        usage = kv_usage(resp.text) if resp.status_code == 200 else None
        if usage is None:
            self._seen.pop(u.url, None)
            return
        self._seen[u.url] = Seen(usage, kv_capacity(resp.text))
        self._sent[u.url] = self._sent.get(u.url, 0) - mark  # what went out after the poll began is not in it

    async def loop(self, pools: Iterable[Pool], client: httpx.AsyncClient, timeout: float) -> None:
        members = [u for pool in pools for u in pool.members]
        while True:
            await asyncio.gather(*(self.poll(u, client, timeout) for u in members if u.healthy))
            await asyncio.sleep(POLL_S)
