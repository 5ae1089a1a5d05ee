"""Run AIPerf against a simulated pdctl deployment and print what pdctl's router counted (not in CI: it needs
AIPerf, minutes of time and several processes).

Starts a prefill and a decode simulator and a router on loopback (ports from --port-base), writes the simulated
model's tokenizer (`pdctl tokenizer --out`), then runs AIPerf twice:
  multi-turn    synthetic conversations, streamed chat completions, --goodput on TTFT and ITL
  trace         a Mooncake-style trace replayed on its fixed schedule (sessions of several turns)
each time resetting the KV caches first (--reset-kv-cache: the router's POST /reset_prefix_cache), and prints the
router's warm-turn counts for that run (the /stats delta): every warm turn should hit.

    python -m venv /tmp/aiperf && /tmp/aiperf/bin/pip install aiperf
    python scripts/aiperf_check.py --aiperf /tmp/aiperf/bin/aiperf

Results are simulated: the engines are pdctl's simulator.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

SERVED = "Qwen"
KV = ('{"kv_connector":"NixlConnector","kv_role":"%s","kv_buffer_device":"cuda","kv_load_failure_policy":"fail",'
      '"kv_connector_extra_config":{"backends":["UCX"],"kv_recompute_threshold":0,"decoder_kv_blocks_ttl":480,'
      '"bidirectional_kv_xfer":true}}')


def _start(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})


def _wait(url: str, proc: subprocess.Popen[bytes], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited ({proc.returncode}); see its log")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{what} did not answer {url}/health within {timeout:g}s")


def deployment(work: Path, base: int, speed: float) -> tuple[str, list[subprocess.Popen[bytes]]]:
    """Two simulators (prefill caching on, token details reported) and a router; the router's URL."""
    procs: list[subprocess.Popen[bytes]] = []
    urls = {}
    for i, role in enumerate(("decode", "prefill")):
        port, side = base + 1 + i, base + 11 + i
        argv = [sys.executable, "-m", "pdctl.sim", "serve", "Qwen/Qwen3-32B", "--role", role, "--host", "127.0.0.1",
                "--port", str(port), "--served-model-name", SERVED, "--block-size", "16", "--num-gpu-blocks",
                "40000", "--enable-prompt-tokens-details", "--kv-transfer-config",
                KV % ("kv_consumer" if role == "decode" else "kv_producer"), "--speed", f"{speed:g}"]
        procs.append(_start(argv, work / f"{role}.log", {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(side)}))
        urls[role] = f"http://127.0.0.1:{port}"
        _wait(urls[role], procs[-1], role)
    router = f"http://127.0.0.1:{base}"
    procs.append(_start([sys.executable, "-m", "pdctl", "router", "serve", "--host", "127.0.0.1", "--port",
                         str(base), "--prefill", urls["prefill"], "--decode", urls["decode"], "--model", SERVED,
                         "--block-size", "16"], work / "router.log"))
    _wait(router, procs[-1], "router")
    return router, procs


def trace_file(path: Path, sessions: int, turns: int) -> Path:
    """A Mooncake-style trace: `sessions` conversations of `turns` turns, each turn adding to its history."""
    lines = []
    for s in range(sessions):
        for t in range(turns):
            row: dict[str, Any] = {"session_id": f"s{s}", "input_length": 600 if t == 0 else 120,
                                   "output_length": 24}
            if t == 0:
                row["timestamp"] = s * 250
            else:
                row["delay"] = 200
            lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return path


def stats(router: str) -> dict[str, Any]:
    doc: dict[str, Any] = httpx.get(f"{router}/stats", timeout=10).json()
    return doc


def counts(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    reuse = {k: after["reuse"].get(k, 0) - before["reuse"].get(k, 0) for k in after["reuse"]}
    reasons = {k: v - before["reuse_reasons"].get(k, 0) for k, v in after["reuse_reasons"].items()
               if v - before["reuse_reasons"].get(k, 0)}
    eligible = after["eligible_turns"] - before["eligible_turns"]
    reused = reuse.get("hit", 0) + reuse.get("partial", 0)
    return {"requests": after["requests_total"] - before["requests_total"], "warm_turns": eligible,
            "warm_hits": reused, "hit_rate": round(reused / eligible, 4) if eligible else None,
            "outcomes": reuse, "reasons": reasons}


def run_aiperf(aiperf: str, router: str, tokenizer: Path, out: Path, extra: list[str]) -> None:
    argv = [aiperf, "profile", "--model", SERVED, "--url", router, "--endpoint-type", "chat", "--streaming",
            "--tokenizer", str(tokenizer), "--reset-kv-cache", "--artifact-dir", str(out),
            "--goodput", "time_to_first_token:500 inter_token_latency:50", *extra]
    print("$ " + " ".join(argv), flush=True)
    result = subprocess.run(argv, capture_output=True, text=True)
    (out.parent / f"{out.name}.log").write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        raise SystemExit(f"aiperf failed ({result.returncode}):\n{(result.stdout + result.stderr)[-3000:]}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--aiperf", default="aiperf", help="the aiperf executable (pip install aiperf)")
    parser.add_argument("--port-base", type=int, default=43000, help="router port; engines take the next ones")
    parser.add_argument("--speed", type=float, default=10.0, help="simulator speed (divides every delay)")
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--work", type=Path, default=None, help="where logs and AIPerf's artifacts go")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="pdctl-aiperf-"))
    work.mkdir(parents=True, exist_ok=True)
    tok = work / "tokenizer"
    subprocess.run([sys.executable, "-m", "pdctl", "tokenizer", "--out", str(tok)], check=True)
    router, procs = deployment(work, args.port_base, args.speed)
    results: dict[str, Any] = {}
    try:
        modes = {
            "multi-turn": ["--conversation-num", str(args.conversations), "--conversation-turn-mean",
                           str(args.turns), "--conversation-turn-stddev", "0", "--synthetic-input-tokens-mean",
                           "600", "--output-tokens-mean", "24", "--concurrency", "4"],
            "trace": ["--input-file", str(trace_file(work / "trace.jsonl", args.conversations, args.turns)),
                      "--custom-dataset-type", "mooncake_trace", "--fixed-schedule"],
        }
        for mode, extra in modes.items():
            before = stats(router)
            run_aiperf(args.aiperf, router, tok, work / mode, extra)
            results[mode] = counts(before, stats(router))
            print(f"{mode}: {json.dumps(results[mode])}", flush=True)
    finally:
        for p in reversed(procs):
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            p.wait(10)
    print(json.dumps({"simulated": True, "work": str(work), **results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
