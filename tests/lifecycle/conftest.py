"""Deployments of the simulator on this machine (local transport) with free ports and a private PDCTL_HOME."""

from __future__ import annotations

import site
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner, Result

from pdctl.cli import app
from pdctl.lifecycle import down
from pdctl.remote.sshconnect import SshOptions
from pdctl.topology import Topology, load
from tests.conftest import free_port
from tests.support.netns import SshLab, running_lab

MakeTopo = Callable[..., Topology]


def topology_yaml(name: str, work: Path, *, python_venv: str | None = None, nodes: list[dict[str, object]]
                  | None = None, placement: tuple[str, str, str] = ("local", "local", "local"),
                  router_extra: str = "", extra_yaml: str = "") -> str:
    nodes = nodes or [{"name": "local", "address": "127.0.0.1", "transport": "local"}]
    node_lines = "\n".join("  - {" + ", ".join(f"{k}: {v}" for k, v in n.items()) + "}" for n in nodes)
    p, d, r = placement
    venv = python_venv if python_venv is not None else "null"
    return f"""name: {name}
engine: sim
nodes:
{node_lines}
model: {{id: Qwen/Qwen3-32B, served_name: Qwen, max_model_len: 32768, max_num_seqs: 8, block_size: 16}}
prefill:
  - {{node: {p}, port: {free_port()}, side_channel_port: {free_port()}, prefix_caching: false}}
decode:
  - {{node: {d}, port: {free_port()}, side_channel_port: {free_port()}}}
router: {{node: {r}, port: {free_port()}{router_extra}}}
sim: {{speed: 200, num_blocks: 4000}}
python: {{venv: {venv}}}
work_dir: {work}
{extra_yaml}"""


def dry_run(topo_file: Path | str, *args: str, exit_code: int = 0) -> Result:
    """`pdctl up -t TOPO_FILE --dry-run ARGS...` through the CLI, having exited with `exit_code`."""
    result = CliRunner().invoke(app, ["up", "-t", str(topo_file), "--dry-run", *args])
    assert result.exit_code == exit_code, result.output
    return result


@pytest.fixture
def console() -> Console:
    return Console(stderr=True, width=120, color_system=None)


@pytest.fixture
def pdctl_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("PDCTL_HOME", str(home))
    return home


@pytest.fixture
def make_topo(tmp_path: Path, pdctl_home: Path, console: Console) -> Iterator[MakeTopo]:
    """Write and load a unique local sim topology; every one made is taken down at the end of the test."""
    made: list[tuple[Topology, SshOptions | None]] = []

    def make(ssh: SshOptions | None = None, **kw: object) -> Topology:
        name = f"lc-{uuid.uuid4().hex[:8]}"
        path = tmp_path / f"{name}.yaml"
        path.write_text(topology_yaml(name, tmp_path / "work", **kw))  # type: ignore[arg-type]
        topo = load(path)
        made.append((topo, ssh))
        return topo

    yield make
    for topo, ssh in made:
        if any(n.port != 22 for n in topo.nodes):
            continue  # a test's deliberately dead host: that test checks `down` itself
        down(topo, console, ssh=ssh, timeout=5)


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshLab]:
    with running_lab(tmp_path_factory.mktemp("ssh-lab"), count=3) as lab:
        yield lab


@pytest.fixture(scope="session")
def node_venv(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The venv the SSH hosts run pdctl from: this interpreter's packages (the hosts share this filesystem).

    `--system-site-packages` would give the base interpreter's packages, not an active venv's, so the
    packages of the interpreter running the tests are added as site dirs (which also runs their editable .pth).
    """
    venv = tmp_path_factory.mktemp("node-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    ours = [p for p in site.getsitepackages() if Path(p).is_dir()]
    theirs = subprocess.run([f"{venv}/bin/python", "-c", "import site; print(site.getsitepackages()[0])"],
                            check=True, capture_output=True, text=True).stdout.strip()
    Path(theirs).mkdir(parents=True, exist_ok=True)
    (Path(theirs) / "pdctl-tests.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in ours))
    return str(venv)
