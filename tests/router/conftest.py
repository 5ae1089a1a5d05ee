"""Router test fixtures: real simulator processes (tests.support.sim_procs) and a real router process."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import free_port
from tests.support.relay import late_end
from tests.support.sim_procs import SERVED, SimPair, SimProc, sim_pair, stop_group, wait_for_health

SPEED = 1000
BLOCK = 16


@dataclass
class RouterProc:
    url: str
    log_path: Path
    proc: subprocess.Popen[bytes]

    def stats(self, **headers: str) -> dict[str, Any]:
        return httpx.get(f"{self.url}/stats", headers=headers, timeout=10).json()

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        stop_group(self.proc)


def start_router(log_dir: Path, prefill: Sequence[str], decode: Sequence[str], *args: str,
                 env: dict[str, str] | None = None, name: str = "router") -> RouterProc:
    port = free_port()
    # These tests exercise the P/D handshake on every warm turn: conditional disaggregation (on by default) is off
    # unless a test asks for it.
    if not any(a.startswith("--local-prefill-tokens") for a in args):
        args = ("--local-prefill-tokens", "0", *args)
    # ... and so do their D->P reads of short histories: the cheapest-source rule (--min-read-tokens, issue 29)
    # is off unless a test asks for it.
    if not any(a.startswith("--min-read-tokens") for a in args):
        args = ("--min-read-tokens", "0", *args)
    argv = [sys.executable, "-m", "pdctl", "router", "serve", "--host", "127.0.0.1", "--port", str(port),
            *(a for u in prefill for a in ("--prefill", u)), *(a for u in decode for a in ("--decode", u)),
            "--model", SERVED, "--block-size", str(BLOCK), "--health-interval", "0.5", *args]
    log_path = Path(log_dir) / f"{name}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    router = RouterProc(f"http://127.0.0.1:{port}", log_path, proc)
    wait_for_health("router", router.url, proc, router.log_text, router.stop, 30)
    return router


@contextlib.contextmanager
def router_process(log_dir: Path, prefill: Sequence[str], decode: Sequence[str], *args: str,
                   **kwargs: Any) -> Iterator[RouterProc]:
    router = start_router(log_dir, prefill, decode, *args, **kwargs)
    try:
        yield router
    finally:
        router.stop()


def corrupt(*sims: SimProc) -> float:
    """The simulator's integrity oracle: reuses whose KV was not the prompt's prefix. Must stay 0."""
    return sum(s.metric("pdctl_sim_corrupt_reuse_total") for s in sims)


_UPSTREAM = re.compile(rb"127\.0\.0\.1:\d+")


def assert_clean(raw: bytes, headers: httpx.Headers) -> None:
    """Nothing internal reaches a client: no KV params, no token ids it did not ask for, no upstream hosts."""
    assert b"kv_transfer_params" not in raw
    assert b"token_ids" not in raw
    assert not _UPSTREAM.search(raw)
    assert not any(_UPSTREAM.search(v.encode()) for v in headers.values())


@pytest.fixture(scope="session")
def pd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimPair]:
    with sim_pair(tmp_path_factory.mktemp("pd"), speed=SPEED, block_size=BLOCK) as pair:
        yield pair


@pytest.fixture(scope="session")
def router(pd: SimPair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProc]:
    with router_process(tmp_path_factory.mktemp("router"), [pd.prefill_url], [pd.decode_url]) as r:
        yield r


AGENT_KEY = "agent-key-" + os.urandom(6).hex()


@pytest.fixture(scope="session")
def agent_router(pd: SimPair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProc]:
    """A router with an API key, a small body limit and its own conversation header (the agent-API tests)."""
    with router_process(tmp_path_factory.mktemp("agents"), [pd.prefill_url], [pd.decode_url],
                        "--api-key-env", "PDCTL_TEST_AGENT_KEY", "--max-body-bytes", "20000",
                        "--conversation-header", "X-My-Conversation", "--conversation-header", "X-Session-ID",
                        env={"PDCTL_TEST_AGENT_KEY": AGENT_KEY}, name="agents") as r:
        yield r


@pytest.fixture(scope="session")
def late(pd: SimPair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProc]:
    """A router whose decode's streams close 150 ms after their `[DONE]` (tests.support.relay), as a busy
    engine's may: a client that sends its next turn at `[DONE]` is there well before that."""
    logs = tmp_path_factory.mktemp("late")
    with late_end(logs, pd.decode_url, 150) as decode, router_process(logs, [pd.prefill_url], [decode]) as r:
        yield r
