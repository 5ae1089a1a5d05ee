"""Bring every host of a topology to the state its processes need, changing only what disagrees.

`provision()` is the hook `pdctl up` calls between preflight and launch. Per host, in parallel: read the
facts the operations need in one round trip, then run the operations in order (EFA, venv, wheelhouse,
packages, pdctl itself, the vLLM patch, the model), printing what changed or why nothing did, and the time.
`preview()` is the same path dry (`up --dry-run`, `doctor`): each operation stops at its first change.
"""

from __future__ import annotations

import dataclasses
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from pdctl.errors import PdctlError
from pdctl.facts.base import Fact, HostLayout, gather, layout_for, layouts_from_env
from pdctl.facts.efa import EfaModule, FiInfo, InstallerVersion
from pdctl.facts.host import Sudo
from pdctl.facts.python import FileHashes, VllmCompat
from pdctl.lifecycle.hosts.interrupts import Interrupts
from pdctl.operations import efa, model, python, ship, vllm
from pdctl.operations.base import Context, Facts, Noop, Operation
from pdctl.operations.dry import Preview, dry_run
from pdctl.operations.steps import StepRunner
from pdctl.plan import ProcessSpec
from pdctl.remote.base import Transport
from pdctl.remote.fanout import parallel
from pdctl.topology import Topology

OPERATIONS: list[tuple[str, Callable[[Context], Operation]]] = [
    ("efa.installer", efa.installer),
    ("python.venv", python.venv),
    ("python.wheelhouse", python.wheelhouse),
    ("python.packages", python.packages),
    ("pdctl.ship", ship.ship),
    ("vllm.compat", vllm.compat),
    ("model.download", model.download),
]

# Operations whose refusal in a preview stands whatever the earlier ones change (`model.download` refuses only a
# `model.local_dir` without a model, which nothing before it creates).
INDEPENDENT = frozenset({"model.download"})


@dataclass
class OpResult:
    name: str
    changes: list[str] = field(default_factory=list)
    noop: str | None = None


@dataclass
class HostReport:
    node: str
    results: list[OpResult] = field(default_factory=list)
    seconds: float = 0.0
    error: PdctlError | None = None

    @property
    def changed(self) -> bool:
        return any(r.changes for r in self.results)


@dataclass
class HostPreview:
    """`preview()` of one host: each operation's first change or why it has none; `error`: facts unreadable."""

    node: str
    previews: list[Preview] = field(default_factory=list)
    error: PdctlError | None = None

    @property
    def changes(self) -> list[Preview]:
        return [p for p in self.previews if p.changes]


def contexts(
    topo: Topology,
    specs: Sequence[ProcessSpec],
    layouts: Mapping[str, HostLayout],
    *,
    allow_reboot: bool = False,
    wheel: Any = None,
) -> list[Context]:
    """One context per node that runs something (in `specs`, the topology's plan), with what it runs."""
    engines = {s.node for s in specs if s.role in ("prefill", "decode")}
    pdctl_nodes = {s.node for s in specs if s.role == "router" or topo.engine == "sim"}
    wheelhouse = python.wheelhouse_files(topo.python.wheelhouse) if topo.python.wheelhouse else []
    return [
        Context(
            topo=topo,
            node=node,
            facts=Facts(lambda _: {}),
            layout=layout_for(layouts, node.name),
            runs_engine=node.name in engines,
            runs_pdctl=node.name in pdctl_nodes,
            allow_reboot=allow_reboot,
            wheel=wheel,
            wheelhouse=wheelhouse,
        )
        for node in topo.nodes
        if node.name in engines or node.name in pdctl_nodes
    ]


def facts_for(ctx: Context) -> list[Fact[Any]]:
    """The facts the operations will read on this host, gathered up front in one round trip."""
    facts: list[Fact[Any]] = [Sudo(), python.venv_state(ctx)]
    reqs = python.requirements(ctx)
    if reqs:
        facts.append(python.venv_state(ctx, tuple(r.name for r in reqs)))
    if ctx.topo.efa.required and ctx.vllm:
        facts += [InstallerVersion(), EfaModule(), FiInfo()]
    if ctx.topo.python.wheelhouse:
        facts.append(FileHashes(ctx.remote_wheelhouse))
    if ctx.vllm:
        facts += [VllmCompat(ctx.python), model.snapshot_fact(ctx)]
    return facts


@dataclass
class Stopping:
    """Ctrl-C during provisioning: said at once with the step each host is running; each host finishes that step
    (a remote command is not cut halfway), then stops before its next one."""

    ctrl_c: Interrupts
    running: dict[str, str] = field(default_factory=dict)  # node -> the step it runs now
    lock: threading.Lock = field(default_factory=threading.Lock)

    def finishing(self) -> str:
        with self.lock:
            now = ", ".join(f"{node} {step}" for node, step in sorted(self.running.items()))
        return (f"{now or 'reading the hosts'}; then provisioning stops: nothing more is installed and "
                "nothing is started")

    def before(self, node: str, step: str) -> None:
        """Raises KeyboardInterrupt in a host's thread once Ctrl-C came: the step is not begun."""
        if self.ctrl_c.count:
            raise KeyboardInterrupt
        with self.lock:
            self.running[node] = step

    def after(self, node: str) -> None:
        with self.lock:
            self.running.pop(node, None)


def run_operation(
    op_name: str,
    operation: Callable[[Context], Operation],
    ctx: Context,
    transport: Transport,
    console: Console,
    runner: StepRunner,
    stopping: Stopping | None = None,
) -> OpResult:
    """Drive one operation on one host: execute each step it yields and send back the result."""
    result = OpResult(op_name)
    steps = operation(ctx)
    sent = None
    while True:
        try:
            step = steps.send(sent)
        except StopIteration:
            break
        if isinstance(step, Noop):
            result.noop = step.reason
            sent = None
            continue
        if stopping is not None:
            stopping.before(ctx.node.name, f"{op_name}: {step.describe}")
        console.print(f"  {escape(ctx.node.name)} {op_name}: [yellow]{escape(step.describe)}[/]", highlight=False)
        result.changes.append(step.describe)
        try:
            sent = runner.execute(step, transport, ctx)
        finally:
            if stopping is not None:
                stopping.after(ctx.node.name)
    if result.changes:  # everything read before may be stale now
        ctx.facts = Facts(lambda facts: gather(transport, facts, ctx.layout))
    return result


def read_facts(ctx: Context, transport: Transport) -> PdctlError | None:
    """Read the host's facts into `ctx` in one round trip; the error if the host could not answer."""
    ctx.facts = Facts(lambda facts: gather(transport, facts, ctx.layout))
    try:
        ctx.facts.prime(gather(transport, facts_for(ctx), ctx.layout))
    except PdctlError as exc:
        return exc
    return None


def provision_host(
    ctx: Context, transport: Transport, console: Console, runner: StepRunner, read_error: PdctlError | None = None,
    stopping: Stopping | None = None,
) -> HostReport:
    """Run the operations on one host whose facts `read_facts` has read (`read_error`: it could not)."""
    report = HostReport(ctx.node.name)
    start = time.monotonic()
    name = escape(ctx.node.name)
    stopped = False
    try:
        if read_error is not None:
            raise read_error
        for op_name, operation in OPERATIONS:
            report.results.append(run_operation(op_name, operation, ctx, transport, console, runner, stopping))
    except PdctlError as exc:
        report.error = exc
    except KeyboardInterrupt:
        stopped = True
    report.seconds = time.monotonic() - start
    changes = sum(len(r.changes) for r in report.results)
    status = f"{changes} change{'s' if changes != 1 else ''}" if changes else "no changes"
    if report.error:
        status = f"[red]failed[/] after {status}"
    if stopped:
        status = f"[red]stopped (Ctrl-C)[/] after {status}"
    console.print(f"[bold]{name}[/]: {status} in {report.seconds:.1f} s", highlight=False)
    if stopped:
        raise KeyboardInterrupt
    return report


@contextmanager
def _shipping(ctxs: list[Context], wheel: ship.Wheel | None) -> Iterator[None]:
    """Give the contexts pdctl's wheel: `wheel`, else one built now for the block (where a node has a venv)."""
    with tempfile.TemporaryDirectory(prefix="pdctl-wheel-") as tmp:
        if wheel is None and any(c.venv for c in ctxs):
            wheel = ship.build_wheel(Path(tmp))
        for ctx in ctxs:
            ctx.wheel = wheel
        yield


def provision(
    topo: Topology,
    specs: Sequence[ProcessSpec],
    hosts: dict[str, Transport],
    console: Console,
    *,
    allow_reboot: bool = False,
    layouts: Mapping[str, HostLayout] | None = None,
    wheel: ship.Wheel | None = None,
) -> list[HostReport]:
    """Provision `hosts` (node name -> transport) for `topo` and its plan `specs`; raises a `PdctlError` naming
    every host that failed.

    `layouts` (default: from $PDCTL_HOST_LAYOUT) say where a host keeps its tools and system files; `wheel`
    is pdctl's own wheel to ship (default: built now from the running pdctl).
    """
    layouts = layouts_from_env() if layouts is None else layouts
    ctxs = [c for c in contexts(topo, specs, layouts, allow_reboot=allow_reboot) if c.node.name in hosts]
    with _shipping(ctxs, wheel):
        console.print(f"provisioning {len(ctxs)} host{'s' if len(ctxs) != 1 else ''}", highlight=False)
        by_node = {c.node.name: c for c in ctxs}
        ctrl_c = Interrupts(lambda text: console.print(f"[bold]{escape(text)}[/]", highlight=False))
        stopping = Stopping(ctrl_c)
        # a Ctrl-C is said at once; each host finishes the step it runs, then stops (KeyboardInterrupt after)
        with ctrl_c.installed(), ctrl_c.finishing(stopping.finishing):
            try:
                read = parallel(by_node, lambda n: read_facts(by_node[n], hosts[n]), max_workers=len(by_node))
                if ctrl_c.count:
                    raise KeyboardInterrupt
                _refuse_missing_weights([c for c in ctxs if read[c.node.name] is None])
                with StepRunner(console) as runner:
                    reports = list(parallel(
                        by_node, lambda n: provision_host(by_node[n], hosts[n], console, runner, read[n], stopping),
                        max_workers=len(by_node)).values())
                if ctrl_c.count:
                    raise KeyboardInterrupt
            except KeyboardInterrupt:
                console.print(f"interrupted: provisioning stopped, {topo.name} was not started; "
                              f"`pdctl up -t {topo.file}` carries on from here", highlight=False)
                raise
    failed = [r for r in reports if r.error]
    if len(failed) == 1:
        raise failed[0].error  # type: ignore[misc]
    if failed:
        lines = "\n".join(f"  {r.node}: {r.error}" for r in failed)
        raise PdctlError(f"provisioning failed on {len(failed)} hosts:\n{lines}", failed[0].error.hint)  # type: ignore[union-attr]
    return reports


def _refuse_missing_weights(ctxs: Sequence[Context]) -> None:
    """A `model.local_dir` without a model fails the deployment whatever else changes: say so before any host
    is changed (a venv and vLLM installed for nothing), naming every node that lacks it."""
    missing = [e for e in (model.local_dir_missing(c) for c in ctxs) if e is not None]
    if len(missing) == 1:
        raise missing[0]
    if missing:
        lines = "\n".join(f"  {e.message}" for e in missing)
        raise PdctlError(f"model.local_dir is missing on {len(missing)} nodes:\n{lines}", model.LOCAL_DIR_FIX)


def preview_host(ctx: Context, transport: Transport, known: Mapping[str, Any] | None = None) -> HostPreview:
    """Every operation on one host, dry. `known`: facts already read this round (doctor's), used as they are."""
    report = HostPreview(ctx.node.name)
    ctx.facts = Facts(lambda facts: gather(transport, facts, ctx.layout))
    try:
        wanted = [f for f in facts_for(ctx) if known is None or f.key() not in known]
        ctx.facts.prime({**(known or {}), **(gather(transport, wanted, ctx.layout) if wanted else {})})
        for op_name, operation in OPERATIONS:
            result = dry_run(op_name, operation, ctx)
            if result.error is not None and report.changes and op_name not in INDEPENDENT:
                result = dataclasses.replace(result, after_changes=True)
            report.previews.append(result)
    except PdctlError as exc:  # a fact's read failed: the host went away
        report.error = exc
    return report


def preview(
    topo: Topology,
    specs: Sequence[ProcessSpec],
    hosts: Mapping[str, Transport],
    *,
    allow_reboot: bool = False,
    layouts: Mapping[str, HostLayout] | None = None,
    wheel: ship.Wheel | None = None,
    known: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[HostPreview]:
    """What `provision()` would change on each host, changing nothing: per operation its first change.

    `known` (node -> fact values) are facts the caller read already; the rest are read here, in one round trip.
    """
    layouts = layouts_from_env() if layouts is None else layouts
    ctxs = [c for c in contexts(topo, specs, layouts, allow_reboot=allow_reboot) if c.node.name in hosts]
    by_node = {c.node.name: c for c in ctxs}
    with _shipping(ctxs, wheel):
        return list(parallel(by_node, lambda n: preview_host(by_node[n], hosts[n], (known or {}).get(n)),
                             max_workers=len(by_node)).values())
