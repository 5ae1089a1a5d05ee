"""Opening an SSH connection the way `ssh` would: ~/.ssh/config, agent, known_hosts, ProxyJump.

Unknown host keys are refused unless the caller opts in (then recorded); a changed key is always a hard error.
paramiko and socket errors become `ConnectError`s in one place, `mapped_errors`, naming the host and what failed.
paramiko's own log line for a refused channel is dropped (`_RefusedChannelLine`): the opener gets the refusal as an
exception and reports it; any other paramiko log record still reaches stderr.
"""

from __future__ import annotations

import getpass
import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from pdctl.errors import ConnectError
from pdctl.remote import knownhosts
from pdctl.remote.sshconfig import HostConfig, host_config, proxy_command


class _RefusedChannelLine(logging.Filter):
    """paramiko logs "Secsh channel N open FAILED: Connection refused" at ERROR, and with no handler configured
    Python prints it on stderr, whenever a channel is refused. It also raises that refusal (ChannelException) to
    the code that opened the channel, and pdctl opens such channels on purpose: health polls before an engine
    listens, probes of a process that is down. Those callers report (or expect) the refusal themselves, so the
    log line only repeats it, out of context."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not (text.startswith("Secsh channel ") and " open FAILED: " in text)


logging.getLogger("paramiko.transport").addFilter(_RefusedChannelLine())


@dataclass(frozen=True)
class SshOptions:
    """How to reach SSH hosts; every path injectable so tests use temporary files."""

    ssh_config: Path | None = None
    known_hosts: Path | None = None
    accept_new_host_keys: bool = False
    connect_timeout: float = 10.0
    keepalive_s: int = 15
    identity_files: tuple[str, ...] = field(default=())

    @classmethod
    def from_env(cls, **overrides: object) -> SshOptions:
        """Defaults from `PDCTL_SSH_CONFIG` / `PDCTL_KNOWN_HOSTS`, then ~/.ssh; `overrides` win where not None."""
        env_cfg = os.environ.get("PDCTL_SSH_CONFIG")
        env_kh = os.environ.get("PDCTL_KNOWN_HOSTS")
        values: dict[str, object] = {
            "ssh_config": Path(env_cfg) if env_cfg else Path("~/.ssh/config").expanduser(),
            "known_hosts": Path(env_kh) if env_kh else Path("~/.ssh/known_hosts").expanduser(),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Target:
    """One resolved hop: where to connect and as whom."""

    label: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    proxy_jump: str | None
    proxy_command: str | None = None


def load_config(options: SshOptions) -> HostConfig:
    return host_config(options.ssh_config)


def resolve(
    spec: str,
    config: HostConfig,
    options: SshOptions,
    *,
    user: str | None = None,
    port: int | None = None,
    label: str | None = None,
) -> Target:
    """`spec` is `[user@]host[:port]` or a config alias; explicit user/port win over the config file.
    `label` names the host in errors (the topology's node name)."""
    spec_user, _, hostport = spec.rpartition("@")
    host, _, spec_port = hostport.partition(":") if hostport.count(":") == 1 else (hostport, "", "")
    entry = config.lookup(host)
    jump, command = entry.get("proxyjump"), entry.get("proxycommand")
    files = entry.get("identityfile", [])
    hostname = str(entry.get("hostname", host))
    target = Target(
        label=label or host,
        hostname=hostname,
        port=port or int(spec_port or str(entry.get("port", 22))),
        user=user or spec_user or str(entry.get("user") or getpass.getuser()),
        identity_files=tuple(options.identity_files) + tuple(files if isinstance(files, list) else [files]),
        proxy_jump=None if jump in (None, "none") else str(jump),
    )
    if command not in (None, "none") and target.proxy_jump is None:
        line = proxy_command(str(command), hostname, target.port, target.user)
        target = Target(**{**target.__dict__, "proxy_command": line})
    return target


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown keys, or accept and append them to known_hosts when the user said so; never a revoked key
    or a host known only through a certificate authority."""

    def __init__(self, options: SshOptions, markers: knownhosts.Markers | None = None) -> None:
        self.options = options
        self.markers = markers or knownhosts.Markers()

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if self.markers.revoked_for(hostname, key):
            raise _RefusedHostKey(f"the host key of {hostname} is marked @revoked in {self.options.known_hosts} "
                                  f"({key.fingerprint})", "replace the host's key, or remove the @revoked line")
        line = self.markers.authority_line(hostname)
        if line is not None:
            raise _RefusedHostKey(
                f"{hostname} is trusted through a @cert-authority ({self.options.known_hosts}:{line}); pdctl "
                "cannot verify SSH host certificates",
                f"add the host's own key to known_hosts (ssh-keyscan {hostname}), after checking its fingerprint")
        if not self.options.accept_new_host_keys:
            raise _UnknownHostKey(hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)
        path = self.options.known_hosts
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with path.open("a") as fh:
                fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


class _RefusedHostKey(paramiko.SSHException):
    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.message, self.hint = message, hint


class _NoPromptTransport(paramiko.Transport):
    """paramiko answers a server's keyboard-interactive request (a 2FA code after the key) by prompting on the
    terminal and reading stdin; pdctl runs unattended and never does."""

    def auth_interactive_dumb(self, username: str, handler: object = None, submethods: str = "") -> list[str]:
        raise paramiko.AuthenticationException(
            "the server asks for keyboard-interactive or password authentication after the key (a second factor?); "
            "pdctl never prompts"
        )


class _UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(f"unknown host key for {hostname}")
        self.hostname = hostname
        self.fingerprint = key.fingerprint


@contextmanager
def mapped_errors(target: Target, options: SshOptions) -> Iterator[None]:
    """The one place where paramiko/socket errors become ConnectError messages."""
    where = f"{target.user}@{target.hostname}:{target.port}"
    if target.proxy_command:
        where += f" through ProxyCommand `{target.proxy_command}`"
    kh = options.known_hosts or Path("~/.ssh/known_hosts")
    try:
        yield
    except _RefusedHostKey as exc:
        raise ConnectError(target.label, exc.message, hint=exc.hint) from None
    except _UnknownHostKey as exc:
        raise ConnectError(
            target.label,
            f"host key of {exc.hostname} is not in {kh} ({exc.fingerprint})",
            hint="check the fingerprint, then rerun with --accept-new-host-keys to record it",
        ) from None
    except paramiko.BadHostKeyException as exc:
        raise ConnectError(
            target.label,
            f"HOST KEY CHANGED for {exc.hostname}: it does not match {kh} (someone may be intercepting, "
            "or the host was rebuilt)",
            hint=f"if the change is expected: ssh-keygen -R {exc.hostname} -f {kh}",
        ) from None
    except paramiko.AuthenticationException as exc:
        keys = ", ".join(target.identity_files) or "agent and default keys"
        raise ConnectError(
            target.label,
            f"authentication failed for {where} (keys tried: {keys}): {exc}",
            hint="check the user and IdentityFile in your SSH config, or `ssh-add` the key",
        ) from None
    except socket.gaierror:
        raise ConnectError(
            target.label, f"could not resolve hostname {target.hostname}", hint="check the node address"
        ) from None
    except TimeoutError:
        raise ConnectError(
            target.label,
            f"timed out connecting to {where} after {options.connect_timeout:g}s",
            hint="is the host up and port open? (security group, bastion/ProxyJump)",
        ) from None
    except paramiko.ssh_exception.NoValidConnectionsError as exc:
        del exc
        raise ConnectError(
            target.label, f"unreachable: {where}: connection refused", hint="is the host up and sshd running?"
        ) from None
    except (paramiko.ssh_exception.ChannelException, paramiko.SSHException) as exc:
        raise ConnectError(target.label, f"SSH error with {where}: {exc}") from None
    except OSError as exc:
        raise ConnectError(
            target.label, f"unreachable: {where}: {exc.strerror or exc}", hint="is the host up and routable?"
        ) from None


def open_client(target: Target, options: SshOptions, config: HostConfig) -> list[paramiko.SSHClient]:
    """Connect to `target`, through its ProxyJump chain or ProxyCommand; returns the clients, the target's last."""
    chain: list[paramiko.SSHClient] = []
    sock: paramiko.Channel | paramiko.ProxyCommand | None = None
    if target.proxy_command:
        with mapped_errors(target, options):
            sock = paramiko.ProxyCommand(target.proxy_command)
    elif target.proxy_jump:
        hops = target.proxy_jump.split(",")
        jump = resolve(hops[-1], config, options)
        if len(hops) > 1:
            jump = Target(**{**jump.__dict__, "proxy_jump": ",".join(hops[:-1])})
        try:
            chain = open_client(jump, options, config)
        except ConnectError as exc:  # name both: the node we wanted and the hop that failed
            raise ConnectError(target.label, f"jump host {exc.message}", hint=exc.hint) from None
        with mapped_errors(target, options):
            transport = chain[-1].get_transport()
            assert transport is not None
            sock = transport.open_channel(
                "direct-tcpip", (target.hostname, target.port), ("127.0.0.1", 0), timeout=options.connect_timeout
            )
    client = paramiko.SSHClient()
    markers = None
    if options.known_hosts is not None and options.known_hosts.exists():
        markers = knownhosts.load(client.get_host_keys(), options.known_hosts)
    client.set_missing_host_key_policy(_HostKeyPolicy(options, markers))
    with mapped_errors(target, options):
        client.connect(
            target.hostname,
            port=target.port,
            username=target.user,
            key_filename=list(target.identity_files) or None,  # type: ignore[arg-type]  # a list works; stubs: str
            timeout=options.connect_timeout,
            banner_timeout=options.connect_timeout,
            auth_timeout=options.connect_timeout,
            sock=sock,
            transport_factory=_NoPromptTransport,  # type: ignore[arg-type]  # the stubs omit gss_* of Transport
        )
        transport = client.get_transport()
        assert transport is not None
        transport.set_keepalive(options.keepalive_s)
    return [*chain, client]
