"""Test hosts for provisioning: per-host roots holding fake hardware state, wheels built here, topologies."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from pdctl.facts.base import HostLayout
from pdctl.remote.base import CommandResult
from pdctl.remote.local import LocalTransport
from pdctl.remote.shell import Command
from pdctl.topology import Topology
from tests.support.venvs import system_site_env

FAKEBIN = Path(__file__).parent / "fakebin"
VLLM_FIXTURE = Path(__file__).parents[1] / "fixtures" / "vllm-0.26.0"


class HomeTransport(LocalTransport):
    """This machine as a host whose user has its own home directory (two of them stand for two hosts)."""

    def __init__(self, name: str, home: Path) -> None:
        super().__init__(name)
        self.home = home

    def run(self, command: Command, *, env: Mapping[str, str] | None = None, **kw: Any) -> CommandResult:
        return super().run(command, env={"HOME": str(self.home), **(env or {})}, **kw)

    def put(self, local: Path, remote: str, progress: Any = None) -> None:
        if remote.startswith("~/"):
            remote = str(self.home / remote[2:])
        super().put(local, remote, progress)


def host_root(base: Path, name: str) -> tuple[Path, HostLayout]:
    """A fresh host: its root (fake /opt, /sys, /proc state) and the layout that points facts at it."""
    root = base / name
    for sub in ("fake", "home", "proc/sys/kernel/random"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/random/boot_id").write_text("00000000-0000-0000-0000-000000000001\n")
    env = {"FAKE_HOST_ROOT": str(root), **system_site_env(root / "userbase")}
    layout = HostLayout(root=str(root), path=(str(FAKEBIN),), env=env)
    return root, layout


def layout_host(tmp: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh host `name` (see `host_root`) that pdctl's facts read through `PDCTL_HOST_LAYOUT`; its root."""
    root, layout = host_root(tmp, name)
    spec = {name: {"root": layout.root, "path": list(layout.path), "env": dict(layout.env)}}
    (tmp / "layout.json").write_text(json.dumps(spec))
    monkeypatch.setenv("PDCTL_HOST_LAYOUT", str(tmp / "layout.json"))
    return root


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(
    dest: Path, name: str, version: str, files: Mapping[str, bytes], requires: Sequence[str] = ()
) -> Path:
    """A minimal, valid pure-Python wheel; `requires` become its Requires-Dist lines."""
    dist = f"{name.replace('-', '_')}-{version}"
    deps = "".join(f"Requires-Dist: {r}\n" for r in requires)
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{deps}".encode()
    wheel = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    content = {**files, f"{dist}.dist-info/METADATA": meta, f"{dist}.dist-info/WHEEL": wheel}
    record = "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in content.items())
    content[f"{dist}.dist-info/RECORD"] = (record + f"{dist}.dist-info/RECORD,,\n").encode()
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as zf:
        for n, d in content.items():
            zf.writestr(n, d)
    return out


def fake_vllm_wheel(dest: Path, requires: Sequence[str] = ()) -> Path:
    """vLLM 0.26.0 as far as the patch cares: its four OpenAI entrypoint files, laid out as installed."""
    files = {p.relative_to(VLLM_FIXTURE).as_posix(): p.read_bytes() for p in VLLM_FIXTURE.rglob("*.py")}
    files["vllm/__init__.py"] = b'__version__ = "0.26.0"\n'
    return make_wheel(dest, "vllm", "0.26.0", files, requires)


def installer_tarball(dest: Path) -> tuple[Path, str]:
    """aws-efa-installer-1.47.0.tar.gz holding the fake installer; returns it and its sha256."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in ("efa_installer.sh", "fi_info"):
            tar.add(FAKEBIN / name, arcname=f"aws-efa-installer/{name}")
    out = dest / "aws-efa-installer-1.47.0.tar.gz"
    out.write_bytes(buf.getvalue())
    return out, hashlib.sha256(buf.getvalue()).hexdigest()


def topology(**fields: Any) -> Topology:
    base: dict[str, Any] = {
        "name": "prov",
        "nodes": [{"name": "a", "transport": "local"}],
        "model": {"id": "Qwen/Qwen3-32B"},
        "prefill": [{"node": "a", "port": 18100}],
        "decode": [{"node": "a", "port": 18200}],
        "router": {"node": "a", "port": 18000},
        "work_dir": "~/.pdctl",
        "hf_home": "~/hf",
    }
    base.update(fields)
    return Topology.model_validate(base)
