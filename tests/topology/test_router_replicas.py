"""`router.replicas` that the nodes cannot hold: `validate` names the file, line and key, and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdctl.lb_config import Backend, haproxy_config
from pdctl.plan import plan
from pdctl.topology import load
from tests.topology.test_validation import VALID, validate


@pytest.mark.parametrize(
    ("router", "expected"),
    [
        ("  replicas: 3\n  replica_port: 8099\n",
         "topo.yaml:25: router.replica_port: port 8100 on node `a` is already used by prefill[0].port "
         "(router-1 needs port 8100 on `a`: set router.replica_port to a range of 3 free ports, or place the "
         "routers on other router.replica_nodes)"),
        ("  replicas: 3\n  replica_nodes: [a, z]\n",
         "topo.yaml:25: router.replica_nodes[1]: no node named `z` (nodes are: a)"),
        ("  replicas: 3\n  replica_port: 65534\n",
         "topo.yaml:25: router.replica_port: router-2 would listen on port 65536 on node `a`: above 65535 "
         "(lower router.replica_port, spread the routers over more router.replica_nodes, or lower "
         "router.replicas)"),
        ("  replicas: 3\n",  # default replica_port = port + 1: 8001..8003, free
         None),
        ("  replicas: 2\n  conversation_headers: ['x-id bad']\n",
         "router.conversation_headers[0]: `x-id bad` is not a header name the load balancer can hash on (use "
         "letters, digits, `-` and `_` only (e.g. X-Conversation-Id))"),
    ],
)
def test_replicas_the_nodes_cannot_hold(tmp_path: Path, router: str, expected: str | None) -> None:
    text = VALID.replace("  port: 8000\n", "  port: 8000\n" + router, 1)
    code, output = validate(tmp_path, text)
    if expected is None:
        assert code == 0, output
        return
    assert code == 2, output
    assert expected in " ".join(output.split()), output
    assert "Traceback" not in output


def test_plan_puts_the_routers_behind_the_load_balancer(tmp_path: Path) -> None:
    path = tmp_path / "topo.yaml"
    path.write_text(VALID.replace("  port: 8000\n", "  port: 8000\n  replicas: 3\n", 1))
    specs = plan(load(path))
    routers = [s for s in specs if s.role == "router"]
    assert [(s.name, s.url) for s in routers] == [
        ("router-0", "http://127.0.0.1:8001"), ("router-1", "http://127.0.0.1:8002"),
        ("router-2", "http://127.0.0.1:8003")]
    lb = specs[-1]
    assert (lb.name, lb.role, lb.url, lb.argv[:3]) == (
        "lb", "lb", "http://127.0.0.1:8000", ("/usr/sbin/haproxy", "-W", "-db"))
    assert lb.log_path.endswith("/logs/lb.log") and lb.secret_env == {}


def test_haproxy_config_hashes_conversation_headers_then_authorization() -> None:
    text = haproxy_config("127.0.0.1", 8000, [Backend("router-0", "127.0.0.1", 8001)],
                          ["x-conversation-id", "x-session-id"], "/run/x/haproxy.sock")
    rules = [line.strip() for line in text.splitlines() if "set-var" in line or line.strip().startswith("balance")]
    assert rules == [  # set in reverse precedence: the last match wins
        "http-request set-var(txn.pdctl_conversation) src",
        "http-request set-var(txn.pdctl_conversation) req.hdr(authorization) if { req.hdr(authorization) -m found }",
        "http-request set-var(txn.pdctl_conversation) req.hdr(x-session-id) if { req.hdr(x-session-id) -m found }",
        "http-request set-var(txn.pdctl_conversation) req.hdr(x-conversation-id) if "
        "{ req.hdr(x-conversation-id) -m found }",
        "balance hash var(txn.pdctl_conversation)",
    ]
    assert "hash-type consistent" in text and "server router-0 127.0.0.1:8001 check" in text
