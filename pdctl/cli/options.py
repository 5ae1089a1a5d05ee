"""The options several commands share, each declared once: same name, help and default wherever it appears.

A command that reaches hosts takes all three SSH options and turns them into `SshOptions` with `ssh_options`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdctl.remote.sshconnect import SshOptions

TOPOLOGY_HELP = "Topology file; default $PDCTL_TOPOLOGY, then ./pdctl.yaml."

TopologyOpt = Annotated[Path | None, typer.Option("--topology", "-t", help=TOPOLOGY_HELP, show_default=False)]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a topology key for this run (repeatable), "
                 "e.g. --set connector.bidirectional_kv_xfer=false.", show_default=False),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks (accepted anywhere on the line).")]

AcceptOpt = Annotated[
    bool, typer.Option("--accept-new-host-keys", help="Trust and record SSH host keys seen for the first time.")
]
SshConfigOpt = Annotated[
    Path | None,
    typer.Option("--ssh-config", help="SSH config file; default $PDCTL_SSH_CONFIG, then ~/.ssh/config.",
                 show_default=False),
]
KnownHostsOpt = Annotated[
    Path | None,
    typer.Option("--known-hosts", help="known_hosts file; default $PDCTL_KNOWN_HOSTS, then ~/.ssh/known_hosts.",
                 show_default=False),
]


def ssh_options(accept_new_host_keys: bool, ssh_config: Path | None, known_hosts: Path | None) -> SshOptions:
    """The three SSH options of a command, over the environment's defaults."""
    return SshOptions.from_env(
        accept_new_host_keys=accept_new_host_keys or None, ssh_config=ssh_config, known_hosts=known_hosts
    )
