"""`pdctl observe` (a Prometheus scrape configuration, the Grafana dashboard, optionally a Prometheus) and
`pdctl top` (the dashboard's figures live in the terminal): thin shells over `pdctl.lifecycle.watch.observe` and
`pdctl.lifecycle.watch.top`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from pdctl.cli.options import AcceptOpt, JsonOpt, KnownHostsOpt, SetOpt, SshConfigOpt, TopologyOpt, ssh_options
from pdctl.cli.output import out, print_json, say
from pdctl.cli.support import load_topology
from pdctl.errors import UsageError


def observe(
    topology: TopologyOpt = None,
    overrides: SetOpt = None,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", help="Write prometheus.yml, pdctl-dashboard.json and the key files (0600) here.",
        show_default=False)] = None,
    start: Annotated[bool, typer.Option(
        "--start", help="Run Prometheus on the router's node, scraping the deployment (`pdctl down` stops it).")]
    = False,
    port: Annotated[int, typer.Option("--port", help="--start: the port Prometheus listens on.")] = 9090,
    interval: Annotated[str, typer.Option("--scrape-interval", help="Prometheus's scrape interval.")] = "15s",
    prometheus_bin: Annotated[str, typer.Option(
        "--prometheus-bin", help="--start: the prometheus binary on the router's node.")] = "prometheus",
    accept_new_host_keys: AcceptOpt = False,
    ssh_config: SshConfigOpt = None,
    known_hosts: KnownHostsOpt = None,
) -> None:
    """Render a Prometheus scrape configuration of the deployment (every router and engine) and pdctl's Grafana
    dashboard; with --start, run a real Prometheus on the router's node. Keys go to 0600 files, never to stdout."""
    from pdctl.lifecycle.watch.observe import DASHBOARD, prometheus_dir
    from pdctl.lifecycle.watch.observe import observe as do_observe

    topo = load_topology(topology, overrides)
    if out_dir is None and not start:
        out_dir = Path(f"{topo.name}-observe")
    done = do_observe(topo, out_dir, ssh=ssh_options(accept_new_host_keys, ssh_config, known_hosts),
                      interval=interval, start=start, port=port, prometheus_bin=prometheus_bin)
    for path in done.files:
        say(out, f"wrote {path}")
    say(out, f"targets: {', '.join(done.targets)}")
    if done.prometheus_url and done.prometheus_node:
        say(out, f"prometheus: {done.prometheus_url} on {done.prometheus_node} (`pdctl down` stops it)")
    if out_dir is not None:
        board = str(out_dir / DASHBOARD)
    else:  # only on the node, beside the Prometheus configuration
        board = f"{prometheus_dir(topo, done.prometheus_node or '')}/{DASHBOARD} on {done.prometheus_node}"
    say(out, f"grafana: import {board} (Dashboards > New > Import), data source: that Prometheus")


def top(
    topology: TopologyOpt = None,
    overrides: SetOpt = None,
    interval: Annotated[float, typer.Option("--interval", "-n", help="Seconds between samples.")] = 2.0,
    once: Annotated[bool, typer.Option("--once", help="Two samples, one frame, then exit.")] = False,
    as_json: JsonOpt = False,
    accept_new_host_keys: AcceptOpt = False,
    ssh_config: SshConfigOpt = None,
    known_hosts: KnownHostsOpt = None,
) -> None:
    """The dashboard's figures, live: TTFT/ITL percentiles, reuse outcomes and reasons, KV source and movement,
    pinned KV per decode, admission and refusals, each instance's health and load (Ctrl-C to stop)."""
    from pdctl.lifecycle.watch.top import Sampler
    from pdctl.lifecycle.watch.top_render import render_top

    if not interval > 0:
        raise UsageError(f"--interval {interval:g} is not a positive number of seconds", hint="e.g. --interval 2")
    topo = load_topology(topology, overrides)
    with Sampler(topo, ssh_options(accept_new_host_keys, ssh_config, known_hosts)) as sampler:
        sampler.sample()
        while True:
            time.sleep(interval)
            view = sampler.sample()
            if as_json:
                print_json(view.to_json())
            else:
                if not once:
                    out.clear()
                render_top(view, out)
            if once:
                return


def register(app: typer.Typer) -> None:
    app.command("observe")(observe)
    app.command("top")(top)
