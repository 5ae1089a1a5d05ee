"""One bench: for each leg, redeploy with its overrides (fresh router state), wait, warm up, play the workload
length by length while metering the prefills' KV transfer, collect, guard; then put the deployment back as it
was found. `--no-redeploy` measures the running deployment as a single leg.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from pdctl.bench.leg import guards
from pdctl.bench.leg.legs import Endpoints, LegSpec, bidirectional, endpoints, leg_topology
from pdctl.bench.results.records import BenchResult, LegResult, RequestRecord
from pdctl.bench.runner import capacity, eviction, probe
from pdctl.bench.runner.collect import UsageMeter
from pdctl.bench.runner.restore import Deployer, restore
from pdctl.bench.traffic.agent import play_sessions
from pdctl.bench.traffic.client import ClientOptions, play
from pdctl.bench.traffic.remote_play import play_on_node
from pdctl.bench.traffic.workload import TEXT_APIS, Conversation, ConversationPlan, WorkloadSpec, build
from pdctl.errors import PdctlError, UsageError
from pdctl.lifecycle.hosts.connect import connected
from pdctl.lifecycle.hosts.interrupts import Interrupts, current
from pdctl.plan import python_for, run_dir
from pdctl.remote.base import Transport
from pdctl.remote.local import LocalTransport
from pdctl.remote.sshconnect import SshOptions
from pdctl.topology import Topology

T = TypeVar("T")

ClientWhere = Literal["auto", "local", "router-node"]
"""Where the load player runs: auto = on the router's node when that node is remote, else here."""
Hosts = Mapping[str, Transport]


class Progress(Protocol):
    def leg_started(self, name: str, total: int) -> None: ...

    def request_done(self, record: RequestRecord) -> None: ...

    def note(self, text: str) -> None: ...


@dataclass(frozen=True)
class BenchOptions:
    topology: Path
    workload: WorkloadSpec
    legs: list[LegSpec]
    clients: int = 1
    rate: float = 0.0
    no_redeploy: bool = False
    base_overrides: list[str] = field(default_factory=list)
    warmup: bool = True
    api_key: str | None = None
    ssh: SshOptions | None = None
    client: ClientWhere = "auto"
    capacity: capacity.CapacityOptions | None = None


def run_bench(opts: BenchOptions, deployer: Deployer | None, progress: Progress,
              save: Callable[[BenchResult], None] | None = None) -> BenchResult:
    """Every leg, then `save(result)` (the report), then the deployment put back as found: a Ctrl-C stops the
    legs and keeps what finished; one more, or one during the restore, takes the deployment down instead, and
    `result.deployment` says which state it was left in."""
    base = leg_topology(opts.topology, opts.base_overrides, LegSpec("base", ()))
    if base.slurm is not None:
        if not opts.no_redeploy:
            raise UsageError("bench legs that redeploy are not supported inside a Slurm job yet",
                             hint="`pdctl up` the topology, then `pdctl bench --no-redeploy`")
        from pdctl.slurm.allocation import bound

        base = bound(base)
    legs = [LegSpec(opts.legs[0].name if opts.legs else base.name, ())] if opts.no_redeploy else opts.legs
    if not opts.no_redeploy and deployer is None:
        raise UsageError("legs need the lifecycle to redeploy", hint="pass --no-redeploy to bench what is running")
    start = time.monotonic()
    result = BenchResult(
        topology=base.name,
        simulated=base.engine == "sim",
        workload=_describe(opts.workload, opts),
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        host={"cpus": os.cpu_count() or 0, "load_average_start": _load()},
    )
    # Every leg's topology and the corpus are checked before anything is stopped or started.
    topos = [base if opts.no_redeploy else leg_topology(opts.topology, opts.base_overrides, s) for s in legs]
    build(dataclasses.replace(opts.workload, lengths=(16,), conversations=1, turns=1))
    ctrl_c = Interrupts(progress.note, "the bench's bookkeeping")
    with connected(base.nodes, opts.ssh) as hosts, ctrl_c.installed():
        return _run(opts, deployer, progress, base, legs, topos, hosts, result, start, save, ctrl_c)


def _run(opts: BenchOptions, deployer: Deployer | None, progress: Progress, base: Topology, legs: list[LegSpec],
         topos: list[Topology], hosts: Hosts, result: BenchResult, start: float,
         save: Callable[[BenchResult], None] | None, ctrl_c: Interrupts) -> BenchResult:
    base_ep = endpoints(base)
    was_running = probe.healthy(hosts[base_ep.router_node], base_ep.router_url)
    if opts.no_redeploy and not was_running:
        raise UsageError(
            f"{base.name} is not running (no answer from {base_ep.router_url}/health)",
            hint=f"start it with `pdctl up -t {opts.topology}`, or drop --no-redeploy",
        )
    workload = opts.workload
    kept = _Kept(progress)
    progress = kept
    current: tuple[LegSpec, Topology] | None = None
    redeploys = deployer is not None and not opts.no_redeploy
    then = f"stopping the bench and writing the report of the requests that finished{_down_instead(base, redeploys)}"
    with ctrl_c.stops(then=then):
        try:
            for spec, topo in zip(legs, topos, strict=True):
                current, kept.records = (spec, topo), []
                try:
                    ep = _deploy(spec, topo, base_ep, hosts, deployer if not opts.no_redeploy else None, progress)
                except PdctlError as exc:
                    # One leg that cannot deploy (a setting the engine refuses) fails itself, not the other legs.
                    progress.note(f"leg {spec.name}: could not deploy: {exc.message}")
                    failed = LegResult(spec.name, list(spec.overrides), bidirectional(topo), topo.engine == "sim")
                    lines = [x.strip() for x in exc.message.splitlines() if x.strip()]
                    failed.failures.append(f"could not deploy: {' … '.join(dict.fromkeys([lines[0], lines[-1]]))}")
                    result.legs.append(failed)
                    continue
                workload = _calibrated(workload, ep, hosts)
                result.workload = {**_describe(workload, opts), "client": client_where(opts, topo, hosts)}
                result.legs.append(run_leg(spec, topo, ep, workload, opts, progress, hosts, result))
                current = None
        except KeyboardInterrupt:  # keep what finished: the report is written from it, before anything else
            result.interrupted = True
            if current is not None and kept.records:
                spec, topo = current
                cut = LegResult(spec.name, list(spec.overrides), bidirectional(topo), topo.engine == "sim",
                                records=list(kept.records), mode=topo.mode)
                cut.failures.append(f"interrupted (Ctrl-C) after {len(cut.records)} requests")
                result.legs.append(cut)
            progress.note(f"interrupted: writing the report of the {len(result.records)} requests that finished"
                          f"{_restoring(base, redeploys)}; Ctrl-C again takes {base.name} down instead")
    result.wall_s = time.monotonic() - start
    result.host["load_average_end"] = _load()
    if save is not None:
        with ctrl_c.finishing(f"writing the report{_down_instead(base, redeploys)}"):
            save(result)
    if redeploys:
        assert deployer is not None
        # a Ctrl-C beyond the one that stopped the legs asks to stop now: down, not a redeploy
        done = restore(base, opts.topology, was_running, deployer, ctrl_c, progress.note,
                       stop_now=ctrl_c.count > int(result.interrupted))
        result.deployment, result.deployment_state = done.line, done.state
    result.interrupted = result.interrupted or ctrl_c.count > 0  # a Ctrl-C after the legs still ends it as one
    return result


def _restoring(base: Topology, redeploys: bool) -> str:
    return f", then {base.name} is put back as it was found" if redeploys else ""


def _down_instead(base: Topology, redeploys: bool) -> str:
    """What a Ctrl-C more than the first makes of the restore."""
    return f"; then {base.name} is taken down, not put back" if redeploys else ""


def _load() -> list[float]:
    """This machine's load average over 1, 5 and 15 minutes."""
    return [round(x, 2) for x in os.getloadavg()]


class _Kept:
    """The bench's progress, also keeping the current leg's finished records for a bench cut short by Ctrl-C."""

    def __init__(self, inner: Progress) -> None:
        self.inner = inner
        self.records: list[RequestRecord] = []

    def leg_started(self, name: str, total: int) -> None:
        self.inner.leg_started(name, total)

    def request_done(self, record: RequestRecord) -> None:
        self.records.append(record)
        self.inner.request_done(record)

    def note(self, text: str) -> None:
        self.inner.note(text)


def _deploy(spec: LegSpec, topo: Topology, running: Endpoints, hosts: Hosts, deployer: Deployer | None,
            progress: Progress) -> Endpoints:
    """Redeploy for the leg and wait for every endpoint; one retry, so a transient launch failure costs no leg."""
    try:
        return _deploy_once(spec, topo, running, hosts, deployer, progress)
    except PdctlError as exc:
        if deployer is None:
            raise
        progress.note(f"leg {spec.name}: deploy failed ({exc.message.splitlines()[0]}); retrying once")
    return _deploy_once(spec, topo, running, hosts, deployer, progress)


def _deploy_once(spec: LegSpec, topo: Topology, running: Endpoints, hosts: Hosts, deployer: Deployer | None,
                 progress: Progress) -> Endpoints:
    """The leg's endpoints, healthy: from the plan the redeploy started, or `running` (the deployment's) without one."""
    ep = running
    if deployer is not None:
        progress.note(f"leg {spec.name}: redeploying with {', '.join(spec.overrides) or 'no overrides'}")
        ep = endpoints(topo, deployer.redeploy(topo))
    probe.wait_healthy([(hosts[node], url) for node, url in ep.health_targets()])
    return ep


def client_where(opts: BenchOptions, topo: Topology, hosts: Hosts) -> str:
    """`local`, or `router node <name>` when the player runs next to the router."""
    node = topo.router.node
    remote = not isinstance(hosts[node], LocalTransport)
    if opts.client == "router-node" or (opts.client == "auto" and remote):
        return f"router node {node}"
    return "local"


def run_leg(
    spec: LegSpec, topo: Topology, ep: Endpoints, workload: WorkloadSpec, opts: BenchOptions, progress: Progress,
    hosts: Hosts, result: BenchResult | None = None,
) -> LegResult:
    leg = LegResult(
        name=spec.name,
        overrides=list(spec.overrides),
        bidirectional=bidirectional(topo),
        simulated=topo.engine == "sim",
        mode=topo.mode,
        engines=len(ep.prefill_urls) + len(ep.decode_urls),
        shape=f"{len(ep.decode_urls)} aggregated" if topo.mode == "aggregated"
        else f"{len(ep.prefill_urls)}P{len(ep.decode_urls)}D",
    )
    started = time.monotonic()
    client = ClientOptions(
        url=ep.router_url,
        model=ep.model,
        api=workload.api,
        output_tokens=workload.output_tokens,
        clients=opts.clients,
        rate=opts.rate,
        api_key=opts.api_key or (os.environ.get(topo.router.api_key_env) if topo.router.api_key_env else None),
        seed=workload.seed,
    )
    if opts.capacity is not None:
        cap = opts.capacity
        evict_from = 0
        if cap.evict:
            size = _eviction_size(cap, ep, hosts, progress, result)
            evict_from = size.evict_from
            if result is not None:
                result.eviction = size.to_json()
        return _capacity_leg(spec, topo, ep, leg, client, cap, progress, hosts, started, evict_from)
    plans = build(workload)
    player = _player(opts, topo, hosts)
    if opts.warmup and not _warm_up(spec.name, plans[0], client, progress, leg, player):
        leg.wall_s = time.monotonic() - started
        return leg
    progress.leg_started(spec.name, sum(p.turns for p in plans))
    meter = probe.KvMeter(ep, hosts)
    pulls = probe.KvMeter(ep, hosts, decodes=True)
    for length in workload.lengths:
        convs = [Conversation(p, workload.api, f"{spec.name}-{p.key}") for p in plans if p.length == length]
        meter.start()
        pulls.start()
        leg.records += player(convs, client, spec.name, progress.request_done)
        kv = meter.stop()
        leg.pull_by_length[length] = pulls.stop()
        leg.kv_by_length[length] = kv
        leg.kv = leg.kv + kv
    leg.router_stats = probe.router_stats(hosts[ep.router_node], ep.router_url)
    leg.failures = guards.check(leg)
    leg.wall_s = time.monotonic() - started
    return leg


def _eviction_size(cap: capacity.CapacityOptions, ep: Endpoints, hosts: Hosts, progress: Progress,
                   result: BenchResult | None) -> eviction.EvictionSize:
    """The prefills' KV read once, at the first P/D leg; later legs (and an aggregated one, which has no prefill)
    keep that sizing so every leg plays the same session counts."""
    if result is not None and result.eviction is not None and (result.eviction["evict_from"] or not ep.prefill_urls):
        known = result.eviction
        return eviction.EvictionSize(tuple(known["prefill_kv_tokens"]), known["shared_tokens"],
                                     known["session_tokens"], known["evict_from"])
    size = eviction.size(eviction.prefill_capacity(ep, hosts) if ep.prefill_urls else [None], cap.agent)
    progress.note(f"eviction profile: {size.describe()}")
    return size


def _capacity_leg(spec: LegSpec, topo: Topology, ep: Endpoints, leg: LegResult, client: ClientOptions,
                  cap: capacity.CapacityOptions, progress: Progress, hosts: Hosts, started: float,
                  evict_from: int = 0) -> LegResult:
    """Agent sessions, N per point; each point's sessions are new (their own seed) but share the system prompt, and
    each run of a point has sessions of its own. A simulator's --speed divides the arrival and think times, as it
    divides the engines' time. `evict_from` (the eviction profile, 0: unknown): the fewest sessions that evict, where
    its search starts; each point says whether it evicts."""
    scale = topo.sim.speed if topo.engine == "sim" else 1.0
    transport = hosts[ep.router_node].async_http()
    kv_meter = probe.KvMeter(ep, hosts)  # the prefills' D->P reads per point, as the sweep meters them per length

    def play_n(n: int, run: int = 0) -> list[RequestRecord]:
        seed = cap.agent.seed * 1000 + n + run * capacity.RUN_SEED
        agent = dataclasses.replace(cap.agent, sessions=n, seed=seed, run=run)
        progress.leg_started(f"{spec.name} x{n}" + (f" run {run + 1}" if run else ""), n * agent.turns)
        kv_meter.start()
        records = _run_interruptible(
            lambda: play_sessions(agent, client, spec.name, scale, progress.request_done, transport))
        kv = kv_meter.stop()
        leg.kv_by_length[n] = leg.kv_by_length[n] + kv if n in leg.kv_by_length else kv  # every run of the point
        leg.kv = leg.kv + kv
        for rec in records:
            rec.length = n  # a capacity record's "length" is its point's session count
        leg.records += records
        return records

    meter = UsageMeter.for_leg(ep, hosts, aggregated=topo.mode == "aggregated")
    points = capacity.measure(spec.name, play_n, cap, scale, meter, evict_from or 1)
    if evict_from:
        points = [dataclasses.replace(p, evicts=p.sessions >= evict_from) for p in points]
    leg.capacity = [p.to_json() for p in points]
    leg.router_stats = probe.router_stats(hosts[ep.router_node], ep.router_url)
    leg.failures = guards.check(leg, count_failed=False)
    leg.wall_s = time.monotonic() - started
    return leg


Player = Callable[[list[Conversation], ClientOptions, str, Callable[[RequestRecord], None] | None],
                  list[RequestRecord]]


def _player(opts: BenchOptions, topo: Topology, hosts: Hosts) -> Player:
    """Plays conversations here (through the router node's transport) or on the router's node itself."""
    node = topo.router.node
    transport = hosts[node]
    if client_where(opts, topo, hosts) == "local":
        def here(convs: list[Conversation], client: ClientOptions, leg: str,
                 on_record: Callable[[RequestRecord], None] | None) -> list[RequestRecord]:
            return _run_interruptible(lambda: play(convs, client, leg, on_record, transport=transport.async_http()))
        return here

    def there(convs: list[Conversation], client: ClientOptions, leg: str,
              on_record: Callable[[RequestRecord], None] | None) -> list[RequestRecord]:
        records = play_on_node(transport, python_for(topo, node=node), run_dir(topo, node), convs, client, leg)
        for rec in records:
            if on_record is not None:
                on_record(rec)
        return records
    return there


def _run_interruptible(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """`asyncio.run(main())` where Ctrl-C cancels the main task (the player's tasks and connections close as
    cancelled) and then raises KeyboardInterrupt, instead of raising it inside whichever task runs, which left
    unretrieved task exceptions and unfinished generators for asyncio to print with tracebacks. Under the bench's
    `Interrupts` the Ctrl-Cs after the first are said and held while the tasks wind down."""
    ctrl_c = current()
    if ctrl_c is None:
        return asyncio.run(main())  # asyncio's own Ctrl-C: the first cancels the main task
    cancelled = threading.Event()
    with asyncio.Runner() as runner:
        loop = runner.get_loop()
        task: list[asyncio.Task[T]] = []

        async def run() -> T:
            task.append(asyncio.current_task())  # type: ignore[arg-type]
            if cancelled.is_set():  # the Ctrl-C came before this task did
                raise asyncio.CancelledError
            return await main()

        def cancel() -> None:
            cancelled.set()
            if task:
                loop.call_soon_threadsafe(task[0].cancel)

        try:
            with ctrl_c.stops(then="stopping the traffic", cancel=cancel):
                done = runner.run(run())
        except asyncio.CancelledError:
            if cancelled.is_set():
                raise KeyboardInterrupt from None
            raise
    if cancelled.is_set():  # the Ctrl-C came as the traffic ended: it still stops the bench
        raise KeyboardInterrupt
    return done


def _warm_up(name: str, plan: ConversationPlan, client: ClientOptions, progress: Progress, leg: LegResult,
             player: Player) -> bool:
    """Two short turns outside the records, so the first measured request pays no cold-start cost."""
    short = dataclasses.replace(plan, key=f"warmup-{plan.key}", users=plan.users[:1])
    conv = Conversation(short, client.api, f"{name}-warmup")
    records = player([conv], dataclasses.replace(client, clients=1, rate=0.0), name, None)
    bad = next((r for r in records if not r.ok), None)
    if bad is not None:
        leg.failures.append(f"warm-up request failed: {bad.error or f'HTTP {bad.status}'}")
        progress.note(f"leg {name}: warm-up failed: {bad.error}")
        return False
    return True


def _calibrated(workload: WorkloadSpec, ep: Endpoints, hosts: Hosts) -> WorkloadSpec:
    """Size chat text in the engine's own tokens, measured once on its `/tokenize` (no local tokenizer)."""
    engine = (ep.prefill_urls or ep.decode_urls)[:1]  # an aggregated leg has only its engines
    if workload.api not in TEXT_APIS or workload.tokens_per_word != 1.0 or not engine:
        return workload
    sample = str(build(dataclasses.replace(workload, lengths=(400,), conversations=1, turns=1))[0].first)
    node = ep.prefill_logs[0][0] if ep.prefill_logs else ep.decode_nodes[0]
    ratio = probe.tokens_per_word(hosts[node], engine[0], ep.model, sample)
    return dataclasses.replace(workload, tokens_per_word=round(ratio, 4)) if ratio else workload


def _describe(w: WorkloadSpec, opts: BenchOptions) -> dict[str, object]:
    cap = opts.capacity
    if cap is not None:
        a = cap.agent
        slo = {k: getattr(cap.slo, k) for k in capacity.SLO_KEYS if getattr(cap.slo, k) != float("inf")}
        return {
            "profile": "agent", "api": a.api, "turns": a.turns, "system_tokens": a.system_tokens,
            "agent": {"turns": a.turns, "system_tokens": a.system_tokens, "task_tokens": a.task_tokens,
                      "tool_tokens": f"{a.tool_tokens.low:g}-{a.tool_tokens.high:g}",
                      "output_tokens": a.output_tokens, "think_s": f"{a.think_s.low:g}-{a.think_s.high:g}",
                      "arrival_rate": a.arrival_rate, "seed": a.seed},
            "sessions": list(cap.sessions) or "search", "slo": slo, "runs": cap.runs,
            **({"profile": "evict"} if cap.evict else {}),
        }
    return {
        "api": w.api,
        "lengths": list(w.lengths),
        "conversations": w.conversations,
        "turns": w.turns,
        "user_tokens": w.user_tokens,
        "output_tokens": w.output_tokens,
        "clients": opts.clients,
        "rate": opts.rate,
        "seed": w.seed,
        "tokens_per_word": w.tokens_per_word,
        "source": str(w.source) if w.source else "generated",
    }

