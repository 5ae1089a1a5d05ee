"""The simulator's time model: pure functions of token and descriptor counts, in milliseconds at speed 1.

Calibrated on vLLM 0.26.0 + NIXL 1.5.1 serving the Qwen3-32B shape on one H200 per role with `--enforce-eager`
(shared/reference/anchor-measurements.md, records in reference/h200x2-2026-11-30/); CUDA graphs, pdctl's default on
GPUs, make the real engines faster than this model (docs/results).
TTFT seen by a client = prefill request (overhead + KV read + compute) + decode request (overhead + KV pull +
the first step). `Pacer` turns modelled time into sleeps, divided by `--speed`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence

# Least-squares fit of every OFF request: TTFT_ms = 99.6 + 0.11996 n + 1.388e-6 n^2 (anchor-measurements.md).
OFF_FIT_CONST_MS = 99.6
PREFILL_MS_PER_TOKEN = 0.11996
PREFILL_MS_PER_TOKEN_SQ = 1.388e-6
# Median of (e2e - TTFT) / 63 over the 48 OFF and ON records (bench-off.json, bench-on.json).
TPOT_MS = 38.0
# The fit's constant, less the first decode step and a typical P->D pull, split between the two HTTP hops.
PREFILL_OVERHEAD_MS = 27.0
DECODE_OVERHEAD_MS = 27.0

# Qwen3-32B: 2 (K, V) x 64 layers x 8 KV heads x 128 head_dim x 2 bytes (bf16).
KV_BYTES_PER_TOKEN = 2 * 64 * 8 * 128 * 2
# One NIXL descriptor per layer per contiguous run of blocks: 94784 descriptors for a fragmented 6 GB
# (~1500-block) read, 704 for a contiguous 6 GB read at block size 128 (kvmetrics.txt files).
DESCRIPTORS_PER_RUN = 64
# Contiguous reads: 6 GB / 704 descriptors in 29 ms, 3 GB / 2144 in 16 ms -> ~210 GB/s.
READ_BYTES_PER_MS = 210e9 / 1e3
# Fragmented reads: 6 GB / 94784 descriptors in 720 ms, 6 GB / 11968 in 132 ms -> ~7 us per descriptor. A large
# descriptor takes its bytes' time instead: at block 256 (CUDA graphs runs, docs/results/h200x2-graphs-local)
# 6.4 GB in 3504 descriptors (55 runs) took 33.4 ms, 4.3 GB in 2400 took 23.3 ms, about the bytes alone. So a read
# takes the longer of its bytes and its descriptors (the 11968-descriptor block-128 read, 132 ms, is the one
# measurement this puts at 84 ms).
DESCRIPTOR_MS = 0.007
# Posting a transfer and its notification (Avg post time floor in the kvmetrics lines).
READ_POST_MS = 0.7
# A D->P readback's request also waits in WAITING_FOR_REMOTE_KVS for engine steps and the read's notification:
# the gap between the anchor's ON TTFT and its compute + transfer at 2.6k tokens (fitted once the simulator
# answered keep-alive requests without delayed ACKs).
READBACK_WAIT_MS = 38.0

# Tokenizing text (a chat rendering or a text prompt) in the engine's API server, which the anchor's token-id
# prompts never paid. Measured on vLLM 0.26.0 on the H200 host (16 cores; docs/results/h200-1gpu/tokenizer/):
# a byte-level BPE (50k merges, HF `tokenizers`, scripts/tokenizer_cost.py) with a ChatML template, user messages
# of 2k-24k tokens of Python source, median of 20 (`scripts/gpu/h200-1gpu.sh measure`, i.e.
# `scripts/gpu/tokenizer_vllm.py --url ... --model-dir ... --reps 20`), least-squares fits over the four lengths:
#   /tokenize with `messages`:                       1.3 ms + 2.82 us/token (69.9 ms at 24k)
#   ... with `return_token_strs` true:               +0.48 us/token (83 ms and 263 KB at 24k, against 95 KB)
#   chat completion minus the same prompt as ids:    2.15 us/token (6 / 14 / 28 / 54 ms at 2k / 8k / 16k / 24k;
#     max_tokens 1, prefix cache warm: the render + encode a text request pays beyond the ids' own JSON parsing,
#     which the token-id calibration above already holds)
TOKENIZE_BASE_MS = 1.3
TOKENIZE_MS_PER_TOKEN = 0.00282
ENCODE_MS_PER_TOKEN = 0.00215
TOKEN_STRS_MS_PER_TOKEN = 0.00048


def encode_ms(tokens: int) -> float:
    """Turning a text or chat prompt into ids before a generation request is scheduled."""
    return ENCODE_MS_PER_TOKEN * max(tokens, 0)


def tokenize_ms(tokens: int, token_strs: bool = False) -> float:
    """One `/tokenize` request: render and encode, then the ids (and, if asked, their strings) as JSON."""
    per = TOKENIZE_MS_PER_TOKEN + (TOKEN_STRS_MS_PER_TOKEN if token_strs else 0.0)
    return TOKENIZE_BASE_MS + per * max(tokens, 0)


def prefill_compute_ms(new_tokens: int, context_tokens: int = 0) -> float:
    """Computing `new_tokens` after `context_tokens` already in KV: the OFF fit's n-dependent part."""
    if new_tokens <= 0:
        return 0.0
    end = context_tokens + new_tokens
    return PREFILL_MS_PER_TOKEN * new_tokens + PREFILL_MS_PER_TOKEN_SQ * (end * end - context_tokens**2)


def prefill_request_ms(computed: int, context: int, read_ms: float = 0.0) -> float:
    """A prefill-only request (max_tokens=1): overhead, the optional D->P read, then the compute."""
    return PREFILL_OVERHEAD_MS + read_ms + prefill_compute_ms(computed, context)


def decode_first_token_ms(computed: int, context: int, pull_ms: float = 0.0) -> float:
    """Decode side to its first token: overhead, the P->D pull, what is left to compute, one step."""
    return DECODE_OVERHEAD_MS + pull_ms + prefill_compute_ms(computed, context) + TPOT_MS


def kv_bytes(tokens: int) -> int:
    return max(tokens, 0) * KV_BYTES_PER_TOKEN


def contiguous_runs(local: Sequence[int], remote: Sequence[int]) -> int:
    """Runs where both sides' block ids ascend by one: NIXL merges each into one region per layer."""
    runs = 0
    for i in range(len(local)):
        if i == 0 or local[i] != local[i - 1] + 1 or remote[i] != remote[i - 1] + 1:
            runs += 1
    return runs


def num_descriptors(local: Sequence[int], remote: Sequence[int]) -> int:
    return contiguous_runs(local, remote) * DESCRIPTORS_PER_RUN


def kv_read_ms(nbytes: int, descriptors: int) -> float:
    """One NIXL READ: post cost, then the bytes over the link or the per-descriptor cost, whichever is longer
    (small descriptors of fragmented block-16 reads are bound by the per-descriptor cost, large ones by bytes)."""
    if nbytes <= 0:
        return 0.0
    return READ_POST_MS + max(nbytes / READ_BYTES_PER_MS, descriptors * DESCRIPTOR_MS)


def off_fit_ttft_ms(n: int) -> float:
    """The measured OFF curve itself, for comparisons."""
    return OFF_FIT_CONST_MS + PREFILL_MS_PER_TOKEN * n + PREFILL_MS_PER_TOKEN_SQ * n * n


def modelled_ms(wall_s: float, speed: float) -> float:
    """Wall seconds this process spent, in modelled milliseconds (0 at an infinite speed)."""
    scale = time_scale(speed)
    return wall_s * 1000 / scale if scale else 0.0


def time_scale(speed: float) -> float:
    """Wall seconds per modelled second: 1/speed, and 0 (no delays at all) for an infinite speed."""
    return 0.0 if math.isinf(speed) else 1.0 / speed


class Pacer:
    """Sleeps modelled time divided by speed, without drift and without sleeping for sub-millisecond debts."""

    MIN_SLEEP_S = 0.001

    def __init__(self, speed: float) -> None:
        self.scale = time_scale(speed)
        self.target = time.monotonic()

    def scaled_s(self, ms: float) -> float:
        return ms * self.scale / 1000.0

    async def wait_ms(self, ms: float) -> None:
        if ms <= 0 or self.scale == 0.0:
            return
        now = time.monotonic()
        # Make up for oversleeping, but never for time spent queueing elsewhere.
        self.target = max(self.target, now - 0.002)
        self.target += self.scaled_s(ms)
        delay = self.target - now
        if delay >= self.MIN_SLEEP_S:
            await asyncio.sleep(delay)
