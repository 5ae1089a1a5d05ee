#!/usr/bin/env python3
"""Three pieces of the router's per-request CPU timed alone, in-process, best of 7: what router_cpu_bench.py cannot
resolve on a shared host (its run-to-run spread is 20 % and more; these are a few microseconds).

  entry      a streaming POST /v1/completions through the router's ASGI app (request id, API key, JSON body,
             conversation headers, the request counter) around a handler that sends a head and 4 events
  metrics    one turn's counts: the request, its reuse outcome and KV source, KV moved, TTFT, prefill time, a release
  releases   a release from `submit` to done, the client answering at once (the bookkeeping, no I/O)

Run it from a checkout (PYTHONPATH at its root) to time that checkout's code; an A/B is two checkouts alternated:

    PYTHONPATH=. python scripts/router_cpu_micro.py
"""

from __future__ import annotations

import argparse
import asyncio
import time
import timeit
from array import array
from typing import Any

from prometheus_client import CollectorRegistry

from pdctl.router.config import RouterConfig
from pdctl.router.kv.handles import Handle
from pdctl.router.kv.release import ReleaseMetrics, Releaser
from pdctl.router.server import app as appmod
from pdctl.router.server.routes import Route, RouteTable
from pdctl.router.turn.metrics import RouterMetrics
from pdctl.router.upstream.client import Whole
from pdctl.router.upstream.pools import Pool

REPEAT = 7


async def _handler(state: Any, ctx: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    for _ in range(3):
        await send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


async def entry(n: int) -> float:
    appmod.ROUTES = RouteTable([Route("/v1/completions", "POST", _handler)])  # read when the app is built
    app = appmod.create_app(RouterConfig(prefill=("http://p",), decode=("http://d",)))
    body = b'{"model":"m","prompt":"hello there","max_tokens":8,"stream":true}'
    headers = [(b"host", b"x"), (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
               (b"user-agent", b"x"), (b"accept", b"*/*")]
    message = {"type": "http.request", "body": body, "more_body": False}

    async def receive() -> dict[str, Any]:
        return message

    async def send(_: Any) -> None:
        pass

    best = float("inf")
    for _ in range(REPEAT):
        t = time.perf_counter()
        for _ in range(n):
            scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": headers,
                     "query_string": b"", "http_version": "1.1"}
            await app(scope, receive, send)
        best = min(best, (time.perf_counter() - t) / n)
    return best


def metrics(n: int) -> float:
    m = RouterMetrics()

    def turn() -> None:
        m.request("/v1/completions", 200)
        m.reuse_outcome("miss", "new_conversation", 0, False)
        m.moved(0, 512)
        m.ttft_seconds.observe(0.004)
        m.prefill_seconds.observe(0.002)
        m.releases.count("evicted", "sent")

    return min(timeit.repeat(turn, number=n, repeat=REPEAT)) / n


class _Client:
    async def post_whole(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> Whole:
        await asyncio.sleep(0)
        return Whole(200, b"{}")


async def releases(n: int) -> float:
    r = Releaser(Pool("prefill", ["http://p:1"]), Pool("decode", ["http://d:1"]), "m",
                 ReleaseMetrics(CollectorRegistry()), 64)
    r.client = _Client()  # type: ignore[assignment]
    params = {"remote_num_tokens": 512, "remote_block_ids": list(range(32)), "remote_engine_id": "e",
              "remote_request_id": "r", "remote_host": "h", "remote_port": 1}
    h = Handle("c", params, "http://d:1", array("q", range(512)), 0.0, 1e9)
    best = float("inf")
    for _ in range(REPEAT):
        t = time.perf_counter()
        for i in range(n):
            r.submit(h, "evicted")
            if i % 4 == 3:  # a turn's worth of loop steps between releases
                await asyncio.sleep(0)
                await asyncio.sleep(0)
        await r.drained(30)
        best = min(best, (time.perf_counter() - t) / n)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=("entry", "metrics", "releases"), action="append", help="repeatable")
    ap.add_argument("--label", default="", help="printed before each line (before, after)")
    args = ap.parse_args()
    try:
        import uvloop
        run = uvloop.run
    except ImportError:
        run = asyncio.run
    for what in args.only or ("entry", "metrics", "releases"):
        us = (run(entry(20_000)) if what == "entry" else metrics(20_000) if what == "metrics"
              else run(releases(5_000))) * 1e6
        print(f"{args.label}{' ' if args.label else ''}{what}: {us:.2f} us (best of {REPEAT})", flush=True)


if __name__ == "__main__":
    main()
