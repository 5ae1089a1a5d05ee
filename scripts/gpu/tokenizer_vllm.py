#!/usr/bin/env python3
"""What a real vLLM's tokenizer costs the chat path: `/tokenize` and a chat request's render + tokenize.

Against one running vLLM (prefix caching on) whose model directory has a byte-level BPE tokenizer with a chat
template (scripts/tokenizer_cost.py --model-dir). Per length: a user message of N BPE tokens of Python source
(the tokenizer's own training text), then, median of --reps each, alternating:
  - `/tokenize` with `messages` (template + encode), `return_token_strs` false and true, and the bytes answered;
  - `/tokenize` with the rendered text as `prompt` (encode only, no template);
  - a chat completion (`max_tokens` 1, not streamed) and the same prompt as token ids on `/v1/completions`,
    both after a warm-up so the prefix cache holds the prompt and the compute is the same: the difference is the
    chat request's render + tokenize less the ids' JSON parsing.

    python scripts/gpu/tokenizer_vllm.py --url http://127.0.0.1:8300 --model-dir /root/models/qwen3-8b-bpe
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.tokenizer_cost import corpus


def timed(c: httpx.Client, path: str, body: dict[str, Any]) -> tuple[float, httpx.Response]:
    t = time.perf_counter()
    r = c.post(path, json=body)
    ms = (time.perf_counter() - t) * 1000
    if r.status_code != 200:
        sys.exit(f"{path}: HTTP {r.status_code}: {r.text[:300]}")
    return ms, r


def measure(c: httpx.Client, tok: Tokenizer, model: str, text: str, reps: int) -> dict[str, Any]:
    messages = [{"role": "user", "content": text}]
    tok_body = {"model": model, "messages": messages, "add_generation_prompt": True}
    _, r = timed(c, "/tokenize", {**tok_body, "return_token_strs": False})
    ids: list[int] = r.json()["tokens"]
    gen = {"model": model, "max_tokens": 1, "temperature": 0, "stream": False}
    calls: dict[str, tuple[str, dict[str, Any]]] = {
        "tokenize_messages": ("/tokenize", {**tok_body, "return_token_strs": False}),
        "tokenize_messages_strs": ("/tokenize", {**tok_body, "return_token_strs": True}),
        "tokenize_prompt": ("/tokenize", {"model": model, "prompt": tok.decode(ids, skip_special_tokens=False),
                                          "add_special_tokens": False}),
        "chat": ("/v1/chat/completions", {**gen, "messages": messages}),
        "ids": ("/v1/completions", {**gen, "prompt": ids}),
    }
    for path, body in (calls["chat"], calls["ids"], calls["chat"], calls["ids"]):  # warm the prefix cache
        timed(c, path, body)
    ms: dict[str, list[float]] = {k: [] for k in calls}
    size: dict[str, int] = {}
    for _ in range(reps):
        for key, (path, body) in calls.items():
            t, r = timed(c, path, body)
            ms[key].append(t)
            size[key] = len(r.content)
            if key == "chat":
                usage = r.json().get("usage") or {}
                size["chat_prompt_tokens"] = int(usage.get("prompt_tokens", 0))
    out: dict[str, Any] = {"tokens": len(ids), "chars": len(text)}
    out |= {f"{k}_ms": statistics.median(v) for k, v in ms.items()}
    out |= {f"{k}_min_ms": min(v) for k, v in ms.items()}
    out |= {"tokenize_bytes": size["tokenize_messages"], "tokenize_strs_bytes": size["tokenize_messages_strs"],
            "chat_prompt_tokens": size.get("chat_prompt_tokens", 0)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8300")
    ap.add_argument("--model-dir", type=Path, required=True, help="the served model directory (its tokenizer.json)")
    ap.add_argument("--lengths", default="2000,8000,16000,24000")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    tok = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
    doc = "\n".join(sorted(corpus(), key=len)[-80:])
    all_ids = tok.encode(doc).ids
    rows = []
    with httpx.Client(base_url=args.url, timeout=300) as c:
        model = c.get("/v1/models").json()["data"][0]["id"]
        for n in (int(x) for x in args.lengths.split(",")):
            rows.append(measure(c, tok, model, tok.decode(all_ids[:n]), args.reps))
            print(f"  {n}: {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
    print(f"vLLM at {args.url}, byte-level BPE ({args.model_dir}), median of {args.reps}, ms")
    print("| tokens (chat) | /tokenize messages | + token_strs | bytes (strs) | /tokenize prompt only | chat TTFT "
          "(max_tokens 1) | same as ids | chat - ids | /tokenize us/token |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        d = r["chat_ms"] - r["ids_ms"]
        print(f"| {r['tokens']} | {r['tokenize_messages_ms']:.2f} | {r['tokenize_messages_strs_ms']:.2f} | "
              f"{r['tokenize_bytes']} ({r['tokenize_strs_bytes']}) | {r['tokenize_prompt_ms']:.2f} | "
              f"{r['chat_ms']:.2f} | {r['ids_ms']:.2f} | {d:+.2f} | "
              f"{r['tokenize_messages_ms'] * 1000 / r['tokens']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
