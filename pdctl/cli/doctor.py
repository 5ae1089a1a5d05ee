"""`pdctl doctor`: a thin shell over `pdctl.lifecycle.doctor`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from pdctl.cli.support import TOPOLOGY_HELP, call, load_topology, out
from pdctl.lifecycle.doctor import DoctorReport, HostChecks, doctor
from pdctl.remote.sshconnect import SshOptions

TopologyOpt = Annotated[Path | None, typer.Option("--topology", "-t", help=TOPOLOGY_HELP, show_default=False)]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a topology key (dotted.key=value).")]


def doctor_command(
    topology: TopologyOpt = None,
    overrides: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    accept_new_host_keys: Annotated[
        bool, typer.Option("--accept-new-host-keys", help="Trust and record SSH host keys seen for the first time.")
    ] = False,
) -> None:
    """Read every node's state (EFA, GPUs, driver, venv, vLLM/NIXL, model, ports, disk) and say what to fix.

    Also lists what `pdctl up` would change on each node (each provisioning step's first change).
    Changes nothing. Exits 1 when any check fails.
    """

    def run() -> DoctorReport:
        from pdctl.lifecycle.connect import reachable
        from pdctl.plan import plan
        from pdctl.slurm.allocation import bound

        topo = bound(load_topology(topology, overrides))
        options = SshOptions.from_env(accept_new_host_keys=accept_new_host_keys or None)
        with reachable(topo.nodes, options) as (hosts, failed):
            report = doctor(topo, plan(topo), hosts)
        for node, exc in failed.items():
            unreachable = HostChecks(node)
            unreachable.add("connect", False, exc.message, exc.hint or "check the node's address and SSH access")
            report.hosts.append(unreachable)
        return report

    report = call(run)
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        out.print(report)
        out.print("[green]all checks pass[/]" if report.ok else "[red]some checks fail[/]: see the last column")
    raise typer.Exit(0 if report.ok else 1)


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor_command)
