"""No Slurm controller answers: `up --dry-run` and `up` stop at once with one message naming this machine,
SLURM_CONF and munge, instead of "no changes" or Slurm's own text. The controller is a loopback port with
nothing listening (the client tools are real; no daemon runs)."""

from __future__ import annotations

import shutil
import socket
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdctl.cli import app
from tests.conftest import free_port
from tests.lifecycle.conftest import pdctl_home, topology_yaml  # noqa: F401
from tests.support.netns import skip_or_fail

pytestmark = pytest.mark.slurm


@pytest.fixture
def no_controller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    if shutil.which("scontrol") is None or shutil.which("sbatch") is None:
        skip_or_fail("the Slurm client tools are required in CI", "the Slurm client tools are not installed")
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"""ClusterName=h33
SlurmctldHost=h33ctl(127.0.0.1)
SlurmctldPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={tmp_path}/munge.sock
NodeName=h1 NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES
""")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    return conf


def _topology(tmp_path: Path) -> Path:
    name = f"h33-{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.yaml"
    nodes: list[dict[str, object]] = [{"name": n} for n in ("p", "d", "r")]
    path.write_text(topology_yaml(name, tmp_path / "work", nodes=nodes, placement=("p", "d", "r"),
                                  extra_yaml="slurm: {partition: debug}\n"))
    return path


def _expected(conf: Path) -> list[str]:
    me = socket.gethostname()
    return [
        f"Error: the Slurm controller is unreachable from {me} (the login node pdctl runs its Slurm commands on): "
        "Slurmctld(primary) at h33ctl is DOWN",
        f"hint: run `scontrol ping` on {me}: slurmctld must be up and reachable from here, SLURM_CONF ({conf}) "
        "must be this cluster's slurm.conf, and munged must run here (`munge -n | unmunge`)",
    ]


@pytest.mark.usefixtures("pdctl_home")
@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "up"])
def test_up_without_a_controller_says_so(no_controller: Path, tmp_path: Path, dry: bool) -> None:
    topo = _topology(tmp_path)
    result = CliRunner().invoke(app, ["up", "-t", str(topo), *(["--dry-run"] if dry else [])])
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    assert result.stderr.splitlines() == _expected(no_controller)


@pytest.mark.usefixtures("pdctl_home")
def test_a_slurm_conf_that_does_not_exist(no_controller: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nowhere.conf"
    monkeypatch.setenv("SLURM_CONF", str(missing))
    result = CliRunner().invoke(app, ["up", "-t", str(_topology(tmp_path)), "--dry-run"])
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines()[0] == (
        f"Error: the Slurm controller is unreachable from {socket.gethostname()} (the login node pdctl runs its "
        f"Slurm commands on): SLURM_CONF names {missing}, which does not exist")
