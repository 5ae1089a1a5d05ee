"""The simulator's command line, mirroring `vllm serve`, parsed into one frozen SimConfig."""

from __future__ import annotations

import argparse
import json
import math
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Policy = Literal["fail", "recompute"]


class ConfigError(ValueError):
    """A simulator argument is invalid."""


@dataclass(frozen=True)
class KVConfig:
    connector: str | None = None
    kv_role: str | None = None
    load_failure_policy: Policy = "fail"
    bidirectional: bool = False
    recompute_threshold: int = 0
    decoder_kv_blocks_ttl: float = 480.0
    lease_duration: float = 30.0
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return self.connector is not None


@dataclass(frozen=True)
class SimConfig:
    model: str
    role: Literal["prefill", "decode"]
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_names: tuple[str, ...] = ()
    dtype: str = "auto"
    max_model_len: int = 32768
    max_num_seqs: int = 256
    block_size: int = 16
    num_gpu_blocks: int = 40000
    prefix_caching: bool = True
    kv: KVConfig = field(default_factory=KVConfig)
    speed: float = 1.0
    side_channel_host: str = "localhost"
    side_channel_port: int = 5600
    engine_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    log_stats_interval: float = 10.0
    fail_kv_reads: int = 0
    die_after: int = 0
    extra_latency_ms: float = 0.0
    step_model: str | None = None
    max_num_batched_tokens: int | None = None
    poison_marker: str | None = None
    kv_pull_delay_ms: float = 0.0
    stream_kv_params: bool = True
    prefix_check: bool = True
    prompt_tokens_details: bool = False
    api_key: str | None = field(default=None, repr=False)
    ignored_args: tuple[str, ...] = ()

    @property
    def model_name(self) -> str:
        return self.served_model_names[0] if self.served_model_names else self.model


def parse_kv_config(text: str | None) -> KVConfig:
    if not text:
        return KVConfig()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--kv-transfer-config is not valid JSON ({e.msg} at char {e.pos})") from e
    if not isinstance(raw, dict):
        raise ConfigError("--kv-transfer-config must be a JSON object")
    extra = raw.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        raise ConfigError("--kv-transfer-config: kv_connector_extra_config must be an object")
    policy = raw.get("kv_load_failure_policy", "fail")
    if policy not in ("fail", "recompute"):
        raise ConfigError(f"--kv-transfer-config: kv_load_failure_policy must be fail or recompute, not {policy!r}")
    bidirectional = bool(extra.get("bidirectional_kv_xfer", False))
    # Newest pull_scheduler: the threshold defaults to 64 with bidirectional, else 0, in both directions.
    threshold = extra.get("kv_recompute_threshold", 64 if bidirectional else 0)
    lease: Any = extra.get("kv_lease_duration", raw.get("kv_lease_duration", 30))
    return KVConfig(
        connector=raw.get("kv_connector"),
        kv_role=raw.get("kv_role"),
        load_failure_policy=policy,
        bidirectional=bidirectional,
        recompute_threshold=int(threshold),
        decoder_kv_blocks_ttl=float(extra.get("decoder_kv_blocks_ttl", 480)),
        lease_duration=float(lease),
        raw=raw,
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pdctl.sim", description="vLLM-compatible P/D engine simulator")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve one simulated prefill or decode engine")
    s.add_argument("model")
    s.add_argument("--role", choices=["prefill", "decode"], required=True)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--served-model-name", nargs="+", default=None)
    s.add_argument("--dtype", default="auto")
    s.add_argument("--max-model-len", type=int, default=32768)
    s.add_argument("--max-num-seqs", type=int, default=256)
    s.add_argument("--block-size", type=int, default=16)
    s.add_argument("--num-gpu-blocks", "--num-gpu-blocks-override", type=int, default=40000, dest="num_gpu_blocks")
    s.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    s.add_argument("--kv-transfer-config", default=None)
    s.add_argument("--speed", type=float, default=1.0, help="divides every delay; inf = no delays")
    s.add_argument("--engine-id", default=None, help="default: a new uuid4 per start, as vLLM")
    s.add_argument("--log-stats-interval", type=float, default=10.0, help="wall seconds between stats lines")
    s.add_argument("--fail-kv-reads", type=int, default=0, help="fault: fail the next N KV reads this engine starts")
    s.add_argument("--die-after", type=int, default=0, help="fault: exit after serving N generation requests")
    s.add_argument("--extra-latency-ms", type=float, default=0.0, help="fault: add this to every request")
    s.add_argument("--step-model", choices=["h200-graphs", "h200-eager"], default=None,
                   help="schedule steps as vLLM does (continuous batching, chunked prefill) with this calibration; "
                   "default: the per-request model")
    s.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="the step model's token budget per step (default: the profile's, vLLM's 8192)")
    s.add_argument("--api-key", default=None, help="require this Bearer token on /v1 routes (or VLLM_API_KEY)")
    s.add_argument("--poison-marker", default=None,
                   help="fault: a request whose body contains this text fails with HTTP 500 (a poison prompt)")
    s.add_argument("--kv-pull-delay-ms", type=float, default=0.0,
                   help="fault: wait this many wall-clock ms before each remote KV read (a busy engine)")
    s.add_argument("--stream-kv-params", action=argparse.BooleanOptionalAction, default=True,
                   help="put kv_transfer_params in a stream's final chunk; --no-stream-kv-params: as vLLM < 0.33 "
                   "without pdctl's patch")
    s.add_argument("--prefix-check", action=argparse.BooleanOptionalAction, default=True,
                   help="as a prefill, verify the router's digests of a handle's tokens before reading it "
                   "(pdctl.prefix_check, which pdctl patches into vLLM); --no-prefix-check: a vLLM without the "
                   "patch, which then reads nothing of a handle the router sent for checking")
    s.add_argument("--enable-prompt-tokens-details", action="store_true",
                   help="report usage.prompt_tokens_details.cached_tokens (the prefix-cache hit plus KV read from "
                   "the peer), as vLLM does with this flag")
    return p


def parse_args(argv: Sequence[str], env: dict[str, str] | None = None) -> SimConfig:
    env = dict(os.environ) if env is None else env
    args, unknown = build_parser().parse_known_args(list(argv))
    checks = [
        (args.port > 0, "--port must be positive"),
        (args.max_model_len > 0, "--max-model-len must be positive"),
        (args.max_num_seqs > 0, "--max-num-seqs must be positive"),
        (args.block_size > 0, "--block-size must be positive"),
        (args.num_gpu_blocks > 0, "--num-gpu-blocks must be positive"),
        (args.speed > 0 and not math.isnan(args.speed), "--speed must be > 0 (inf for no delays)"),
        (args.max_num_batched_tokens is None or args.max_num_batched_tokens > 0,
         "--max-num-batched-tokens must be positive"),
        (args.fail_kv_reads >= 0 and args.die_after >= 0, "--fail-kv-reads and --die-after must be >= 0"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    try:
        side_port = int(env.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600"))
    except ValueError as e:
        raise ConfigError("VLLM_NIXL_SIDE_CHANNEL_PORT must be an integer") from e
    return SimConfig(
        model=args.model,
        role=args.role,
        host=args.host,
        port=args.port,
        served_model_names=tuple(args.served_model_name or ()),
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        block_size=args.block_size,
        num_gpu_blocks=args.num_gpu_blocks,
        prefix_caching=args.enable_prefix_caching,
        kv=parse_kv_config(args.kv_transfer_config),
        speed=args.speed,
        side_channel_host=env.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost"),
        side_channel_port=side_port,
        engine_id=args.engine_id or str(uuid.uuid4()),
        log_stats_interval=args.log_stats_interval,
        fail_kv_reads=args.fail_kv_reads,
        die_after=args.die_after,
        extra_latency_ms=args.extra_latency_ms,
        step_model=args.step_model,
        max_num_batched_tokens=args.max_num_batched_tokens,
        poison_marker=args.poison_marker or None,
        kv_pull_delay_ms=args.kv_pull_delay_ms,
        stream_kv_params=args.stream_kv_params,
        prefix_check=args.prefix_check,
        prompt_tokens_details=args.enable_prompt_tokens_details,
        api_key=args.api_key or env.get("VLLM_API_KEY") or None,
        ignored_args=tuple(unknown),
    )
