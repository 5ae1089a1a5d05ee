#!/usr/bin/env python3
"""On a running deployment: the same token-id conversations through pdctl's router and as two hops done by hand.

The hand-made path is what a proxy with zero overhead would do: POST the prefill (`max_tokens=1`, the decode's
last handle as `kv_transfer_params`), then stream the decode with the prefill's params. Turns 2+ of both paths
reuse the decode's KV, so the difference in TTFT is what the router adds. Prints medians per length.

    python scripts/gpu/direct_vs_router.py --router http://127.0.0.1:8000 --prefill http://127.0.0.1:8100 \
        --decode http://127.0.0.1:8200 --lengths 2000,24000 --conversations 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pdctl.bench.traffic.client import ClientOptions, play
from pdctl.bench.traffic.workload import Conversation, WorkloadSpec, build
from pdctl.router.turn.verify import hit_params, miss_params


def direct_turn(c: httpx.Client, args: argparse.Namespace, model: str, conv: Conversation,
                handle: dict[str, Any] | None) -> tuple[dict[str, float], dict[str, Any] | None, list[int]]:
    body = conv.body(model, 64)
    body.pop("conversation_id", None)
    p_body = {k: v for k, v in body.items() if k not in ("stream_options", "return_token_ids")}
    p_body.update(stream=False, max_tokens=1, kv_transfer_params=hit_params(handle) if handle else miss_params())
    t0 = time.perf_counter()
    p = c.post(args.prefill + "/v1/completions", json=p_body)
    p.raise_for_status()
    t1 = time.perf_counter()
    d_body = {**body, "kv_transfer_params": p.json()["kv_transfer_params"]}
    first = None
    new_handle, ids = None, []
    with c.stream("POST", args.decode + "/v1/completions", json=d_body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            new_handle = chunk.get("kv_transfer_params") or new_handle
            for ch in chunk.get("choices") or []:
                if ch.get("text") and first is None:
                    first = time.perf_counter()
                ids += ch.get("token_ids") or []
    assert first is not None, "no content streamed"
    return {"ttft": (first - t0) * 1e3, "prefill": (t1 - t0) * 1e3, "decode_first": (first - t1) * 1e3}, new_handle, ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--router", default="http://127.0.0.1:8000")
    ap.add_argument("--prefill", default="http://127.0.0.1:8100")
    ap.add_argument("--decode", default="http://127.0.0.1:8200")
    ap.add_argument("--lengths", default="2000,8000,16000,24000")
    ap.add_argument("--conversations", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    model = httpx.get(args.prefill + "/v1/models").json()["data"][0]["id"]
    lengths = [int(x) for x in args.lengths.split(",")]
    spec = WorkloadSpec(lengths=tuple(lengths), conversations=args.conversations, turns=3, user_tokens=512,
                        output_tokens=64, api="completions", seed=7)
    plans = build(spec)
    out: list[dict[str, Any]] = []
    with httpx.Client(timeout=600) as c:
        for n in lengths:
            for path in ("direct", "router"):
                convs = [Conversation(p, "completions", f"{path}-{p.key}") for p in plans if p.length == n]
                if path == "router":
                    recs = asyncio.run(play(convs, ClientOptions(url=args.router, model=model, api="completions",
                                                                 output_tokens=64), path))
                    out += [{"path": path, "length": n, "turn": r.turn, "ttft": r.ttft_ms, "prefill": r.prefill_ms,
                             "reuse": r.reuse} for r in recs]
                    continue
                for conv in convs:
                    handle = None
                    while not conv.done:
                        t, handle, ids = direct_turn(c, args, model, conv, handle)
                        out.append({"path": path, "length": n, "turn": conv.turn, **t})
                        conv.advance("", ids)
    print("median of turns 2-3 (ms): TTFT, and the prefill hop")
    print("| tokens | direct TTFT | router TTFT | router - direct | direct prefill | router prefill |")
    print("|---|---|---|---|---|---|")
    for n in lengths:
        def med(path: str, key: str, n: int = n) -> float:
            return statistics.median(r[key] for r in out if r["path"] == path and r["length"] == n and r["turn"] >= 1)
        d, r = med("direct", "ttft"), med("router", "ttft")
        print(f"| {n} | {d:.0f} | {r:.0f} | {r - d:+.0f} | {med('direct', 'prefill'):.0f} | "
              f"{med('router', 'prefill'):.0f} |")
    print("router reuse on turns 2+:", sorted({r["reuse"] for r in out if r["path"] == "router" and r["turn"] >= 1}))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
