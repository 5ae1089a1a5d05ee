#!/usr/bin/env python3
"""Router load and fault benchmark on simulated engines (results are simulated; printed, not asserted).

Phase "load": `--streams` concurrent streaming multi-turn chat conversations through one router for `--seconds`
(1P1D by default). Phase "faults": `--fault-streams` conversations on 2P2D for `--seconds`, one decode SIGKILLed
at 25 % and restarted on its port at 40 %, one prefill killed at 60 % and restarted at 75 %. Each phase prints:
requests, errors by kind, client-visible failures before the stream started (on the reuse path: turns >= 2),
TTFT p50/p99, the router's RSS and open fds over time, and the simulator's integrity oracle
(`pdctl_sim_corrupt_reuse_total`, summed over every engine incarnation).

    python scripts/load_bench.py                       # 1000 streams, then 256 with faults, 60 s each (speed 100)
    python scripts/load_bench.py --seconds 20 --streams 500 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pdctl.router import wire  # noqa: E402
from tests.support.ports import free_port  # noqa: E402
from tests.support.sim_procs import SERVED, SimProc, start_sim, stop_group, wait_for_health  # noqa: E402


@dataclass
class Tally:
    requests: int = 0
    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    before_start: int = 0  # failures the client saw before any byte of its stream
    before_start_reuse: int = 0  # ... of those, turns >= 2 (a handle was expected)
    mid_stream: int = 0
    ttft: list[float] = field(default_factory=list)
    reuse: Counter[str] = field(default_factory=Counter)


class Engines:
    """Simulated engines by name, restartable in place; the oracle summed over every incarnation."""

    def __init__(self, log_dir: Path, speed: float) -> None:
        self.log_dir, self.speed = log_dir, speed
        self.procs: dict[str, SimProc] = {}
        self.corrupt_dead = 0.0

    def start(self, name: str, role: str, port: int | None = None, side: int | None = None) -> SimProc:
        sim = start_sim(self.log_dir, role, name=name, speed=self.speed, num_blocks=200000, max_num_seqs=1024,
                        port=port, side_port=side)
        self.procs[name] = sim
        return sim

    def kill(self, name: str) -> None:
        sim = self.procs[name]
        with contextlib.suppress(Exception):
            self.corrupt_dead += sim.metric("pdctl_sim_corrupt_reuse_total")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(sim.proc.pid, signal.SIGKILL)
        sim.proc.wait(10)

    def restart(self, name: str) -> None:
        old = self.procs[name]
        self.start(name, old.role, old.port, old.side_port)

    def corrupt(self) -> float:
        return self.corrupt_dead + sum(p.metric("pdctl_sim_corrupt_reuse_total") for p in self.procs.values()
                                       if p.proc.poll() is None)

    def stop(self) -> None:
        for p in self.procs.values():
            p.stop()


def start_router(log_dir: Path, prefill: list[str], decode: list[str]) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    argv = [sys.executable, "-m", "pdctl", "router", "serve", "--port", str(port), "--model", SERVED,
            *(a for u in prefill for a in ("--prefill", u)), *(a for u in decode for a in ("--decode", u)),
            "--log-level", "warning", "--local-prefill-tokens", "0"]  # every warm turn through the P/D hops
    log = open(log_dir / "router.log", "ab")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    wait_for_health("router", url, proc, lambda: (log_dir / "router.log").read_text(), lambda: stop_group(proc), 60)
    return url, proc


def router_ttft(url: str) -> dict[str, float | None]:
    """p50/p99 of the router's own TTFT histogram (`pdctl_router_ttft_seconds`), as bucket upper bounds in ms: what
    the router added plus the engines, without the load generator's own event-loop lag."""
    text = httpx.get(url + "/metrics", timeout=10).text
    buckets = [(float(le), float(n)) for le, n in re.findall(r'pdctl_router_ttft_seconds_bucket\{le="([^"]+)"\} (\S+)',
                                                             text)]
    total = buckets[-1][1] if buckets else 0.0
    out: dict[str, float | None] = {}
    for name, q in (("p50", 0.5), ("p99", 0.99)):
        bound = next((le for le, n in buckets if total and n >= q * total), None)
        out[name] = None if bound is None else bound * 1000
    return out


def router_usage(pid: int) -> tuple[float, int]:
    """(RSS MiB, open fds) of the router process."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]
    return round(rss, 1), len(os.listdir(f"/proc/{pid}/fd"))


async def conversation(client: httpx.AsyncClient, url: str, tally: Tally, stop_at: float, think: float,
                       turns: int, max_tokens: int) -> None:
    while time.monotonic() < stop_at:
        messages: list[dict[str, str]] = []
        cid = os.urandom(8).hex()
        for turn in range(turns):
            if time.monotonic() >= stop_at:
                return
            messages.append({"role": "user", "content": f"turn {turn} of {cid}: " + "tell me more " * 20})
            body = {"model": SERVED, "messages": messages, "max_tokens": max_tokens, "stream": True,
                    "conversation_id": cid}
            text = await one_turn(client, url, body, tally, turn)
            if text is None:
                break  # start a new conversation, as a client would after an error
            messages.append({"role": "assistant", "content": text})
            await asyncio.sleep(think * random.uniform(0.5, 1.5))


async def one_turn(client: httpx.AsyncClient, url: str, body: dict[str, Any], tally: Tally, turn: int) -> str | None:
    tally.requests += 1
    started = time.perf_counter()
    first = True
    parts: list[str] = []
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                kind = f"http_{r.status_code}"
                raise _Before(kind)
            tally.reuse[wire.Reuse.parse(r.headers.get(wire.REUSE_HEADER)).outcome] += 1
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    tally.errors["mid_stream_error_event"] += 1
                    tally.mid_stream += 1
                    return None
                if first:
                    tally.ttft.append(time.perf_counter() - started)
                    first = False
                for c in event.get("choices") or ():
                    parts.append((c.get("delta") or {}).get("content") or "")
    except _Before as e:
        _before(tally, str(e), turn)
        return None
    except httpx.HTTPError as e:
        if first:
            _before(tally, type(e).__name__, turn)
        else:
            tally.errors[f"mid_stream_{type(e).__name__}"] += 1
            tally.mid_stream += 1
        return None
    tally.ok += 1
    return "".join(parts)


class _Before(Exception):
    pass


def _before(tally: Tally, kind: str, turn: int) -> None:
    tally.errors[kind] += 1
    tally.before_start += 1
    tally.before_start_reuse += turn > 0


async def drive(url: str, pid: int, streams: int, seconds: float, think: float, turns: int, max_tokens: int,
                faults: list[tuple[float, str]], engines: Engines) -> dict[str, Any]:
    tally = Tally()
    usage: list[tuple[float, float, int]] = []
    limits = httpx.Limits(max_connections=streams + 64, max_keepalive_connections=streams + 64)
    t0 = time.monotonic()
    stop_at = t0 + seconds
    async with httpx.AsyncClient(timeout=httpx.Timeout(120, connect=30), limits=limits) as client:
        async def sampler() -> None:
            while time.monotonic() < stop_at:
                usage.append((round(time.monotonic() - t0), *router_usage(pid)))
                await asyncio.sleep(max(1.0, seconds / 12))

        async def injector() -> None:
            for at, action in faults:
                await asyncio.sleep(max(0.0, t0 + at * seconds - time.monotonic()))
                verb, name = action.split(" ")
                print(f"  t={time.monotonic() - t0:5.1f}s {verb} {name}", flush=True)
                await asyncio.to_thread(engines.kill if verb == "kill" else engines.restart, name)

        tasks = [asyncio.create_task(conversation(client, url, tally, stop_at, think, turns, max_tokens))
                 for _ in range(streams)]
        await asyncio.gather(sampler(), injector(), *tasks)
    usage.append((round(time.monotonic() - t0), *router_usage(pid)))
    ttft = sorted(tally.ttft)
    return {
        "requests": tally.requests, "ok": tally.ok, "errors": dict(tally.errors),
        "failed_before_stream_start": tally.before_start, "failed_before_start_on_reuse_path": tally.before_start_reuse,
        "mid_stream_failures": tally.mid_stream, "reuse": dict(tally.reuse),
        "ttft_p50_ms": round(statistics.median(ttft) * 1000, 1) if ttft else None,
        "ttft_p99_ms": round(ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))] * 1000, 1) if ttft else None,
        "router_rss_mib_and_fds_over_time": usage, "corrupt_reuses": engines.corrupt(),
        "wall_s": round(time.monotonic() - t0, 1),
    }


def phase(name: str, args: argparse.Namespace, n_p: int, n_d: int, streams: int,
          faults: list[tuple[float, str]]) -> dict[str, Any]:
    log_dir = Path(tempfile.mkdtemp(prefix=f"pdctl-load-{name}-"))
    engines = Engines(log_dir, args.speed)
    proc = None
    try:
        decodes = [engines.start(f"decode-{i}", "decode").url for i in range(n_d)]
        prefills = [engines.start(f"prefill-{i}", "prefill").url for i in range(n_p)]
        url, proc = start_router(log_dir, prefills, decodes)
        print(f"{name}: {streams} streams, {n_p}P{n_d}D, {args.seconds:g}s (logs: {log_dir})", flush=True)
        result = asyncio.run(drive(url, proc.pid, streams, args.seconds, args.think, args.turns, args.max_tokens,
                                   faults, engines))
        result["router_ttft_ms_at_most"] = router_ttft(url)
        result["router_stats"] = {k: v for k, v in httpx.get(url + "/stats", timeout=10).json().items()
                                  if k in ("reuse", "reuse_reasons", "hit_rate", "prefill", "decode")}
        return {"phase": name, "streams": streams, "topology": f"{n_p}P{n_d}D", **result}
    finally:
        if proc is not None:
            stop_group(proc)
        engines.stop()


def summary(r: dict[str, Any]) -> str:
    usage = r["router_rss_mib_and_fds_over_time"]
    lines = [
        f"== {r['phase']}: {r['streams']} streams on {r['topology']}, {r['wall_s']}s (simulated engines)",
        f"   requests {r['requests']}, ok {r['ok']}, errors {r['errors'] or 'none'}",
        f"   failed before the stream started: {r['failed_before_stream_start']} "
        f"(on the reuse path: {r['failed_before_start_on_reuse_path']}); mid-stream: {r['mid_stream_failures']}",
        f"   TTFT at the client p50 {r['ttft_p50_ms']} ms, p99 {r['ttft_p99_ms']} ms; as the router saw it (bucket "
        f"bounds) p50 <= {r['router_ttft_ms_at_most']['p50']} ms, p99 <= {r['router_ttft_ms_at_most']['p99']} ms",
        f"   reuse {r['reuse']}; router reasons {r['router_stats']['reuse_reasons']}",
        "   router RSS MiB / open fds over time: " + ", ".join(f"{t}s {m}/{f}" for t, m, f in usage),
        f"   corrupt reuses (oracle): {r['corrupt_reuses']:g}",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--fault-streams", type=int, default=256)
    ap.add_argument("--think", type=float, default=2.0, help="mean seconds between a reply and the next turn")
    ap.add_argument("--turns", type=int, default=8, help="turns per conversation before a new one starts")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--speed", type=float, default=100, help="simulator speed (divides every modelled delay)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--skip-load", action="store_true")
    args = ap.parse_args()
    out = []
    if not args.skip_load:
        out.append(phase("load", args, 1, 1, args.streams, []))
    faults = [(0.25, "kill decode-0"), (0.40, "restart decode-0"), (0.60, "kill prefill-0"),
              (0.75, "restart prefill-0")]
    out.append(phase("faults", args, 2, 2, args.fault_streams, faults))
    for r in out:
        print(summary(r))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
