"""`pdctl bench`: the multi-turn TTFT A/B benchmark (legs, plots, report)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Annotated, cast

import typer
from rich.console import Console

from pdctl.bench import report
from pdctl.bench.legs import parse_legs
from pdctl.bench.render import RichProgress, as_json, print_outcome
from pdctl.bench.run import BenchOptions, run_bench
from pdctl.bench.workload import DEFAULT_LENGTHS, Api, WorkloadSpec
from pdctl.cli_support import TOPOLOGY_HELP, call, err, out, topology_path
from pdctl.errors import UsageError

DEFAULT_LENGTHS_TEXT = ",".join(map(str, DEFAULT_LENGTHS))


def _ints(text: str) -> tuple[int, ...]:
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
    lengths: Annotated[str, typer.Option(help="Tokens of history at turn 1, comma-separated.")] = DEFAULT_LENGTHS_TEXT,
    conversations: Annotated[int, typer.Option(help="Conversations per length.")] = 10,
    turns: Annotated[int, typer.Option(help="Turns per conversation.")] = 10,
    user_tokens: Annotated[int, typer.Option(help="Tokens of each new user message.")] = 150,
    output_tokens: Annotated[int, typer.Option(help="Output tokens per turn (ignore_eos).")] = 300,
    clients: Annotated[int, typer.Option(help="Conversations played at once.")] = 2,
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
        spec = WorkloadSpec(
            lengths=_ints(lengths),
            conversations=conversations,
            turns=turns,
            user_tokens=user_tokens,
            output_tokens=output_tokens,
            api=api_kind,
            seed=seed,
            source=input_file,
        )
        if clients < 1 or rate < 0:
            raise UsageError("--clients must be >= 1 and --rate >= 0")
        return BenchOptions(
            topology=topology_path(topology),
            workload=spec,
            legs=legs if not (no_redeploy and not leg) else [],
            clients=clients,
            rate=rate,
            no_redeploy=no_redeploy,
            base_overrides=list(overrides or []),
            warmup=not no_warmup,
        )

    opts = call(prepare)
    deployer = None
    if not opts.no_redeploy:
        from pdctl.bench.deploy import LifecycleDeployer

        deployer = LifecycleDeployer(console)
    with RichProgress(console) as progress:
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


def register(app: typer.Typer) -> None:
    app.command()(bench)

