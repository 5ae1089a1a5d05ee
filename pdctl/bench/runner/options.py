"""From the bench's command-line values to `BenchOptions`: profiles, parsing and every usage check, so the CLI
only passes values through. Each bad value is a `UsageError` naming the flag and an example."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from pdctl.bench.leg.legs import DEFAULT_LEGS, LegSpec, leg_topology, parse_legs
from pdctl.bench.runner import eviction
from pdctl.bench.runner.capacity import CapacityOptions, Slo, parse_sweep
from pdctl.bench.runner.estimate import estimate
from pdctl.bench.runner.run import BenchOptions, ClientWhere
from pdctl.bench.traffic.agent import AgentSpec, Range
from pdctl.bench.traffic.workload import DEFAULT_LENGTHS, Api, WorkloadSpec
from pdctl.errors import UsageError
from pdctl.remote.sshconnect import SshOptions

APIS = ("chat", "completions", "responses", "messages")
CLIENTS = ("auto", "local", "router-node")


@dataclass(frozen=True)
class Profile:
    """The workload of a --profile; explicit flags win. quick keeps the README's `pdctl bench -t
    configs/local-sim.yaml` to a few minutes on the simulator; full is the seed's sweep (an hour or more)."""

    lengths: tuple[int, ...]
    conversations: int
    turns: int
    user_tokens: int
    output_tokens: int
    clients: int


PROFILES = {
    "quick": Profile((2000, 8000, 16000, 24000), conversations=4, turns=5, user_tokens=150, output_tokens=64,
                     clients=2),
    "full": Profile(DEFAULT_LENGTHS, conversations=10, turns=10, user_tokens=150, output_tokens=300, clients=2),
}


@dataclass(frozen=True)
class BenchArgs:
    """The bench's options as given on the command line; None: not given (the profile decides)."""

    topology: Path
    overrides: list[str] = field(default_factory=list)
    profile: str = "quick"
    lengths: str | None = None
    conversations: int | None = None
    turns: int | None = None
    user_tokens: int | None = None
    output_tokens: int | None = None
    clients: int | None = None
    rate: float = 0.0
    api: str = "chat"
    legs: list[str] | None = None
    no_redeploy: bool = False
    input_file: Path | None = None
    seed: int = 0
    warmup: bool = True
    client: str = "auto"
    sweep: str | None = None
    slo: str | None = None
    system_tokens: int = 6000
    tool_tokens: str = "200-2000"
    think_s: str | None = None  # None: the profile's (agent 0.5-3, evict 2-8)
    arrival_rate: float | None = None  # None: the profile's (agent 1, evict 2)
    runs: int = 2


def parse_lengths(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise UsageError(
            f"--lengths {text!r} is not a list of integers", hint="e.g. --lengths 2000,8000,16000"
        ) from None
    if not values:
        raise UsageError("--lengths is empty", hint="e.g. --lengths 2000,8000,16000")
    return values


def bench_options(args: BenchArgs, ssh: SshOptions | None = None) -> BenchOptions:
    """Check every value and build the run's options; nothing is deployed or read from the hosts."""
    if args.api not in APIS:
        raise UsageError(f"--api {args.api!r} is not chat, completions, responses or messages",
                         hint="pass --api chat, --api completions, --api responses or --api messages")
    api = cast(Api, args.api)
    legs = parse_legs(args.legs)
    if args.no_redeploy and args.legs and (len(legs) > 1 or any(x.overrides for x in legs)):
        raise UsageError(
            "--no-redeploy benches the running deployment as it is; --leg overrides need a redeploy",
            hint="drop --no-redeploy, or pass at most one --leg NAME without overrides",
        )
    bare = [t for t in args.legs or [] if ":" not in t]
    if bare and not args.no_redeploy:
        known = {leg.name: leg for leg in DEFAULT_LEGS}
        unknown = [t for t in bare if t.strip() not in known]
        if unknown:
            raise UsageError(
                f"--leg {unknown[0]!r} has no overrides and is not one of {', '.join(known)}",
                hint=f"a leg is NAME:key=value,... (e.g. --leg b128:model.block_size=128); "
                f"`--leg {unknown[0]}:` benches the topology as it is",
            )
        legs = [known.get(leg.name, leg) if leg.name in bare else leg for leg in legs]
    capacity = None
    profile_name = args.profile
    if args.profile == "evict":
        capacity = _capacity(args, evict=True)
        api, profile_name = "completions", "quick"
        if not args.legs:
            legs = eviction.legs(leg_topology(args.topology, list(args.overrides), LegSpec("base", ())))
    elif args.sweep is not None or args.slo is not None or args.profile == "agent":
        capacity = _capacity(args)
        api, profile_name = "completions", "quick"
    base = profile(profile_name)
    spec = WorkloadSpec(
        lengths=parse_lengths(args.lengths) if args.lengths is not None else base.lengths,
        conversations=_given(args.conversations, base.conversations),
        turns=_given(args.turns, base.turns),
        user_tokens=_given(args.user_tokens, base.user_tokens),
        output_tokens=_given(args.output_tokens, base.output_tokens),
        api=api,
        seed=args.seed,
        source=args.input_file,
    )
    if args.client not in CLIENTS:
        raise UsageError(f"--client {args.client!r} is not auto, local or router-node", hint="pass --client local")
    players = _given(args.clients, base.clients)
    if players < 1 or args.rate < 0:
        raise UsageError("--clients must be >= 1 and --rate >= 0")
    return BenchOptions(
        topology=args.topology,
        workload=spec,
        legs=legs if not (args.no_redeploy and not args.legs) else [],
        clients=players,
        rate=args.rate,
        no_redeploy=args.no_redeploy,
        base_overrides=itl_budget(capacity, list(args.overrides)),
        warmup=args.warmup,
        ssh=ssh,
        client=cast(ClientWhere, args.client),
        capacity=capacity,
    )


def profile(name: str) -> Profile:
    if name not in PROFILES:
        raise UsageError(f"--profile {name!r} is not one of {', '.join(PROFILES)}, agent, evict",
                         hint="pass --profile quick, --profile full, --profile agent with --sweep/--slo, or "
                         "--profile evict")
    return PROFILES[name]


def estimate_line(opts: BenchOptions) -> str:
    """One line on what the run will take, before it starts."""
    topo = leg_topology(opts.topology, opts.base_overrides, LegSpec("base", ()))
    legs = 1 if opts.no_redeploy else len(opts.legs)
    if opts.capacity is not None:
        points = len(opts.capacity.sessions) or "a search over"
        return (f"capacity run: {legs} leg(s) x {points} session counts, {opts.capacity.agent.turns} turns per "
                "session; no time estimate (it depends on where the SLO breaks)")
    guess = estimate(opts.workload, legs, opts.clients, topo.engine, topo.sim.speed, not opts.no_redeploy)
    return guess.line(topo.engine == "sim")


def _capacity(args: BenchArgs, evict: bool = False) -> CapacityOptions:
    """The agent (or eviction) profile's sessions; the eviction profile searches its SLO (500 ms TTFT p90, 200 ms
    ITL p99 unless --slo says) from the first session count that evicts when no --sweep is given."""
    base = eviction.EVICT_AGENT if evict else AgentSpec()
    agent = AgentSpec(
        sessions=1, turns=args.turns or base.turns, system_tokens=args.system_tokens,
        tool_tokens=Range.parse(args.tool_tokens, "--tool-tokens"), output_tokens=args.output_tokens or 200,
        think_s=Range.parse(args.think_s, "--think-s") if args.think_s is not None else base.think_s,
        arrival_rate=args.arrival_rate if args.arrival_rate is not None else base.arrival_rate, seed=args.seed,
    )
    slo = args.slo or (eviction.EVICT_SLO if evict else None)
    if args.runs < 1:
        raise UsageError(f"--runs must be >= 1, got {args.runs}", hint="--runs 2 (a third when two disagree)")
    return CapacityOptions(agent, sessions=parse_sweep(args.sweep) if args.sweep else (),
                           slo=Slo.parse(slo) if slo else Slo(), runs=args.runs, evict=evict)


def itl_budget(capacity: CapacityOptions | None, overrides: list[str]) -> list[str]:
    """A capacity run's ITL p99 SLO is also the routers' ITL budget (router.itl_slo_ms: the cost model runs a warm
    turn on its decode only where the stall keeps that decode's ITL within it), put first, so the command's --set
    and each leg's overrides still win. The plan turns it into the router's clock (a simulator's speed)."""
    if capacity is None or not math.isfinite(capacity.slo.itl_p99):
        return overrides
    return [f"router.itl_slo_ms={capacity.slo.itl_p99:g}", *overrides]


def _given(value: int | None, default: int) -> int:
    return value if value is not None else default
