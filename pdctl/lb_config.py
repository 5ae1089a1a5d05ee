"""Pure: the HAProxy configuration in front of several routers (`router.replicas` > 1).

A conversation is hashed, consistently, to one router: the first of the routers' conversation headers the request
carries (`router.conversation_headers`, else the router's own list), else its `Authorization` header, else the
client's address. Routers share no handles, so a turn that lands on another router (one was added, drained or
died) misses once and recomputes; it never reuses KV another router placed. The file holds no key: the routers'
/health needs none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

LB_KEY_VAR = "txn.pdctl_conversation"
HEALTH_INTERVAL_MS = 500
BACKEND = "routers"


@dataclass(frozen=True)
class Backend:
    name: str  # router-0 ...
    host: str
    port: int


def haproxy_config(bind: str, port: int, routers: Sequence[Backend], headers: Sequence[str],
                   admin_socket: str) -> str:
    """The whole haproxy.cfg: logs to stdout (HAProxy runs in the foreground, `-db`, its stdout is its log file),
    an admin socket for draining one router (`set server routers/router-1 state drain`), health checks on /health,
    a retry elsewhere when a router refuses the connection (nothing reached it, so nothing ran twice), and the
    router that served each response in its `X-PD-Router` header."""
    keys = [f"    http-request set-var({LB_KEY_VAR}) req.hdr(authorization) if {{ req.hdr(authorization) -m found }}"]
    # set in reverse precedence: the last one that matches wins
    for h in reversed(headers):
        keys.append(f"    http-request set-var({LB_KEY_VAR}) req.hdr({h}) if {{ req.hdr({h}) -m found }}")
    servers = [
        f"    server {b.name} {b.host}:{b.port} check inter {HEALTH_INTERVAL_MS} fall 2 rise 2"
        for b in routers
    ]
    lines = [
        "# written by pdctl: `pdctl up` rewrites it",
        "global",
        "    log stdout format raw local0 info",
        f"    stats socket {admin_socket} mode 600 level admin",
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",
        "    option dontlognull",
        "    timeout connect 5s",
        "    timeout client 1h",
        "    timeout server 1h",
        "    timeout http-keep-alive 60s",
        "    retries 3",
        # a router that refused the connection, or closed it with no byte of an answer (a reused idle connection
        # to a router that died): nothing was sent back, so the request goes to another router
        "    retry-on conn-failure empty-response",
        "    option redispatch 1",
        "frontend clients",
        f"    bind {bind}:{port}",
        f"    default_backend {BACKEND}",
        f"backend {BACKEND}",
        "    http-request set-var(txn.pdctl_conversation) src",
        *keys,
        f"    balance hash var({LB_KEY_VAR})",
        "    hash-type consistent",
        "    http-response set-header X-PD-Router %[srv_name]",
        "    option httpchk GET /health",
        "    http-check expect status 200",
        *servers,
    ]
    return "\n".join(lines) + "\n"


def servers_of(text: str) -> dict[str, str]:
    """Pure: the routers a haproxy.cfg (as `haproxy_config` writes it) sends to: name -> host:port."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] == "server":
            out[words[1]] = words[2]
    return out


def server_diff(old_text: str | None, new: Sequence[Backend]) -> str:
    """Pure: how the routers of a new config differ from the old one's: "+router-3 -router-2", "router-1 moves
    to 127.0.0.1:9002", or "its settings" where the routers are the same."""
    old = servers_of(old_text or "")
    wanted = {b.name: f"{b.host}:{b.port}" for b in new}
    parts = [f"+{n}" for n in wanted if n not in old] + [f"-{n}" for n in old if n not in wanted]
    parts += [f"{n} moves to {a}" for n, a in wanted.items() if n in old and old[n] != a]
    return " ".join(parts) or "its settings"
