"""The srun transport on its own, against the test cluster: commands, stdin and exit codes, put, a detached step
found by its marker and stopped, and srun's own failures named as such."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdctl.errors import ConnectError
from pdctl.remote.procs import NODE_VAR, PROCESS_VAR, DetachedJob
from pdctl.slurm import jobs
from pdctl.slurm.transport import SlurmTransport
from tests.support.slurm import SlurmLab

pytestmark = [pytest.mark.slurm, pytest.mark.ssh]


@pytest.fixture
def job(cluster: SlurmLab, pdctl_home: Path) -> Iterator[int]:
    res = cluster.cmd("sbatch", "--parsable", "-N", "2", "--output", "/dev/null", "--wrap", "sleep infinity")
    jobid = int(res.stdout.strip())
    jobs.wait_running(jobid, lambda _: None, timeout=30)
    yield jobid
    cluster.cmd("scancel", str(jobid))


def test_commands_run_on_the_host_inside_the_job(cluster: SlurmLab, job: int) -> None:
    h2 = SlurmTransport("d", job, "h2", "tr")
    res = h2.run('echo "$SLURMD_NODENAME $SLURM_JOB_ID"; hostname -I; cat; exit 3', stdin=b"from stdin\n")
    assert res.exit_code == 3
    assert res.lines[0] == f"h2 {job}"
    assert res.lines[1].split() == [cluster.lab.hosts[1].address]
    assert res.lines[2] == "from stdin"


def test_put_copies_through_a_step(job: int, tmp_path: Path) -> None:
    src = tmp_path / "tool.sh"
    src.write_text("#!/bin/sh\necho hi\n")
    src.chmod(0o750)
    dest = tmp_path / "deep" / "dir" / "tool.sh"
    SlurmTransport("p", job, "h1", "tr").put(src, str(dest))
    assert dest.read_text() == src.read_text() and dest.stat().st_mode & 0o777 == 0o750


def test_a_detached_step_outlives_its_start_and_is_found_and_stopped(cluster: SlurmLab, job: int,
                                                                    tmp_path: Path) -> None:
    name = f"tr-{uuid.uuid4().hex[:6]}"
    host = SlurmTransport("d", job, "h2", name)
    started = host.start_detached(DetachedJob(
        unit=f"pdctl-{name}-sleeper", argv=("sleep", "300"),
        env={"PDCTL_DEPLOYMENT": name, NODE_VAR: "d", PROCESS_VAR: "sleeper"},
        workdir=str(tmp_path / "wd"), log_path=str(tmp_path / "wd" / "sleeper.log"),
    ))
    found = host.find_by_marker(name, "d")
    assert [p.pid for p in found] == [started.pid] and found[0].process == "sleeper"
    assert f"pdctl-{name}-sleeper" in cluster.cmd("squeue", "-h", "-s", "-j", str(job), "-o", "%j").stdout
    assert f"in step {job}." in (tmp_path / "wd" / "sleeper.log").read_text()

    host.signal([started.pid], [], "TERM")
    for _ in range(50):
        if not host.find_by_marker(name, "d") and not jobs.steps(job, f"pdctl-{name}-sleeper"):
            break
        time.sleep(0.2)
    assert host.find_by_marker(name, "d") == []
    assert jobs.steps(job, f"pdctl-{name}-") == []  # the step ended with its process


def test_srun_failures_are_connection_errors(job: int) -> None:
    with pytest.raises(ConnectError) as outside:
        SlurmTransport("r", job, "h3", "tr").run("true")  # h3 is not one of the job's two hosts
    assert outside.value.message.startswith(f"r (h3 in job {job}): srun cannot start a step: ")
    with pytest.raises(ConnectError) as gone:
        SlurmTransport("r", 999999, "h1", "tr").run("true")
    assert "srun cannot start a step: " in gone.value.message
    assert gone.value.hint == "`pdctl status` shows the job's state; if it ended, `pdctl up` submits a new one"
