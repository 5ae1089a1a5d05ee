#!/usr/bin/env python3
"""What a router restart leaves on the decode, and what the next load gets: simulated engines, a small decode KV.

Three legs on one simulated prefill + decode (fresh engines for each leg):

    fresh      the load on engines nobody used before
    journal    a router runs a first load and is SIGKILLed; a new router on the same --state-dir starts (it
               releases what the killed one pinned) and runs the load
    none       the same without --state-dir: the killed router's pins stay on the decode until its TTL

The load is `--conversations` new conversations, `--streams` at a time, each of `--turns` turns (explicit ids, chat).
Prints per leg: the decode's KV use left after the restart and how long until it is back under 5 % (from the new
router's start, its own start-up included), then the load's requests per second, errors and timeouts (`--timeout`
per request). Simulated: nothing here is a GPU result.

    python scripts/retention_check.py
    python scripts/retention_check.py --words 200 --streams 16 --conversations 80
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.router.conftest import start_router
from tests.support.sim_procs import kv_config, sim_pair

BLOCK = 16


def usage(decode: str) -> float:
    text = httpx.get(f"{decode}/metrics", timeout=10).text
    return max([float(line.split()[-1]) for line in text.splitlines()
                if line.startswith("vllm:kv_cache_usage_perc")] or [0.0])


def conversation(router: str, turns: int, words: int, timeout: float) -> tuple[int, int, int]:
    """(turns answered 200, errors, timeouts)."""
    cid, messages, ok, errors, timeouts = uuid.uuid4().hex, [], 0, 0, 0
    with httpx.Client(timeout=timeout) as client:
        for t in range(turns):
            user = " ".join(f"{cid[:8]}-{t}-{i}" for i in range(words))
            messages.append({"role": "user", "content": user})
            body = {"model": "Qwen", "messages": messages, "max_tokens": 16, "conversation_id": cid}
            try:
                r = client.post(f"{router}/v1/chat/completions", json=body)
            except httpx.TimeoutException:
                timeouts += 1
                break
            if r.status_code != 200:
                errors += 1
                break
            ok += 1
            messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
    return ok, errors, timeouts


def load(router: str, args: argparse.Namespace) -> tuple[float, int, int, int]:
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(args.streams) as pool:
        done = list(pool.map(lambda _: conversation(router, args.turns, args.words, args.timeout),
                             range(args.conversations)))
    seconds = time.perf_counter() - t0
    ok, errors, timeouts = (sum(d[i] for d in done) for i in range(3))
    return ok / seconds, ok, errors, timeouts


def leg(name: str, args: argparse.Namespace, root: Path) -> str:
    work = root / name
    work.mkdir()
    state = work / "state"
    with sim_pair(work, speed=args.speed, block_size=BLOCK, num_blocks=args.blocks,
                  prefill_args=("--kv-transfer-config", kv_config("prefill", threshold=0, lease=1.0))) as pd:
        journal = ("--state-dir", str(state)) if name == "journal" else ()
        left = released_s = 0.0
        if name != "fresh":
            # The first router may pin up to the high-water mark (no pin budget): what a long ON run leaves.
            first = start_router(work, [pd.prefill_url], [pd.decode_url], "--state-dir", str(state),
                                 "--pin-budget-fraction", "0", name="first")
            load(first.url, args)
            time.sleep(0.5)  # the journal's appends (a few times a second)
            os.killpg(first.proc.pid, signal.SIGKILL)
            first.proc.wait(timeout=10)
            left = usage(pd.decode_url)
        t0 = time.perf_counter()
        router = start_router(work, [pd.prefill_url], [pd.decode_url], *journal, name="router")
        try:
            while usage(pd.decode_url) > 0.05 and time.perf_counter() - t0 < 30:
                time.sleep(0.1)
            released_s = time.perf_counter() - t0
            after = usage(pd.decode_url)
            rps, ok, errors, timeouts = load(router.url, args)
        finally:
            router.stop()
    gone = f"{released_s:5.1f}" if after <= 0.05 else "  never (30 s)"
    return f"{name:8} {100 * left:8.1f} {100 * after:8.1f} {gone:>14} {rps:9.1f} {ok:6} {errors:6} {timeouts:8}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=600, help="the decode's KV blocks (16 tokens each)")
    ap.add_argument("--conversations", type=int, default=120)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--words", type=int, default=60, help="words of each user message")
    ap.add_argument("--speed", type=float, default=1000, help="the simulator's speed-up")
    ap.add_argument("--timeout", type=float, default=20, help="seconds per request before it counts as a timeout")
    args = ap.parse_args()
    print(f"simulated engines, decode KV {args.blocks} x {BLOCK} tokens; {args.conversations} conversations x "
          f"{args.turns} turns, {args.streams} at a time; load average {os.getloadavg()[0]:.1f}")
    print(f"{'leg':8} {'KV left%':>8} {'KV start%':>8} {'KV<5% after s':>14} {'req/s':>9} {'ok':>6} {'errors':>6} "
          f"{'timeouts':>8}")
    with tempfile.TemporaryDirectory(prefix="retention-check-") as tmp:
        for name in ("fresh", "journal", "none"):
            print(leg(name, args, Path(tmp)), flush=True)


if __name__ == "__main__":
    main()
