"""A host reached over SSH (paramiko): one connection per host, reused by every command and upload."""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Protocol

import httpx
import paramiko

from pdctl.errors import ConnectError, RemoteCommandError
from pdctl.remote.base import CommandResult, Progress, Stream, Transport
from pdctl.remote.sshconnect import SshOptions, Target, load_config, mapped_errors, open_client, resolve
from pdctl.remote.sshhttp import AsyncSshHttpTransport, SshHttpTransport

READ = 1 << 15
EOF_GRACE_S = 1.0


class SshTransport(Transport):
    """Commands run as `sh -c <script>` in their own channel; files go over SFTP."""

    def __init__(self, name: str, target: Target, clients: list[paramiko.SSHClient], options: SshOptions) -> None:
        super().__init__(name)
        self.target = target
        self.options = options
        self._clients = clients
        self._sftp: paramiko.SFTPClient | None = None

    @property
    def client(self) -> paramiko.SSHClient:
        return self._clients[-1]

    def _needs_sudo(self) -> bool:
        return True  # the remote user is not known here: `sudo=True` always asks for sudo

    def _run_script(self, script: str, *, sudo: bool, timeout: float | None, stdin: bytes) -> CommandResult:
        start = time.monotonic()
        with mapped_errors(self.target, self.options):
            transport = self.client.get_transport()
            if transport is None or not transport.is_active():
                raise ConnectError(self.name, "the SSH connection was lost", hint="check the host and rerun")
            chan = transport.open_session(timeout=self.options.connect_timeout)
            try:
                chan.exec_command(f"sh -c {shlex.quote(script)}")
                if stdin:
                    chan.sendall(stdin)
                chan.shutdown_write()
                out, err = self._collect(chan, script, start, timeout)
                code = chan.recv_exit_status()
                link = chan.get_transport()
                if code == -1 and (link is None or not link.is_active()):  # paramiko's "closed, no status"
                    raise ConnectError(self.name, f"the SSH connection ({self._where()}) dropped while a command "
                                       "ran", hint="check the host and the jump hosts in front of it, then rerun")
            finally:
                chan.close()
        if sudo and code != 0 and "a password is required" in err:
            err += f"\n{self.name}: sudo needs a password here; pdctl needs passwordless sudo (NOPASSWD)"
        return CommandResult(code, out, err, time.monotonic() - start)

    def _collect(
        self, chan: paramiko.Channel, script: str, start: float, timeout: float | None
    ) -> tuple[str, str]:
        out: list[bytes] = []
        err: list[bytes] = []
        pause = 0.001
        exited_at: float | None = None
        while True:
            busy = False
            if chan.recv_ready():
                out.append(chan.recv(READ))
                busy = True
            if chan.recv_stderr_ready():
                err.append(chan.recv_stderr(READ))
                busy = True
            if busy:
                pause = 0.001
                continue
            now = time.monotonic()
            if chan.exit_status_ready():
                exited_at = exited_at or now
                # Output may trail the exit status; a backgrounded child holding stdout must not hang us.
                if chan.eof_received or now - exited_at > EOF_GRACE_S:
                    break
            if timeout is not None and now - start > timeout:
                raise RemoteCommandError(
                    self.name, script, 124, b"".join(err).decode(errors="replace"),
                    hint=f"it ran longer than {timeout:g}s",
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.02)
        return b"".join(out).decode(errors="replace"), b"".join(err).decode(errors="replace")

    def put(self, local: Path, remote: str, progress: Progress | None = None) -> None:
        rel = remote[2:] if remote.startswith("~/") else remote
        parent = rel.rsplit("/", 1)[0] if "/" in rel else ""
        if parent:
            self.check(["mkdir", "-p", parent if remote == rel else "~/" + parent])
        tmp = f"{rel}.pdctl-tmp"
        with mapped_errors(self.target, self.options):
            sftp = self._sftp_client()
            sftp.put(str(local), tmp, callback=progress)
            sftp.chmod(tmp, local.stat().st_mode & 0o7777)
            sftp.posix_rename(tmp, rel)

    def _new_http(self) -> httpx.BaseTransport:
        return SshHttpTransport(self.client.get_transport, self._hop())

    def async_http(self) -> httpx.AsyncBaseTransport:
        return AsyncSshHttpTransport(self.client.get_transport, self._hop())

    def connect_tcp(self, host: str, port: int, timeout: float = 10.0) -> Stream:
        with mapped_errors(self.target, self.options):
            link = self.client.get_transport()
            if link is None or not link.is_active():
                raise ConnectError(self.name, "the SSH connection was lost", hint="check the host and rerun")
            try:
                chan = link.open_channel("direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=timeout)
            except paramiko.ChannelException as exc:  # the node's sshd could not connect there
                raise ConnectError(self.name, f"{host}:{port} refused through SSH ({self._where()}): {exc.text}",
                                   hint="is the process listening there running? (`pdctl status`)") from None
        chan.settimeout(None)
        return chan

    def _hop(self) -> str:
        """The host as errors name it: node, and the jump hosts in front of it."""
        return f"{self.name} ({self._where()})"

    def _where(self) -> str:
        t = self.target
        via = f" via {t.proxy_jump}" if t.proxy_jump else " via ProxyCommand" if t.proxy_command else ""
        return f"{t.user}@{t.hostname}{via}"

    def _sftp_client(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            self._sftp = self.client.open_sftp()
        return self._sftp

    def close(self) -> None:
        super().close()
        if self._sftp is not None:
            self._sftp.close()
        for client in reversed(self._clients):
            client.close()


class SshHost(Protocol):
    """Where an SSH host is: what `connect_ssh` reads of a topology node."""

    @property
    def name(self) -> str: ...

    @property
    def address(self) -> str: ...

    @property
    def user(self) -> str | None: ...

    @property
    def port(self) -> int: ...

    @property
    def ssh_alias(self) -> str | None: ...


def connect_ssh(node: SshHost, options: SshOptions) -> SshTransport:
    """Open the one connection to `node` (alias from ~/.ssh/config or its address)."""
    config = load_config(options)
    port = node.port if node.port != 22 else None
    target = resolve(
        node.ssh_alias or node.address, config, options, user=node.user, port=port, label=node.name
    )
    clients = open_client(target, options, config)
    return SshTransport(node.name, target, clients, options)
