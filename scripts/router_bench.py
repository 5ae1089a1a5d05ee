#!/usr/bin/env python3
"""Router overhead benchmark: the router vs calling the engines' two hops directly vs a naive proxy.

Starts a simulated prefill and decode at zero delay (--speed inf), pdctl's router and a naive two-hop proxy (the
shape of vLLM's example proxy: starlette, one shared httpx client, request.json(), StreamingResponse) each pinned
to one core, then drives streaming /v1/completions at several concurrencies from load-generator processes on
the other cores. Prints one table (and --json). Every request is a new conversation (a miss: the same two hops).

    python scripts/router_bench.py                      # 1, 64 and 256 concurrent streams, 5 s each
    python scripts/router_bench.py --seconds 10 --json bench.json

`--long 2000,8000,16000,24000` measures instead what a long multi-turn conversation costs: token-id conversations
(pdctl bench's workload: each turn = the previous prompt + its 64 output ids + 512 new ids) played one at a time
through the router (turns 2+ take the KV-reuse path) and through the naive proxy (every turn a miss), with the
engines at zero delay, so the TTFT is what the proxy and the engines' HTTP handling cost at that prompt length.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.ports import free_port
from tests.support.sim_procs import stop_group

MODEL = "Qwen"
MISS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None, "remote_block_ids": None,
        "remote_host": None, "remote_port": None}


def pinned(cores: list[int]) -> Any:
    return (lambda: os.sched_setaffinity(0, cores)) if cores else None


def start(argv: list[str], log: Path, cores: list[int], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log, "ab") as f:
        return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=pinned(cores), env={**os.environ, **(env or {})})


def wait_health(url: str, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    sys.exit(f"{what} did not answer /health at {url}")


# The simulator's listening sockets lack TCP_NODELAY, so on keep-alive connections its response bodies wait ~40 ms
# for a delayed ACK (Nagle). Set it until the simulator does; a no-op once it has.
SIM_NODELAY = """
import socket, sys
import pdctl.sim.server as server
listen = getattr(server, "_listen", None)
if listen is not None:
    def _listen(*a, **k):
        sock = listen(*a, **k)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    server._listen = _listen
from pdctl.sim.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def sim(role: str, port: int, log: Path, cores: list[int]) -> subprocess.Popen[bytes]:
    kv = {"kv_connector": "NixlConnector", "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
          "kv_connector_extra_config": {"bidirectional_kv_xfer": True, "kv_recompute_threshold": 0,
                                        "decoder_kv_blocks_ttl": 60}}
    argv = [sys.executable, "-c", SIM_NODELAY, "serve", "Qwen/Qwen3-32B", "--role", role, "--port", str(port),
            "--served-model-name", MODEL, "--speed", "inf", "--num-gpu-blocks", "2000000", "--max-num-seqs", "1024",
            "--kv-transfer-config", json.dumps(kv), "--log-stats-interval", "3600"]
    env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}
    return start(argv, log, cores, env)


# -- the naive proxy: what a first FastAPI/starlette two-hop proxy looks like ---------------------------------
def naive_app(prefill: list[str], decode: list[str]) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    state: dict[str, httpx.AsyncClient] = {}
    turn = [0]

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> Any:
        state["c"] = httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=2048))
        yield
        await state["c"].aclose()

    async def completions(request: Request) -> Any:
        body = await request.json()
        body.pop("conversation_id", None)
        p_body = {**body, "stream": False, "max_tokens": 1, "kv_transfer_params": dict(MISS)}
        turn[0] += 1  # round robin, as vLLM's example proxy
        p_url, d_url = prefill[turn[0] % len(prefill)], decode[turn[0] % len(decode)]
        p = await state["c"].post(p_url + "/v1/completions", json=p_body)
        p.raise_for_status()
        d_body = {**body, "stream": True, "kv_transfer_params": p.json().get("kv_transfer_params")}

        async def relay() -> Any:
            async with state["c"].stream("POST", d_url + "/v1/completions", json=d_body) as d:
                async for line in d.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        chunk = json.loads(line[6:])
                        chunk.get("kv_transfer_params")  # where the example proxy caches the handle
                    yield line + "\n"

        return StreamingResponse(relay(), media_type="text/event-stream")

    async def health(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]), Route("/health", health)],
                     lifespan=lifespan)


# -- load generation ---------------------------------------------------------------------------------------------
def body(i: int, max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "prompt": f"request {i} " + "some words of context " * 16, "max_tokens": max_tokens,
            "stream": True}


async def one(client: httpx.AsyncClient, target: dict[str, str], i: int, max_tokens: int) -> None:
    b = body(i, max_tokens)
    if target["mode"] == "direct":
        prefill, decode = target["prefill"].split(","), target["decode"].split(",")
        p = await client.post(prefill[i % len(prefill)] + "/v1/completions",
                              json={**b, "stream": False, "max_tokens": 1, "kv_transfer_params": MISS})
        p.raise_for_status()
        b["kv_transfer_params"] = p.json()["kv_transfer_params"]
        url = decode[i % len(decode)]
    else:
        url = target["url"]
    async with client.stream("POST", url + "/v1/completions", json=b) as r:
        r.raise_for_status()
        got = b""
        async for chunk in r.aiter_raw():
            got += chunk
        if b'"error"' in got or not got.rstrip().endswith(b"[DONE]"):
            raise RuntimeError("stream ended badly")


def worker(target: dict[str, str], conc: int, seconds: float, max_tokens: int, seed: int, out: Any) -> None:
    async def run() -> tuple[list[float], int]:
        lat: list[float] = []
        errors = 0
        stop = time.perf_counter() + seconds
        limits = httpx.Limits(max_connections=conc + 8, max_keepalive_connections=conc + 8)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            async def loop(w: int) -> None:
                nonlocal errors
                i = 0
                while time.perf_counter() < stop:
                    t0 = time.perf_counter()
                    try:
                        await one(client, target, seed * 1_000_000 + w * 10_000 + i, max_tokens)
                        lat.append(time.perf_counter() - t0)
                    except Exception:  # counted, reported in the table
                        errors += 1
                    i += 1
            await asyncio.gather(*(loop(w) for w in range(conc)))
        return lat, errors

    out.put(asyncio.run(run()))


def measure(target: dict[str, str], conc: int, seconds: float, max_tokens: int, procs: int,
            cores: list[int]) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    n = max(1, min(procs, conc))
    q = ctx.Queue()
    workers = []
    for k in range(n):
        share = conc // n + (1 if k < conc % n else 0)
        w = ctx.Process(target=worker, args=(target, share, seconds, max_tokens, k, q))
        w.start()
        if cores:
            os.sched_setaffinity(w.pid, [cores[k % len(cores)]])
        workers.append(w)
    lat: list[float] = []
    errors = 0
    for _ in workers:
        part, err = q.get()
        lat.extend(part)
        errors += err
    for w in workers:
        w.join()
    lat.sort()
    pct = (lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1000) if lat else (lambda p: float("nan"))
    return {"target": target["mode"], "concurrency": conc, "requests": len(lat), "errors": errors,
            "rps": round(len(lat) / seconds, 1), "p50_ms": round(pct(0.5), 3), "p99_ms": round(pct(0.99), 3),
            "mean_ms": round(statistics.fmean(lat) * 1000, 3) if lat else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="1,64,256", help="comma-separated concurrent streams")
    ap.add_argument("--seconds", type=float, default=5.0, help="measurement time per point")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--load-procs", type=int, default=0, help="load-generator processes (default: spare cores)")
    ap.add_argument("--pairs", type=int, default=0,
                    help="simulated P+D pairs, so the engines are not the bottleneck (default: by core count)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--long", default="", help="comma-separated prompt lengths: time long conversations instead")
    ap.add_argument("--conversations", type=int, default=5, help="with --long: conversations per length")
    ap.add_argument("--naive-serve", nargs=3, metavar=("PORT", "PREFILL", "DECODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.naive_serve:
        import uvicorn

        port, p, d = args.naive_serve
        uvicorn.run(naive_app(p.split(","), d.split(",")), host="127.0.0.1", port=int(port), log_level="warning")
        return

    cores = sorted(os.sched_getaffinity(0))
    pairs = args.pairs or max(1, min(4, (len(cores) - 4) // 3))
    router_core = cores[:1]
    engine_cores = cores[1 : 1 + 2 * pairs] if len(cores) > 2 * pairs + 1 else cores[1:] or cores
    load_cores = cores[1 + 2 * pairs :] or engine_cores
    procs = args.load_procs or max(1, min(8, len(load_cores)))
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"router-bench-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    ports = [(free_port(), free_port()) for _ in range(pairs)]
    purls = [f"http://127.0.0.1:{pp}" for pp, _ in ports]
    durls = [f"http://127.0.0.1:{dp}" for _, dp in ports]
    rp, np_ = free_port(), free_port()
    running = []
    for k, (pp, dp) in enumerate(ports):
        running.append(sim("prefill", pp, logs / f"prefill-{k}.log", [engine_cores[(2 * k) % len(engine_cores)]]))
        running.append(sim("decode", dp, logs / f"decode-{k}.log", [engine_cores[(2 * k + 1) % len(engine_cores)]]))
    try:
        for url, proc in zip([u for pair in zip(purls, durls, strict=True) for u in pair], running, strict=True):
            wait_health(url, proc, "simulator")
        router = start([sys.executable, "-m", "pdctl.router", "serve", "--port", str(rp),
                        *(a for u in purls for a in ("--prefill", u)), *(a for u in durls for a in ("--decode", u)),
                        "--model", MODEL, "--decoder-kv-blocks-ttl", "60", "--log-level", "warning",
                        "--local-prefill-tokens", "0"],  # the P/D handshake on every warm turn, as the naive proxy
                       logs / "router.log", router_core)
        naive = start([sys.executable, __file__, "--naive-serve", str(np_), ",".join(purls), ",".join(durls)],
                      logs / "naive.log", router_core)
        running += [router, naive]
        wait_health(f"http://127.0.0.1:{rp}", router, "router")
        wait_health(f"http://127.0.0.1:{np_}", naive, "naive proxy")
        if args.long:
            long_report([int(n) for n in args.long.split(",")], f"http://127.0.0.1:{rp}",
                        f"http://127.0.0.1:{np_}", args)
            return
        targets = [{"mode": "direct", "prefill": ",".join(purls), "decode": ",".join(durls)},
                   {"mode": "router", "url": f"http://127.0.0.1:{rp}"},
                   {"mode": "naive", "url": f"http://127.0.0.1:{np_}"}]
        rows = []
        for conc in (int(c) for c in args.concurrency.split(",")):
            for t in targets:
                measure(t, conc, 1.0, args.max_tokens, procs, load_cores)  # warm-up
                rows.append(measure(t, conc, args.seconds, args.max_tokens, procs, load_cores))
                r = rows[-1]
                print(f"{r['target']:>7} c={conc:<4} {r['rps']:>8} req/s  p50 {r['p50_ms']:>8} ms  "
                      f"p99 {r['p99_ms']:>8} ms  errors {r['errors']}", flush=True)
    finally:
        for p in running:
            stop_group(p)
    report(rows, cores, pairs, args)


def long_ttfts(url: str, lengths: list[int], conversations: int, leg: str) -> dict[int, list[float]]:
    from pdctl.bench.traffic.client import ClientOptions, play
    from pdctl.bench.traffic.workload import Conversation, WorkloadSpec, build

    spec = WorkloadSpec(lengths=tuple(lengths), conversations=conversations, turns=3, user_tokens=512,
                        output_tokens=64, api="completions")
    opts = ClientOptions(url=url, model=MODEL, api="completions", output_tokens=64)
    out: dict[int, list[float]] = {}
    for n in lengths:
        convs = [Conversation(p, "completions", f"{leg}-{p.key}") for p in build(spec) if p.length == n]
        records = asyncio.run(play(convs, opts, leg))
        bad = [r.error for r in records if not r.ok]
        if bad:
            sys.exit(f"{leg} at {n} tokens: {bad[0]}")
        if leg == "router" and any(r.reuse != "hit" for r in records if r.turn >= 1):
            sys.exit(f"router at {n} tokens: a turn 2+ was not a hit")
        out[n] = [r.ttft_ms for r in records if r.turn >= 1 and r.ttft_ms is not None]
    return out


def long_report(lengths: list[int], router_url: str, naive_url: str, args: argparse.Namespace) -> None:
    long_ttfts(router_url, lengths[:1], 1, "warmup")
    long_ttfts(naive_url, lengths[:1], 1, "warmup")
    router = long_ttfts(router_url, lengths, args.conversations, "router")
    naive = long_ttfts(naive_url, lengths, args.conversations, "naive")
    print(f"\nmedian TTFT of turns 2-3 (ms), {args.conversations} conversations per length, one at a time; engines "
          "simulated at zero delay; router and naive proxy each pinned to 1 core")
    print("| prompt tokens | router (reuse path) | naive proxy (recompute path) | router - naive |")
    print("|---|---|---|---|")
    rows = []
    for n in lengths:
        r, p = statistics.median(router[n]), statistics.median(naive[n])
        rows.append({"length": n, "router_ms": round(r, 2), "naive_ms": round(p, 2)})
        print(f"| {n} | {r:.1f} | {p:.1f} | {r - p:+.1f} |")
    if args.json:
        args.json.write_text(json.dumps({"long": rows, "conversations": args.conversations}, indent=1))


def report(rows: list[dict[str, Any]], cores: list[int], pairs: int, args: argparse.Namespace) -> None:
    by = {(r["target"], r["concurrency"]): r for r in rows}
    print(f"\nrouter and naive proxy each pinned to 1 core; {len(cores)} cores; {pairs} simulated P+D pair(s) at "
          f"zero delay; max_tokens={args.max_tokens}; {args.seconds:g} s per point")
    print("| streams | direct req/s | router req/s | naive req/s | router/naive | router added p50 | "
          "router added p99 | router errors |")
    print("|---|---|---|---|---|---|---|---|")
    for conc in sorted({r["concurrency"] for r in rows}):
        d, r, n = by[("direct", conc)], by[("router", conc)], by[("naive", conc)]
        ratio = r["rps"] / n["rps"] if n["rps"] else float("nan")
        print(f"| {conc} | {d['rps']} | {r['rps']} | {n['rps']} | {ratio:.2f}x | "
              f"{r['p50_ms'] - d['p50_ms']:+.3f} ms | {r['p99_ms'] - d['p99_ms']:+.3f} ms | {r['errors']} |")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "cores": len(cores), "max_tokens": args.max_tokens}, indent=1))


if __name__ == "__main__":
    main()
