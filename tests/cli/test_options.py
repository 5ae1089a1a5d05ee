"""Options shared by several commands are one declaration: the same names, help and defaults everywhere, and the
SSH options of every command that reaches hosts (bench and doctor included) reach the SSH transport."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.cli.options import ssh_options
from pdctl.remote.sshconnect import SshOptions
from tests.lifecycle.conftest import topology_yaml
from tests.support.netns import SshLab

HOST_COMMANDS = ("up", "status", "down", "logs", "port-forward", "doctor", "bench")
SSH_OPTIONS = ("--accept-new-host-keys", "--ssh-config", "--known-hosts")
SHARED = (*SSH_OPTIONS, "--topology", "--set", "--json")


def _params(command: str) -> dict[str, typer.core.TyperOption]:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    found = group.commands[command]
    return {p.opts[0]: p for p in found.params if isinstance(p, typer.core.TyperOption)}


def test_every_command_that_reaches_hosts_takes_the_same_ssh_options() -> None:
    reference = _params("up")
    for command in HOST_COMMANDS:
        params = _params(command)
        for name in SSH_OPTIONS:
            assert name in params, (command, name)
            ours, theirs = params[name], reference[name]
            assert (ours.opts, ours.help, ours.default, ours.is_flag) == (
                theirs.opts, theirs.help, theirs.default, theirs.is_flag), (command, name)
    for command in ("validate", "plan", "init", "demo"):
        assert not set(SSH_OPTIONS) & set(_params(command)), command


def test_a_shared_option_reads_the_same_wherever_it_appears() -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    seen: dict[str, set[tuple[object, ...]]] = {}
    for command in group.commands:
        if command == "router":
            continue
        for name, p in _params(command).items():
            if name in SHARED:
                seen.setdefault(name, set()).add((tuple(p.opts), p.help, p.default))
    assert {name: len(forms) for name, forms in seen.items()} == dict.fromkeys(SHARED, 1)
    [(opts, _, _)] = seen["--topology"]
    assert opts == ("--topology", "-t")


def test_bench_help_lists_the_ssh_options() -> None:
    result = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for name in SSH_OPTIONS:
        assert name in result.output, name
    assert "Trust and record SSH host keys seen for the first time." in result.output


def test_ssh_options_fall_back_to_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PDCTL_SSH_CONFIG", str(tmp_path / "env_config"))
    monkeypatch.setenv("PDCTL_KNOWN_HOSTS", str(tmp_path / "env_known"))
    assert ssh_options(False, None, None) == SshOptions(ssh_config=tmp_path / "env_config",
                                                        known_hosts=tmp_path / "env_known")
    given = ssh_options(True, tmp_path / "config", tmp_path / "known")
    assert given == SshOptions(ssh_config=tmp_path / "config", known_hosts=tmp_path / "known",
                               accept_new_host_keys=True)


def _topology(tmp_path: Path, lab: SshLab) -> Path:
    name = f"cli-{uuid.uuid4().hex[:8]}"
    nodes: list[dict[str, object]] = [
        {"name": "h1", "address": lab.hosts[0].address, "ssh_alias": "h1", "transport": "ssh"}
    ]
    path = tmp_path / f"{name}.yaml"
    path.write_text(topology_yaml(name, tmp_path / "work", nodes=nodes, placement=("h1", "h1", "h1"),
                                  python_venv=str(tmp_path / "venv")))
    return path


def _connect_check(stdout: str) -> dict[str, str] | None:
    [host] = json.loads(stdout)["hosts"]
    assert host["node"] == "h1"
    return next((c for c in host["checks"] if c["name"] == "connect"), None)


@pytest.mark.ssh
def test_doctor_honours_the_ssh_options(tmp_path: Path, lab: SshLab, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty_config"
    empty.write_text("")
    monkeypatch.setenv("PDCTL_SSH_CONFIG", str(empty))  # without --ssh-config the alias h1 means nothing
    topo, known = _topology(tmp_path, lab), tmp_path / "known_hosts"
    known.write_text("")
    base = ["doctor", "-t", str(topo), "--json"]
    runner = CliRunner()

    unresolved = runner.invoke(app, [*base, "--known-hosts", str(lab.known_hosts())])
    check = _connect_check(unresolved.stdout)
    assert unresolved.exit_code == 1 and check is not None and check["status"] == "fail"
    assert check["value"] == "h1: could not resolve hostname h1"

    address = lab.hosts[0].address
    refused = runner.invoke(app, [*base, "--ssh-config", str(lab.ssh_config()), "--known-hosts", str(known)])
    check = _connect_check(refused.stdout)
    assert check is not None and check["value"].startswith(f"h1: host key of {address} is not in {known} (")
    assert check["fix"] == "check the fingerprint, then rerun with --accept-new-host-keys to record it"

    accepted = runner.invoke(app, [*base, "--ssh-config", str(lab.ssh_config()), "--known-hosts", str(known),
                                   "--accept-new-host-keys"])
    assert _connect_check(accepted.stdout) is None, accepted.stdout
    assert [line.split()[0] for line in known.read_text().splitlines()] == [address]


@pytest.mark.ssh
def test_bench_reaches_the_hosts_with_the_ssh_options(tmp_path: Path, lab: SshLab) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    result = CliRunner().invoke(app, ["bench", "-t", str(_topology(tmp_path, lab)), "--no-redeploy",
                                      "--ssh-config", str(lab.ssh_config()), "--known-hosts", str(known)])
    assert result.exit_code == 1, result.output
    error, hint = result.stderr.splitlines()[-2:]
    assert error.startswith(f"Error: h1: host key of {lab.hosts[0].address} is not in {known} (")
    assert hint == "hint: check the fingerprint, then rerun with --accept-new-host-keys to record it"
