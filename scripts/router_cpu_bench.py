#!/usr/bin/env python3
"""The router's CPU per request and its throughput over repetitions, ON and OFF, on simulated engines.

For each leg (ON: the engines keep a finished turn's KV for the next one, `bidirectional_kv_xfer`; OFF: they do
not) this starts one simulated prefill and decode at zero delay (`--speed inf`) and pdctl's router, pinned to its
own core with `taskset` semantics (sched_setaffinity) where the machine has more than one; both legs' deployments
are up at once (the idle one's timers cost about 1 % of a core). Then it plays each workload at each stream count
`--reps` times on the same deployments (nothing restarted between repetitions), the legs taking turns within each
repetition (ON then OFF, then OFF then ON, ...), so that the two sides of a ratio run seconds apart:

  new   every request a new conversation (a miss: the prefill then the decode)
  mix   half the streams play new one-turn conversations, half play 4-turn conversations (each turn the previous
        prompt + its reply + new text: turns 2-4 are warm; ON reuses the decode's KV)

Per repetition it prints req/s, errors, and the router's CPU seconds per 1000 requests (utime + stime of the
router process from /proc/<pid>/stat, read before and after), then the criteria: ON/OFF req/s per repetition,
each repetition vs the first, and whether the CPU target (<= 1.0 s per 1000 requests) holds.

    python scripts/router_cpu_bench.py                                   # 64,256,1000 streams, new + mix, 3 x 10 s
    python scripts/router_cpu_bench.py --streams 256 --seconds 5 --workloads new --legs on
    python scripts/router_cpu_bench.py --decode-blocks 4000              # a small decode KV: retention must yield
    python scripts/router_cpu_bench.py --profile /tmp/router.speedscope  # also py-spy the router (if installed)
    python scripts/router_cpu_bench.py --cprofile-engines /tmp/engines    # the engines under cProfile (pstats files)
    python scripts/router_cpu_bench.py --aa off --streams 256 --workloads new  # A/A: two OFF deployments

`--aa LEG` runs two deployments of the same leg (LEG and LEG-b) the way ON and OFF run, and prints their ratio per
repetition: what this bench reads as a difference between two legs when there is none (the host's resolution).

An engine's cProfile stats cover its whole life: an ON router that stops releases the handles it holds, so the ON
prefill's stats end with those one-token release requests (one per handle), which no repetition counted.

The load generator is a lean HTTP/1.1 client (asyncio + httptools), so that on a small machine it takes as little
CPU from the engines as it can; its requests are streaming /v1/completions with max_tokens 8.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import httptools

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.ports import free_port
from tests.support.sim_procs import kv_config, stop_group

MODEL = "Qwen"
CPU_TARGET_S = 1.0  # router CPU seconds per 1000 requests
TICKS = os.sysconf("SC_CLK_TCK")


_NEXT_PORT: list[int] = []


def next_port() -> int:
    """A free port: the next of --base-port's range when given, else any the OS offers."""
    if not _NEXT_PORT:
        return free_port()
    while True:  # skip ports an outgoing connection holds as its local port just now
        _NEXT_PORT[0] += 1
        with socket.socket() as s, contextlib.suppress(OSError):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", _NEXT_PORT[0] - 1))
            return _NEXT_PORT[0] - 1


# A module (the router, a simulated engine) under cProfile: uvicorn re-raises the SIGTERM it caught once it has shut
# down, so the stats are written by a handler of that signal (which uvicorn restores before re-raising), not at exit.
CPROFILE = """
import cProfile, os, runpy, signal, sys, time
out, module, sys.argv = sys.argv[1], sys.argv[2], [sys.argv[2], *sys.argv[3:]]
prof = cProfile.Profile(time.process_time)  # CPU time: waits and other processes do not count
def dump(*_):
    prof.disable()
    prof.dump_stats(out)
    os._exit(0)
signal.signal(signal.SIGTERM, dump)
prof.enable()
runpy.run_module(module, run_name="__main__")
"""


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def start(argv: list[str], log: Path, cores: list[int], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log, "ab") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    if cores:
        os.sched_setaffinity(proc.pid, cores)
    return proc


def wait_health(port: int, proc: subprocess.Popen[bytes], what: str, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited with {proc.returncode}; its log: {log}")
        with contextlib.suppress(OSError, RuntimeError):
            status, _ = asyncio.run(_get(port, "/health"))
            if status == 200:
                return
        time.sleep(0.1)
    sys.exit(f"{what} did not answer /health on port {port}; its log: {log}")


def counters(port: int) -> dict[str, int]:
    """The router's counts so far (/stats): releases by reason and result (sent alone, carried on a turn's prefill
    request, ...), as "release REASON RESULT"; the KV source the cost model chose for warm turns ("source S") and
    why it refused the decode alone ("refused WHY")."""
    status, body = asyncio.run(_get(port, "/stats"))
    if status != 200:
        return {}
    doc = json.loads(body)
    out: dict[str, int] = {}
    for reason, by_result in (doc.get("retention") or {}).get("releases", {}).items():
        for result, n in by_result.items():
            out[f"release {reason} {result}"] = out.get(f"release {reason} {result}", 0) + int(n)
    choice = doc.get("kv_choice") or {}
    for prefix, key in (("source", "mix"), ("refused", "local_refused")):
        out.update({f"{prefix} {k}": int(n) for k, n in (choice.get(key) or {}).items()})
    return out


def since(before: dict[str, int], after: dict[str, int], prefix: str) -> dict[str, int]:
    """What grew between two `counters` readings, for the keys under `prefix` (the prefix dropped)."""
    return {k.removeprefix(prefix): n - before.get(k, 0) for k, n in after.items()
            if k.startswith(prefix) and n - before.get(k, 0)}


async def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = await Conn.open(port)
    try:
        return await conn.request(b"GET", path.encode(), b"")
    finally:
        conn.close()


# -- a lean keep-alive HTTP/1.1 client ---------------------------------------------------------------------------
class Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.body: list[bytes] = []
        self.done: asyncio.Future[None] | None = None
        self.keep = True

    @classmethod
    async def open(cls, port: int) -> Conn:
        _, conn = await asyncio.get_running_loop().create_connection(cls, "127.0.0.1", port)
        return conn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._end(RuntimeError(f"bad response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.keep = False
        self._end(RuntimeError("connection closed"))

    def on_headers_complete(self) -> None:
        self.keep = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self._end(None)

    def _end(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            if exc is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(exc)

    async def request(self, method: bytes, path: bytes, body: bytes) -> tuple[int, bytes]:
        assert self.transport is not None
        self.body = []
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(b"%s %s HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (method, path, len(body), body))
        await asyncio.wait_for(self.done, 60)
        return self.parser.get_status_code(), b"".join(self.body)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def reply_text(sse: bytes) -> str:
    out = []
    for line in sse.split(b"\n"):
        if line.startswith(b"data: {"):
            chunk = json.loads(line[6:])
            for c in chunk.get("choices") or ():
                out.append(c.get("text") or "")
    return "".join(out)


WORDS = "some words of context that a user would type into a prompt "


def worker(port: int, streams: int, seconds: float, workload: str, seed: int, out: Any) -> None:
    async def run() -> tuple[int, int, list[str]]:
        done = errors = 0
        samples: deque[str] = deque(maxlen=3)
        stop = time.perf_counter() + seconds

        async def loop(w: int) -> None:
            nonlocal done, errors
            conn: Conn | None = None
            multi = workload == "mix" and w % 2 == 1
            i = 0
            prompt = ""
            while time.perf_counter() < stop:
                turn = i % 4 if multi else 0
                if turn == 0:
                    prompt = f"conversation {seed}-{w}-{i} {time.time_ns()} " + WORDS * 8
                else:
                    prompt += f" user turn {turn}: " + WORDS * 2
                body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 8, "stream": True}).encode()
                try:
                    if conn is None or not conn.keep:
                        conn = await Conn.open(port)
                    status, got = await conn.request(b"POST", b"/v1/completions", body)
                    if status != 200 or not got.rstrip().endswith(b"[DONE]") or b'"error"' in got:
                        raise RuntimeError(f"HTTP {status}: {got[-300:]!r}")
                    if multi:
                        prompt += reply_text(got)
                    done += 1
                except Exception as exc:  # counted, and a few shown
                    errors += 1
                    samples.append(str(exc)[:300])
                    if conn is not None:
                        conn.close()
                    conn = None
                    i = (i // 4 + 1) * 4 if multi else i  # a broken conversation starts over
                    continue
                i += 1
            if conn is not None:
                conn.close()

        await asyncio.gather(*(loop(w) for w in range(streams)))
        return done, errors, list(samples)

    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    out.put(asyncio.run(run()))


def play(port: int, streams: int, seconds: float, workload: str, procs: int,
         cores: list[int]) -> tuple[int, int, list[str]]:
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    n = max(1, min(procs, streams))
    ws = []
    for k in range(n):
        share = streams // n + (1 if k < streams % n else 0)
        w = ctx.Process(target=worker, args=(port, share, seconds, workload, k, q))
        w.start()
        if cores and w.pid is not None:
            os.sched_setaffinity(w.pid, cores)
        ws.append(w)
    done = errors = 0
    samples: list[str] = []
    for _ in ws:
        d, e, s = q.get()
        done, errors, samples = done + d, errors + e, samples + s
    for w in ws:
        w.join()
    return done, errors, samples


# -- one leg's deployment: engines + router, measured one repetition at a time -----------------------------------
class Deployment:
    """One leg's simulated prefill and decode and its router, started once and measured repetition by repetition
    (nothing restarted between them)."""

    def __init__(self, name: str, args: argparse.Namespace, logs: Path, router_cores: list[int],
                 other_cores: list[int]) -> None:
        self.name, self.args, self.logs, self.other_cores = name, args, logs, other_cores
        self.procs: list[subprocess.Popen[bytes]] = []
        self.spy: subprocess.Popen[bytes] | None = None
        self.idle = 0.0
        bidirectional = name.split("-")[0] == "on"
        pp, dp, self.rp = next_port(), next_port(), next_port()
        for role, port, blocks in (("prefill", pp, 2_000_000), ("decode", dp, args.decode_blocks)):
            sim = (["-c", CPROFILE, f"{args.cprofile_engines}.{name}-{role}", "pdctl.sim"] if args.cprofile_engines
                   else ["-m", "pdctl.sim"])
            argv = [sys.executable, *sim, "serve", "Qwen/Qwen3-32B", "--role", role, "--port", str(port),
                    "--served-model-name", MODEL, "--speed", "inf", "--num-gpu-blocks", str(blocks),
                    "--max-num-seqs", "1024", "--log-stats-interval", "3600",
                    "--kv-transfer-config", kv_config(role, bidirectional, ttl=args.kv_ttl),
                    *([] if role == "decode" else ["--no-enable-prefix-caching"])]
            env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(next_port())}
            self.procs.append(start(argv, logs / f"{name}-{role}.log", other_cores, env))
        for (port, proc), role in zip(((pp, self.procs[0]), (dp, self.procs[1])), ("prefill", "decode"), strict=True):
            wait_health(port, proc, f"simulated {role}", logs / f"{name}-{role}.log")
        self.router_log = logs / f"{name}-router.log"
        prof = ["-c", CPROFILE, f"{args.cprofile}.{name}", "pdctl.router"] if args.cprofile else ["-m", "pdctl.router"]
        self.router = start([sys.executable, *prof, "serve", "--port", str(self.rp),
                             "--prefill", f"http://127.0.0.1:{pp}", "--decode", f"http://127.0.0.1:{dp}",
                             "--model", MODEL, "--decoder-kv-blocks-ttl", str(args.kv_ttl), "--log-level", "warning",
                             *args.router_arg], self.router_log, router_cores)
        self.procs.append(self.router)
        wait_health(self.rp, self.router, "router", self.router_log)
        if args.profile and shutil.which("py-spy"):
            out = Path(f"{args.profile}.{name}")
            self.spy = subprocess.Popen(["py-spy", "record", "--pid", str(self.router.pid), "--format", "speedscope",
                                         "--output", str(out), "--rate", "50"], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True)

    def warm(self) -> None:
        """A short load (imports, connections), then the router's CPU while idle (health checks, timers)."""
        play(self.rp, 16, 1.0, "new", self.args.load_procs, self.other_cores)
        c0 = cpu_seconds(self.router.pid)
        time.sleep(5)
        self.idle = (cpu_seconds(self.router.pid) - c0) / 5
        print(f"{self.name:>3} router idle (health checks, timers): {self.idle:.1%} of a core", flush=True)

    def measure(self, workload: str, streams: int, rep: int) -> dict[str, Any]:
        """One repetition: the load for --seconds, the router's and the engines' CPU over it, what /stats counted."""
        name, args, procs, router = self.name, self.args, self.procs, self.router
        load = os.getloadavg()[0]
        c0, t0 = cpu_seconds(router.pid), time.perf_counter()
        e0 = [cpu_seconds(p.pid) for p in procs[:2]]
        r0 = counters(self.rp)
        done, errors, samples = play(self.rp, streams, args.seconds, workload, args.load_procs, self.other_cores)
        wall, cpu = time.perf_counter() - t0, cpu_seconds(router.pid) - c0
        engines = [cpu_seconds(p.pid) - e for p, e in zip(procs[:2], e0, strict=True)]
        r1 = counters(self.rp)
        released = since(r0, r1, "release ")
        row = {"leg": name, "workload": workload, "streams": streams, "rep": rep, "requests": done,
               "errors": errors, "rps": round(done / wall, 1),
               "cpu_s_per_1000": round(cpu / done * 1000, 3) if done else None,
               "router_cpu_util": round(cpu / wall, 2), "load1": round(load, 2),
               "router_idle_util": round(self.idle, 4),
               # the simulated engines' CPU per 1000 requests: what sets req/s when the router has spare
               "prefill_cpu_s_per_1000": round(engines[0] / done * 1000, 3) if done else None,
               "decode_cpu_s_per_1000": round(engines[1] / done * 1000, 3) if done else None,
               "releases": released,
               # warm turns by the KV source the router chose, and why the decode alone was refused
               "sources": since(r0, r1, "source "), "refused": since(r0, r1, "refused ")}
        print(f"{name:>3} {workload:>4} streams={streams:<5} rep {rep}: {row['rps']:>7} req/s  "
              f"errors {errors:<4} router CPU {row['cpu_s_per_1000']} s/1000 req "
              f"({row['router_cpu_util']:.0%} of a core)  engines P {row['prefill_cpu_s_per_1000']} "
              f"D {row['decode_cpu_s_per_1000']}  releases {released or 0}  load {load:.1f}", flush=True)
        if row["sources"] or row["refused"]:
            print(f"      warm turns by source {row['sources']}  decode alone refused {row['refused']}", flush=True)
        for s in samples[:2]:
            print(f"      error: {s}", flush=True)
        if router.poll() is not None:
            sys.exit(f"the router exited with {router.returncode}; its log: {self.router_log}")
        return row

    def stop(self) -> None:
        if self.spy is not None:
            self.spy.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.spy.wait(timeout=30)
        for p in reversed(self.procs):
            stop_group(p)


def run(args: argparse.Namespace, logs: Path, router_cores: list[int], other_cores: list[int]) -> list[dict[str, Any]]:
    """Every leg's deployment up at once, then each point's repetitions with the legs taking turns (ON, OFF; then
    OFF, ON; ...): the two legs of a repetition run seconds apart, so a drift of the host over the minutes a sweep
    takes (other load, clocks) reaches both alike instead of setting their ratio."""
    deployments: list[Deployment] = []
    rows: list[dict[str, Any]] = []
    try:
        for g in args.legs.split(","):
            deployments.append(Deployment(g, args, logs, router_cores, other_cores))
        for d in deployments:
            d.warm()
        for workload in args.workloads.split(","):
            for streams in (int(s) for s in args.streams.split(",")):
                for rep in range(1, args.reps + 1):
                    turn = deployments if rep % 2 else deployments[::-1]
                    rows += [d.measure(workload, streams, rep) for d in turn]
    finally:
        for d in deployments:
            d.stop()
    return rows


def report(rows: list[dict[str, Any]], args: argparse.Namespace, cores: int, pinned: bool) -> None:
    by = {(r["leg"], r["workload"], r["streams"], r["rep"]): r for r in rows}
    legs = list(dict.fromkeys(r["leg"] for r in rows))  # in the order given
    aa = len(legs) == 2 and legs[0].split("-")[0] == legs[1].split("-")[0]  # --aa: two deployments of one leg
    num, den = legs[:2] if aa else ("on", "off")
    ratio_name = f"{num.upper()}/{den.upper()}"
    print(f"\nsimulated engines at zero delay (1 prefill + 1 decode, decode KV {args.decode_blocks} blocks), "
          f"{args.reps} x {args.seconds:g} s per point on one deployment per leg (both up, legs taking turns within "
          f"a repetition); {cores} cores; router "
          f"{'pinned to its own core' if pinned else 'not pinned (one core)'}; max_tokens 8; streaming "
          "/v1/completions")
    print("| workload | streams | leg | req/s per repetition | vs first | errors | router CPU s / 1000 req |")
    print("|---|---|---|---|---|---|---|")
    fails: list[str] = []
    every: list[float] = []  # each repetition's ON/OFF
    for workload in args.workloads.split(","):
        for streams in (int(s) for s in args.streams.split(",")):
            for g in legs:
                rs = [by[(g, workload, streams, k)] for k in range(1, args.reps + 1) if (g, workload, streams, k) in by]
                if not rs:
                    continue
                first = rs[0]["rps"] or float("nan")
                vs = " / ".join(f"{r['rps'] / first:.2f}" for r in rs)
                cpu = " / ".join(str(r["cpu_s_per_1000"]) for r in rs)
                errs = sum(r["errors"] for r in rs)
                print(f"| {workload} | {streams} | {g.upper()} | {' / '.join(str(r['rps']) for r in rs)} | {vs} | "
                      f"{errs} | {cpu} |")
                if errs:
                    fails.append(f"{g.upper()} {workload} {streams}: {errs} errors")
                if any(r["rps"] < 0.9 * first for r in rs):
                    fails.append(f"{g.upper()} {workload} {streams}: a repetition > 10% below the first")
                if any(r["cpu_s_per_1000"] is None or r["cpu_s_per_1000"] > CPU_TARGET_S for r in rs):
                    fails.append(f"{g.upper()} {workload} {streams}: router CPU > {CPU_TARGET_S} s per 1000")
            if num in legs and den in legs:
                ratios = []
                for k in range(1, args.reps + 1):
                    on, off = by.get((num, workload, streams, k)), by.get((den, workload, streams, k))
                    if on and off and off["rps"]:
                        ratios.append(on["rps"] / off["rps"])
                every += ratios
                print(f"| {workload} | {streams} | {ratio_name} | {' / '.join(f'{x:.2f}x' for x in ratios)} | | | |")
                if not aa and any(x < 0.95 for x in ratios):
                    fails.append(f"{workload} {streams}: ON < 0.95x OFF in a repetition")
    if every:  # whether ON is lower as a rule or only in some samples, and what each leg's engines cost
        engines = {g: [(r["prefill_cpu_s_per_1000"], r["decode_cpu_s_per_1000"]) for r in rows
                       if r["leg"] == g and r["prefill_cpu_s_per_1000"] is not None] for g in legs}
        cost = "; ".join(f"{g.upper()} {statistics.median(p for p, _ in v):.2f} / "
                         f"{statistics.median(d for _, d in v):.2f}" for g, v in engines.items() if v)
        print(f"\n{ratio_name} over all {len(every)} repetitions: median {statistics.median(every):.2f}x, "
              f"{min(every):.2f}-{max(every):.2f}x; the engines' CPU per request, prefill / decode ms (medians): "
              f"{cost}")
    if aa:
        print(f"(--aa: both deployments run {num.upper()}; {ratio_name} is the bench's spread between two "
              "deployments of one leg, not a difference between legs)")
    judged = "" if aa else "ON >= 0.95x OFF, "  # an A/A run has no ON against OFF to judge
    print(f"\ncriteria ({judged}no repetition > 10% below the first, 0 errors, router CPU <= "
          f"{CPU_TARGET_S} s / 1000): " + ("all met" if not fails else "NOT met:\n  " + "\n  ".join(fails)))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "cores": cores, "pinned": pinned,
                                         "decode_blocks": args.decode_blocks, "seconds": args.seconds}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", default="64,256,1000", help="comma-separated concurrent streams")
    ap.add_argument("--workloads", default="new,mix", help="new, mix or both (comma-separated)")
    ap.add_argument("--legs", default="on,off", help="on, off or both (comma-separated); on-b, off-b: a second "
                    "deployment of that leg beside them")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per point, back to back")
    ap.add_argument("--seconds", type=float, default=10.0, help="seconds per repetition")
    ap.add_argument("--decode-blocks", type=int, default=2_000_000,
                    help="the decode's KV in blocks (the simulator's --num-gpu-blocks); small = retention must yield")
    ap.add_argument("--kv-ttl", type=float, default=60, help="decoder_kv_blocks_ttl (s) of the engines and router")
    ap.add_argument("--load-procs", type=int, default=2, help="load-generator processes")
    ap.add_argument("--router-arg", action="append", default=[], help="extra `router serve` argument (repeatable)")
    ap.add_argument("--profile", help="py-spy the router into PATH.on / PATH.off (speedscope format)")
    ap.add_argument("--base-port", type=int, help="take ports from here up (default: free ones)")
    ap.add_argument("--cprofile", help="run the router under cProfile, its stats to PATH.on / PATH.off (slower)")
    ap.add_argument("--cprofile-engines", help="run the simulated engines under cProfile, their stats to "
                    "PATH.on-prefill, PATH.on-decode, PATH.off-prefill, PATH.off-decode (slower)")
    ap.add_argument("--aa", choices=("on", "off"), help="A/A: two deployments of this leg (LEG and LEG-b) instead "
                    "of --legs, their ratio printed per repetition")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    if args.aa:
        args.legs = f"{args.aa},{args.aa}-b"
    bad = [w for w in args.workloads.split(",") if w not in ("new", "mix")]
    bad += [g for g in args.legs.split(",") if g not in ("on", "off", "on-b", "off-b")]
    if bad:
        sys.exit(f"unknown workload or leg {bad[0]!r}: --workloads takes new,mix and --legs on,off,on-b,off-b")
    if len(set(args.legs.split(","))) < len(args.legs.split(",")):
        sys.exit(f"--legs {args.legs}: a leg named twice; a second deployment of a leg is on-b or off-b")
    if args.base_port:
        _NEXT_PORT.append(args.base_port)
    cores = sorted(os.sched_getaffinity(0))
    pinned = len(cores) > 1
    router_cores, other_cores = (cores[:1], cores[1:]) if pinned else ([], [])
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"router-cpu-bench-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    print(f"logs: {logs}", flush=True)
    report(run(args, logs, router_cores, other_cores), args, len(cores), pinned)


if __name__ == "__main__":
    main()
