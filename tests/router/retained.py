"""Helpers of the retention and journal tests: a sim pair with a small decode KV, routers on one state dir, turns of
conversations by explicit id, and the decode's blocks as the simulator counts them."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.router.conftest import BLOCK, SPEED, RouterProc, start_router
from tests.router.faults import eventually
from tests.support.sim_procs import SimPair, SimProc, kv_config, sim_pair

NUM_BLOCKS = 240
LEASE_S = 1.0


def used_blocks(sim: SimProc) -> int:
    return round(sim.metric("vllm:kv_cache_usage_perc") * NUM_BLOCKS)


@contextlib.contextmanager
def small_pair(tmp_path: Path, num_blocks: int = NUM_BLOCKS) -> Iterator[SimPair]:
    """A sim pair of its own: a decode of `num_blocks` blocks that nothing else pins."""
    with sim_pair(tmp_path, speed=SPEED, block_size=BLOCK, num_blocks=num_blocks,
                  prefill_args=("--kv-transfer-config", kv_config("prefill", threshold=0, lease=LEASE_S))) as pd:
        yield pd


def router_on(pd: SimPair, tmp_path: Path, state: Path, *args: str, name: str = "router") -> RouterProc:
    """A router on `state` (its pin journal's directory), with no pin budget: only KV pressure releases."""
    return start_router(tmp_path, [pd.prefill_url], [pd.decode_url], "--state-dir", str(state),
                        "--pin-budget-fraction", "0", *args, name=name)


def sigkill(router: RouterProc) -> None:
    """Kill the router once its journal file holds every pin it has (it appends a few times a second)."""
    assert eventually(lambda: (j := retention(router)["journal"])["written"] == j["pins"] > 0), retention(router)
    os.killpg(router.proc.pid, signal.SIGKILL)
    router.proc.wait(timeout=10)


def journals(state: Path) -> list[str]:
    return sorted(p.name for p in (state / "kv-journal").glob("*.journal"))


@dataclass
class Chat:
    """One conversation by explicit id (`conversation_id` in the body): its turns and what the router said."""

    url: str
    cid: str
    words: int = 40
    messages: list[dict[str, Any]] = field(default_factory=list)

    def turn(self, headers: dict[str, str] | None = None, max_tokens: int = 8) -> tuple[int, str, str]:
        """(status, outcome, reason) of the next turn."""
        user = " ".join(f"{self.cid[:8]}-{len(self.messages)}-{i}" for i in range(self.words))
        messages = [*self.messages, {"role": "user", "content": user}]
        body = {"model": "Qwen", "messages": messages, "max_tokens": max_tokens, "conversation_id": self.cid}
        r = httpx.post(f"{self.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
        if r.status_code == 200:
            self.messages = [*messages, {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]}]
        reuse = r.headers.get("x-pd-kv-reuse", "")
        return r.status_code, reuse.split(";")[0], reuse.rsplit("reason=", 1)[-1]


def retention(router: RouterProc) -> dict[str, Any]:
    section: dict[str, Any] = router.stats()["retention"]
    return section


def released(router: RouterProc, reason: str, results: tuple[str, ...] = ("sent", "carried")) -> int:
    """Releases done for `reason`: sent alone or carried on a turn's prefill request (release.py)."""
    by_result = retention(router)["releases"].get(reason, {})
    return sum(int(by_result.get(r, 0)) for r in results)
