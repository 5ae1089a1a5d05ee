"""`pdctl bench`: the multi-turn TTFT A/B benchmark (legs, plots, report)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, cast

import typer
from rich.console import Console

from pdctl.bench import report
from pdctl.bench.agent import AgentSpec, Range
from pdctl.bench.capacity import CapacityOptions, Slo, parse_sweep
from pdctl.bench.estimate import estimate
from pdctl.bench.legs import LegSpec, leg_topology, parse_legs
from pdctl.bench.progress import make_progress
from pdctl.bench.render import as_json, print_outcome
from pdctl.bench.run import BenchOptions, run_bench
from pdctl.bench.workload import DEFAULT_LENGTHS, Api, WorkloadSpec
from pdctl.cli.support import TOPOLOGY_HELP, call, err, out, topology_path
from pdctl.errors import UsageError


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


def bench(
    topology: Annotated[Path | None, typer.Option("--topology", "-t", help=TOPOLOGY_HELP, show_default=False)] = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Override a topology key for every leg.")] = None,
    profile: Annotated[
        str, typer.Option(help="Workload defaults: quick (minutes on the simulator), full (the seed's sweep, "
                          "7 lengths x 10 conversations x 10 turns) or agent (agent sessions for --sweep/--slo); "
                          "the flags below override it.")
    ] = "quick",
    lengths: Annotated[
        str | None, typer.Option(help="Tokens of history at turn 1, comma-separated.", show_default=False)
    ] = None,
    conversations: Annotated[int | None, typer.Option(help="Conversations per length.", show_default=False)] = None,
    turns: Annotated[int | None, typer.Option(help="Turns per conversation.", show_default=False)] = None,
    user_tokens: Annotated[
        int | None, typer.Option(help="Tokens of each new user message.", show_default=False)
    ] = None,
    output_tokens: Annotated[
        int | None, typer.Option(help="Output tokens per turn (ignore_eos).", show_default=False)
    ] = None,
    clients: Annotated[int | None, typer.Option(help="Conversations played at once.", show_default=False)] = None,
    rate: Annotated[float, typer.Option(help="Requests/s per client, Poisson; 0: back to back.")] = 0.0,
    api: Annotated[str, typer.Option(help="chat (text), responses or messages (the same text conversations on the "
                                         "Responses / Anthropic Messages API), or completions (token ids, the "
                                         "anchor run's shape).")] = "chat",
    leg: Annotated[
        list[str] | None,
        typer.Option(help="NAME:key=value,key=value (repeatable); default off and on on "
                     "connector.bidirectional_kv_xfer."),
    ] = None,
    no_redeploy: Annotated[
        bool, typer.Option("--no-redeploy", help="Bench the running deployment as one leg.")
    ] = False,
    input_file: Annotated[
        Path | None, typer.Option("--input", help="Corpus for chat text: a text file or ShareGPT JSON.")
    ] = None,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Report directory; default bench-out/NAME-TIME.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the workload.")] = 0,
    no_warmup: Annotated[bool, typer.Option("--no-warmup", help="Skip the warm-up conversation of each leg.")] = False,
    as_json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")] = False,
    client: Annotated[
        str, typer.Option("--client", help="Where the load player runs: auto (on the router's node when it is "
                          "remote, else here), local (here, through the SSH connection) or router-node.")
    ] = "auto",
    sweep: Annotated[
        str | None, typer.Option(help="Capacity sweep of agent sessions per leg, e.g. sessions=1,2,4,8,16,32 "
                                 "(implies --profile agent).", show_default=False)
    ] = None,
    slo: Annotated[
        str | None, typer.Option(help="SLO in ms, e.g. ttft_p90=500,itl_p99=200: drawn on the goodput plot; "
                                 "without --sweep, search each leg for the largest N within it.", show_default=False)
    ] = None,
    system_tokens: Annotated[int, typer.Option(help="Agent profile: shared system prompt + tool schema tokens.")
                             ] = 6000,
    tool_tokens: Annotated[str, typer.Option(help="Agent profile: tool result tokens per turn, N or LOW-HIGH.")
                           ] = "200-2000",
    think_s: Annotated[str, typer.Option(help="Agent profile: seconds between a reply and the next turn, N or "
                                         "LOW-HIGH (divided by sim.speed on the simulator).")] = "0.5-3",
    arrival_rate: Annotated[float, typer.Option(help="Agent profile: sessions arriving per second (Poisson, "
                                                "times sim.speed on the simulator); 0: all at once.")] = 1.0,
) -> None:
    """Multi-turn TTFT sweep, one leg per set of overrides (default: bidirectional KV transfer off, then on).

    Each leg redeploys prefill, decode and router with its overrides, warms up and plays the conversations.

    Writes requests.json, legs.json, summary.csv, two plots and report.md to --out; exits 1 when a guard fails.
    """
    console = Console(stderr=True, soft_wrap=True)

    def prepare() -> BenchOptions:
        if api not in ("chat", "completions", "responses", "messages"):
            raise UsageError(f"--api {api!r} is not chat, completions, responses or messages",
                             hint="pass --api chat, --api completions, --api responses or --api messages")
        api_kind = cast(Api, api)
        legs = parse_legs(leg)
        if no_redeploy and leg and (len(legs) > 1 or any(x.overrides for x in legs)):
            raise UsageError(
                "--no-redeploy benches the running deployment as it is; --leg overrides need a redeploy",
                hint="drop --no-redeploy, or pass at most one --leg NAME without overrides",
            )
        cap = None
        if sweep is not None or slo is not None or profile == "agent":
            cap = CapacityOptions(
                AgentSpec(sessions=1, turns=turns or 6, system_tokens=system_tokens,
                          tool_tokens=Range.parse(tool_tokens, "--tool-tokens"),
                          output_tokens=output_tokens or 200, think_s=Range.parse(think_s, "--think-s"),
                          arrival_rate=arrival_rate, seed=seed),
                sessions=parse_sweep(sweep) if sweep else (), slo=Slo.parse(slo) if slo else Slo())
            api_kind, profile_name = "completions", "quick"
        else:
            profile_name = profile
        base = _profile(profile_name)
        spec = WorkloadSpec(
            lengths=parse_lengths(lengths) if lengths is not None else base.lengths,
            conversations=conversations if conversations is not None else base.conversations,
            turns=turns if turns is not None else base.turns,
            user_tokens=user_tokens if user_tokens is not None else base.user_tokens,
            output_tokens=output_tokens if output_tokens is not None else base.output_tokens,
            api=api_kind,
            seed=seed,
            source=input_file,
        )
        if client not in ("auto", "local", "router-node"):
            raise UsageError(f"--client {client!r} is not auto, local or router-node", hint="pass --client local")
        players = clients if clients is not None else base.clients
        if players < 1 or rate < 0:
            raise UsageError("--clients must be >= 1 and --rate >= 0")
        return BenchOptions(
            topology=topology_path(topology),
            workload=spec,
            legs=legs if not (no_redeploy and not leg) else [],
            clients=players,
            rate=rate,
            no_redeploy=no_redeploy,
            base_overrides=list(overrides or []),
            warmup=not no_warmup,
            client=client,  # type: ignore[arg-type]
            capacity=cap,
        )

    opts = call(prepare)
    deployer = None
    if not opts.no_redeploy:
        from pdctl.bench.deploy import LifecycleDeployer

        deployer = LifecycleDeployer(console)
    err.print(call(lambda: _estimate(opts)), highlight=False, markup=False)
    with make_progress(console, opts.workload.turns) as progress:
        result = call(lambda: run_bench(opts, deployer, progress))
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    target = out_dir or Path("bench-out") / f"{result.topology}-{stamp}"
    files = call(lambda: report.write(result, target))
    if as_json_out:
        print(json.dumps(as_json(result, files), indent=1))
    else:
        print_outcome(result, files, out)
    if not result.passed:
        if as_json_out:
            print_outcome(result, files, err)
        raise typer.Exit(1)


def bench_play(
    play_file: Annotated[Path, typer.Argument(help="Play file written by `pdctl bench`.")],
    out_file: Annotated[Path, typer.Argument(help="Where to write the request records (JSON).")],
) -> None:
    """Internal: play a bench's conversations on this node (pdctl bench runs it on the router's node)."""
    from pdctl.bench.remote_play import play_file as run_play

    call(lambda: run_play(play_file, out_file))


def _profile(name: str) -> Profile:
    if name not in PROFILES:
        raise UsageError(f"--profile {name!r} is not one of {', '.join(PROFILES)}, agent",
                         hint="pass --profile quick, --profile full or --profile agent with --sweep/--slo")
    return PROFILES[name]


def _estimate(opts: BenchOptions) -> str:
    topo = leg_topology(opts.topology, opts.base_overrides, LegSpec("base", ()))
    legs = 1 if opts.no_redeploy else len(opts.legs)
    if opts.capacity is not None:
        points = len(opts.capacity.sessions) or "a search over"
        return (f"capacity run: {legs} leg(s) x {points} session counts, {opts.capacity.agent.turns} turns per "
                "session; no time estimate (it depends on where the SLO breaks)")
    guess = estimate(opts.workload, legs, opts.clients, topo.engine, topo.sim.speed, not opts.no_redeploy)
    return guess.line(topo.engine == "sim")


def register(app: typer.Typer) -> None:
    app.command()(bench)
    app.command("bench-play", hidden=True)(bench_play)

