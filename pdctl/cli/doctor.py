"""`pdctl doctor`: a thin shell over `pdctl.lifecycle.bringup.doctor`."""

from __future__ import annotations

import typer

from pdctl.cli.options import AcceptOpt, JsonOpt, KnownHostsOpt, SetOpt, SshConfigOpt, TopologyOpt, ssh_options
from pdctl.cli.output import out, print_json
from pdctl.cli.support import load_topology
from pdctl.lifecycle.bringup.doctor import UP_MARK, diagnose


def doctor_command(
    topology: TopologyOpt = None,
    overrides: SetOpt = None,
    as_json: JsonOpt = False,
    accept_new_host_keys: AcceptOpt = False,
    ssh_config: SshConfigOpt = None,
    known_hosts: KnownHostsOpt = None,
) -> None:
    """Read every node's state (EFA, GPUs, driver, venv, vLLM/NIXL, model, ports, disk) and say what to fix.

    Also lists what `pdctl up` would change on each node (each provisioning step's first change). What is
    missing but `up` provisions itself (venv, vLLM, NIXL, pdctl, the model download) is marked ↑, not a failure.
    Changes nothing. Exits 1 when any check fails.
    """
    topo = load_topology(topology, overrides)
    report = diagnose(topo, ssh_options(accept_new_host_keys, ssh_config, known_hosts))
    if as_json:
        print_json(report.to_json())
    else:
        out.print(report)
        later = f"; `pdctl up` does the {report.for_up} marked {UP_MARK}" if report.for_up else ""
        out.print(f"[green]all checks pass[/]{later}" if report.ok
                  else f"[red]some checks fail[/]: see the last column{later}")
    raise typer.Exit(0 if report.ok else 1)


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor_command)
