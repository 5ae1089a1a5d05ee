"""The bench's side reads of a deployment: health, the prefills' `/metrics` (or their logs), the router's `/stats`,
and a tokens-per-word ratio measured on an engine's `/tokenize`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import httpx

from pdctl.bench.leg.legs import Endpoints
from pdctl.bench.results.records import KvTransfer
from pdctl.bench.runner.collect import kv_from_log, nixl_delta
from pdctl.engine_metrics import KV_LOG_NEEDLE, Samples, has_nixl, parse_prometheus
from pdctl.errors import LaunchError
from pdctl.lifecycle.hosts.launch import health
from pdctl.remote.base import Transport
from pdctl.remote.shell import expand_home
from pdctl.router.wire import RouterStats

TIMEOUT = httpx.Timeout(30.0, connect=5.0)


def wait_healthy(targets: list[tuple[Transport, str]], timeout_s: float = 300.0) -> None:
    """Every `url/health` answers 200 (each through its host's transport), or LaunchError naming the first that
    did not."""
    deadline = time.monotonic() + timeout_s
    for transport, url in targets:
        while health(transport, f"{url}/health", timeout=5.0) != "ok":
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"{url}/health on {transport.name} did not answer 200 within {timeout_s:.0f} s",
                    hint="check `pdctl status`, or deploy with `pdctl up` and rerun the bench",
                )
            time.sleep(0.25)


def healthy(transport: Transport, url: str) -> bool:
    return health(transport, f"{url}/health", timeout=3.0) == "ok"


def router_stats(transport: Transport, url: str) -> RouterStats | None:
    """None when the router does not answer its /stats, or answers something else (the leg records nothing)."""
    try:
        with httpx.Client(timeout=TIMEOUT, transport=transport.http()) as client:
            resp = client.get(f"{url}/stats")
        return RouterStats.from_json(resp.json()) if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def tokens_per_word(transport: Transport, url: str, model: str, text: str) -> float | None:
    """How many of the engine's tokens one corpus word makes; None when `/tokenize` is not there."""
    words = len(text.split())
    try:
        with httpx.Client(timeout=TIMEOUT, transport=transport.http()) as client:
            resp = client.post(f"{url}/tokenize", json={"model": model, "prompt": text})
        count = int(resp.json()["count"]) if resp.status_code == 200 else 0
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None
    return count / words if count and words else None


class KvMeter:
    """KV transfer of the prefill instances over a span: `/metrics` deltas, else `KV Transfer metrics` log lines."""

    def __init__(self, ep: Endpoints, transports: Mapping[str, Transport] | None = None,
                 decodes: bool = False) -> None:
        """`decodes`: meter the decode instances' own reads (their P->D pulls) instead, from /metrics only."""
        self.ep = ep
        self.transports = transports or {}
        self._targets = (list(zip(ep.decode_urls, ep.decode_nodes, strict=False)) if decodes
                         else [(url, node) for url, (node, _) in zip(ep.prefill_urls, ep.prefill_logs, strict=False)])
        self._logs = () if decodes else ep.prefill_logs
        self._samples: Samples = {}
        self._log_lines: dict[str, int] = {}

    def metrics_available(self) -> bool:
        return has_nixl(self._scrape())

    def start(self) -> None:
        self._samples = self._scrape()
        self._log_lines = {path: self._line_count(node, path) for node, path in self._logs}

    def stop(self) -> KvTransfer:
        after = self._scrape()
        if has_nixl(after):
            return nixl_delta(self._samples, after)
        lines: list[str] = []
        for node, path in self._logs:
            lines += self._new_lines(node, path, self._log_lines.get(path, 0))
        kv = kv_from_log(lines)
        return kv if kv.transfers or kv.failed else KvTransfer()

    def _scrape(self) -> Samples:
        total: Samples = {}
        for url, node in self._targets:
            transport = self.transports.get(node)
            if transport is None:
                continue
            try:
                with httpx.Client(timeout=TIMEOUT, transport=transport.http()) as client:
                    resp = client.get(f"{url}/metrics")
            except httpx.HTTPError:
                continue
            if resp.status_code == 200:
                for k, v in parse_prometheus(resp.text).items():
                    total[k] = total.get(k, 0.0) + v
        return total

    def _line_count(self, node: str, path: str) -> int:
        transport = self.transports.get(node)
        if transport is None:
            return 0
        res = transport.run(f"wc -l < {expand_home(path)} 2>/dev/null || echo 0")
        return int(res.stdout.strip() or 0) if res.stdout.strip().isdigit() else 0

    def _new_lines(self, node: str, path: str, since: int) -> list[str]:
        transport = self.transports.get(node)
        if transport is None:
            return []
        res = transport.run(f"tail -n +{since + 1} {expand_home(path)} 2>/dev/null | grep -F '{KV_LOG_NEEDLE}'")
        return res.stdout.splitlines()
