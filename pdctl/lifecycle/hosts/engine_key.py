"""The deployment's engine API key: made at the first `up`, kept on every node of the deployment (mode 0600).

The value travels only over the transports (stdin of a command, the output of a read) and lives in pdctl's
memory; the plan, the state file, status output and logs carry the file's path, never the key.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

from pdctl.errors import LaunchError
from pdctl.plan import engine_key_path
from pdctl.remote.base import Transport
from pdctl.remote.fanout import parallel
from pdctl.remote.shell import expand_home
from pdctl.topology import Topology


def _nodes(topo: Topology) -> list[str]:
    return sorted({inst.node for _, _, inst in topo.instances()} | {topo.router.node})


def read_key(transport: Transport, topo: Topology, node: str) -> str | None:
    """The key on `node`, or None where none was written yet."""
    text = transport.read_text(engine_key_path(topo, node), max_bytes=4096)
    return text.strip() or None if text is not None else None


def ensure_key(topo: Topology, hosts: Mapping[str, Transport]) -> str:
    """The deployment's key, written to every node that lacks it; a new one when no node has one."""
    nodes = _nodes(topo)
    found = parallel(nodes, lambda n: read_key(hosts[n], topo, n))
    keys = {k for k in found.values() if k}
    if len(keys) > 1:
        differ = ", ".join(n for n, k in found.items() if k)
        raise LaunchError(
            f"{topo.name}: the engine key files differ between nodes ({differ})",
            hint=f"stop the deployment (`pdctl down`), remove {engine_key_path(topo, nodes[0])} on every node, "
            "then `pdctl up` makes a new key",
        )
    key = keys.pop() if keys else secrets.token_urlsafe(32)
    parallel([n for n in nodes if not found[n]], lambda n: _write(hosts[n], engine_key_path(topo, n), key))
    return key


def _write(transport: Transport, path: str, key: str) -> None:
    target = expand_home(path)
    # $$: nodes sharing one filesystem (a cluster's home) write the same file at once
    script = (f"umask 077; mkdir -p \"$(dirname {target})\" && cat > {target}.tmp.$$ && chmod 600 {target}.tmp.$$ "
              f"&& mv {target}.tmp.$$ {target}")
    transport.check(script, stdin=key.encode(), timeout=30.0)
