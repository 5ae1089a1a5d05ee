"""`pdctl bench`: the multi-turn TTFT A/B benchmark (legs, plots, report); the checks live in
`pdctl.bench.runner.options`, the run in `pdctl.bench.session`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from pdctl.bench.output.render import as_json, print_outcome
from pdctl.bench.runner.options import APIS, CLIENTS, PROFILES, BenchArgs, bench_options
from pdctl.bench.session import bench as run
from pdctl.cli.complete import choices
from pdctl.cli.errors import INTERRUPTED_EXIT
from pdctl.cli.options import AcceptOpt, JsonOpt, KnownHostsOpt, SetOpt, SshConfigOpt, TopologyOpt, ssh_options
from pdctl.cli.output import err, out, print_json
from pdctl.cli.support import topology_path


def bench(
    topology: TopologyOpt = None,
    overrides: SetOpt = None,
    profile: Annotated[
        str, typer.Option(help="Workload defaults: quick (minutes on the simulator), full (the seed's sweep, "
                          "7 lengths x 10 conversations x 10 turns), agent (agent sessions for --sweep/--slo) or "
                          "evict (agent sessions that exceed the prefills' KV; legs off, on-prefill, on, agg; "
                          "docs/benchmarking.md); the flags below override it.",
                          autocompletion=choices(*PROFILES, "agent", "evict"))
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
                                         "anchor run's shape).", autocompletion=choices(*APIS))] = "chat",
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
    as_json_out: JsonOpt = False,
    client: Annotated[
        str, typer.Option("--client", help="Where the load player runs: auto (on the router's node when it is "
                          "remote, else here), local (here, through the SSH connection) or router-node.",
                          autocompletion=choices(*CLIENTS))
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
    think_s: Annotated[str | None, typer.Option(help="Agent profile: seconds between a reply and the next turn, N "
                                                "or LOW-HIGH (divided by sim.speed on the simulator); default "
                                                "0.5-3, evict 2-8.", show_default=False)] = None,
    arrival_rate: Annotated[float | None, typer.Option(help="Agent profile: sessions arriving per second (Poisson, "
                                                       "times sim.speed on the simulator); 0: all at once; default "
                                                       "1, evict 2.", show_default=False)] = None,
    runs: Annotated[int, typer.Option(help="Capacity runs: plays per session count; with 2, a third when the two "
                                      "differ by more than 10 % in an SLO figure.")] = 2,
    accept_new_host_keys: AcceptOpt = False,
    ssh_config: SshConfigOpt = None,
    known_hosts: KnownHostsOpt = None,
) -> None:
    """Multi-turn TTFT sweep, one leg per set of overrides (default: bidirectional KV transfer off, then on).

    Each leg redeploys prefill, decode and router with its overrides (--set applies to every leg), warms up and
    plays the conversations.

    Writes requests.json, legs.json, summary.csv, three plots (ttft_vs_length.png, prefill_split.png,
    ttft_stages.png) and report.md to --out (a capacity run also capacity.json and goodput.png); exits 1 when a
    guard fails. Ctrl-C writes the report of the
    requests that finished and exits 130.
    """
    args = BenchArgs(
        topology=topology_path(topology), overrides=list(overrides or []), profile=profile, lengths=lengths,
        conversations=conversations, turns=turns, user_tokens=user_tokens, output_tokens=output_tokens,
        clients=clients, rate=rate, api=api, legs=leg, no_redeploy=no_redeploy, input_file=input_file, seed=seed,
        warmup=not no_warmup, client=client, sweep=sweep, slo=slo, system_tokens=system_tokens,
        tool_tokens=tool_tokens, think_s=think_s, arrival_rate=arrival_rate, runs=runs,
    )
    opts = bench_options(args, ssh=ssh_options(accept_new_host_keys, ssh_config, known_hosts))
    result, files = run(opts, Console(stderr=True, soft_wrap=True), out_dir)
    if as_json_out:
        print_json(as_json(result, files), indent=1)
    else:
        print_outcome(result, files, out)
    if not result.passed:
        if as_json_out:
            print_outcome(result, files, err)
        raise typer.Exit(INTERRUPTED_EXIT if result.interrupted else 1)


def bench_play(
    play_file: Annotated[Path, typer.Argument(help="Play file written by `pdctl bench`.")],
    out_file: Annotated[Path, typer.Argument(help="Where to write the request records (JSON).")],
) -> None:
    """Internal: play a bench's conversations on this node (pdctl bench runs it on the router's node)."""
    from pdctl.bench.traffic.remote_play import play_file as run_play

    run_play(play_file, out_file)


def register(app: typer.Typer) -> None:
    app.command()(bench)
    app.command("bench-play", hidden=True)(bench_play)
