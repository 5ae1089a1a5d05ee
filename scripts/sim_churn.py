#!/usr/bin/env python3
"""Simulator churn: does the engines' CPU per request stay flat over tens of thousands of requests?

Starts a simulated prefill and decode at zero delay (--speed inf) and pdctl's router in front of them, then drives
streaming /v1/completions through the router at --streams concurrent streams until --requests have completed.
Every --window requests it prints what each process (prefill, decode, router) spent of CPU per request in that
window (utime + stime from /proc/<pid>/stat), the window's req/s, errors, and what the decode retains (its
/metrics), so a cost per request that grows with time shows as a rising column. Results are *simulated*.

    python scripts/sim_churn.py                                  # 20,000 new conversations, 256 streams
    python scripts/sim_churn.py --mix multi                      # half new, half 4-turn conversations
    python scripts/sim_churn.py --requests 40000 --json out.json

--mix new: every request a new conversation (one turn, never continued: the decode retains its blocks until the
router releases them or decoder_kv_blocks_ttl runs out). --mix multi: each stream alternates a one-turn
conversation and a 4-turn one (each turn = the previous prompt + its reply + new text, with a conversation_id).
--direct: the load generator makes the two hops itself (prefill, then decode with its handle), without the router,
so the engines see more requests per second (the router is then not in the table).
--base-port P puts the engines, their side channels and the router on P..P+4 instead of free ports.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import re
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
TICK = os.sysconf("SC_CLK_TCK")
WORDS = "some words of context " * 16
# What the decode exposes about its retained KV; absent on a simulator that predates them.
GAUGES = ("pdctl_sim_kv_retained_requests", "pdctl_sim_kv_retained_blocks", "vllm:kv_cache_usage_perc",
          "vllm:num_requests_waiting")


def cpu_s(pid: int) -> float:
    """utime + stime of one process, seconds (fields 14 and 15 of /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def start(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log, "ab") as f:
        return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})


def wait_health(url: str, proc: subprocess.Popen[bytes], what: str, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited with {proc.returncode}; its log: {log}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    sys.exit(f"{what} did not answer /health at {url}; its log: {log}")


def sim(role: str, port: int, side_port: int, log: Path, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    kv = {"kv_connector": "NixlConnector", "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
          "kv_connector_extra_config": {"bidirectional_kv_xfer": True, "kv_recompute_threshold": 0,
                                        "decoder_kv_blocks_ttl": args.ttl}}
    argv = [sys.executable, "-m", "pdctl.sim", "serve", "Qwen/Qwen3-32B", "--role", role, "--host", "127.0.0.1",
            "--port", str(port), "--served-model-name", MODEL, "--speed", "inf",
            "--num-gpu-blocks", str(args.num_gpu_blocks), "--max-num-seqs", "1024",
            "--kv-transfer-config", json.dumps(kv), "--log-stats-interval", "10"]
    env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_port)}
    return start(argv, log, env)


# -- load generation -----------------------------------------------------------------------------------------
MISS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None, "remote_block_ids": None,
        "remote_host": None, "remote_port": None}


async def turn(client: httpx.AsyncClient, url: str, prompt: str, conv: str | None, max_tokens: int) -> str:
    body: dict[str, Any] = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    if conv is not None:
        body["conversation_id"] = conv
    if "," in url:  # --direct: "prefill,decode"; the prefill's handle goes to the decode, as the router sends it
        purl, url = url.split(",")
        p = await client.post(purl + "/v1/completions", json={**body, "stream": False, "max_tokens": 1,
                                                                "kv_transfer_params": MISS})
        p.raise_for_status()
        body["kv_transfer_params"] = p.json()["kv_transfer_params"]
    text: list[str] = []
    done = False
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(str(chunk["error"]))
            text.extend(c.get("text", "") for c in chunk.get("choices") or [])
    if not done:
        raise RuntimeError("stream ended without [DONE]")
    return "".join(text)


def worker(url: str, streams: int, first: int, mix: str, max_tokens: int, done: Any, errors: Any,
           target: int) -> None:
    async def run() -> None:
        limits = httpx.Limits(max_connections=streams + 8, max_keepalive_connections=streams + 8)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            async def count(ok: bool) -> None:
                with (done if ok else errors).get_lock():
                    (done if ok else errors).value += 1

            async def loop(w: int) -> None:
                k = 0
                while done.value < target:
                    tag = f"s{first + w}-c{k}"
                    turns = 4 if mix == "multi" and k % 2 else 1
                    prompt = f"conversation {tag} " + WORDS
                    for t in range(turns):
                        try:
                            reply = await turn(client, url, prompt, tag if turns > 1 else None, max_tokens)
                            await count(True)
                        except Exception:  # counted, printed per window
                            await count(False)
                            break
                        prompt = prompt + reply + f" then turn {t + 1} asks " + WORDS
                    k += 1

            await asyncio.gather(*(loop(w) for w in range(streams)))

    asyncio.run(run())


def scrape(url: str) -> dict[str, float]:
    try:
        text = httpx.get(url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return {}
    out: dict[str, float] = {}
    for name in GAUGES:
        values = re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
        if values:
            out[name] = sum(float(v) for v in values)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20_000, help="completed requests to drive")
    ap.add_argument("--streams", type=int, default=256, help="concurrent streams")
    ap.add_argument("--window", type=int, default=2000, help="requests per printed window")
    ap.add_argument("--mix", choices=("new", "multi"), default="new")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--ttl", type=float, default=480, help="decoder_kv_blocks_ttl, engines and router (s)")
    ap.add_argument("--num-gpu-blocks", type=int, default=2_000_000, help="each engine's KV blocks")
    ap.add_argument("--load-procs", type=int, default=2, help="load-generator processes")
    ap.add_argument("--base-port", type=int, default=0, help="ports P..P+4 instead of free ones")
    ap.add_argument("--direct", action="store_true", help="no router: the load generator makes both hops")
    ap.add_argument("--json", type=Path, help="also write the windows here")
    args = ap.parse_args()

    ports = list(range(args.base_port, args.base_port + 5)) if args.base_port else [free_port() for _ in range(5)]
    p_port, p_side, d_port, d_side, r_port = ports
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"sim-churn-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    purl, durl, rurl = (f"http://127.0.0.1:{p}" for p in (p_port, d_port, r_port))
    procs: dict[str, subprocess.Popen[bytes]] = {}
    loaders: list[Any] = []
    try:
        procs["prefill"] = sim("prefill", p_port, p_side, logs / "prefill.log", args)
        procs["decode"] = sim("decode", d_port, d_side, logs / "decode.log", args)
        wait_health(purl, procs["prefill"], "prefill", logs / "prefill.log")
        wait_health(durl, procs["decode"], "decode", logs / "decode.log")
        if not args.direct:
            procs["router"] = start([sys.executable, "-m", "pdctl.router", "serve", "--port", str(r_port),
                                     "--prefill", purl, "--decode", durl, "--model", MODEL,
                                     "--decoder-kv-blocks-ttl", f"{args.ttl:g}", "--log-level", "warning"],
                                    logs / "router.log")
            wait_health(rurl, procs["router"], "router", logs / "router.log")
        target = f"{purl},{durl}" if args.direct else rurl
        ctx = mp.get_context("fork")
        done, errors = ctx.Value("q", 0), ctx.Value("q", 0)
        n = max(1, min(args.load_procs, args.streams))
        first = 0
        for k in range(n):
            share = args.streams // n + (1 if k < args.streams % n else 0)
            loaders.append(ctx.Process(target=worker, args=(target, share, first, args.mix, args.max_tokens, done,
                                                             errors, args.requests)))
            first += share
        print(f"simulated engines at zero delay; {args.streams} streams, mix {args.mix}, {args.requests} requests, "
              f"load average at start {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}; "
              f"logs in {logs}", flush=True)
        print("| requests | req/s | prefill CPU ms/req | decode CPU ms/req | router CPU ms/req | errors | "
              "decode retained reqs | decode retained blocks | decode KV use | decode waiting |", flush=True)
        print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
        rows = []
        last_cpu = {name: cpu_s(p.pid) for name, p in procs.items()}
        last_t, last_n, last_err = time.perf_counter(), 0, 0
        for w in loaders:
            w.start()
        boundary = args.window
        while boundary <= args.requests:
            while done.value < boundary:
                if not any(w.is_alive() for w in loaders):
                    sys.exit("the load generators stopped early")
                for name, p in procs.items():
                    if p.poll() is not None:
                        sys.exit(f"{name} exited with {p.returncode}; logs in {logs}")
                time.sleep(0.05)
            now, count, err = time.perf_counter(), done.value, errors.value
            cpu = {name: cpu_s(p.pid) for name, p in procs.items()}
            reqs = count - last_n
            per = {name: (cpu[name] - last_cpu[name]) * 1000 / reqs for name in procs}
            gauges = scrape(durl)
            row = {"requests": count, "rps": round(reqs / (now - last_t), 1),
                   **{f"{name}_cpu_ms": round(v, 3) for name, v in per.items()}, "errors": err - last_err,
                   **{k: gauges.get(k) for k in GAUGES}}
            rows.append(row)

            def show(v: float | None, fmt: str = "{:.0f}") -> str:
                return "-" if v is None else fmt.format(v)

            router_ms = f"{per['router']:.2f}" if "router" in per else "-"
            print(f"| {count} | {row['rps']} | {per['prefill']:.2f} | {per['decode']:.2f} | {router_ms} | "
                  f"{row['errors']} | {show(gauges.get(GAUGES[0]))} | {show(gauges.get(GAUGES[1]))} | "
                  f"{show(gauges.get(GAUGES[2]), '{:.3f}')} | {show(gauges.get(GAUGES[3]))} |", flush=True)
            last_cpu, last_t, last_n, last_err = cpu, now, count, err
            boundary += args.window
        la = os.getloadavg()
        print(f"load average at end {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}", flush=True)
        if args.json:
            args.json.write_text(json.dumps({"rows": rows, "args": vars(args) | {"json": str(args.json)}},
                                            indent=1))
    finally:
        for w in loaders:
            if w.is_alive():
                w.terminate()
            w.join(timeout=5)
        for p in procs.values():
            stop_group(p)


if __name__ == "__main__":
    main()
