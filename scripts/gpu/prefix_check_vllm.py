#!/usr/bin/env python3
"""pdctl's prefix check inside a real vLLM prefill (issue 18): does the patched NIXL scheduler verify as
pdctl/prefix_check.py does, and read only what it verified?

Against a running prefill (P) and decode (D), for instance the deployment `h200-1gpu.sh up-bpe` starts, with token
ids (/v1/completions, greedy, a fresh cache_salt per request so no engine's prefix cache answers for NIXL). Each
case is its own conversation: turn 1 through P (a miss) and D (streamed, return_token_ids), whose final chunk is
the decode's handle; then a second turn, sent to P as pdctl's router sends it (the handle with remote_num_tokens 0
and the digest chain of the held tokens, `pdctl_prefix`):

    turn-1    D's final chunk carries a handle whose blocks fit --block-size; P's answer has `pdctl_reuse` null
              (the key is there only when request_finished is patched; printed, the hit case proves it)
    hit       turn 2 extends turn 1's prompt + output: pdctl_reuse hit, all held tokens; P's NIXL counters grow
    partial   turn 2' with a token edited after the first chunk: partial at whole chunks, P reads; D's output
              equals a cold run of the same prompt (through P and D with no handle)
    miss      turn 2' with an early token edited: miss, P reads nothing; D's output equals the cold run's
    no-spec   the handle with remote_num_tokens 0 and no spec, as an unpatched router-less check would see it:
              P reads nothing
    control   (INFO, never fails) the miss prompt with the handle trusted as vLLM's example proxy sends it
              (remote_num_tokens as D said, no spec): whether stale KV changes D's output, i.e. whether the cold
              comparisons above can tell wrong KV from right with these weights

    python scripts/gpu/prefix_check_vllm.py --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200 \\
        --engine-key-file /root/.pdctl/h200-1gpu/engine.key

One line per case, PASS or FAIL with its numbers; exits 1 on any FAIL. httpx and the standard library only (and
pdctl/prefix_check.py, which is standard library too: the contract itself).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pdctl.prefix_check import FIELD, REPORT, chunk_tokens, spec

MISS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None, "remote_block_ids": None,
        "remote_host": None, "remote_port": None}
COUNT = "vllm:nixl_xfer_time_seconds_count"
BYTES = "vllm:nixl_bytes_transferred_sum"


@dataclass
class Turn1:
    prompt: list[int]
    output: list[int]
    handle: dict[str, Any]
    held: list[int]  # the tokens the decode's handle holds: prompt + output, remote_num_tokens of them
    p_params: dict[str, Any]


class Engines:
    def __init__(self, args: argparse.Namespace) -> None:
        key = args.engine_key_file.read_text().strip() if args.engine_key_file else None
        auth = {"authorization": f"Bearer {key}"} if key else {}
        self.c = httpx.Client(timeout=httpx.Timeout(120.0), headers=auth)
        self.p, self.d, self.model, self.args = args.prefill.rstrip("/"), args.decode.rstrip("/"), args.model, args
        self.rng = random.Random(args.seed)

    def ids(self, n: int) -> list[int]:
        return [self.rng.randrange(1000, self.args.vocab) for _ in range(n)]

    def _body(self, prompt: list[int], params: dict[str, Any], max_tokens: int) -> dict[str, Any]:
        return {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, "kv_transfer_params": params, "cache_salt": uuid.uuid4().hex}

    def prefill(self, prompt: list[int], params: dict[str, Any]) -> dict[str, Any]:
        r = self.c.post(f"{self.p}/v1/completions", json={**self._body(prompt, params, 1), "stream": False})
        r.raise_for_status()
        answer: dict[str, Any] = r.json().get("kv_transfer_params") or {}
        return answer

    def decode(self, prompt: list[int], params: dict[str, Any]) -> tuple[list[int], dict[str, Any] | None]:
        """D's generated token ids and the handle on its final chunk."""
        body = {**self._body(prompt, params, self.args.output_tokens), "stream": True, "return_token_ids": True}
        out: list[int] = []
        handle = None
        with self.c.stream("POST", f"{self.d}/v1/completions", json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices", []):
                    out += choice.get("token_ids") or []
                handle = chunk.get("kv_transfer_params") or handle
        return out, handle

    def cold(self, prompt: list[int]) -> list[int]:
        return self.decode(prompt, self.prefill(prompt, dict(MISS)))[0]

    def nixl(self) -> tuple[int, float]:
        """P's NIXL transfers and bytes so far (its /metrics, summed over engines)."""
        text = self.c.get(f"{self.p}/metrics").text
        totals = {COUNT: 0.0, BYTES: 0.0}
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in totals:
                totals[name] += float(line.rsplit(" ", 1)[1])
        return int(totals[COUNT]), totals[BYTES]

    def read_by_p(self, before: tuple[int, float], expect: bool) -> tuple[int, float]:
        """What P read since `before`: polled until it grows when a read is expected, else after a settle."""
        deadline = time.monotonic() + (self.args.wait if expect else self.args.settle)
        while True:
            now = self.nixl()
            if (expect and now[0] > before[0]) or time.monotonic() >= deadline:
                return now[0] - before[0], now[1] - before[1]
            time.sleep(0.2)

    def turn1(self) -> Turn1:
        prompt = self.ids(self.args.tokens)
        p_params = self.prefill(prompt, dict(MISS))
        out, handle = self.decode(prompt, p_params)
        if not handle or not handle.get("remote_num_tokens"):
            raise SystemExit(f"FAIL turn-1: D's final chunk has no handle ({handle!r}); is the streaming patch in "
                             "and bidirectional_kv_xfer on?")
        n = handle["remote_num_tokens"]
        return Turn1(prompt, out, handle, (prompt + out)[:n], p_params)

    def turn2(self, t: Turn1, edit_at: int | None = None) -> list[int]:
        """Turn 1's prompt and output, then new tokens; one token changed at `edit_at`."""
        prompt = t.prompt + t.output + self.ids(self.args.new_tokens)
        if edit_at is not None:
            prompt[edit_at] = prompt[edit_at] + 1 if prompt[edit_at] + 1 < self.args.vocab else 1000
        return prompt

    def with_spec(self, t: Turn1) -> dict[str, Any]:
        n = len(t.held)
        return {**t.handle, "remote_num_tokens": 0, FIELD: spec(t.held, n, self.args.block_size)}


def _mb(b: float) -> str:
    return f"{b / 1e6:.0f} MB"


def _same(a: list[int], b: list[int]) -> str:
    if a == b:
        return f"D's {len(a)} tokens = the cold run's"
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f"D's tokens differ from the cold run's at {first} of {len(a)}"


def run(e: Engines) -> list[tuple[bool | None, str]]:
    bs = e.args.block_size
    step = chunk_tokens(bs)
    lines: list[tuple[bool | None, str]] = []

    a = e.turn1()
    blocks = a.handle.get("remote_block_ids") or [[]]
    group = blocks[0] if blocks and isinstance(blocks[0], list) else blocks
    fits = len(group) == -(-len(a.held) // bs)
    size = f"block size {bs}" + ("" if fits else ": WRONG, pass the engines' --block-size")
    patched = "null: the patched request_finished" if REPORT in a.p_params else "absent: request_finished unpatched?"
    lines.append((fits and a.p_params.get(REPORT) is None,
                  f"turn-1: D holds {len(a.held)} tokens in {len(group)} blocks ({size}); P answered {REPORT} "
                  f"{patched}"))

    prompt = e.turn2(a)
    before = e.nixl()
    p = e.prefill(prompt, e.with_spec(a))
    reads, got = e.read_by_p(before, expect=True)
    report = p.get(REPORT)
    want = {"outcome": "hit", "tokens": len(a.held), "reason": "verified"}
    # The report also says what the prefill's own cache held and what it read (issue 29): read = tokens - cached.
    verdict = {k: (report or {}).get(k) for k in want}
    cached, read = (report or {}).get("cached", 0), (report or {}).get("read", len(a.held))
    out, _ = e.decode(prompt, p)
    lines.append((verdict == want and read == len(a.held) - cached and reads > 0 and got > 0,
                  f"hit: {REPORT}={json.dumps(report)}, P read {reads} transfers {_mb(got)}; "
                  f"(info) {_same(out, e.cold(prompt))}"))

    for name, at in (("partial", step + 10), ("miss", 5)):
        t = e.turn1()
        prompt = e.turn2(t, at)
        before = e.nixl()
        p = e.prefill(prompt, e.with_spec(t))
        expect_tokens = (at // step) * step
        reads, got = e.read_by_p(before, expect=expect_tokens > 0)
        report = p.get(REPORT) or {}
        out, _ = e.decode(prompt, p)
        cold = e.cold(prompt)
        outcome = "partial" if expect_tokens else "miss"
        ok = (report.get("outcome") == outcome and report.get("tokens") == expect_tokens
              and (reads > 0) == (expect_tokens > 0) and out == cold)
        lines.append((ok, f"{name} (token {at} edited): {REPORT}={json.dumps(report)} (want {outcome} "
                          f"{expect_tokens}), P read {reads} transfers {_mb(got)}; {_same(out, cold)}"))

    t = e.turn1()
    prompt = e.turn2(t)
    before = e.nixl()
    bare = {k: v for k, v in t.handle.items() if k != FIELD}
    p = e.prefill(prompt, {**bare, "remote_num_tokens": 0})
    reads, got = e.read_by_p(before, expect=False)
    e.decode(prompt, p)
    lines.append((reads == 0 and p.get(REPORT) is None,
                  f"no-spec: remote_num_tokens 0 and no {FIELD}: P read {reads} transfers {_mb(got)}, "
                  f"{REPORT}={json.dumps(p.get(REPORT, 'absent'))}"))

    t = e.turn1()
    prompt = e.turn2(t, 5)
    before = e.nixl()
    p = e.prefill(prompt, dict(t.handle))  # trusted: remote_num_tokens as the decode said
    reads, got = e.read_by_p(before, expect=True)
    out, _ = e.decode(prompt, p)
    cold = e.cold(prompt)
    lines.append((None, f"control: the diverged prompt with the handle trusted: P read {reads} transfers "
                        f"{_mb(got)}; {_same(out, cold)}"
                        + ("" if out != cold else " (stale KV did not show in the output: the cold comparisons"
                                                  " prove less with these weights)")))
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefill", required=True, help="the prefill's URL")
    ap.add_argument("--decode", required=True, help="the decode's URL")
    ap.add_argument("--engine-key-file", type=Path, help="the API key the engines want (pdctl's engine.key)")
    ap.add_argument("--model", default="Qwen", help="the served model name")
    ap.add_argument("--block-size", type=int, default=256, help="the engines' KV block size (pdctl's default: 256)")
    ap.add_argument("--tokens", type=int, default=2000, help="turn 1's prompt, in tokens")
    ap.add_argument("--new-tokens", type=int, default=200, help="the tokens turn 2 adds")
    ap.add_argument("--output-tokens", type=int, default=16, help="D's output per turn")
    ap.add_argument("--vocab", type=int, default=30000, help="prompt token ids are drawn below this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--wait", type=float, default=10.0, help="seconds to wait for P's NIXL counters to grow")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds after which no growth means no read")
    ap.add_argument("--json", type=Path, help="also write the lines here")
    args = ap.parse_args()
    if args.tokens <= chunk_tokens(args.block_size) + 10:
        ap.error(f"--tokens must exceed {chunk_tokens(args.block_size) + 10} for the partial case")
    try:
        lines = run(Engines(args))
    except httpx.HTTPStatusError as exc:
        print(f"FAIL {exc.request.method} {exc.request.url}: HTTP {exc.response.status_code} {exc.response.text[:300]}")
        return 1
    except httpx.HTTPError as exc:
        print(f"FAIL {exc.request.method} {exc.request.url}: {exc!r}")
        return 1
    for ok, text in lines:
        print(f"{'INFO' if ok is None else 'PASS' if ok else 'FAIL'} {text}")
    if args.json:
        args.json.write_text(json.dumps([{"ok": ok, "line": text} for ok, text in lines], indent=2) + "\n")
    return 1 if any(ok is False for ok, _ in lines) else 0


if __name__ == "__main__":
    raise SystemExit(main())
