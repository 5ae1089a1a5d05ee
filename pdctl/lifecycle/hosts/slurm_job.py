"""The Slurm job around a deployment's lifecycle: `up` gets a running allocation (submitting a holder job unless
`slurm.jobid` attaches to one), `status` reports the job, `down` cancels pdctl's steps and the job it submitted.
"""

from __future__ import annotations

import difflib
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from rich.console import Console

from pdctl.errors import Problem, TopologyError
from pdctl.slurm import jobs
from pdctl.slurm.allocation import attached_job, bind, recorded_job
from pdctl.slurm.commands import sbatch_argv, step_prefix
from pdctl.state import DeploymentState, StateStore
from pdctl.topology import Topology


@dataclass
class SlurmStatus:
    """The deployment's job as `status` reports it."""

    jobid: int | None
    state: str
    reason: str = ""
    nodes: list[str] = field(default_factory=list)
    time_left: str = ""
    submitted_by_pdctl: bool = False
    hosts: dict[str, str] = field(default_factory=dict)
    """topology node -> the job's host it runs on"""


@contextmanager
def allocation(topo: Topology, console: Console, store: StateStore, state: DeploymentState,
               timeout: float | None = None) -> Iterator[Topology]:
    """`topo` bound to a running job for `up`. A job this call submitted is cancelled again when what follows
    fails before any process of the deployment was started (nothing is left queued or holding hosts)."""
    assert topo.slurm is not None
    jobs.controller()
    submitted_now = False
    jobid: int | None = topo.slurm.jobid
    if jobid is not None:
        info = attached_job(topo)
        state.slurm = {"jobid": info.jobid, "submitted": False}
        console.print(f"slurm: attached to {info.describe()} on {', '.join(info.nodes)}", highlight=False)
    else:
        jobid, _ = recorded_job(topo, store)
        known = jobs.job(jobid) if jobid is not None else None
        if known is None or not known.active:
            _check_partition(topo)
            argv = sbatch_argv(topo)
            console.print(f"slurm: {shlex.join(argv)}", highlight=False, markup=False)
            jobid = jobs.submit(argv)
            submitted_now = True
        state.slurm = {"jobid": jobid, "submitted": True}
        store.save(state)
    try:
        if topo.slurm.jobid is None:
            assert jobid is not None
            info = jobs.wait_running(jobid, lambda i: console.print(f"slurm: {i.describe()}", highlight=False),
                                     timeout)
            if submitted_now:
                console.print(f"slurm: job {jobid} runs on {', '.join(info.nodes)}", highlight=False)
        yield bind(topo, info)
    except BaseException:
        if submitted_now and not state.processes:
            console.print(f"slurm: cancelling job {jobid} (this `up` submitted it and started nothing)")
            jobs.cancel(str(jobid), jobid=jobid)
            state.slurm = None
            store.save(state)
        raise


def _check_partition(topo: Topology) -> None:
    """An unknown partition is a mistake in the file: refused with the cluster's partitions, nothing submitted."""
    assert topo.slurm is not None
    wanted = topo.slurm.partition
    if wanted is None:
        return
    known = jobs.partitions()
    if wanted not in known:
        close = difflib.get_close_matches(wanted, known, n=1)
        hint = f"did you mean `{close[0]}`?" if close else f"partitions: {', '.join(known) or 'none'}"
        raise TopologyError([Problem("topology", None, "slurm.partition",
                                     f"no partition `{wanted}` on this cluster", hint)])


def job_status(topo: Topology, store: StateStore | None) -> tuple[Topology | None, SlurmStatus]:
    """The job now, and `topo` bound to it when it runs (None: nothing of the deployment can be running)."""
    jobid, submitted = recorded_job(topo, store)
    if jobid is None:
        return None, SlurmStatus(None, "NONE", "no job: `pdctl up` submits one")
    info = jobs.job(jobid)
    if info is None:
        return None, SlurmStatus(jobid, "GONE", "Slurm no longer knows the job", submitted_by_pdctl=submitted)
    report = SlurmStatus(jobid, info.state, info.reason, info.nodes, info.time_left, submitted)
    if not info.running:
        return None, report
    bound = bind(topo, info)
    report.hosts = {n.name: n.slurm_node or "" for n in bound.nodes}
    return bound, report


def release(topo: Topology, jobid: int, submitted: bool, console: Console) -> None:
    """After `down` stopped the processes: cancel pdctl's steps left in the job, then the job if pdctl made it."""
    for step in jobs.steps(jobid, step_prefix(topo.name)):
        jobs.cancel(step)
        console.print(f"slurm: cancelled step {step}", highlight=False)
    if submitted:
        jobs.cancel(str(jobid), jobid=jobid)
        console.print(f"slurm: cancelled job {jobid}", highlight=False)
    else:
        console.print(f"slurm: job {jobid} is yours (slurm.jobid): left running", highlight=False)


def job_gone(topo: Topology, job: SlurmStatus, console: Console) -> None:
    """`down` without a running job: say what happened to it; a job pdctl submitted that still waits is cancelled."""
    if job.jobid is None:
        console.print(f"slurm: {topo.name} has no job recorded; nothing runs in Slurm for it", highlight=False)
        return
    if job.submitted_by_pdctl and job.state in jobs.ACTIVE:
        jobs.cancel(str(job.jobid), jobid=job.jobid)
        console.print(f"slurm: cancelled job {job.jobid} ({job.state}: it never ran)", highlight=False)
        return
    reason = f" ({job.reason})" if job.reason and job.reason != "None" else ""
    console.print(f"slurm: job {job.jobid} is {job.state}{reason}: it ended without pdctl (time limit, "
                  "preemption or scancel), and its steps with it; nothing left to stop", highlight=False)
