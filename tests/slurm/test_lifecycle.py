"""up / status / bench / down of a sim deployment inside a real Slurm job: the holder job, the steps, the hosts'
addresses, attach mode, a job that ends behind pdctl's back, and bad input."""

from __future__ import annotations

import json
import queue
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.remote.local import LocalTransport
from pdctl.state import DeploymentState, StateStore
from tests.slurm.conftest import WriteTopo
from tests.support.slurm import SlurmLab

pytestmark = [pytest.mark.slurm, pytest.mark.ssh, pytest.mark.slow]

runner = CliRunner()


def _job_state(cluster: SlurmLab, jobid: str) -> str:
    out = cluster.cmd("scontrol", "show", "job", "-o", jobid).stdout
    return dict(w.split("=", 1) for w in out.split() if "=" in w).get("JobState", "")


def _steps(cluster: SlurmLab, jobid: str) -> list[str]:
    return cluster.cmd("squeue", "-h", "-s", "-j", jobid, "-o", "%j").stdout.split()


def _job_named(cluster: SlurmLab, name: str) -> str:
    return cluster.cmd("squeue", "-h", "--name", name, "-o", "%i").stdout.strip()


def _hold(cluster: SlurmLab, nodes: int = 3, command: str = "sleep infinity") -> str:
    res = cluster.cmd("sbatch", "--parsable", "-N", str(nodes), "--output", "/dev/null", "--wrap", command)
    assert res.returncode == 0, res.stderr
    jobid = res.stdout.strip()
    for _ in range(100):
        if _job_state(cluster, jobid) in ("RUNNING", "COMPLETED"):
            return jobid
        time.sleep(0.2)
    raise AssertionError(f"job {jobid} did not start")


def _wait_gone(cluster: SlurmLab, jobid: str) -> str:
    for _ in range(100):
        state = _job_state(cluster, jobid)
        if state not in ("RUNNING", "COMPLETING", "PENDING"):
            return state
        time.sleep(0.2)
    raise AssertionError(f"job {jobid} still active")


SECRET = "hf-slurm-secret-4711"


def _cmdlines_with(text: str) -> list[str]:
    """Command lines of every process on this machine (login node and the namespaces' hosts) containing `text`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args:
            found.append(args)
    return found


def test_up_status_bench_down_in_a_submitted_job(cluster: SlurmLab, write_topo: WriteTopo, tmp_path: Path,
                                                 pdctl_home: Path) -> None:
    topo = write_topo("{partition: debug, time: \"30:00\"}", extra=f"env: {{all: {{HF_TOKEN: {SECRET}}}}}\n")
    name = topo.stem

    up = runner.invoke(app, ["up", "-t", str(topo), "--skip-provision"])
    assert up.exit_code == 0, up.output
    assert f"slurm: sbatch --parsable --job-name pdctl-{name} --nodes 3 --partition debug --time 30:00 " \
        "--exclusive --output /dev/null --wrap 'sleep infinity'" in up.stderr
    assert "turn 2 hit" in up.stderr
    jobid = _job_named(cluster, f"pdctl-{name}")
    assert jobid and _job_state(cluster, jobid) == "RUNNING"
    assert sorted(s for s in _steps(cluster, jobid) if s.startswith(f"pdctl-{name}-")) == [
        f"pdctl-{name}-{p}" for p in ("decode-0", "prefill-0", "router")]

    # the processes' environment went in on the steps' stdin: no srun argv on the login node shows a secret
    assert _cmdlines_with(f"pdctl-{name}-router") and _cmdlines_with(SECRET) == []
    assert SECRET not in (pdctl_home / "deployments" / f"{name}.json").read_text()

    again = runner.invoke(app, ["up", "-t", str(topo), "--skip-provision"])
    assert again.exit_code == 0, again.output
    assert "already running, no changes" in again.stdout and "sbatch" not in again.stderr
    assert _job_named(cluster, f"pdctl-{name}") == jobid

    logs = runner.invoke(app, ["logs", "-t", str(topo), "router", "-n", "200"])
    assert logs.exit_code == 0, logs.output
    assert f"in step {jobid}." in logs.stdout

    st = runner.invoke(app, ["status", "-t", str(topo), "--json"])
    assert st.exit_code == 0, st.output
    report = json.loads(st.stdout)
    assert report["healthy"] is True
    assert report["slurm"]["jobid"] == int(jobid) and report["slurm"]["state"] == "RUNNING"
    assert report["slurm"]["submitted_by_pdctl"] is True and report["slurm"]["time_left"]
    assert sorted(report["slurm"]["hosts"].values()) == ["h1", "h2", "h3"]
    hosts = {p["name"]: p["host"] for p in report["processes"]}
    assert sorted(hosts.values()) == sorted(h.address for h in cluster.lab.hosts)  # resolved on each host
    assert report["router"]["hit"] >= 1

    text = runner.invoke(app, ["status", "-t", str(topo)])
    assert text.exit_code == 0, text.output
    assert f"slurm: job {jobid} RUNNING, submitted by pdctl, time left " in text.stdout
    assert ": p on h1, d on h2, r on h3" in text.stdout

    bench = runner.invoke(app, ["bench", "-t", str(topo), "--no-redeploy", "--lengths", "128", "--conversations",
                                "1", "--turns", "2", "--user-tokens", "8", "--output-tokens", "2", "--clients", "1",
                                "--no-warmup", "--out", str(tmp_path / "bench"), "--json"])
    assert bench.exit_code == 0, bench.output
    result = json.loads(bench.stdout)
    assert result["legs"][0]["hit_rate"] == 1.0
    assert result["workload"]["client"] == "router node r"  # played in a step on the router's host

    down = runner.invoke(app, ["down", "-t", str(topo)])
    assert down.exit_code == 0, down.output
    assert f"slurm: cancelled job {jobid}" in down.stderr
    assert _wait_gone(cluster, jobid) == "CANCELLED"
    assert cluster.cmd("squeue", "-h", "-j", jobid, "-t", "all").stdout.strip() == "" or \
        "CANCELLED" in cluster.cmd("squeue", "-h", "-j", jobid, "-t", "all", "-o", "%T").stdout
    assert _steps(cluster, jobid) == []
    assert LocalTransport().find_by_marker(name) == []
    assert _cmdlines_with(f"pdctl-{name}-") == []  # the steps' srun processes here ended with them


def test_up_waits_for_a_pending_job_and_says_why(cluster: SlurmLab, write_topo: WriteTopo) -> None:
    blocker = _hold(cluster)  # a job of someone else on every host: an exclusive holder must wait
    topo = write_topo("{}")
    proc = subprocess.Popen([sys.executable, "-m", "pdctl", "up", "-t", str(topo), "--skip-provision",
                             "--no-smoke-test"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr],  # type: ignore[union-attr]
                              daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while not any("PENDING (Resources)" in line for line in seen) and time.monotonic() < deadline:
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                continue
        assert any(line.startswith("slurm: job ") and "PENDING (Resources)" in line for line in seen), seen
        assert proc.poll() is None  # still waiting
        cluster.cmd("scancel", blocker)
        assert proc.wait(timeout=120) == 0
        reader.join(timeout=10)
        while not lines.empty():
            seen.append(lines.get())
        assert any("runs on h1, h2, h3" in line for line in seen), seen
    finally:
        if proc.poll() is None:
            proc.kill()
        cluster.cmd("scancel", blocker)
    down = runner.invoke(app, ["down", "-t", str(topo)])
    assert down.exit_code == 0, down.output


def test_down_without_the_state_file_finds_the_job_by_name(cluster: SlurmLab, write_topo: WriteTopo,
                                                           pdctl_home: Path) -> None:
    topo = write_topo("{}")
    up = runner.invoke(app, ["up", "-t", str(topo), "--skip-provision", "--no-smoke-test"])
    assert up.exit_code == 0, up.output
    jobid = _job_named(cluster, f"pdctl-{topo.stem}")
    (pdctl_home / "deployments" / f"{topo.stem}.json").unlink()

    down = runner.invoke(app, ["down", "-t", str(topo)])
    assert down.exit_code == 0, down.output
    assert f"slurm: cancelled job {jobid}" in down.stderr
    assert _wait_gone(cluster, jobid) == "CANCELLED"
    assert LocalTransport().find_by_marker(topo.stem) == []


def test_a_launch_that_fails_cancels_the_job_it_submitted(cluster: SlurmLab, write_topo: WriteTopo) -> None:
    topo = write_topo("{}")
    up = runner.invoke(app, ["up", "-t", str(topo), "--skip-provision", "--set", "sim.args=['--speed','0']"])
    assert up.exit_code == 1, up.output
    assert "this `up` submitted it and started nothing" in up.stderr
    jobid = up.stderr.split("slurm: job ", 1)[1].split()[0]
    assert _wait_gone(cluster, jobid) == "CANCELLED"
    assert _job_named(cluster, f"pdctl-{topo.stem}") == ""
    assert LocalTransport().find_by_marker(topo.stem) == []


def test_attach_mode_leaves_the_users_job_running(cluster: SlurmLab, write_topo: WriteTopo) -> None:
    jobid = _hold(cluster)
    try:
        # the router's node names its host; the others take the remaining hosts in order
        nodes: list[dict[str, object]] = [{"name": "p"}, {"name": "d"}, {"name": "r", "slurm_node": "h1"}]
        topo = write_topo(f"{{jobid: {jobid}}}", nodes=nodes)
        up = runner.invoke(app, ["up", "-t", str(topo), "--skip-provision", "--no-smoke-test"])
        assert up.exit_code == 0, up.output
        assert f"slurm: attached to job {jobid} RUNNING on h1, h2, h3" in up.stderr
        assert "sbatch" not in up.stderr
        st = json.loads(runner.invoke(app, ["status", "-t", str(topo), "--json"]).stdout)
        assert st["healthy"] is True and st["slurm"]["hosts"] == {"p": "h2", "d": "h3", "r": "h1"}
        assert st["slurm"]["submitted_by_pdctl"] is False

        efa = ["--set", "engine=vllm", "--set", "connector.backend=LIBFABRIC", "--set", "efa.required=true",
               "--set", "prefill[0].gpus=[0]", "--set", "decode[0].gpus=[0]"]
        doc = runner.invoke(app, ["doctor", "-t", str(topo), *efa, "--json"])
        assert doc.exit_code == 1, doc.output
        checks = {h["node"]: {c["name"]: c for c in h["checks"]} for h in json.loads(doc.stdout)["hosts"]}
        limit = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]  # srun hands the caller's limit to the step
        memlock = checks["p"]["memlock in a step"]
        if limit == resource.RLIM_INFINITY:
            assert memlock["status"] == "ok" and memlock["value"] == "unlimited"
        else:
            assert memlock["status"] == "fail" and memlock["value"] == f"{limit // 1024} KiB"
            assert "PropagateResourceLimitsExcept=MEMLOCK in slurm.conf" in memlock["fix"]

        down = runner.invoke(app, ["down", "-t", str(topo)])
        assert down.exit_code == 0, down.output
        assert f"slurm: job {jobid} is yours (slurm.jobid): left running" in down.stderr
        assert _job_state(cluster, jobid) == "RUNNING"
        assert [s for s in _steps(cluster, jobid) if s.startswith("pdctl-")] == []
        assert LocalTransport().find_by_marker(topo.stem) == []
    finally:
        cluster.cmd("scancel", jobid)


def test_a_job_cancelled_behind_pdctls_back(cluster: SlurmLab, write_topo: WriteTopo) -> None:
    topo = write_topo("{}")
    up = runner.invoke(app, ["up", "-t", str(topo), "--skip-provision", "--no-smoke-test"])
    assert up.exit_code == 0, up.output
    jobid = _job_named(cluster, f"pdctl-{topo.stem}")
    assert cluster.cmd("scancel", jobid).returncode == 0
    assert _wait_gone(cluster, jobid) == "CANCELLED"

    st = runner.invoke(app, ["status", "-t", str(topo), "--json"])
    assert st.exit_code == 1, st.output
    report = json.loads(st.stdout)
    assert report["healthy"] is False and report["slurm"]["state"] == "CANCELLED"
    assert {p["health"] for p in report["processes"]} == {f"job {jobid} CANCELLED"}

    text = runner.invoke(app, ["status", "-t", str(topo)])
    assert text.exit_code == 1
    assert f"slurm: job {jobid} CANCELLED, submitted by pdctl: nothing of {topo.stem} runs; `pdctl down` clears " \
        "it, `pdctl up` starts it in a new job" in text.stdout

    down = runner.invoke(app, ["down", "-t", str(topo)])
    assert down.exit_code == 0, down.output
    assert f"slurm: job {jobid} is CANCELLED: it ended without pdctl (time limit, preemption or scancel), and " \
        "its steps with it; nothing left to stop" in down.stderr
    for _ in range(50):
        if not LocalTransport().find_by_marker(topo.stem):
            break
        time.sleep(0.2)
    assert LocalTransport().find_by_marker(topo.stem) == []
    again = runner.invoke(app, ["status", "-t", str(topo), "--json"])
    assert json.loads(again.stdout)["slurm"]["state"] == "NONE"


def test_a_job_slurm_no_longer_knows(cluster: SlurmLab, write_topo: WriteTopo) -> None:
    topo = write_topo("{}")
    store = StateStore(topo.stem)
    store.save(DeploymentState(name=topo.stem, slurm={"jobid": 999998, "submitted": True}))
    st = runner.invoke(app, ["status", "-t", str(topo), "--json"])
    assert st.exit_code == 1
    assert json.loads(st.stdout)["slurm"] == {
        "jobid": 999998, "state": "GONE", "reason": "Slurm no longer knows the job", "nodes": [], "time_left": "",
        "submitted_by_pdctl": True, "hosts": {}}
    down = runner.invoke(app, ["down", "-t", str(topo)])
    assert down.exit_code == 0, down.output
    assert "slurm: job 999998 is GONE (Slurm no longer knows the job): it ended without pdctl" in down.stderr
    assert not store.path.exists()


def test_unknown_partition_is_refused_before_anything_is_submitted(cluster: SlurmLab, write_topo: WriteTopo) -> None:
    topo = write_topo("{partition: debgu}")
    up = runner.invoke(app, ["up", "-t", str(topo), "--skip-provision"])
    assert up.exit_code == 2, up.output
    assert "topology: slurm.partition: no partition `debgu` on this cluster (did you mean `debug`?)" in up.stderr
    assert _job_named(cluster, f"pdctl-{topo.stem}") == ""


def test_too_few_hosts(cluster: SlurmLab, write_topo: WriteTopo) -> None:
    topo = write_topo("{nodes: 2}")
    bad = runner.invoke(app, ["validate", "-t", str(topo)])
    assert bad.exit_code == 2
    line = topo.read_text().splitlines().index("slurm: {nodes: 2}") + 1
    assert f"{topo}:{line}: slurm.nodes: 2 host(s) for 3 topology node(s) on distinct hosts (allocate at least 3, " \
        "or put nodes on one host with the same slurm_node)" in bad.stderr

    jobid = _hold(cluster, nodes=1)
    try:
        small = write_topo(f"{{jobid: {jobid}}}")
        up = runner.invoke(app, ["up", "-t", str(small), "--skip-provision"])
        assert up.exit_code == 1, up.output
        assert f"Error: job {jobid} has 1 host(s) (h1) but the topology needs 3" in up.stderr
        assert _job_state(cluster, jobid) == "RUNNING"  # the user's job: left alone
        assert [s for s in _steps(cluster, jobid) if s.startswith("pdctl-")] == []
    finally:
        cluster.cmd("scancel", jobid)


def test_jobid_that_does_not_exist_or_does_not_run(cluster: SlurmLab, write_topo: WriteTopo) -> None:
    missing = write_topo("{jobid: 999999}")
    up = runner.invoke(app, ["up", "-t", str(missing), "--skip-provision"])
    assert up.exit_code == 2, up.output
    assert "topology: slurm.jobid: no job 999999 on this cluster" in up.stderr

    done = _hold(cluster, nodes=1, command="true")
    assert _wait_gone(cluster, done) == "COMPLETED"
    ended = write_topo(f"{{jobid: {done}}}")
    up = runner.invoke(app, ["up", "-t", str(ended), "--skip-provision"])
    assert up.exit_code == 1, up.output
    assert f"Error: slurm.jobid: job {done} COMPLETED, not running" in up.stderr
    assert cluster.cmd("squeue", "-h", "-o", "%j").stdout.count("pdctl-") == 0
