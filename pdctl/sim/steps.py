"""The step-level engine model: how vLLM's scheduler forms one batch, and what that step costs, as pure functions.

Every step vLLM's V1 scheduler serves its running requests first (a decode takes one token, a partly prefilled
request its next chunk), then admits waiting requests in arrival order while the step's token budget
(`max_num_batched_tokens`) and `max_num_seqs` allow; a request waiting for remote KV stays in the queue and is
skipped. One step's time grows with the tokens it computes and with the context each token attends to; every
decode stream in the batch waits for the whole step, so a prefill chunk beside them is an inter-token gap.

Costs are in milliseconds at speed 1, least-squares fits on measured H200 runs (scripts/sim_curve.py prints the
fit against every committed setting; everything the model produces is simulated).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StepCosts:
    name: str
    request_ms: float  # per HTTP request outside the engine steps: parse, tokenize, first chunk out
    base_ms: float  # every step: reading the weights, launches
    token_ms: float  # per token the step computes (decode or prefill)
    self_pair_ms: float  # per causal (query, key) pair inside one prefill chunk: c * c / 2 pairs
    ctx_pair_ms: float  # per (query, cached key) pair: a chunk's or a decode's tokens against earlier KV
    ctx_read_ms: float  # per context token a slot reads from KV (what makes TPOT grow with context)
    max_num_batched_tokens: int = 8192  # vLLM's default token budget on a GPU with >= 70 GiB


# Fitted (least maximum relative error of scripts/sim_steps_curve.py's single-client points) on vLLM 0.26.0,
# Qwen3-32B shape, CUDA graphs: one aggregated H200 (reference/h200-1gpu-2026-12-01: cold turns, warm turns with
# and without prefix caching at 2k-24k, TPOT 19.0-19.6 ms at 1 client, 22.7-25.5 ms at 4) and the two-H200
# block-256 P/D runs (docs/results/h200x2-graphs-local*: warm ON turns, decode-local turns, cold turns). The two
# machines disagree at 16k-24k context: the P/D decode computed a local turn's ~670 new tokens in less time than
# the single H200 computed ~520; the fit splits that (-14 % on the one, +14 % on the other, sim included).
H200_GRAPHS = StepCosts("h200-graphs", request_ms=5.7, base_ms=18.8, token_ms=0.0856, self_pair_ms=2.30e-6,
                        ctx_pair_ms=6.08e-6, ctx_read_ms=2.7e-5)
# The same with --enforce-eager (bench-eager-c1.json; TPOT ~33 ms), the setting of the two-H200 runs 1-3. Both fits
# assume vLLM's default budget of 8192 tokens (chunked prefill): within 12 % of every point they were fitted on.
H200_EAGER = StepCosts("h200-eager", request_ms=3.7, base_ms=32.0, token_ms=0.0953, self_pair_ms=2.25e-6,
                       ctx_pair_ms=5.75e-6, ctx_read_ms=2.7e-5)
PROFILES = {c.name: c for c in (H200_GRAPHS, H200_EAGER)}


@dataclass
class Seq:
    """One request in the scheduler: what is left to prefill, what is in KV, what is left to sample."""

    rid: str
    prompt_left: int
    computed: int
    out_left: int
    ready: bool = True  # False while the request waits for remote KV (vLLM's WAITING_FOR_REMOTE_KVS)
    produced: int = 0

    @property
    def prefilling(self) -> bool:
        return self.prompt_left > 0


@dataclass(frozen=True)
class Slot:
    """One request's share of a step: `tokens` computed after `context` tokens already in KV."""

    seq: Seq
    tokens: int
    context: int


@dataclass(frozen=True)
class Batch:
    slots: tuple[Slot, ...]
    admitted: tuple[Seq, ...]  # waiting requests this step moved to running

    @property
    def num_tokens(self) -> int:
        return sum(s.tokens for s in self.slots)

    @property
    def decodes(self) -> int:
        return sum(1 for s in self.slots if not s.seq.prefilling)


def form_batch(running: Sequence[Seq], waiting: Sequence[Seq], max_num_seqs: int, budget: int) -> Batch:
    """vLLM V1's schedule(): running requests first, then waiting ones in order, within the token budget."""
    slots: list[Slot] = []
    left = budget
    for seq in running:
        if left <= 0:
            break
        n = min(seq.prompt_left, left) if seq.prefilling else 1
        slots.append(Slot(seq, n, seq.computed))
        left -= n
    admitted: list[Seq] = []
    active = len(running)
    for seq in waiting:
        if left <= 0 or active >= max_num_seqs:
            break
        if not seq.ready:
            continue
        n = min(seq.prompt_left, left) if seq.prefilling else 1
        slots.append(Slot(seq, n, seq.computed))
        admitted.append(seq)
        left -= n
        active += 1
    return Batch(tuple(slots), tuple(admitted))


def chunk_ms(costs: StepCosts, tokens: int, context: int) -> float:
    """What one request's slot adds to a step (a decode is a chunk of one token)."""
    if tokens <= 0:
        return 0.0
    return (costs.token_ms * tokens + costs.self_pair_ms * tokens * tokens / 2
            + costs.ctx_pair_ms * tokens * context + costs.ctx_read_ms * context)


def step_ms(costs: StepCosts, slots: Sequence[Slot] | Sequence[tuple[int, int]]) -> float:
    """One step's time: the fixed part plus each slot's tokens and attention."""
    if not slots:
        return 0.0
    total = costs.base_ms
    for s in slots:
        tokens, context = (s.tokens, s.context) if isinstance(s, Slot) else s
        total += chunk_ms(costs, tokens, context)
    return total


def advance(batch: Batch) -> list[Seq]:
    """Apply a finished step: prefill progress, one sampled token per request that finished its prompt or is
    decoding. Returns the requests that sampled their last token."""
    done: list[Seq] = []
    for s in batch.slots:
        seq = s.seq
        seq.computed += s.tokens
        if seq.prefilling:
            seq.prompt_left -= s.tokens
            if seq.prefilling:
                continue
        seq.produced += 1
        seq.out_left -= 1
        if seq.out_left <= 0:
            done.append(seq)
    return done


def readback_wait_ms(costs: StepCosts) -> float:
    """A prefill's D->P readback, once read, waits for one engine step to see it finished (vLLM moves the request
    out of WAITING_FOR_REMOTE_KVS from a step's connector output): one step's fixed part. The eager anchor measured
    38 ms (timing.READBACK_WAIT_MS) against this 32 ms."""
    return costs.base_ms


def unmodelled_ms(modelled_ms: float, own_ms: float) -> float:
    """What is left to wait of a request's modelled time outside the steps (HTTP, parsing, the KV read) after
    the simulator process spent `own_ms` (in modelled ms) doing that work for real."""
    return max(modelled_ms - max(own_ms, 0.0), 0.0)


def alone_ttft_ms(costs: StepCosts, new_tokens: int, context: int) -> float:
    """One request alone on the engine: its prefill chunks back to back, the first token at the last one."""
    total, done, budget = costs.request_ms, 0, costs.max_num_batched_tokens
    while True:
        n = min(new_tokens - done, budget)
        total += step_ms(costs, [(max(n, 1), context + done)])
        done += n
        if done >= new_tokens:
            return total


def alone_tpot_ms(costs: StepCosts, context: int) -> float:
    """One decode stream alone: one token per step against its context."""
    return step_ms(costs, [(1, context)])
