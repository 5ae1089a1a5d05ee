"""Each decode's KV capacity, read from its /metrics (`vllm:cache_config_info`), for the pin budget (pins.py).

Read once per decode process: a decode that restarts (a new generation, upstream/pools.py) may have another capacity,
so it is read again. A decode whose /metrics does not say (an engine other than vLLM, an older vLLM) gets no
budget, and the log says so once with the knob that sets one.
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from pdctl.router.kv.pins import budget_for, kv_capacity
from pdctl.router.upstream.pools import Pool

log = logging.getLogger("pdctl.router")


class Capacities:
    def __init__(self, tokens: int, fraction: float) -> None:
        self.tokens, self.fraction = tokens, fraction
        self._known: dict[str, tuple[int, int | None]] = {}  # url -> (generation, capacity in tokens)

    @property
    def needed(self) -> bool:
        return self.tokens <= 0 < self.fraction

    def budget(self, url: str) -> int:
        known = self._known.get(url)
        return budget_for(self.tokens, self.fraction, known[1] if known else None)

    def budgets(self, pool: Pool) -> dict[str, int]:
        return {u.url: b for u in pool.members if (b := self.budget(u.url))}

    async def learn(self, pool: Pool, client: httpx.AsyncClient, timeout: float) -> None:
        """Read the capacity of every healthy decode not yet read in its current process."""
        for u in pool.healthy():
            known = self._known.get(u.url)
            if known is not None and known[0] == u.generation:
                continue
            try:
                resp = await client.get(f"{u.url}/metrics", timeout=timeout)
            except httpx.HTTPError:
                continue
            if resp.status_code != 200:
                continue
            capacity = kv_capacity(resp.text)
            if capacity is None and known is None:
                log.warning("decode %s does not report its KV capacity (no vllm:cache_config_info in /metrics): no "
                            "pin budget for it; set router.pin_budget_tokens (--pin-budget-tokens)", u.url)
            self._known[u.url] = (u.generation, capacity)

    async def loop(self, pool: Pool, client: httpx.AsyncClient, interval: float, timeout: float) -> None:
        while self.needed:
            await self.learn(pool, client, timeout)
            await asyncio.sleep(interval)
