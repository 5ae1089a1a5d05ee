"""Pure: the `sbatch` line of a topology's holder job and the `srun` line of a step on one host."""

from __future__ import annotations

from pdctl.topology import Topology

HOLD = "sleep infinity"


def step_prefix(deployment: str) -> str:
    """Every step pdctl starts for `deployment` is named with this prefix (how `down` finds them)."""
    return f"pdctl-{deployment}-"


def step_name(deployment: str, what: str) -> str:
    return f"{step_prefix(deployment)}{what}"


def hosts_needed(topo: Topology) -> int:
    """Distinct hosts the topology's nodes take: each named `slurm_node` once, every other node one."""
    named = {n.slurm_node for n in topo.nodes if n.slurm_node is not None}
    return len(named) + sum(1 for n in topo.nodes if n.slurm_node is None)


def sbatch_argv(topo: Topology) -> list[str]:
    """The holder job: an allocation that runs nothing but `sleep infinity` until `down` cancels it."""
    s = topo.slurm
    assert s is not None
    argv = ["sbatch", "--parsable", "--job-name", s.job_name_for(topo.name)]
    argv += ["--nodes", str(s.nodes or (len(s.nodelist) if s.nodelist else hosts_needed(topo)))]
    if s.partition:
        argv += ["--partition", s.partition]
    if s.nodelist:
        argv += ["--nodelist", ",".join(s.nodelist)]
    if s.time:
        argv += ["--time", s.time]
    if s.account:
        argv += ["--account", s.account]
    if s.exclusive:
        argv.append("--exclusive")
    if s.gres:
        argv += ["--gres", s.gres]
    if s.gpus_per_node:
        argv += ["--gpus-per-node", str(s.gpus_per_node)]
    # the holder's own output would land in the login directory of whoever ran `up`
    argv += ["--output", "/dev/null", *s.extra_sbatch, "--wrap", HOLD]
    return argv


def srun_argv(jobid: int | str, host: str, step: str) -> list[str]:
    """One task on `host` inside the job, sharing the allocation's resources with every other step."""
    return ["srun", "--jobid", str(jobid), "--overlap", "-N1", "-n1", "-w", host, "--job-name", step, "--quiet"]
