"""Resolving hosts as OpenSSH does (`ssh -G`), and the fallback to paramiko's parser without an ssh client."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pdctl.remote.sshconfig import OpenSshConfig, host_config, proxy_command
from pdctl.remote.sshconnect import SshOptions, resolve

pytestmark = pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")


def _config(tmp_path: Path) -> Path:
    key = tmp_path / "id_test"
    key.write_text("not really a key\n")
    nodes = tmp_path / "nodes.conf"
    nodes.write_text(f"Host gpu-*\n  User ubuntu\n  IdentityFile {key}\n  ProxyJump bastion\n"
                     "Host gpu-1\n  HostName 10.9.0.11\n")
    main = tmp_path / "config"
    main.write_text(f"Include {nodes}\n\nHost ssm-*\n  ProxyCommand aws ssm start-session --target %h "
                    "--parameters portNumber=%p\n  User ec2-user\n\nMatch host bastion\n  HostName 192.0.2.7\n")
    return main


def test_include_match_and_proxy_settings_come_from_openssh(tmp_path: Path) -> None:
    options = SshOptions(ssh_config=_config(tmp_path))
    config = host_config(options.ssh_config)
    assert isinstance(config, OpenSshConfig)
    node = resolve("gpu-1", config, options, label="gpu-1")
    assert (node.hostname, node.user, node.port, node.proxy_jump) == ("10.9.0.11", "ubuntu", 22, "bastion")
    assert node.identity_files == (str(tmp_path / "id_test"),)  # ssh's default key names that do not exist: dropped
    assert resolve("bastion", config, options).hostname == "192.0.2.7"  # a Match block
    ssm = resolve("ssm-i-0abc", config, options, port=2222)
    assert ssm.proxy_jump is None and ssm.user == "ec2-user"
    assert ssm.proxy_command == "aws ssm start-session --target ssm-i-0abc --parameters portNumber=2222"


def test_without_an_ssh_client_paramiko_reads_the_file_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    config = host_config(_config(tmp_path))
    assert not isinstance(config, OpenSshConfig)
    assert "pdctl: no OpenSSH client (`ssh`) on PATH: reading the SSH config with paramiko's parser" in \
        capsys.readouterr().err
    assert resolve("ssm-x", config, SshOptions()).user == "ec2-user"


def test_proxy_command_tokens() -> None:
    assert proxy_command("ssh -W %h:%p -l %r jump %%", "10.0.0.1", 22, "me") == "ssh -W 10.0.0.1:22 -l me jump %"
