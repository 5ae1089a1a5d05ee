"""How `ssh` itself would reach a host: OpenSSH's own reading of the config (`ssh -G`), else paramiko's parser.

`ssh -G` applies everything OpenSSH supports (Include, Match, ProxyJump chains, ProxyCommand, canonicalisation),
so pdctl resolves hosts exactly as the user's `ssh` does. Where no OpenSSH client is installed, paramiko's parser
reads the file (no Include or Match exec), and pdctl says so once on stderr.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import paramiko

from pdctl.errors import ConnectError

Entry = dict[str, "str | list[str]"]
_SAID: set[str] = set()


class HostConfig(Protocol):
    """What resolution needs from a config: the options that apply to one host, keys lower-case."""

    def lookup(self, hostname: str) -> Mapping[str, Any]: ...


class OpenSshConfig:
    """Asks `ssh -G [-F FILE] HOST` once per host; values as OpenSSH prints them (`~` left for the caller)."""

    def __init__(self, ssh: str, config: Path | None) -> None:
        self.ssh = ssh
        self.config = config
        self._cache: dict[str, Entry] = {}

    def lookup(self, hostname: str) -> Entry:
        if hostname not in self._cache:
            self._cache[hostname] = self._ask(hostname)
        return self._cache[hostname]

    def _ask(self, hostname: str) -> Entry:
        # Without -F, ssh reads ~/.ssh/config and the system-wide file, as a plain `ssh HOST` would.
        argv = [self.ssh, "-G"]
        if self.config is not None and self.config != Path("~/.ssh/config").expanduser():
            argv += ["-F", str(self.config)]
        try:
            res = subprocess.run([*argv, hostname], capture_output=True, text=True, timeout=15,
                                 stdin=subprocess.DEVNULL, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConnectError(hostname, f"`ssh -G` failed: {exc}", hint="check the ssh client") from None
        if res.returncode != 0:
            why = (res.stderr.strip().splitlines() or ["no output"])[-1]
            raise ConnectError(hostname, f"OpenSSH cannot read the SSH config {self.config}: {why}",
                               hint=f"check it with `ssh -G -F {self.config} {hostname}`")
        entry: Entry = {}
        for line in res.stdout.splitlines():
            key, _, value = line.partition(" ")
            if key == "identityfile":
                files = entry.setdefault("identityfile", [])
                assert isinstance(files, list)
                files.append(value)
            elif key:
                entry.setdefault(key, value)
        files = entry.get("identityfile", [])
        assert isinstance(files, list)
        # ssh -G lists the default key names too; only those that exist are worth offering.
        entry["identityfile"] = [f for f in files if Path(os.path.expanduser(f)).exists()]
        return entry


def host_config(config: Path | None) -> HostConfig:
    """OpenSSH's view of `config` where an `ssh` client exists (PDCTL_SSH_RESOLVER=paramiko forces the parser)."""
    ssh = shutil.which("ssh")
    if ssh is not None and os.environ.get("PDCTL_SSH_RESOLVER") != "paramiko":
        if config is not None and not config.exists():
            config = None
        return OpenSshConfig(ssh, config)
    reason = "PDCTL_SSH_RESOLVER=paramiko" if ssh else "no OpenSSH client (`ssh`) on PATH"
    if reason not in _SAID:
        _SAID.add(reason)
        sys.stderr.write(f"pdctl: {reason}: reading the SSH config with paramiko's parser (no Include, Match "
                         "exec or Canonicalize*; ProxyJump and ProxyCommand are honoured)\n")
    return _paramiko_config(config)


def _paramiko_config(path: Path | None) -> paramiko.SSHConfig:
    if path is None or not path.exists():
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_path(str(path))
    except (OSError, paramiko.SSHException) as exc:
        raise ConnectError(
            str(path), f"cannot read SSH config: {exc}", hint="fix the file or pass --ssh-config"
        ) from None


def proxy_command(template: str, hostname: str, port: int, user: str) -> str:
    """A ProxyCommand with OpenSSH's tokens filled in (%h %p %r %n %%)."""
    out, i = [], 0
    while i < len(template):
        ch = template[i]
        if ch == "%" and i + 1 < len(template):
            token = template[i + 1]
            out.append({"h": hostname, "p": str(port), "r": user, "n": hostname, "%": "%"}.get(token, ch + token))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)
