#!/usr/bin/env python3
"""A router-only restart under load on a running deployment: does the next load run as on fresh engines?

Runs against a deployment `pdctl up` has just started (fresh engines), through its router, four loads of the same
shape, with two router restarts before the last two:

    fresh        the load on the freshly started engines; it leaves its conversations' KV pinned on the decode
    again        the same load again, nothing restarted (what a second load gets from the engines as they are)
    up --set     `pdctl up -t TOPOLOGY --set router.handle_ttl=...`: a router setting changed, so `up` restarts the
                 router alone (the engines keep running), then the same load
    SIGKILL+up   the router SIGKILLed (no chance to release anything), `pdctl up` with the same settings starts
                 it again, then the same load

The load: --conversations new conversations of --turns turns, --streams at a time, each turn --words random words
of the model's vocabulary (the word-level tokenizer of scripts/make_dummy_model.py and the simulator), chat API,
explicit conversation ids. After each restart it polls the new router's /stats (each decode's own KV use, as the
router reads it from the decode's /metrics) until the decode is back under --idle-kv, and reports how long that
took. Per leg it prints: the decode's KV use just before the restart and just after it (from /stats), seconds
until it was under --idle-kv, then the load's req/s, turns answered, errors (status != 200) and timeouts.

    python scripts/gpu/restart_check.py -t configs/h200-1gpu-evict.yaml --router http://127.0.0.1:8000 --json out.json

Real or simulated depends only on the deployment: the GPU run (scripts/gpu/h200-1gpu-evict.sh restart) points it
at vLLM; the same command works on `configs/local-sim.yaml`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from importlib import resources
from typing import Any

import httpx


def vocabulary() -> list[str]:
    text = resources.files("pdctl.sim").joinpath("data/vocab.txt").read_text(encoding="utf-8")
    return [w for w in text.split() if w.isalpha()]


def stats(router: str) -> dict[str, Any]:
    doc: dict[str, Any] = httpx.get(f"{router}/stats", timeout=10).json()
    return doc


def decode_kv(router: str) -> float | None:
    """The largest KV use among the decodes, as the router last read it (None: not read yet)."""
    try:
        decodes = (stats(router).get("retention") or {}).get("decodes") or []
    except (httpx.HTTPError, ValueError):
        return None
    usage = [d["kv_usage"] for d in decodes if d.get("kv_usage") is not None]
    return max(usage) if usage else None


def conversation(router: str, words: list[str], args: argparse.Namespace) -> tuple[int, int, int, list[str]]:
    """(turns answered 200, errors, timeouts, error lines)."""
    rng = random.Random(uuid.uuid4().int)
    cid, messages, ok, errors, timeouts, why = uuid.uuid4().hex, [], 0, 0, 0, []
    with httpx.Client(timeout=args.timeout) as client:
        for _ in range(args.turns):
            messages.append({"role": "user", "content": " ".join(rng.choices(words, k=args.words))})
            body = {"model": args.model, "messages": messages, "max_tokens": args.max_tokens,
                    "conversation_id": cid}
            try:
                r = client.post(f"{router}/v1/chat/completions", json=body)
            except httpx.TimeoutException:
                timeouts += 1
                break
            except httpx.HTTPError as e:
                errors += 1
                why.append(f"{type(e).__name__}: {e}")
                break
            if r.status_code != 200:
                errors += 1
                why.append(f"HTTP {r.status_code}: {r.text[:200]}")
                break
            ok += 1
            messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
    return ok, errors, timeouts, why


def load(router: str, words: list[str], args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(args.streams) as pool:
        done = list(pool.map(lambda _: conversation(router, words, args), range(args.conversations)))
    seconds = time.perf_counter() - t0
    ok, errors, timeouts = (sum(d[i] for d in done) for i in range(3))  # type: ignore[misc]
    why = [w for d in done for w in d[3]]
    return {"seconds": round(seconds, 1), "req_s": round(ok / seconds, 2), "ok": ok, "errors": errors,
            "timeouts": timeouts, "error_lines": why[:10]}


def pdctl(args: argparse.Namespace, *argv: str) -> tuple[int, str]:
    cmd = [args.cli, *argv, "-t", args.topology, *[x for s in args.set for x in ("--set", s)]]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.up_timeout)
    return done.returncode, done.stdout + done.stderr


def router_pid(args: argparse.Namespace) -> int:
    rc, text = pdctl(args, "status", "--json")
    doc = json.loads(text[text.index("{"):])
    pids = [p["pid"] for p in doc["processes"] if p["role"] == "router" and p.get("pid")]
    if not pids:
        sys.exit(f"restart_check: no running router in `pdctl status --json` (exit {rc})")
    return int(pids[0])


def wait_released(router: str, args: argparse.Namespace) -> tuple[float | None, float | None]:
    """(the decode's KV use at the new router's first reading, seconds from the restart until under --idle-kv)."""
    t0, first = time.perf_counter(), None
    while time.perf_counter() - t0 < args.release_wait:
        usage = decode_kv(router)
        if usage is not None:
            first = usage if first is None else first
            if usage <= args.idle_kv:
                return first, round(time.perf_counter() - t0, 1)
        time.sleep(0.5)
    return first, None


def restart(name: str, router: str, args: argparse.Namespace) -> dict[str, Any]:
    time.sleep(1.0)  # the router polls the decode's KV every 0.25 s: a reading taken after the load, not during it
    before = decode_kv(router)
    t0 = time.perf_counter()
    if name == "up --set":
        rc, text = pdctl(args, "up")
    else:
        pid = router_pid(args)
        os.kill(pid, signal.SIGKILL)
        time.sleep(1)
        rc, text = pdctl(args, "up")
    up_s = round(time.perf_counter() - t0, 1)
    first, released_s = wait_released(router, args)
    freed = f"{released_s} s" if released_s is not None else f"never ({args.release_wait} s)"
    print(f"  {name}: `pdctl up` exit {rc} in {up_s} s; decode KV {fmt(before)} before, {fmt(first)} at the new "
          f"router's first reading, under {100 * args.idle_kv:.0f} % after {freed}", flush=True)
    return {"up_exit": rc, "up_s": up_s, "up_tail": text.splitlines()[-15:], "kv_before": before,
            "kv_first": first, "released_s": released_s}


def fmt(usage: float | None) -> str:
    return "?" if usage is None else f"{100 * usage:.1f} %"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-t", "--topology", required=True)
    ap.add_argument("--router", required=True, help="the router's URL, e.g. http://127.0.0.1:8000")
    ap.add_argument("--cli", default="pdctl", help="the pdctl command")
    ap.add_argument("--set", action="append", default=[], help="topology overrides of every `pdctl up` here")
    ap.add_argument("--restart-set", default="router.handle_ttl=449",
                    help="the router setting the first restart changes (a router-only change)")
    ap.add_argument("--conversations", type=int, default=48)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--words", type=int, default=1500, help="words (tokens) of each user message")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--model", default="Qwen")
    ap.add_argument("--timeout", type=float, default=60, help="seconds per request before it counts as a timeout")
    ap.add_argument("--idle-kv", type=float, default=0.05, help="the decode's KV use that counts as released")
    ap.add_argument("--release-wait", type=int, default=60)
    ap.add_argument("--up-timeout", type=int, default=300)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    words = vocabulary()
    print(f"{args.conversations} conversations x {args.turns} turns of {args.words} words, {args.streams} at a time, "
          f"max_tokens {args.max_tokens}; router {args.router}", flush=True)
    legs: dict[str, Any] = {}
    for name in ("fresh", "again", "up --set", "SIGKILL+up"):
        if name == "up --set":
            args.set.append(args.restart_set)
        leg: dict[str, Any] = restart(name, args.router, args) if name not in ("fresh", "again") else {}
        leg["load"] = load(args.router, words, args)
        leg["after_load"] = {k: v for k, v in stats(args.router).get("retention", {}).items() if k != "journal"}
        legs[name] = leg
        lo = leg["load"]
        print(f"  {name}: {lo['req_s']} req/s, {lo['ok']} turns answered, {lo['errors']} errors, "
              f"{lo['timeouts']} timeouts in {lo['seconds']} s; decode KV after it {fmt(decode_kv(args.router))}",
              flush=True)
        for line in lo["error_lines"]:
            print(f"    {line}")
    print(f"{'leg':12} {'KV before':>10} {'KV after':>10} {'freed s':>8} {'req/s':>7} {'ok':>5} {'errors':>6} "
          f"{'timeouts':>8}")
    for name, leg in legs.items():
        lo = leg["load"]
        print(f"{name:12} {fmt(leg.get('kv_before')):>10} {fmt(leg.get('kv_first')):>10} "
              f"{leg.get('released_s', '-')!s:>8} {lo['req_s']:7} {lo['ok']:5} {lo['errors']:6} {lo['timeouts']:8}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"args": {k: v for k, v in vars(args).items()}, "legs": legs}, f, indent=1)


if __name__ == "__main__":
    main()
