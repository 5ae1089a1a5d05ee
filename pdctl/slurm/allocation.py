"""Binding a topology to a running job: each node to one of the job's hosts, its address read on that host.

The result is the same `Topology` with `SlurmNode`s, so plan, launch, status and down run unchanged.
"""

from __future__ import annotations

import ipaddress

from pdctl.errors import Problem, SlurmError, TopologyError
from pdctl.remote.fanout import parallel
from pdctl.slurm.jobs import JobInfo, by_name, job, slurm
from pdctl.slurm.transport import SlurmTransport
from pdctl.state import StateStore
from pdctl.topology import Node, Topology

# Every global address of the host, as the host itself sees them.
ADDRESSES = "hostname -I 2>/dev/null || ip -o -4 addr show scope global | awk '{print $4}' | cut -d/ -f1"


class SlurmNode(Node):
    """A topology node bound to one host of a running job."""

    jobid: int
    deployment: str


def bind(topo: Topology, info: JobInfo) -> Topology:
    """`topo` with every node on a host of `info` (explicit `slurm_node`s, the rest in order) and its address."""
    hosts = info.nodes
    named = [n.slurm_node for n in topo.nodes if n.slurm_node is not None]
    for node in topo.nodes:
        if node.slurm_node is not None and node.slurm_node not in hosts:
            raise SlurmError(f"node `{node.name}`: slurm_node `{node.slurm_node}` is not a host of job {info.jobid} "
                             f"({', '.join(hosts)})", hint="set slurm_node to one of the job's hosts")
    free = [h for h in hosts if h not in named]
    unbound = [n for n in topo.nodes if n.slurm_node is None]
    if len(unbound) > len(free):
        raise SlurmError(
            f"job {info.jobid} has {len(hosts)} host(s) ({', '.join(hosts)}) but the topology needs "
            f"{len(set(named)) + len(unbound)}",
            hint="allocate more hosts (slurm.nodes), or place several nodes on one host with slurm_node",
        )
    placed = {n.name: n.slurm_node or free[unbound.index(n)] for n in topo.nodes}
    distinct = sorted(set(placed.values()))

    def address(host: str) -> str:
        probe = SlurmTransport(host, info.jobid, host, topo.name)
        return pick_address(probe.check(ADDRESSES, timeout=60.0).stdout, node_addr(host), host)

    found = parallel(distinct, address)
    nodes = [
        SlurmNode(**{**n.model_dump(), "slurm_node": placed[n.name], "jobid": info.jobid, "deployment": topo.name,
                     "address": n.address if "address" in n.model_fields_set else found[placed[n.name]]})
        for n in topo.nodes
    ]
    return topo.model_copy(update={"nodes": nodes})


def node_addr(host: str) -> str | None:
    """The address Slurm reaches `host` on (its NodeAddr), if the controller says."""
    res = slurm(["scontrol", "show", "node", "-o", host])
    fields = dict(w.split("=", 1) for w in res.stdout.split() if "=" in w) if res.returncode == 0 else {}
    return fields.get("NodeAddr")


def pick_address(listed: str, slurm_addr: str | None, host: str) -> str:
    """The host's address for peers: Slurm's NodeAddr when the host has it, else its first global IPv4."""
    addrs = listed.split()
    if slurm_addr and slurm_addr in addrs:
        return slurm_addr
    v4 = [a for a in addrs if _is_v4(a)]
    if v4:
        return v4[0]
    if slurm_addr:
        return slurm_addr
    raise SlurmError(f"{host}: no address found on the host (`hostname -I` printed nothing)",
                     hint="set the node's address in the topology")


def _is_v4(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 4
    except ValueError:
        return False


def recorded_job(topo: Topology, store: StateStore | None) -> tuple[int | None, bool]:
    """(job id, submitted by pdctl) of the deployment: `slurm.jobid` (attached), else the one `up` recorded."""
    assert topo.slurm is not None
    if topo.slurm.jobid is not None:
        return topo.slurm.jobid, False
    state = store.load() if store is not None else None
    rec = state.slurm if state else None
    if rec and isinstance(rec.get("jobid"), int):
        return int(rec["jobid"]), bool(rec.get("submitted"))
    # no record (a lost or moved state file): the holder job pdctl names after the deployment
    return by_name(topo.slurm.job_name_for(topo.name)), True


def attached_job(topo: Topology) -> JobInfo:
    """The job named by `slurm.jobid`, which must exist (exit 2 otherwise) and run (exit 1 otherwise)."""
    assert topo.slurm is not None and topo.slurm.jobid is not None
    jobid = topo.slurm.jobid
    info = job(jobid)
    if info is None:
        raise TopologyError([Problem("topology", None, "slurm.jobid", f"no job {jobid} on this cluster",
                                     "use the id `squeue --me` shows, or remove jobid to let pdctl submit one")])
    if not info.running:
        raise SlurmError(f"slurm.jobid: {info.describe()}, not running", hint=(
            "attach to a running allocation (`squeue --me`), or remove jobid to let pdctl submit one"))
    return info


def bound(topo: Topology) -> Topology:
    """For commands other than up/status/down: `topo` bound to its running job (a SlurmError when none runs)."""
    if topo.slurm is None:
        return topo
    jobid, _ = recorded_job(topo, StateStore(topo.name))
    if jobid is None:
        raise SlurmError(f"{topo.name} has no Slurm job", hint=f"start it with `pdctl up -t {topo.file}`")
    info = job(jobid)
    if info is None or not info.running:
        what = info.describe() if info else f"job {jobid} is gone"
        raise SlurmError(f"{topo.name}: {what}", hint=f"`pdctl up -t {topo.file}` submits a new job")
    return bind(topo, info)
