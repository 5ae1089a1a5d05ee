#!/usr/bin/env python3
"""The warm turn's critical path: pdctl's router against a minimal two-hop proxy that verifies nothing.

Both play the same multi-turn chat conversations (pdctl bench's workload, the shape of vLLM's multi-turn
benchmark client; token ids with --api completions) against the same simulated engines (a fresh prefill and
decode per leg, speed 1, bidirectional KV, so the proxy's turns find no cache the router's left behind). The proxy
does what vLLM's example proxy does with bidirectional KV: it keeps the decode's last handle per session and sends
it to the prefill on the next turn, unverified. Each leg is split into the bench's stages
(pdctl/bench/results/stages.py): router in, prefill hop, D->P read, P->D pull, decode first token, router out; the
proxy sends the router's timing headers.

    python scripts/critical_path.py                               # 2k, 8k, 16k, 24k; 3 conversations of 4 turns
    python scripts/critical_path.py --lengths 2000,24000 --out /tmp/cp   # also a bench report with the stage plot
    python scripts/critical_path.py --verify-at prefill,router    # a pdctl leg per verification mode, one proxy

The router verifies at the prefill by default (no /tokenize before the prefill hop); `--verify-at router` is the
fallback for a vLLM without pdctl's prefix check (a /tokenize of the whole prompt first).

Target (printed): pdctl's mean warm TTFT at every length <= the proxy's + 5 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pdctl.bench.output import report
from pdctl.bench.results import stages
from pdctl.bench.results.records import BenchResult, LegResult
from pdctl.bench.runner.collect import nixl_delta
from pdctl.bench.traffic.client import ClientOptions, play
from pdctl.bench.traffic.workload import Conversation, WorkloadSpec, build
from pdctl.engine_metrics import parse_prometheus
from scripts import router_bench
from scripts.router_bench import free_port, wait_health

MODEL = "Qwen"
TARGET_MS = 5.0
KEY_FILE_ENV = "CRITICAL_PATH_ENGINE_KEY_FILE"  # the path travels in the environment, the key in no argv or log
MISS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None, "remote_block_ids": None,
        "remote_host": None, "remote_port": None}


def start(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return router_bench.start(argv, log, [], env)  # no core pinning here: every process shares the machine


def sim(role: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    kv = {"kv_connector": "NixlConnector", "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
          "kv_connector_extra_config": {"bidirectional_kv_xfer": True, "kv_recompute_threshold": 0,
                                        "decoder_kv_blocks_ttl": 120}}
    argv = [sys.executable, "-m", "pdctl.sim", "serve", "Qwen/Qwen3-32B", "--role", role, "--port", str(port),
            "--served-model-name", MODEL, "--speed", "1", "--num-gpu-blocks", "200000", "--max-model-len", "40000",
            "--kv-transfer-config", json.dumps(kv), "--log-stats-interval", "3600"]
    env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}
    return start(argv, log, env)


# -- the minimal two-hop proxy: no verification, the decode's last handle per session --------------------------
def proxy_app(prefill: str, decode: str) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    state: dict[str, Any] = {"handles": {}}

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        key_file = os.environ.get(KEY_FILE_ENV)  # engines started with an API key (pdctl up writes engine.key)
        auth = {"authorization": f"Bearer {Path(key_file).read_text().strip()}"} if key_file else None
        state["c"] = httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=256), headers=auth)
        yield
        await state["c"].aclose()

    async def completion(request: Request) -> Response:
        t0 = time.perf_counter()
        client: httpx.AsyncClient = state["c"]
        body = await request.json()
        session = request.headers.get("x-session-id", "")
        handle = state["handles"].pop(session, None)
        p_body = {k: v for k, v in body.items() if k not in ("stream_options", "max_completion_tokens")}
        p_body.update(stream=False, max_tokens=1, kv_transfer_params=handle or dict(MISS))
        sent = time.perf_counter()
        p = await client.post(prefill + request.url.path, json=p_body)
        prefill_ms = (time.perf_counter() - sent) * 1000
        if p.status_code != 200:
            return Response(p.content, status_code=p.status_code, media_type="application/json")
        d_body = {**body, "kv_transfer_params": p.json().get("kv_transfer_params")}
        sent_d = time.perf_counter()
        d = await client.send(client.build_request("POST", decode + request.url.path, json=d_body), stream=True)
        lines = d.aiter_lines()
        first = await lines.__anext__()
        n = handle.get("remote_num_tokens", 0) if handle else 0
        headers = {"x-pd-router-in-ms": f"{(sent - t0) * 1000:.1f}", "x-pd-prefill-ms": f"{prefill_ms:.1f}",
                   "x-pd-decode-ms": f"{(time.perf_counter() - sent_d) * 1000:.1f}",
                   "x-pd-kv-reuse": f"hit;tokens={n};reason=unverified" if handle else "miss;tokens=0;reason=new"}

        async def relay() -> AsyncIterator[str]:
            try:
                for line in (first,):
                    yield line + "\n"
                async for line in lines:
                    if line.startswith("data: {"):
                        params = json.loads(line[6:]).get("kv_transfer_params")
                        if params:  # the example proxy's cache: the decode's last handle, never checked
                            state["handles"][session] = params
                    yield line + "\n"
            finally:
                await d.aclose()

        return StreamingResponse(relay(), media_type="text/event-stream", headers=headers)

    async def health(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[Route("/v1/chat/completions", completion, methods=["POST"]),
                             Route("/v1/completions", completion, methods=["POST"]), Route("/health", health)],
                     lifespan=lifespan)


# -- one leg: fresh engines, the front, the conversations, the engines' NIXL metrics per length ------------------
def scrape(url: str) -> dict[str, float]:
    try:
        return parse_prometheus(httpx.get(f"{url}/metrics", timeout=10).text)
    except httpx.HTTPError:
        return {}


def leg(name: str, args: argparse.Namespace, logs: Path, verify_at: str = "prefill") -> LegResult:
    pp, dp, fp = free_port(), free_port(), free_port()
    purl, durl, furl = (f"http://127.0.0.1:{p}" for p in (pp, dp, fp))
    running = [sim("prefill", pp, logs / f"{name}-prefill.log"), sim("decode", dp, logs / f"{name}-decode.log")]
    try:
        wait_health(purl, running[0], "prefill simulator")
        wait_health(durl, running[1], "decode simulator")
        if name.startswith("pdctl"):
            argv = [sys.executable, "-m", "pdctl.router", "serve", "--port", str(fp), "--prefill", purl,
                    "--decode", durl, "--model", MODEL, "--decoder-kv-blocks-ttl", "120", "--log-level", "warning",
                    "--verify-at", verify_at,
                    "--local-prefill-tokens", "0"]  # the P/D handshake on every warm turn: what this script measures
        else:
            argv = [sys.executable, __file__, "--proxy-serve", str(fp), purl, durl]
        running.append(start(argv, logs / f"{name}.log"))
        wait_health(furl, running[2], name)
        return play_leg(name, furl, [purl, durl], args, args.seed)
    finally:
        stop(running)


def stop(running: list[subprocess.Popen[bytes]]) -> None:
    for p in running:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    for p in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)


def play_leg(name: str, furl: str, engines: list[str], args: argparse.Namespace, seed: int) -> LegResult:
    """The conversations through `furl`, per length, with the prefill's and decode's NIXL metrics around each."""
    spec = WorkloadSpec(lengths=tuple(args.lengths), conversations=args.conversations, turns=args.turns,
                        user_tokens=args.user_tokens, output_tokens=args.output_tokens, api=args.api, seed=seed,
                        source=args.source, tokens_per_word=args.tokens_per_word)
    opts = ClientOptions(url=furl, model=args.model, api=args.api, output_tokens=args.output_tokens)
    result = LegResult(name, [], bool(engines), args.prefill is None, mode="disaggregated" if engines else "aggregated")
    warm = WorkloadSpec(lengths=(1000,), conversations=1, turns=2, user_tokens=50, output_tokens=4, api=args.api,
                        seed=seed, source=args.source, tokens_per_word=args.tokens_per_word)
    asyncio.run(play([Conversation(p, args.api, f"warmup-{name}") for p in build(warm)], opts, name))
    for n in args.lengths:
        convs = [Conversation(p, args.api, f"{name}-s{seed}-{p.key}") for p in build(spec) if p.length == n]
        before = [scrape(u) for u in engines]
        records = asyncio.run(play(convs, opts, name))
        if engines:
            result.kv_by_length[n] = nixl_delta(before[0], scrape(engines[0]))
            result.kv = result.kv + result.kv_by_length[n]
            result.pull_by_length[n] = nixl_delta(before[1], scrape(engines[1]))
        bad = next((r for r in records if not r.ok), None)
        if bad is not None:
            sys.exit(f"{name} at {n} tokens: {bad.error or bad.status}")
        result.records += records
        print(f"  {name} {n}: {len(records)} turns", file=sys.stderr, flush=True)
        if args.json:  # as it goes, so a run cut short keeps what it measured
            with args.json.with_suffix(".records.jsonl").open("a") as f:
                f.writelines(json.dumps(r.to_json()) + "\n" for r in records)
    return result


def running_legs(args: argparse.Namespace, logs: Path) -> list[LegResult]:
    """Already-running engines (a real deployment): the router, the proxy over the same prefill and decode, and
    optionally one aggregated engine. Each leg plays its own seed's conversations, so none finds another's prefix
    in a cache; the engines are not restarted between legs."""
    prefill, decode = args.prefill, args.decode
    if args.api in ("chat",) and args.tokens_per_word == 0:
        args.tokens_per_word = probe_tokens_per_word(prefill, args)
    fp = free_port()
    env = {KEY_FILE_ENV: str(args.engine_key_file)} if args.engine_key_file else None
    proxy = start([sys.executable, __file__, "--proxy-serve", str(fp), prefill, decode], logs / "proxy.log", env)
    try:
        wait_health(f"http://127.0.0.1:{fp}", proxy, "proxy")
        legs = [play_leg("pdctl", args.router, [prefill, decode], args, args.seed + 1),
                play_leg("proxy", f"http://127.0.0.1:{fp}", [prefill, decode], args, args.seed + 2)]
    finally:
        stop([proxy])
    if args.aggregated:
        legs.append(play_leg("aggregated", args.aggregated, [], args, args.seed + 3))
    return legs


def probe_tokens_per_word(url: str, args: argparse.Namespace) -> float:
    """Tokens per corpus word on the engine's own tokenizer, so a length means that many of its tokens."""
    sample = WorkloadSpec(lengths=(4000,), conversations=1, turns=1, api="chat", source=args.source)
    text = str(build(sample)[0].first)
    count = httpx.post(f"{url}/tokenize", json={"model": args.model, "prompt": text}, timeout=60).json()["count"]
    ratio = float(count) / len(text.split())
    print(f"  tokens per word on {url}: {ratio:.3f}", file=sys.stderr, flush=True)
    return ratio


def table(pd: LegResult, px: LegResult) -> tuple[list[str], bool]:
    rows = {(r.leg, r.length): r for r in stages.stage_rows([pd, px])}
    lines = [f"| length | {pd.name} TTFT | proxy TTFT | {pd.name} - proxy | target (+5 ms) | "
             + " | ".join(f"{s} ({pd.name} - proxy)" for s in stages.STAGES) + " |",
             "|---" * (5 + len(stages.STAGES)) + "|"]
    ok = True
    for n in sorted({r.length for r in pd.records}):
        a, b = rows[(pd.name, n)], rows[(px.name, n)]
        diff = a.ttft_ms - b.ttft_ms
        ok = ok and diff <= TARGET_MS
        cells = [f"{a.stages[s]:.1f} - {b.stages[s]:.1f} = {a.stages[s] - b.stages[s]:+.1f}" for s in stages.STAGES]
        verdict = "met" if diff <= TARGET_MS else "MISSED"
        head = f"| {n} | {a.ttft_ms:.1f} | {b.ttft_ms:.1f} | {diff:+.1f} | {verdict} | "
        lines.append(head + " | ".join(cells) + " |")
    return lines, ok


def floor_table(legs: list[LegResult]) -> list[str]:
    """Mean and median warm TTFT of every leg, the reuse outcomes, and pdctl's ratio to the aggregated engine."""
    by = {leg.name: leg for leg in legs}
    first = legs[0].name
    lines = ["| length | " + " | ".join(f"{n} mean / median" for n in by) + " | pdctl / aggregated (mean) | reuse "
             "(pdctl: hit/partial/miss) | reused tokens (pdctl mean) |", "|---" * (len(by) + 4) + "|"]
    for n in sorted({r.length for r in legs[0].records}):
        warm = {k: [r for r in v.records if r.length == n and r.turn >= 1 and r.ttft_ms is not None]
                for k, v in by.items()}
        ttft = {k: [float(r.ttft_ms or 0.0) for r in v] for k, v in warm.items()}
        cells = [f"{statistics.fmean(v):.1f} / {statistics.median(v):.1f}" if v else "-" for v in ttft.values()]
        ratio = (f"{statistics.fmean(ttft[first]) / statistics.fmean(ttft['aggregated']):.2f}"
                 if ttft.get("aggregated") and ttft.get(first) else "-")
        pd = warm.get(first, [])
        outcomes = "/".join(str(sum(1 for r in pd if r.reuse == o)) for o in ("hit", "partial", "miss"))
        tokens = statistics.fmean(float(r.reuse_tokens or 0) for r in pd) if pd else 0.0
        lines.append(f"| {n} | " + " | ".join(cells) + f" | {ratio} | {outcomes} | {tokens:.0f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[2000, 8000, 16000, 24000])
    ap.add_argument("--conversations", type=int, default=3)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--user-tokens", type=int, default=150)
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--api", choices=("chat", "completions"), default="chat",
                    help="chat: text conversations; completions: token ids (verified by the router, no tokenizer)")
    ap.add_argument("--verify-at", type=lambda s: s.split(","), default=["prefill"],
                    help="simulated engines: the router's --verify-at, one pdctl leg each (prefill,router: both)")
    ap.add_argument("--model", default=MODEL, help="the served model name")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--source", type=Path, help="chat: a text corpus instead of the generated words")
    ap.add_argument("--tokens-per-word", type=float, default=1.0,
                    help="chat: corpus tokens per word; 0 measures it on the prefill's /tokenize (running engines)")
    ap.add_argument("--router", help="running engines: pdctl's router URL (with --prefill and --decode)")
    ap.add_argument("--prefill", help="running engines: the prefill's URL, which the proxy leg uses")
    ap.add_argument("--decode", help="running engines: the decode's URL, which the proxy leg uses")
    ap.add_argument("--aggregated", help="running engines: also one aggregated engine's URL (prefix caching on)")
    ap.add_argument("--engine-key-file", type=Path,
                    help="running engines: the API key the prefill and decode want (pdctl's engine.key), for the proxy")
    ap.add_argument("--out", type=Path, help="also write a bench report (report.md, ttft_stages.png) here")
    ap.add_argument("--json", type=Path, help="also write the stage rows here")
    ap.add_argument("--proxy-serve", nargs=3, metavar=("PORT", "PREFILL", "DECODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.proxy_serve:
        import uvicorn

        port, p, d = args.proxy_serve
        uvicorn.run(proxy_app(p, d), host="127.0.0.1", port=int(port), log_level="warning")
        return
    if bool(args.router) != bool(args.prefill) or bool(args.prefill) != bool(args.decode):
        ap.error("running engines need all of --router, --prefill and --decode")
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"critical-path-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    if args.router:
        legs = running_legs(args, logs)
        pds, px = [legs[0]], legs[1]
    else:
        pds = [leg("pdctl" if at == "prefill" else f"pdctl-{at}", args, logs, at) for at in args.verify_at]
        px = leg("proxy", args, logs)
        legs = [*pds, px]
    tables = [table(pd, px) for pd in pds]
    where = (f"running engines (prefill {args.prefill}, decode {args.decode}, router {args.router}"
             f"{', aggregated ' + args.aggregated if args.aggregated else ''})" if args.router
             else "simulated engines (pdctl.sim, speed 1)")
    print(f"\nmean warm-turn (turns 2+) TTFT and its stages (ms); {where}, "
          f"{os.cpu_count()} cores; {args.api}, {args.conversations} conversations x {args.turns} turns per length, "
          f"{args.user_tokens} new user tokens and {args.output_tokens} output tokens a turn"
          f"{f', {args.tokens_per_word:.3f} tokens per corpus word' if args.api == 'chat' and args.source else ''}")
    for pd, (lines, ok) in zip(pds, tables, strict=True):
        print("\n".join(lines))
        print(f"\ntarget {pd.name} <= proxy + {TARGET_MS:g} ms at every length: {'met' if ok else 'MISSED'}\n")
    for pd in pds:
        print("\n".join(floor_table([pd, *(x for x in legs if all(x is not p for p in pds))])) + "\n")
    rows = stages.stage_rows(legs)
    if args.json:
        args.json.write_text(json.dumps([{"leg": r.leg, "length": r.length, "turns": r.turns, "ttft_ms": r.ttft_ms,
                                          **r.stages} for r in rows], indent=1) + "\n")
    if args.out:
        bench = BenchResult("critical-path (pdctl router vs unverified two-hop proxy)", True,
                            {"lengths": args.lengths, "conversations": args.conversations, "turns": args.turns,
                             "api": args.api}, legs, wall_s=time.monotonic() - started)
        report.write(bench, args.out)


if __name__ == "__main__":
    main()
