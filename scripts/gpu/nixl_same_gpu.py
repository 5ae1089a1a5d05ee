#!/usr/bin/env python3
"""How fast NIXL over UCX moves GPU memory between two processes on ONE GPU, per UCX setting.

Two processes on cuda:0 play vLLM's roles: the target registers a KV-like buffer with its NIXL agent (UCX backend,
VRAM), the initiator READs it into its own buffer (vLLM's pull) and WRITEs it back, as many descriptors of one
block each (vLLM's layout: block_size x kv_heads x head_dim x 2 bytes per layer, K and V apart) and as a single
descriptor. Each setting runs in fresh processes, because UCX reads its environment once.

    python3 scripts/gpu/nixl_same_gpu.py --json out.json --log-dir logs/ [--gib 1] [--setting NAME=K=V;K=V ...]

Prints one line per setting and operation (GB/s, counting the bytes moved once); the UCX lines that say which
transports were chosen (UCX_LOG_LEVEL=info) go to --log-dir. Needs torch and the nixl_cu13 (or nixl) package.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_SETTINGS = {
    "default": {},
    "get_zcopy_on": {"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y"},
    "tls_ipc_tcp": {"UCX_TLS": "cuda_ipc,cuda_copy,tcp,self"},
    "tls_ipc_tcp_get_on": {"UCX_TLS": "cuda_ipc,cuda_copy,tcp,self", "UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y"},
    "tls_ipc_sm_self": {"UCX_TLS": "cuda_ipc,cuda_copy,sm,self"},
}


def _nixl() -> Any:
    try:
        import nixl_cu13 as nixl
    except ImportError:
        import nixl  # type: ignore[no-redef]
    return nixl


def _target(conn: Any, nbytes: int) -> None:
    import torch

    nixl = _nixl()
    buf = torch.full((nbytes,), 7, dtype=torch.uint8, device="cuda:0")
    agent = nixl.nixl_agent("target", nixl.nixl_agent_config(backends=["UCX"]))
    agent.register_memory(agent.get_reg_descs([buf]))
    conn.send((agent.get_agent_metadata(), buf.data_ptr()))
    conn.recv()  # the initiator is done
    conn.send(int(buf[:1024].sum().item()))


def _wait(agent: Any, handle: Any, limit_s: float) -> str:
    deadline = time.monotonic() + limit_s
    state = "PROC"
    while state == "PROC" and time.monotonic() < deadline:
        state = agent.check_xfer_state(handle)
    return state


def _pair(nbytes: int, desc_bytes: int, reps: int) -> dict[str, Any]:
    import torch

    nixl = _nixl()
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_target, args=(child, nbytes), daemon=True)
    proc.start()
    meta, remote_base = parent.recv()
    buf = torch.zeros((nbytes,), dtype=torch.uint8, device="cuda:0")
    agent = nixl.nixl_agent("initiator", nixl.nixl_agent_config(backends=["UCX"]))
    agent.register_memory(agent.get_reg_descs([buf]))
    peer = agent.add_remote_agent(meta)
    out: dict[str, Any] = {}
    for label, size in (("blocks", desc_bytes), ("single", nbytes)):
        count = nbytes // size
        local = agent.get_xfer_descs([(buf.data_ptr() + i * size, size, 0) for i in range(count)], "VRAM")
        remote = agent.get_xfer_descs([(remote_base + i * size, size, 0) for i in range(count)], "VRAM")
        for op in ("READ", "WRITE"):
            handle = agent.initialize_xfer(op, local, remote, peer)
            times = []
            for _ in range(reps + 1):  # the first is a warm-up (handle mapping, rkey cache)
                t0 = time.perf_counter()
                state = agent.transfer(handle)
                if state == "PROC":
                    state = _wait(agent, handle, 120)
                times.append(time.perf_counter() - t0)
                if state != "DONE":
                    out[f"{op}_{label}"] = {"error": state}
                    break
            else:
                best = min(times[1:])
                out[f"{op}_{label}"] = {
                    "descriptors": count,
                    "gbps_best": round(nbytes / best / 1e9, 2),
                    "gbps_median": round(nbytes / sorted(times[1:])[len(times[1:]) // 2] / 1e9, 2),
                    "warmup_s": round(times[0], 3),
                }
            agent.release_xfer_handle(handle)
    torch.cuda.synchronize()
    out["read_ok"] = bool((buf[:1024] == 7).all().item())
    parent.send("done")
    parent.recv()
    proc.join(10)
    return out


def _d2d(nbytes: int) -> float:
    import torch

    a = torch.empty((nbytes,), dtype=torch.uint8, device="cuda:0")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    torch.cuda.synchronize()
    return round(10 * nbytes / (time.perf_counter() - t0) / 1e9, 1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--log-dir", type=Path, required=True)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--desc-kib", type=int, default=512, help="one descriptor: 256 tokens x 8 heads x 128 x 2 B")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=90, help="seconds per setting")
    ap.add_argument("--setting", action="append", default=[], help="NAME=KEY=VAL;KEY=VAL (replaces the defaults)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    nbytes = int(args.gib * (1 << 30))
    if args.child:
        print("RESULT " + json.dumps(_pair(nbytes, args.desc_kib * 1024, args.reps)), flush=True)
        return 0
    settings = dict(DEFAULT_SETTINGS)
    if args.setting:
        settings = {}
        for text in args.setting:
            name, _, rest = text.partition("=")
            settings[name] = dict(kv.split("=", 1) for kv in rest.split(";") if kv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"d2d_copy_gbps": _d2d(nbytes), "bytes": nbytes, "settings": {}}
    print(f"torch device-to-device copy: {results['d2d_copy_gbps']} GB/s", flush=True)
    for name, extra in settings.items():
        env = {**os.environ, "UCX_LOG_LEVEL": "info", **extra}
        cmd = [sys.executable, __file__, "--json", "-", "--log-dir", "-", "--gib", str(args.gib),
               "--desc-kib", str(args.desc_kib), "--reps", str(args.reps), "--child", name]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
            text, rc = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            text, rc = f"{exc.stdout or ''}{exc.stderr or ''}\nTIMEOUT after {args.timeout}s", 124
        (args.log_dir / f"{name}.log").write_text(text if isinstance(text, str) else str(text))
        found = [json.loads(line[7:]) for line in text.splitlines() if line.startswith("RESULT ")]
        lanes = sorted({line.split("UCX  INFO", 1)[1].strip() for line in text.splitlines()
                        if "UCX  INFO" in line and ("cfg#" in line or "rma" in line)})[:12]
        entry = {"env": extra, "rc": rc, "result": found[0] if found else None, "ucx_lanes": lanes}
        if not found:
            entry["tail"] = text.strip().splitlines()[-8:]
        results["settings"][name] = entry
        summary = found[0] if found else {"failed": entry["tail"][-3:]}
        print(f"{name} {extra}: {json.dumps(summary)}", flush=True)
        for lane in lanes:
            print(f"    {lane}", flush=True)
    args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
