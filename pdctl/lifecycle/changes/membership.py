"""The router's members, from pdctl's side: write its members file through the router node's transport, SIGHUP
the router, and watch its /stats (over the same transport) until the change is applied or a member drained.

The router re-reads the file on SIGHUP (pdctl.router.server.membership); nothing is restarted and no connection
is dropped. pdctl never dials a node itself: the file, the signal and the HTTP all go through `Transport`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection

import httpx

from pdctl.errors import LaunchError
from pdctl.remote.base import Transport
from pdctl.remote.shell import expand_home
from pdctl.router.wire import Members

__all__ = ["Members", "applied", "read", "reload", "stats", "wait_applied", "wait_drained", "write"]
from pdctl.router.wire import RouterStats, UpstreamStats
from pdctl.state import ProcessRecord

POLL_S = 0.2
APPLY_TIMEOUT_S = 30.0


def write(transport: Transport, path: str, m: Members) -> None:
    target = expand_home(path)
    script = (f"mkdir -p \"$(dirname {target})\" && cat > {target}.tmp.$$ && mv {target}.tmp.$$ {target}")
    transport.check(script, stdin=json.dumps(m.to_json(), indent=1).encode(), timeout=30.0)


def read(transport: Transport, path: str) -> dict[str, object] | None:
    """The members file on the router's node as written, or None where there is none (or it is not JSON)."""
    text = transport.read_text(path)
    try:
        doc = json.loads(text) if text else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def reload(transport: Transport, router: ProcessRecord) -> None:
    """SIGHUP to the router pdctl started (its recorded pid): it re-reads its members file."""
    transport.signal([router.pid], [], "HUP")


def stats(transport: Transport, url: str) -> RouterStats | None:
    try:
        with httpx.Client(transport=transport.http(), timeout=5.0) as client:
            return RouterStats.from_json(client.get(f"{url}/stats").json())
    except (httpx.HTTPError, ValueError):
        return None


def _pools(s: RouterStats) -> dict[str, UpstreamStats]:
    return {u.url: u for u in (*s.prefill, *s.decode)}


def applied(s: RouterStats, m: Members, leaving: Collection[str] = ()) -> bool:
    """Whether the router's pools show `m`: every member there, draining as the file says; `leaving` URLs
    (left out of the file) may still be there, draining, until idle."""
    pools = _pools(s)
    wanted = {*m.prefill, *m.decode}
    for url in wanted:
        if url not in pools:
            if url in m.draining:
                continue  # it already left
            return False
        if pools[url].draining != (url in m.draining):
            return False
    return all(url in wanted or (url in leaving and u.draining) for url, u in pools.items())


def wait_applied(transport: Transport, router_url: str, m: Members, leaving: Collection[str] = (),
                 timeout: float = APPLY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = stats(transport, router_url)
        if s is not None and applied(s, m, leaving):
            return
        time.sleep(POLL_S)
    raise LaunchError(
        f"the router at {router_url} did not apply its new members within {timeout:g}s",
        hint="see its log (`pdctl logs -t <topology> router`); `pdctl up` again retries, `pdctl up --restart` "
        "restarts everything",
    )


def wait_drained(transport: Transport, router_url: str, url: str, timeout: float) -> None:
    """Until nothing is in flight on `url` and (a decode) no handle or release of the router's points at it."""
    deadline = time.monotonic() + timeout
    left: UpstreamStats | None = None
    while time.monotonic() < deadline:
        s = stats(transport, router_url)
        if s is not None:
            left = _pools(s).get(url)
            if left is None or (left.draining and not left.outstanding and not left.held):
                return
        time.sleep(POLL_S)
    busy = f"{left.outstanding} request(s) in flight, {left.held} handle(s)" if left else "the router did not answer"
    raise LaunchError(
        f"{url} did not drain within {timeout:g}s ({busy}); it is still running, taking no new turns",
        hint="`pdctl up` again waits again; `pdctl up --timeout <s>` waits longer",
    )
