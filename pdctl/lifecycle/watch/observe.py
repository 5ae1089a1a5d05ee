"""`pdctl observe`: a Prometheus scrape configuration of a deployment and pdctl's Grafana dashboard, and, with
`start`, a real Prometheus on the router's node scraping it.

Every process of the plan is a target: each router (job `pdctl-router`) and each engine (job `pdctl-engines`), at
the address the router reaches it on, labelled `deployment`, `component` (router, prefill, decode, aggregated),
`process` and `node` (the dashboard's queries select on them; lifecycle/watch/dashboard.py). Keys stay in files: the
engine key (engines require it on their API; pdctl sends it to their /metrics too, for engines that guard it) and
the router's client key (router.api_key_env: the router guards /metrics with it) are referenced by
`authorization.credentials_file`, never written into the YAML, printed or logged.

- Rendered here (`out_dir`): prometheus.yml, pdctl-dashboard.json, and the key files beside them (mode 0600),
  read from the router's node. For a Prometheus that reaches the nodes' addresses.
- Started on the router's node (`start`): the same configuration in `<work_dir>/<name>/prometheus/` there,
  referencing the node's own engine key file (no copy), Prometheus run as one more process of the deployment (its
  marker: `pdctl down` stops it), listening on the node's address at `port`. The node needs the `prometheus`
  binary (Debian/Ubuntu: `apt-get install prometheus`; `prometheus_bin` for another path).
"""

from __future__ import annotations

import json
import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from pdctl.errors import LaunchError, UsageError
from pdctl.lifecycle.bringup.smoke import router_api_key
from pdctl.lifecycle.hosts import launch
from pdctl.lifecycle.hosts.connect import connected
from pdctl.lifecycle.hosts.engine_key import read_key
from pdctl.lifecycle.watch.dashboard import dashboard
from pdctl.markers import MARKER, NODE_VAR, PROCESS_VAR
from pdctl.plan import ProcessSpec, engine_key_path, plan, run_dir
from pdctl.remote.base import Transport
from pdctl.remote.procs import DetachedJob, unit_name
from pdctl.remote.shell import expand_home
from pdctl.topology import Topology

PROCESS = "prometheus"
DEFAULT_PORT = 9090
CONFIG = "prometheus.yml"
DASHBOARD = "pdctl-dashboard.json"
ENGINE_KEY = "engine.key"
ROUTER_KEY = "router.key"


@dataclass
class Observed:
    """What `observe` wrote and, with `start`, where its Prometheus listens."""

    files: list[str] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)  # process names scraped
    prometheus_url: str | None = None
    prometheus_node: str | None = None


def _component(spec: ProcessSpec) -> str:
    return "aggregated" if spec.name.startswith("aggregated-") else spec.role


def _hostport(url: str) -> str:
    return url.split("://", 1)[1].rstrip("/")


def scrape_config(topo: Topology, specs: list[ProcessSpec], engine_key_file: str, router_key_file: str | None,
                  interval: str = "15s") -> dict[str, Any]:
    """Prometheus's configuration for the deployment: a job for the routers, one for the engines."""

    def static(s: ProcessSpec) -> dict[str, Any]:
        return {"targets": [_hostport(s.url)], "labels": {"deployment": topo.name, "component": _component(s),
                                                          "process": s.name, "node": s.node}}

    routers = [s for s in specs if s.role == "router"]
    engines = [s for s in specs if s.role != "router"]
    jobs: list[dict[str, Any]] = []
    if routers:
        job: dict[str, Any] = {"job_name": "pdctl-router", "metrics_path": "/metrics",
                               "static_configs": [static(s) for s in routers]}
        if router_key_file is not None:
            job["authorization"] = {"type": "Bearer", "credentials_file": router_key_file}
        jobs.append(job)
    engine_job: dict[str, Any] = {"job_name": "pdctl-engines", "metrics_path": "/metrics",
                                  "static_configs": [static(s) for s in engines]}
    if routers:  # engines behind a router require the deployment's engine key; a lone engine takes the clients'
        engine_job["authorization"] = {"type": "Bearer", "credentials_file": engine_key_file}
    elif router_key_file is not None:
        engine_job["authorization"] = {"type": "Bearer", "credentials_file": router_key_file}
    jobs.append(engine_job)
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval,
                       "external_labels": {"pdctl_deployment": topo.name}},
            "scrape_configs": jobs}


def render_yaml(config: dict[str, Any]) -> str:
    head = "# Rendered by `pdctl observe`; keys are in the credentials_file(s), never here.\n"
    return head + yaml.safe_dump(config, sort_keys=False)


def _write_secret(path: Path, value: str) -> None:
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value)


def _router_node(topo: Topology, specs: list[ProcessSpec]) -> str:
    router = next((s for s in specs if s.role == "router"), None)
    return router.node if router is not None else specs[0].node


def observe(topo: Topology, out_dir: Path | None, *, ssh: Any = None, interval: str = "15s", start: bool = False,
            port: int = DEFAULT_PORT, prometheus_bin: str = "prometheus", timeout: float = 60.0) -> Observed:
    """Render the scrape configuration and the dashboard into `out_dir` (when given), and with `start` run
    Prometheus on the router's node."""
    if out_dir is None and not start:
        raise UsageError("nothing to do: give an output directory, or --start", hint="e.g. pdctl observe --out obs")
    specs = plan(topo)
    node = _router_node(topo, specs)
    has_router = any(s.role == "router" for s in specs)
    client_key = router_api_key(topo)
    if topo.router.api_key_env and client_key is None:
        raise LaunchError(f"router.api_key_env is {topo.router.api_key_env} but pdctl cannot find the key the router "
                          "requires on /metrics", hint="set it in env.router of the topology (or pdctl's environment "
                          "for a local router)")
    done = Observed(targets=[s.name for s in specs])
    with connected([topo.node(node)], ssh) as hosts:
        transport = hosts[node]
        if out_dir is not None:
            done.files = _render_here(topo, specs, out_dir, transport, node, has_router, client_key, interval)
        if start:
            done.prometheus_url = _start(topo, specs, transport, node, client_key, interval, port, prometheus_bin,
                                         timeout)
            done.prometheus_node = node
    return done


def _render_here(topo: Topology, specs: list[ProcessSpec], out_dir: Path, transport: Transport, node: str,
                 has_router: bool, client_key: str | None, interval: str) -> list[str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    engine_file = out_dir.resolve() / ENGINE_KEY
    if has_router:
        key = read_key(transport, topo, node)
        if key is None:
            raise LaunchError(f"{topo.name}: no engine key on {node} ({engine_key_path(topo, node)})",
                              hint="`pdctl up` writes it; observe a deployment that is up")
        _write_secret(engine_file, key)
        files.append(str(engine_file))
    router_file = None
    if client_key is not None:
        router_file = out_dir.resolve() / ROUTER_KEY
        _write_secret(router_file, client_key)
        files.append(str(router_file))
    config = scrape_config(topo, specs, str(engine_file), str(router_file) if router_file else None, interval)
    (out_dir / CONFIG).write_text(render_yaml(config))
    (out_dir / DASHBOARD).write_text(json.dumps(dashboard(), indent=2) + "\n")
    return [str(out_dir / CONFIG), str(out_dir / DASHBOARD), *files]


def prometheus_dir(topo: Topology, node: str) -> str:
    return f"{run_dir(topo, node)}/prometheus"


def _put_text(transport: Transport, path: str, text: str, mode: str = "644") -> None:
    target = expand_home(path)
    transport.check(f"umask 077; mkdir -p \"$(dirname {target})\" && cat > {target}.tmp.$$ && chmod {mode} "
                    f"{target}.tmp.$$ && mv {target}.tmp.$$ {target}", stdin=text.encode(), timeout=30.0)


def _start(topo: Topology, specs: list[ProcessSpec], transport: Transport, node: str, client_key: str | None,
           interval: str, port: int, prometheus_bin: str, timeout: float) -> str:
    where = prometheus_dir(topo, node)
    router_file = None
    if client_key is not None:
        router_file = f"{where}/{ROUTER_KEY}"
        _put_text(transport, router_file, client_key, "600")
    engine_file = expand_home(engine_key_path(topo, node))
    config = scrape_config(topo, specs, engine_file, expand_home(router_file) if router_file else None, interval)
    _put_text(transport, f"{where}/{CONFIG}", render_yaml(config))
    _put_text(transport, f"{where}/{DASHBOARD}", json.dumps(dashboard(), indent=2) + "\n")
    address = topo.node(node).address
    launch.stop(transport, topo.name, node, [PROCESS], timeout=10.0)  # a new configuration: a fresh Prometheus
    argv = (prometheus_bin, f"--config.file={expand_home(where)}/{CONFIG}",
            f"--storage.tsdb.path={expand_home(where)}/data", f"--web.listen-address={address}:{port}",
            "--storage.tsdb.retention.time=15d")
    job = DetachedJob(unit=unit_name(topo.name, PROCESS), argv=argv,
                      env={MARKER: topo.name, NODE_VAR: node, PROCESS_VAR: PROCESS},
                      workdir=run_dir(topo, node), log_path=f"{run_dir(topo, node)}/logs/{PROCESS}.log")
    if not transport.run(f"command -v {shlex.quote(prometheus_bin)}").ok:
        raise LaunchError(f"{node}: no {prometheus_bin} to run",
                          hint="install it there (Debian/Ubuntu: apt-get install prometheus), or --prometheus-bin")
    transport.start_detached(job)
    url = f"http://{address}:{port}"
    _wait_ready(transport, url, job.log_path, timeout)
    return url


def _wait_ready(transport: Transport, url: str, log_path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            with httpx.Client(transport=transport.http(), timeout=2.0) as client:
                r = client.get(f"{url}/-/ready")
            if r.status_code == 200:
                return
            last = f"HTTP {r.status_code}"
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        time.sleep(0.5)
    tail = transport.tail(log_path, 15)
    raise LaunchError(f"Prometheus at {url} was not ready within {timeout:g}s ({last})\n{tail}",
                      hint=f"its log: {log_path}")
