"""`up`, read top to bottom in `_deploy`: each stage called in order, the plan and the decision the values the
later stages take. A second `up` on a running deployment verifies and changes nothing.

    lock          one `up` or `down` at a time per deployment                          hosts/lock.py
    allocation    Slurm topologies: a running allocation, the nodes bound to it        hosts/slurm_job.py
    plan          every process the topology asks for                                  pdctl/plan.py
    connect       every node's transport, opened in parallel                           hosts/connect.py
    restart       `--restart`: everything of the deployment stopped first              changes/stop.py
    decide        per process: start, keep, replace in place, remove                   decision.py
    preflight     reachable, ports free, GPUs present; the LB's binary; the engine key  preflight.py, hosts/
    provision     every host brought to what its processes need                        provision.py
    engines       decodes, then prefills, started and healthy                          hosts/launch.py, hosts/wait.py
    transport     EFA topologies: the KV does not move over TCP                        nixl_check.py
    router        its members file written, then started and healthy                   changes/live.py
    balancer      the LB started, or reloaded with the routers as they run now          changes/lb.py, routers_live.py
    live changes  engines replaced in place or removed (drained, then stopped)         changes/live.py
    smoke test    two turns through the router; turn 2 must reuse decode's KV          smoke.py
A launch that fails, a failed smoke test or Ctrl-C stops what this `up` started (what ran before it stays).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rich.console import Console

from pdctl.errors import LaunchError, SmokeTestError
from pdctl.lifecycle.bringup import nixl_check
from pdctl.lifecycle.bringup.decision import decide_or_refuse
from pdctl.lifecycle.bringup.preflight import preflight
from pdctl.lifecycle.bringup.smoke import SmokeResult, router_api_key, smoke_test
from pdctl.lifecycle.changes import lb as balancer
from pdctl.lifecycle.changes import live as live_changes
from pdctl.lifecycle.changes import routers_live
from pdctl.lifecycle.changes.stop import stop_all
from pdctl.lifecycle.hosts import gpu_memory, launch
from pdctl.lifecycle.hosts.connect import connected
from pdctl.lifecycle.hosts.engine_key import ensure_key
from pdctl.lifecycle.hosts.lock import deployment_lock
from pdctl.lifecycle.hosts.wait import HealthCheck, default_check, wait_healthy
from pdctl.plan import ProcessSpec, entry, plan
from pdctl.remote.base import Transport
from pdctl.remote.fanout import parallel
from pdctl.remote.sshconnect import SshOptions
from pdctl.state import DeploymentState, ProcessRecord, StateStore
from pdctl.topology import Topology


@dataclass
class Deployment:
    """What `up` leaves running."""

    name: str
    router_url: str
    processes: dict[str, ProcessRecord]
    specs: list[ProcessSpec]  # the plan `up` made: what the deployment's endpoints are derived from
    started: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    smoke: SmokeResult | None = None
    changed: list[str] = field(default_factory=list)  # live changes: "decode-1 removed", "prefill-0 replaced"


@dataclass(frozen=True)
class UpOptions:
    ssh: SshOptions | None = None
    restart: bool = False
    rolling: bool = False  # with restart: one process at a time, each drained first (live membership)
    provision: bool = True
    allow_reboot: bool = False
    timeout: float | None = None
    smoke: bool = True
    check: HealthCheck = default_check


def up(topo: Topology, console: Console, options: UpOptions | None = None) -> Deployment:
    """Bring `topo` up (or verify it is up); progress goes to `console`, the result comes back."""
    with deployment_lock(topo.name, "up"):
        return _up(topo, console, options or UpOptions())


def _up(topo: Topology, console: Console, opts: UpOptions) -> Deployment:
    store = StateStore(topo.name)
    state = store.load() or DeploymentState(name=topo.name, topology=topo.name)
    if topo.slurm is None:
        return _deploy(topo, console, opts, store, state)
    from pdctl.lifecycle.hosts.slurm_job import allocation

    with allocation(topo, console, store, state) as bound:
        return _deploy(bound, console, opts, store, state)


def _deploy(topo: Topology, console: Console, opts: UpOptions, store: StateStore,
            state: DeploymentState) -> Deployment:
    specs = plan(topo)
    with connected(topo.nodes, opts.ssh) as hosts:
        if opts.restart and not opts.rolling:
            console.print(f"restart: stopping {topo.name}")
            # every process of the deployment, also those of another mode (aggregated <-> disaggregated legs)
            stop_all(topo, specs, hosts, state, console, stragglers=True)
            state = DeploymentState(name=topo.name, topology=topo.name, slurm=state.slurm)
        live = parallel(sorted({s.node for s in specs}), lambda n: launch.running(hosts[n], topo.name, n))
        decision = decide_or_refuse(topo, specs, state, live, opts.restart and opts.rolling)
        to_start, kept = decision.start, decision.kept
        if to_start and not kept and topo.engine == "vllm":
            state.gpu_memory_before = gpu_memory.used(topo, specs, hosts)  # what `down` must return the GPUs to
        store.save(state)
        # a replacement (`--restart --rolling` after an upgrade of python.vllm_version, say) runs what provisioning
        # installs: provision before it, as before a start
        if to_start or decision.replace:
            preflight(topo, to_start, hosts, router_api_key(topo))
            if any(s.role == "lb" for s in to_start):  # before anything starts: the fix is an install
                balancer.check_binary(topo, hosts[topo.router.node])
            ensure_key(topo, hosts)
            if opts.provision:
                from pdctl.lifecycle.bringup.provision import provision

                provision(topo, specs, {n.name: hosts[n.name] for n in topo.nodes}, console,
                          allow_reboot=opts.allow_reboot)
        timeout = opts.timeout or (1800.0 if topo.engine == "vllm" else 120.0)
        started: list[str] = []
        changed: list[str] = []
        try:
            engines = [s for s in specs if s.role in ("prefill", "decode")]
            for role in ("decode", "prefill"):
                started += _start(hosts, [s for s in to_start if s.role == role], topo.name, store, state, console)
                if topo.shared_gpus() and topo.engine == "vllm":
                    # vLLM sizes its KV from the memory it sees while profiling: engines sharing a GPU start in turn
                    group = [s for s in engines if s.role == role]
                    wait_healthy(group, hosts, topo.name, console, timeout=timeout, check=opts.check)
            wait_healthy(engines, hosts, topo.name, console, timeout=timeout, check=opts.check)
            nixl_check.check_launched(topo, engines, hosts)  # EFA topologies: fail when KV moves over TCP
            # a router to be replaced still runs with its old settings (maybe another port): converge restarts it
            router = [s for s in specs if s.role == "router" and s not in decision.replace]
            live_changes.write_members(topo, specs, hosts, state, decision.removed)  # before a router starts or reloads
            started += _start(hosts, [s for s in to_start if s.role == "router"], topo.name, store, state, console)
            wait_healthy(router, hosts, topo.name, console, timeout=timeout, check=opts.check)
            lb = [s for s in to_start if s.role == "lb"]
            if lb:
                balancer.write_config(topo, specs, hosts[lb[0].node])
                started += _start(hosts, lb, topo.name, store, state, console)
                wait_healthy(lb, hosts, topo.name, console, timeout=timeout, check=opts.check)
            else:  # new routers are up: reload the LB with them, without the removed ones (drained, then stopped)
                changed = routers_live.apply(topo, specs, hosts, store, state, console, decision.removed_routers,
                                             timeout)
            changed += live_changes.converge(topo, specs, hosts, store, state, console, live_changes.Changes(
                decision.replace, decision.removed, [s.name for s in to_start]), timeout, opts.check)
        except KeyboardInterrupt:
            _interrupted(topo, specs, started, hosts, store, state, console)
            raise
        except LaunchError:
            _stop_started(topo, specs, started, hosts, store, state, console, "launch failed")
            raise
        router_url = entry(specs).url
        state.router_url = router_url
        store.save(state)
        result = None
        if opts.smoke:
            console.print(f"smoke test: two turns through the {'router' if topo.has_router() else 'engine'}")
            try:
                result = smoke_test(topo, router_url, hosts[entry(specs).node])
            except KeyboardInterrupt:
                _interrupted(topo, specs, started, hosts, store, state, console)
                raise
            except SmokeTestError as exc:
                # a deployment that failed its check must not stay up for the next `up` to call converged
                if not started:
                    raise
                _stop_started(topo, specs, started, hosts, store, state, console, "smoke test failed")
                raise SmokeTestError(exc.message, hint=stopped_hint(topo)) from None
            state.smoke = result.to_json()
            store.save(state)
            console.print(f"smoke test: turn 1 {result.turn1.outcome}, turn 2 [green]{result.turn2.outcome}[/] "
                          f"({result.turn2.tokens} tokens reused)")
            rate = nixl_check.check_shared_gpu_rate(topo, engines, hosts)  # one GPU shared: not the TCP fallback
            if rate is not None:
                console.print(f"KV transfer between instances sharing a GPU: {rate:.1f} GB/s")
    return Deployment(topo.name, router_url, dict(state.processes), specs, started, kept, result, changed)


def stopped_hint(topo: Topology) -> str:
    return (f"what this `up` started is stopped again; the logs stay (`pdctl logs -t {topo.file} decode-0`); "
            "`pdctl up --no-smoke-test` starts it without the check, to inspect it running")


def _interrupted(
    topo: Topology,
    specs: Sequence[ProcessSpec],
    started: list[str],
    hosts: Mapping[str, Transport],
    store: StateStore,
    state: DeploymentState,
    console: Console,
) -> None:
    """Ctrl-C: an `up` that did not finish leaves nothing of its own running (what ran before it stays)."""
    if not started:
        console.print(f"interrupted: nothing was started; `pdctl status -t {topo.file}` shows what runs")
        return
    try:
        _stop_started(topo, specs, started, hosts, store, state, console, "interrupted")
    except KeyboardInterrupt:  # a second Ctrl-C: leave the rest to `down`
        console.print(f"interrupted again: `pdctl down -t {topo.file}` stops what is left of {topo.name}")
        return
    console.print(f"interrupted: stopped what this `up` started; `pdctl up -t {topo.file}` starts it again")


def _stop_started(
    topo: Topology,
    specs: Sequence[ProcessSpec],
    started: list[str],
    hosts: Mapping[str, Transport],
    store: StateStore,
    state: DeploymentState,
    console: Console,
    why: str,
) -> None:
    if not started:
        return
    console.print(f"[red]{why}[/]: stopping what this run started ({', '.join(started)})")
    stop_all(topo, [s for s in specs if s.name in started], hosts, state, console)
    for name in started:
        store.forget(state, name)


def _start(
    hosts: Mapping[str, Transport],
    specs: Sequence[ProcessSpec],
    deployment: str,
    store: StateStore,
    state: DeploymentState,
    console: Console,
) -> list[str]:
    def one(spec: ProcessSpec) -> str:
        record = launch.start(hosts[spec.node], spec, deployment)
        store.record(state, record)
        where = record.unit or f"pid {record.pid}"
        console.print(f"started {spec.name} on {spec.node} ({where}), log {spec.log_path}", highlight=False)
        return spec.name

    by_name = {s.name: s for s in specs}
    return list(parallel(by_name, lambda name: one(by_name[name])).values())

