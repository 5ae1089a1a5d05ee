"""The cluster as the login node sees it: submit, look up, wait for and cancel jobs and their steps.

Every call is a Slurm client command (`sbatch`, `scontrol`, `squeue`, `sacct`, `sinfo`, `scancel`) run here;
they find the cluster through the usual `SLURM_CONF` / `/etc/slurm/slurm.conf`.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pdctl.errors import SlurmError

ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "REQUEUED", "RESIZING")
"""States in which a job may still run pdctl's steps (or will)."""

TOOLS_HINT = "run pdctl on a login node of the cluster: it needs sbatch, srun, squeue, scontrol, scancel and sinfo"


@dataclass(frozen=True)
class JobInfo:
    """One job as Slurm reports it now."""

    jobid: int
    state: str
    reason: str = ""
    nodes: list[str] = field(default_factory=list)
    time_left: str = ""
    partition: str = ""
    name: str = ""

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    def describe(self) -> str:
        reason = f" ({self.reason})" if self.reason and self.reason != "None" else ""
        return f"job {self.jobid} {self.state}{reason}"


def slurm(argv: Sequence[str], *, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run one Slurm client command here; a missing tool or a hung controller is a SlurmError."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmError(f"`{argv[0]}` is not installed on this machine", hint=TOOLS_HINT) from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{shlex.join(argv)}` got no answer in {timeout:g}s",
                         hint="check that slurmctld is up (`scontrol ping`)") from None


def controller() -> None:
    """`scontrol ping` here: a SlurmError naming this machine, SLURM_CONF and munge when no controller answers."""
    conf = os.environ.get("SLURM_CONF")
    if conf and not os.path.exists(conf):
        raise unreachable(f"SLURM_CONF names {conf}, which does not exist")
    try:
        res = slurm(["scontrol", "ping"])
    except SlurmError as exc:
        if exc.hint == TOOLS_HINT:  # not installed: that message says it already
            raise
        raise unreachable(exc.message) from None
    if res.returncode != 0 or " is DOWN" in res.stdout:
        raise unreachable(_said(res))


def unreachable(detail: str) -> SlurmError:
    """The one message for a controller this machine cannot reach, whichever Slurm command found out."""
    conf = os.environ.get("SLURM_CONF")
    where = f"SLURM_CONF ({conf})" if conf else "/etc/slurm/slurm.conf (SLURM_CONF is not set)"
    return SlurmError(
        f"the Slurm controller is unreachable from {socket.gethostname()} (the login node pdctl runs its Slurm "
        f"commands on): {detail}",
        hint=f"run `scontrol ping` on {socket.gethostname()}: slurmctld must be up and reachable from here, "
        f"{where} must be this cluster's slurm.conf, and munged must run here (`munge -n | unmunge`)",
    )


def _said(res: subprocess.CompletedProcess[str]) -> str:
    """What a Slurm command printed, on one line, without its banners."""
    lines = [ln.strip() for ln in (res.stdout + "\n" + res.stderr).splitlines()]
    text = " ".join(ln for ln in lines if ln and not ln.startswith("**"))
    return text[-300:] or f"exit status {res.returncode}"


def _no_controller(res: subprocess.CompletedProcess[str]) -> bool:
    text = res.stderr + res.stdout
    return any(s in text for s in ("Unable to contact slurm controller", "Could not establish a configuration source"))


def failed(argv: Sequence[str], res: subprocess.CompletedProcess[str]) -> SlurmError:
    if _no_controller(res):
        return unreachable(f"`{shlex.join(argv)}`: {_said(res)}")
    tail = " ".join((res.stderr or res.stdout).split())[-300:]
    return SlurmError(f"`{shlex.join(argv)}` exited {res.returncode}: {tail}",
                      hint="see Slurm's message above; `sinfo` shows the partitions and their hosts")


def submit(argv: Sequence[str]) -> int:
    """`sbatch --parsable ...` -> the job id."""
    res = slurm(argv)
    first = res.stdout.strip().split(";")[0]
    if res.returncode != 0 or not first.isdigit():
        raise failed(argv, res)
    return int(first)


def job(jobid: int) -> JobInfo | None:
    """The job now (scontrol, else accounting once the controller forgot it); None when Slurm knows no such job."""
    res = slurm(["scontrol", "show", "job", "-o", str(jobid)])
    if res.returncode == 0 and res.stdout.strip():
        return _from_scontrol(jobid, res.stdout)
    if "Invalid job id" not in res.stderr:
        raise failed(["scontrol", "show", "job", "-o", str(jobid)], res)
    acct = slurm(["sacct", "-X", "-n", "-P", "-j", str(jobid), "-o", "State,Reason,NodeList,Partition,JobName"])
    rows = [r.split("|") for r in acct.stdout.splitlines() if r.strip()] if acct.returncode == 0 else []
    if not rows or len(rows[0]) < 5:
        return None
    state, reason, _, partition, name = rows[0][:5]
    return JobInfo(jobid, state.split()[0], reason, [], "", partition, name)


def _from_scontrol(jobid: int, text: str) -> JobInfo:
    fields = dict(w.split("=", 1) for w in text.split() if "=" in w)
    state = fields.get("JobState", "UNKNOWN")
    nodes = hostnames(fields.get("NodeList", "")) if state == "RUNNING" else []
    left = ""
    if state == "RUNNING":
        res = slurm(["squeue", "-h", "-j", str(jobid), "-o", "%L"])
        left = res.stdout.strip() if res.returncode == 0 else ""
    return JobInfo(jobid, state, fields.get("Reason", ""), nodes, left, fields.get("Partition", ""),
                   fields.get("JobName", ""))


def hostnames(nodelist: str) -> list[str]:
    """`h[1-3],g1` -> ['h1', 'h2', 'h3', 'g1'], in Slurm's order."""
    if not nodelist or nodelist == "(null)":
        return []
    res = slurm(["scontrol", "show", "hostnames", nodelist])
    if res.returncode != 0:
        raise failed(["scontrol", "show", "hostnames", nodelist], res)
    return res.stdout.split()


def wait_running(jobid: int, progress: Callable[[JobInfo], None], timeout: float | None = None) -> JobInfo:
    """Poll until the job runs; every change of state or reason goes to `progress`. A job that ends first or
    vanishes is a SlurmError."""
    deadline = None if timeout is None else time.monotonic() + timeout
    last: tuple[str, str] | None = None
    pause = 0.2
    while True:
        info = job(jobid)
        if info is None:
            raise SlurmError(f"job {jobid} disappeared while waiting for it to start",
                             hint="look at `squeue --me` and the cluster's logs")
        if (info.state, info.reason) != last:
            progress(info)
            last = (info.state, info.reason)
        if info.running:
            return info
        if not info.active:
            raise SlurmError(f"{info.describe()} before it ran", hint="look at the job with `scontrol show job "
                             f"{jobid}`; `pdctl up` submits a new one")
        if deadline is not None and time.monotonic() > deadline:
            raise SlurmError(f"{info.describe()}: not running after {timeout:g}s",
                             hint=f"it stays queued; `scancel {jobid}` or wait and rerun `pdctl up`")
        time.sleep(pause)
        pause = min(pause * 1.5, 5.0)


def partitions() -> list[str]:
    res = slurm(["sinfo", "-h", "-o", "%R"])
    if res.returncode != 0:
        raise failed(["sinfo", "-h", "-o", "%R"], res)
    return sorted(set(res.stdout.split()))


def steps(jobid: int, prefix: str) -> list[str]:
    """Ids (`J.S`) of the job's steps whose name starts with `prefix`."""
    res = slurm(["squeue", "-h", "-s", "-j", str(jobid), "-o", "%i %j"])
    if res.returncode != 0:
        return []
    rows = [line.split(None, 1) for line in res.stdout.splitlines()]
    return [r[0] for r in rows if len(r) == 2 and r[1].startswith(prefix)]


def cancel(target: str, *, wait: float = 30.0, jobid: int | None = None) -> None:
    """`scancel` a job or a step; with `jobid`, wait until that job is no longer active."""
    res = slurm(["scancel", target])
    if res.returncode != 0 and "Invalid job id" not in res.stderr and "already completing" not in res.stderr:
        raise failed(["scancel", target], res)
    if jobid is None:
        return
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        info = job(jobid)
        if info is None or (not info.active and info.state != "COMPLETING"):
            return
        time.sleep(0.2)
    raise SlurmError(f"job {jobid} still active {wait:g}s after scancel", hint=f"check `squeue -j {jobid}`")


def by_name(name: str) -> int | None:
    """The newest active job of this user named `name` (how a lost state file's job is found again)."""
    argv = ["squeue", "-h", "--me", "--name", name, "-o", "%i"]
    res = slurm(argv)
    if res.returncode != 0 and _no_controller(res):
        raise failed(argv, res)
    ids = [int(w) for w in res.stdout.split() if w.isdigit()] if res.returncode == 0 else []
    return max(ids) if ids else None
