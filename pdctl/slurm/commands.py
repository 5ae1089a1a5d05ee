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


def planned_hosts(topo: Topology) -> dict[str, str]:
    """Node -> host as far as the file says before a job runs: `slurm_node`, else the next of `slurm.nodelist`,
    else a placeholder for the job's n-th host."""
    assert topo.slurm is not None
    named = {n.slurm_node for n in topo.nodes if n.slurm_node is not None}
    free = [h for h in (topo.slurm.nodelist or []) if h not in named]
    placed: dict[str, str] = {}
    index = 0
    for n in topo.nodes:
        if n.slurm_node is not None:
            placed[n.name] = n.slurm_node
            continue
        placed[n.name] = free[index] if index < len(free) else f"<host {index + 1} of the job>"
        index += 1
    return placed


def plan_lines(topo: Topology, processes: list[tuple[str, str]]) -> list[str]:
    """What `up` runs in Slurm: the holder job's sbatch line (or the job attached to), then one srun line per
    (process name, node); the process's own command line follows `...`."""
    import shlex

    assert topo.slurm is not None
    job: int | str = topo.slurm.jobid or "<job>"
    first = (f"attach to job {topo.slurm.jobid} (slurm.jobid): nothing is submitted" if topo.slurm.jobid
             else shlex.join(sbatch_argv(topo)))
    hosts = planned_hosts(topo)
    steps = [f"{name}: {shlex.join(srun_argv(job, hosts[node], step_name(topo.name, name)))} sh -s  # stdin: "
             f"{name}'s line below" for name, node in processes]
    return [first, *steps]


def planned_topology(topo: Topology) -> Topology:
    """`topo` with each node's address shown as its planned host (the real one is read on the host at `up`)."""
    hosts = planned_hosts(topo)
    nodes = [n if "address" in n.model_fields_set else n.model_copy(update={"address": hosts[n.name]})
             for n in topo.nodes]
    return topo.model_copy(update={"nodes": nodes})
