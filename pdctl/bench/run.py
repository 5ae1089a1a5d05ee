"""One bench: for each leg, redeploy with its overrides (fresh router state), wait, warm up, play the workload
length by length while metering the prefills' KV transfer, collect, guard; then put the deployment back as it
was found. `--no-redeploy` measures the running deployment as a single leg.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from pdctl.bench import guards, probe
from pdctl.bench.client import ClientOptions, play
from pdctl.bench.legs import Endpoints, LegSpec, bidirectional, endpoints, leg_topology
from pdctl.bench.records import BenchResult, LegResult, RequestRecord
from pdctl.bench.workload import TEXT_APIS, Conversation, ConversationPlan, WorkloadSpec, build
from pdctl.errors import PdctlError, UsageError
from pdctl.remote.hosts import connected
from pdctl.topology import Topology


class Deployer(Protocol):
    """What the bench needs from the lifecycle: start a whole deployment from scratch, and stop it."""

    def redeploy(self, topo: Topology) -> None: ...

    def down(self, topo: Topology) -> None: ...


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


def run_bench(opts: BenchOptions, deployer: Deployer | None, progress: Progress) -> BenchResult:
    base = leg_topology(opts.topology, opts.base_overrides, LegSpec("base", ()))
    legs = [LegSpec(opts.legs[0].name if opts.legs else base.name, ())] if opts.no_redeploy else opts.legs
    if not opts.no_redeploy and deployer is None:
        raise UsageError("legs need the lifecycle to redeploy", hint="pass --no-redeploy to bench what is running")
    start = time.monotonic()
    result = BenchResult(
        topology=base.name,
        simulated=base.engine == "sim",
        workload=_describe(opts.workload, opts),
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    # Every leg's topology and the corpus are checked before anything is stopped or started.
    topos = [base if opts.no_redeploy else leg_topology(opts.topology, opts.base_overrides, s) for s in legs]
    build(dataclasses.replace(opts.workload, lengths=(16,), conversations=1, turns=1))
    was_running = probe.healthy(endpoints(base).router_url)
    if opts.no_redeploy and not was_running:
        raise UsageError(
            f"{base.name} is not running (no answer from {endpoints(base).router_url}/health)",
            hint=f"start it with `pdctl up -t {opts.topology}`, or drop --no-redeploy",
        )
    workload = opts.workload
    try:
        for spec, topo in zip(legs, topos, strict=True):
            ep = endpoints(topo)
            try:
                _deploy(spec, topo, ep, deployer if not opts.no_redeploy else None, progress)
            except PdctlError as exc:
                # One leg that cannot deploy (a setting the engine refuses) fails itself, not the other legs.
                progress.note(f"leg {spec.name}: could not deploy: {exc.message}")
                failed = LegResult(spec.name, list(spec.overrides), bidirectional(topo), topo.engine == "sim")
                lines = [x.strip() for x in exc.message.splitlines() if x.strip()]
                failed.failures.append(f"could not deploy: {' … '.join(dict.fromkeys([lines[0], lines[-1]]))}")
                result.legs.append(failed)
                continue
            workload = _calibrated(workload, ep)
            result.workload = _describe(workload, opts)
            result.legs.append(run_leg(spec, topo, ep, workload, opts, progress))
    finally:
        if deployer is not None and not opts.no_redeploy:
            progress.note(f"restoring {base.name} as it was found ({'running' if was_running else 'stopped'})")
            if was_running:
                deployer.redeploy(base)
            else:
                deployer.down(base)
    result.wall_s = time.monotonic() - start
    return result


def _deploy(spec: LegSpec, topo: Topology, ep: Endpoints, deployer: Deployer | None, progress: Progress) -> None:
    """Redeploy for the leg and wait for every endpoint; one retry, so a transient launch failure costs no leg."""
    for attempt in (1, 2):
        try:
            if deployer is not None:
                progress.note(f"leg {spec.name}: redeploying with {', '.join(spec.overrides) or 'no overrides'}")
                deployer.redeploy(topo)
            probe.wait_healthy([ep.router_url, *ep.prefill_urls, *ep.decode_urls])
            return
        except PdctlError as exc:
            if attempt == 2 or deployer is None:
                raise
            progress.note(f"leg {spec.name}: deploy failed ({exc.message.splitlines()[0]}); retrying once")


def run_leg(
    spec: LegSpec, topo: Topology, ep: Endpoints, workload: WorkloadSpec, opts: BenchOptions, progress: Progress
) -> LegResult:
    leg = LegResult(
        name=spec.name,
        overrides=list(spec.overrides),
        bidirectional=bidirectional(topo),
        simulated=topo.engine == "sim",
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
    plans = build(workload)
    if opts.warmup and not _warm_up(spec.name, plans[0], client, progress, leg):
        leg.wall_s = time.monotonic() - started
        return leg
    progress.leg_started(spec.name, sum(p.turns for p in plans))
    meter = probe.KvMeter(ep)
    with contextlib.ExitStack() as stack:
        if not meter.metrics_available():
            # Engines without NIXL Prometheus metrics: read their `KV Transfer metrics` log lines instead.
            nodes = {node for node, _ in ep.prefill_logs}
            meter.transports = stack.enter_context(connected(n for n in topo.nodes if n.name in nodes))
        for length in workload.lengths:
            convs = [Conversation(p, workload.api, f"{spec.name}-{p.key}") for p in plans if p.length == length]
            meter.start()
            leg.records += asyncio.run(play(convs, client, spec.name, progress.request_done))
            kv = meter.stop()
            leg.kv_by_length[length] = kv
            leg.kv = leg.kv + kv
    leg.router_stats = probe.router_stats(ep.router_url)
    leg.failures = guards.check(leg)
    leg.wall_s = time.monotonic() - started
    return leg


def _warm_up(name: str, plan: ConversationPlan, client: ClientOptions, progress: Progress, leg: LegResult) -> bool:
    """Two short turns outside the records, so the first measured request pays no cold-start cost."""
    short = dataclasses.replace(plan, key=f"warmup-{plan.key}", users=plan.users[:1])
    conv = Conversation(short, client.api, f"{name}-warmup")
    records = asyncio.run(play([conv], dataclasses.replace(client, clients=1, rate=0.0), name))
    bad = next((r for r in records if not r.ok), None)
    if bad is not None:
        leg.failures.append(f"warm-up request failed: {bad.error or f'HTTP {bad.status}'}")
        progress.note(f"leg {name}: warm-up failed: {bad.error}")
        return False
    return True


def _calibrated(workload: WorkloadSpec, ep: Endpoints) -> WorkloadSpec:
    """Size chat text in the engine's own tokens, measured once on its `/tokenize` (no local tokenizer)."""
    if workload.api not in TEXT_APIS or workload.tokens_per_word != 1.0 or not ep.prefill_urls:
        return workload
    sample = str(build(dataclasses.replace(workload, lengths=(400,), conversations=1, turns=1))[0].first)
    ratio = probe.tokens_per_word(ep.prefill_urls[0], ep.model, sample)
    return dataclasses.replace(workload, tokens_per_word=round(ratio, 4)) if ratio else workload


def _describe(w: WorkloadSpec, opts: BenchOptions) -> dict[str, object]:
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

