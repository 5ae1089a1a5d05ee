"""Start simulated prefill/decode engines as real processes on free 127.0.0.1 ports, for any test area.

    with sim_pair(tmp_path, speed=1000, bidirectional=True) as pair:
        httpx.post(f"{pair.prefill_url}/v1/completions", json={...})
        pair.prefill.metric("pdctl_sim_corrupt_reuse_total")

    with sim_process(tmp_path, "decode", name="decode-1") as d1: ...     # e.g. for 2P2D

Each process runs in its own process group and is killed (the whole group) on exit of the block.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.ports import free_port

MODEL = "Qwen/Qwen3-32B"
SERVED = "Qwen"


@dataclass
class SimProc:
    name: str
    role: str
    url: str
    port: int
    side_port: int
    log_path: Path
    proc: subprocess.Popen[bytes]

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def metric(self, name: str) -> float:
        """Sum of every sample of one Prometheus metric (e.g. `vllm:nixl_num_failed_transfers_total`)."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", re.M)
        return sum(float(v) for v in pattern.findall(text))

    def stop(self) -> None:
        stop_group(self.proc)


@dataclass
class SimPair:
    prefill: SimProc
    decode: SimProc

    @property
    def prefill_url(self) -> str:
        return self.prefill.url

    @property
    def decode_url(self) -> str:
        return self.decode.url

    @property
    def prefill_log(self) -> Path:
        return self.prefill.log_path

    @property
    def decode_log(self) -> Path:
        return self.decode.log_path


def kv_config(role: str, bidirectional: bool = True, threshold: int = 0, ttl: float = 480,
              policy: str = "fail", lease: float | None = None) -> str:
    extra: dict[str, Any] = {"backends": ["UCX"], "kv_recompute_threshold": threshold,
                             "decoder_kv_blocks_ttl": ttl, "bidirectional_kv_xfer": bidirectional}
    if lease is not None:
        extra["kv_lease_duration"] = lease
    return json.dumps({"kv_connector": "NixlConnector",
                       "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
                       "kv_buffer_device": "cuda", "kv_load_failure_policy": policy,
                       "kv_connector_extra_config": extra})


def start_sim(log_dir: Path, role: str, *, name: str | None = None, speed: float = 1000, block_size: int = 16,
              num_blocks: int = 4000, max_model_len: int = 32768, max_num_seqs: int = 64,
              prefix_caching: bool | None = None, bidirectional: bool = True, threshold: int = 0,
              ttl: float = 480, policy: str = "fail", args: Sequence[str] = (),
              wait_s: float = 30, port: int | None = None, side_port: int | None = None,
              connector: bool = True) -> SimProc:
    """Start one simulator and wait for /health. Prefill defaults to no prefix caching, as the anchor setup.
    `port`/`side_port` pin the ports (a restart in place: `start_sim(..., port=old.port, side_port=old.side_port)`).
    `connector=False`: no KV connector, as an aggregated engine runs."""
    name = name or role
    port, side_port = port or free_port(), side_port or free_port()
    log_path = Path(log_dir) / f"{name}.log"
    caching = (role == "decode") if prefix_caching is None else prefix_caching
    argv = [sys.executable, "-m", "pdctl.sim", "serve", MODEL, "--role", role, "--host", "127.0.0.1",
            "--port", str(port), "--served-model-name", SERVED, "--dtype", "bfloat16",
            "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs),
            "--block-size", str(block_size), "--num-gpu-blocks", str(num_blocks),
            *([] if caching else ["--no-enable-prefix-caching"]),
            *(["--kv-transfer-config", kv_config(role, bidirectional, threshold, ttl, policy)] if connector else []),
            "--speed", f"{speed:g}", *args]
    env = {**os.environ, "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_port),
           "PYTHONUNBUFFERED": "1"}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    sim = SimProc(name, role, f"http://127.0.0.1:{port}", port, side_port, log_path, proc)
    wait_for_health(f"simulator {name}", sim.url, proc, sim.log_text, sim.stop, wait_s)
    return sim


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process's whole group, SIGKILL it after 5 s."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def wait_for_health(
    what: str, url: str, proc: subprocess.Popen[bytes], log_text: Callable[[], str], stop: Callable[[], None],
    wait_s: float,
) -> None:
    """Wait until `url`/health answers 200; on death or timeout stop the process and raise with its log's tail."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log_text()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    stop()
    raise RuntimeError(f"{what} did not answer /health within {wait_s}s:\n{log_text()[-2000:]}")


@contextlib.contextmanager
def sim_process(log_dir: Path, role: str, **kwargs: Any) -> Iterator[SimProc]:
    sim = start_sim(log_dir, role, **kwargs)
    try:
        yield sim
    finally:
        sim.stop()


@contextlib.contextmanager
def sim_pair(log_dir: Path, *, prefill_args: Sequence[str] = (), decode_args: Sequence[str] = (),
             prefill_kwargs: dict[str, Any] | None = None, decode_kwargs: dict[str, Any] | None = None,
             **common: Any) -> Iterator[SimPair]:
    """A prefill and a decode simulator. `common` goes to both (speed, block_size, bidirectional, threshold,
    ttl, policy, num_blocks, ...); `*_kwargs` and `*_args` (extra CLI flags) to one side."""
    with (
        sim_process(log_dir, "decode", args=decode_args, **{**common, **(decode_kwargs or {})}) as d,
        sim_process(log_dir, "prefill", args=prefill_args, **{**common, **(prefill_kwargs or {})}) as p,
    ):
        yield SimPair(prefill=p, decode=d)
