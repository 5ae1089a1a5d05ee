"""`pdctl doctor`: the facts and the dry run of provisioning, as a checklist per host: what is there, what is
missing, what `pdctl up` would change (each operation's first change) and what to do.

What is missing but `pdctl up` provisions itself (a venv, vLLM and NIXL, pdctl's wheel, pdctl's patch, the model
download) is marked `up`, not `fail`, when the dry run of that step says `up` would do it: doctor exits 1 only for
what `up` would stop at or cannot fix.

Doctor reads its facts and the operations' in one round trip per host, then previews every operation on them
(`provision.preview`); where a check asks what an operation asks ("is it done?"), the operation answers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.table import Table

import pdctl
from pdctl.facts.base import Fact, HostLayout, gather, layouts_from_env
from pdctl.facts.efa import EfaModule, FiInfo, InstallerVersion, PeerMem
from pdctl.facts.gpu import GpuMemory, GpuMemoryUse, NvidiaSmi
from pdctl.facts.host import Arch, DiskFree, ListeningPorts, Memlock, OsRelease, PortHolders, Sudo
from pdctl.facts.python import VllmCompat
from pdctl.lifecycle.bringup import provision
from pdctl.lifecycle.bringup.preflight import holder_words
from pdctl.lifecycle.bringup.provision import contexts
from pdctl.lifecycle.hosts.connect import reachable
from pdctl.operations import efa as efa_op
from pdctl.operations import model, python
from pdctl.operations.base import Context
from pdctl.operations.dry import Preview
from pdctl.operations.vllm import needs_prefix_check
from pdctl.plan import ProcessSpec, plan
from pdctl.remote.base import Transport
from pdctl.remote.fanout import parallel
from pdctl.remote.sshconnect import SshOptions
from pdctl.topology import Topology

Status = Literal["ok", "fail", "up", "info"]  # up: missing, and `pdctl up` provisions it
GIB = 1 << 30
UP_MARK = "↑"


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    value: str
    fix: str = ""


@dataclass
class HostChecks:
    node: str
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, ok: bool | None, value: str, fix: str = "", *, by_up: bool = False) -> None:
        """`by_up`: when not ok, `pdctl up` does it (status `up`, not `fail`)."""
        status: Status = "info" if ok is None else "ok" if ok else "up" if by_up else "fail"
        self.checks.append(Check(name, status, value, "" if ok else fix))


@dataclass
class DoctorReport:
    hosts: list[HostChecks]

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for h in self.hosts for c in h.checks)

    @property
    def for_up(self) -> int:
        """Checks that are missing and that `pdctl up` provisions."""
        return sum(c.status == "up" for h in self.hosts for c in h.checks)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "hosts": [asdict(h) for h in self.hosts]}

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        mark = {"ok": "[green]✓[/]", "fail": "[red]✗[/]", "up": f"[cyan]{UP_MARK}[/]", "info": "[dim]·[/]"}
        for host in self.hosts:
            table = Table(title=f"[bold]{escape(host.node)}[/]", title_justify="left", show_header=False, box=None)
            for c in host.checks:
                table.add_row(mark[c.status], c.name, escape(c.value), f"[dim]{escape(c.fix)}[/]")
            yield table


def node_ports(ctx: Context, specs: Sequence[ProcessSpec]) -> tuple[int, ...]:
    return tuple(sorted({p for s in specs if s.node == ctx.node.name for p in s.ports}))


def facts_for(ctx: Context, ports: tuple[int, ...] = ()) -> list[Fact[Any]]:
    """What doctor reads on one host; `ports` (the host's planned ports): who holds any of them, too."""
    disk = ctx.topo.hf_home if ctx.vllm and ctx.topo.hf_home else ctx.work_dir
    facts: list[Fact[Any]] = [OsRelease(), Arch(), Sudo(), Memlock(), DiskFree(disk), ListeningPorts()]
    if ports:
        facts.append(PortHolders(ports))
    facts.append(python.venv_state(ctx, tuple(r.name for r in python.requirements(ctx))))
    if ctx.vllm:
        facts += [NvidiaSmi(), GpuMemory(), VllmCompat(ctx.python), model.snapshot_fact(ctx)]
        if ctx.topo.efa.required:
            facts += [InstallerVersion(), EfaModule(), FiInfo(), PeerMem()]
    return facts


def host_checks(
    ctx: Context, specs: Sequence[ProcessSpec], values: Mapping[str, Any], previews: Sequence[Preview] = ()
) -> HostChecks:
    """Judge one host's facts; `previews` (its operations, dry) answer the checks that are an operation's own."""

    def get(fact: Fact[Any]) -> Any:
        return values[fact.key()]

    done = {p.name: p.error is None and not p.changes for p in previews}
    # the steps `up` would run: each changes something, or decides once an earlier step has changed the host
    does = {p.name for p in previews if p.changes or p.after_changes}

    topo, out = ctx.topo, HostChecks(ctx.node.name)
    os_info = get(OsRelease())
    out.add("os", None, f"{os_info.pretty if os_info else 'unknown'} {get(Arch())}")
    if ctx.vllm and topo.efa.required:
        _efa_checks(ctx, get, out)
    if ctx.vllm:
        gpus = get(NvidiaSmi())
        want = ctx.node.gpus
        names = sorted({g.name for g in gpus.gpus})
        out.add("gpus", len(gpus.gpus) >= max(want, 1), f"{len(gpus.gpus)}/{want or '≥1'} {', '.join(names)}"
                if gpus.gpus else gpus.error or "none", "install the NVIDIA driver; check `nvidia-smi` on the node")
        out.add("driver", gpus.driver is not None, gpus.driver or "none", "install the NVIDIA driver")
        _memory_checks(ctx, get(GpuMemory()), out)
    _python_checks(ctx, get, out, done, does)
    if ctx.vllm:
        snap = get(model.snapshot_fact(ctx))
        local = topo.model.local_dir
        out.add("model", done.get("model.download", snap.present),
                snap.path or (f"{local} has no config.json" if local else f"{topo.model.id} not found"),
                f"copy the model to {local} (`pdctl up` refuses without it), or unset model.local_dir to download "
                "model.id" if local else "`pdctl up` downloads it", by_up="model.download" in does)
    ports = node_ports(ctx, specs)
    busy = [p for p in ports if p in get(ListeningPorts())]
    holders = values.get(PortHolders(ports).key()) if busy else None
    held = "; ".join(f"{p} {holder_words(topo, ctx.node.name, p, holders)}" for p in busy)
    out.add("ports", not busy, f"busy: {held}" if busy else f"free: {list(ports)}",
            "stop what listens (`pdctl down`?)")
    free = get(DiskFree(topo.hf_home if ctx.vllm and topo.hf_home else ctx.work_dir))
    need = 100 * GIB if ctx.vllm and not topo.model.local_dir else GIB
    out.add("disk", free is not None and free >= need, f"{(free or 0) / GIB:.0f} GiB free",
            f"free space: at least {need // GIB} GiB is needed")
    for p in previews:  # what `pdctl up` would change: info, or a failure `up` would stop at
        failing = p.error is not None and not p.after_changes
        out.add(p.name, False if failing else None, p.describe(), (p.error.hint or "") if failing and p.error else "")
    return out


VLLM_DEFAULT_UTILIZATION = 0.9


def _memory_checks(ctx: Context, memory: list[GpuMemoryUse], out: HostChecks) -> None:
    """Each GPU's free memory against what the instances on it will take: vLLM refuses to start when the GPU has
    less free than gpu_memory_utilization x its total, and instances sharing a GPU take the sum."""
    topo = ctx.topo
    shares: dict[int, list[tuple[str, float]]] = {}
    for role, i, inst in topo.instances():
        if inst.node == ctx.node.name:
            share = topo.model_for(inst).gpu_memory_utilization or VLLM_DEFAULT_UTILIZATION
            for gpu in inst.gpus:
                shares.setdefault(gpu, []).append((f"{role}[{i}]", share))
    by_index = {m.index: m for m in memory}
    for gpu, owners in sorted(shares.items()):
        m = by_index.get(gpu)
        if m is None:
            continue
        need = sum(share for _, share in owners)
        need_mib = int(need * m.total_mib)
        who = " + ".join(f"{name} {share:g}" for name, share in owners)
        out.add(f"gpu {gpu} memory", m.free_mib >= need_mib,
                f"{m.free_mib} MiB free of {m.total_mib}; {who} = {need:g} needs {need_mib} MiB",
                "free the GPU (`nvidia-smi` shows who holds it; `pdctl down` if this deployment runs) or lower "
                "model.gpu_memory_utilization")


def _efa_checks(ctx: Context, get: Any, out: HostChecks) -> None:
    efa = ctx.topo.efa
    fabric = get(FiInfo())
    out.add("efa devices", efa_op.devices_ok(ctx, fabric.providers, fabric.devices),
            f"{fabric.devices}/{efa.devices} provider {','.join(fabric.providers) or 'none'}"
            + (f" ({fabric.error})" if fabric.error else ""),
            "attach the EFA interfaces at launch; check fi_info -p efa -t FI_EP_RDM")
    installed = get(InstallerVersion())
    pinned = efa.installer_version
    out.add("efa installer", not efa_op.outdated(installed, pinned), installed or "not installed",
            f"`pdctl up` installs {pinned} (set efa.sha256)")
    module = get(EfaModule())
    out.add("efa module", module.loaded is not None and not module.reboot_pending,
            f"loaded {module.loaded or 'none'}, installed {module.installed or 'none'}",
            "reboot the node (`pdctl up --allow-reboot`)")
    peer = get(PeerMem())
    out.add("efa_nv_peermem", peer is not None, peer or "not loaded", "GPUDirect RDMA needs it: rerun the installer")
    memlock = get(Memlock())
    if ctx.topo.slurm is not None:  # measured inside an srun step, where no systemd unit sets the limit
        out.add("memlock in a step", memlock is None, "unlimited" if memlock is None else f"{memlock} KiB",
                SLURM_MEMLOCK_FIX)
        return
    out.add("memlock", memlock is None, "unlimited" if memlock is None else f"{memlock} KiB",
            "EFA needs unlimited locked memory (/etc/security/limits.d/01_efa.conf; units get LimitMEMLOCK)")


SLURM_MEMLOCK_FIX = (
    "EFA needs unlimited locked memory in the steps: srun passes the login node's `ulimit -l` on "
    "(PropagateResourceLimits); set PropagateResourceLimitsExcept=MEMLOCK in slurm.conf and LimitMEMLOCK=infinity "
    "in slurmd's systemd unit on the nodes, or raise the limit where you run pdctl (limits.d, `ulimit -l unlimited`)"
)


def _python_checks(ctx: Context, get: Any, out: HostChecks, done: Mapping[str, bool], does: set[str]) -> None:
    reqs = python.requirements(ctx)
    venv = get(python.venv_state(ctx, tuple(r.name for r in reqs)))
    out.add("python", venv.python is not None, f"{ctx.venv_dir}: Python {venv.python}" if venv.python
            else f"no venv at {ctx.venv_dir}", "`pdctl up` creates it", by_up="python.venv" in does)
    for req in reqs:
        have = venv.version(req.name)
        good = python.satisfied(req, venv)
        value = f"{req.name} {have or 'missing'}"
        if req.name == "nixl" and have:
            backend = ctx.topo.connector.backend
            good = good and backend in venv.nixl_plugins
            value += f" (plugins: {', '.join(venv.nixl_plugins) or 'none'})"
        out.add(req.name, good, value, f"`pdctl up` installs {req} (with its {ctx.topo.connector.backend} plugin)",
                by_up="python.packages" in does)
    if ctx.venv and (ctx.runs_pdctl or ctx.vllm):
        have = venv.version("pdctl")
        shipped = done.get("pdctl.ship", have == pdctl.__version__)  # the same wheel, not only the same version
        build = ", another build" if have == pdctl.__version__ and not shipped else ""
        out.add("pdctl", shipped, f"{have or 'missing'} (CLI {pdctl.__version__}{build})", "`pdctl up` ships it",
                by_up="pdctl.ship" in does)
    if not ctx.vllm:
        return
    rows = [("kv_transfer_params streaming", "pin vLLM 0.33.0 or 0.26.0")]
    if needs_prefix_check(ctx.topo):
        rows.append(("prefix check at the prefill", "set router.verify_at: router, or pin vLLM 0.26.0"))
    if venv.version("vllm") is None:
        for name, _ in rows:
            out.add(name, False, "vllm not installed yet",
                    f"`pdctl up` installs vllm {ctx.topo.python.vllm_version} and patches it if it must",
                    by_up="vllm.compat" in does)
        return
    state = get(VllmCompat(ctx.python))
    for (name, fix), word in zip(rows, (state.streaming, state.prefix_check) if state else (None, None), strict=False):
        good = word in ("native", "patched")
        patch = word == "needs-patch"
        out.add(name, good, word or "unknown", "`pdctl up` applies pdctl's patch" if patch else fix,
                by_up=patch and "vllm.compat" in does)


def _same_versions(reports: dict[str, HostChecks], ctxs: list[Context], versions: dict[str, dict[str, str]]) -> None:
    for name in ("vllm", "nixl", "torch"):
        seen = {node: v[name] for node, v in versions.items() if v.get(name)}
        if len(set(seen.values())) > 1:
            value = ", ".join(f"{n}={v}" for n, v in sorted(seen.items()))
            for node in seen:
                reports[node].add(f"{name} on all hosts", False, value, "install the same version everywhere")


def doctor(
    topo: Topology,
    specs: Sequence[ProcessSpec],
    hosts: Mapping[str, Transport],
    layouts: Mapping[str, HostLayout] | None = None,
) -> DoctorReport:
    """Read the facts of every host (in parallel), preview provisioning on them, and judge them against the
    topology and its plan `specs`. Changes nothing."""
    layouts = layouts_from_env() if layouts is None else layouts
    ctxs = {c.node.name: c for c in contexts(topo, specs, layouts) if c.node.name in hosts}

    def read(ctx: Context) -> dict[str, Any]:
        wanted = {f.key(): f for f in [*facts_for(ctx, node_ports(ctx, specs)), *provision.facts_for(ctx)]}
        return gather(hosts[ctx.node.name], list(wanted.values()), ctx.layout)

    values = parallel(ctxs, lambda n: read(ctxs[n]), max_workers=len(ctxs))
    previews = {p.node: p for p in provision.preview(topo, specs, hosts, layouts=layouts, known=values)}
    reports: dict[str, HostChecks] = {}
    versions: dict[str, dict[str, str]] = {}
    for node, ctx in ctxs.items():
        dry = previews[node]
        reports[node] = host_checks(ctx, specs, values[node], dry.previews)
        if dry.error is not None:
            reports[node].add("provisioning preview", False, dry.error.message, dry.error.hint or "")
        venv = values[node][python.venv_state(ctx, tuple(r.name for r in python.requirements(ctx))).key()]
        found = {n: venv.version(n) for n in ("vllm", "nixl", "torch")} if ctx.vllm else {}
        versions[node] = {k: v for k, v in found.items() if v}
    _same_versions(reports, list(ctxs.values()), versions)
    return DoctorReport(list(reports.values()))


def diagnose(topo: Topology, ssh: SshOptions | None = None) -> DoctorReport:
    """`pdctl doctor`: connect to every node (a Slurm topology's through its job), judge those that answer, and
    report each one that does not as a failed `connect` check."""
    from pdctl.slurm.allocation import bound

    topo = bound(topo)
    with reachable(topo.nodes, ssh) as (hosts, failed):
        report = doctor(topo, plan(topo), hosts)
    for node, exc in failed.items():
        unreachable = HostChecks(node)
        unreachable.add("connect", False, exc.message, exc.hint or "check the node's address and SSH access")
        report.hosts.append(unreachable)
    return report
