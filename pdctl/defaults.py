"""Defaults that both sides of the topology/router boundary need, each declared once.

The topology's `router:` section and the router's own `RouterConfig` describe the same knobs, and the plan leaves
out a flag whose value is the router's default; so the two must start from the same value. Neither can take it
from the other (the topology sits below the router, and the router must not load the topology's schema), so both
take it from here. vLLM's defaults are named as vLLM's: pdctl must agree with them where it leaves a setting to
the engine.
"""

from __future__ import annotations

from typing import Literal

VLLM_BLOCK_SIZE = 16
"""vLLM's KV block size (tokens) when none is given: what an engine runs with where pdctl passes no --block-size."""

UCX_BLOCK_SIZE = 256
"""pdctl's KV block size for vLLM over UCX, from the bench legs in docs/results/h200x2*."""

VLLM_DECODER_KV_BLOCKS_TTL_S = 480
"""vLLM's `decoder_kv_blocks_ttl`: seconds a decode keeps a finished turn's blocks for the next one."""

HANDLE_TTL_S = 450.0
"""Seconds the router trusts a decode handle: 30 s inside vLLM's decoder_kv_blocks_ttl."""

ROUTER_PORT = 8000
"""The port clients connect to."""

VERIFY_PREFIX = True
"""Reuse only KV whose token ids match the new prompt."""

VERIFY_AT: Literal["prefill", "router"] = "prefill"
"""Where the prefix is verified: by the prefill, against the router's digests of the held tokens, once it has
tokenized the prompt itself (pdctl.prefix_check; vLLM needs pdctl's patch, the simulator has it), or by the
router, through a /tokenize of the whole prompt before the prefill hop."""

LOCAL_PREFILL_TOKENS = 4096
"""Conditional disaggregation on: a warm turn whose decode holds all but at most this many of its prompt's tokens
runs on that decode alone. On the simulated 1P1D and 2P2D it holds the most agent sessions within p90 TTFT <= 500 ms
(docs/results/sim-capacity); 0 sends every warm turn through a prefill (needs verify_prefix: without the ids the
router cannot tell what the decode holds, so the topology makes it 0 when verify_prefix is false)."""

MIN_READ_TOKENS = 256
"""The cheapest source of a warm turn's history (issue 29): a prefill reads a decode's KV only for at least this
many tokens beyond what its own prefix cache holds; fewer it computes. A D->P read has a fixed cost, its wait for
the read's completion (READBACK_WAIT_MS, 38 ms in the simulator's model), which 256 tokens of compute cost at 2k-24k
of context (0.13-0.19 ms a token); a conversation whose history the prefill's cache holds then costs what OFF
costs. 0: read whatever the prefill lacks."""

LOCAL_POLICY: Literal["always", "load", "work", "cost"] = "cost"
"""Which turns under local_prefill_tokens run on the decode alone: cost, by the router's per-turn cost model
(pdctl.router.turn.cost: the source with the least predicted time to first token that keeps the decode's ITL within
ITL_SLO_MS), which acts as load (while the decode is not busy: with the prefill's prefix caching on it held the
most sessions on the simulated 1P1D, sim-capacity run E) until the rates it needs are measured."""

ITL_SLO_MS = 200.0
"""The decode's inter-token latency budget the cost model keeps: a warm turn whose prefill on its decode would
stall that decode's other streams for longer than this is sent through a prefill."""

LOCAL_STALL_RATIO = 1.2
"""The most a local turn may lengthen the step of its decode's other streams, against the step they see anyway: a
turn through the prefill stalls them not at all, so ON default keeps their ITL within this much of ON via prefill's
(docs/results/sim-evict-1p1d). 0: no such bound, the ITL budget alone: until the decode's local costs are measured a
turn beside other streams probes them (pdctl.router.turn.cost), then the least TTFT within the budget is chosen. On
one real H100 under eviction that gave warm TTFT p90 102-111 ms against OFF's 484-489 at 9 agent sessions, ITL p99
68-72 ms (docs/results/h100-1gpu-evict, third run, an 8B model); on simulated engines modelled on a 32B model it
broke the ITL SLO at 12 sessions, so it is not the default."""

SAFE_LOCAL_TOKENS = 512
"""local_stall_ratio 0: the most a warm turn may lack to probe a decode beside other streams before even the
prefill's compute is measured (so nothing can price it): ~60-90 ms of an H200's step at 2k-32k context
(pdctl.sim.steps H200_GRAPHS), inside an ITL budget of 200 ms."""

LOCAL_BUSY_STREAMS = 4
"""local_policy load: requests in flight from which a decode counts as busy."""

PIN_BUDGET_TOKENS = 0
"""A fixed budget, in tokens, for the KV the router's live handles pin on one decode; 0: PIN_BUDGET_FRACTION of the
decode's own capacity."""

PIN_BUDGET_FRACTION = 0.5
"""The pin budget as a fraction of each decode's KV (num_gpu_blocks x block_size from its /metrics
`vllm:cache_config_info`, read once per decode process). Half: the other half stays for the turns the decode
runs, each of which holds its whole context there while it generates; a decode whose every running conversation
also has an idle pin splits its KV about evenly between the two. 0: no budget (handles dropped unread are still
released)."""

RETAIN_HIGH_KV = 0.90
"""router.retain_high_kv: a decode whose KV use (its own /metrics, polled by the router) is above this fraction makes
the router release retained handles on it, least valuable first, down to RETAIN_TARGET_KV
(pdctl.router.kv.retention)."""

RETAIN_TARGET_KV = 0.80
"""router.retain_target_kv: where releasing under pressure stops (and from where waiting requests start it)."""

OVERFLOW_KV = 0.0
"""router.overflow_kv: the decode KV use above which a turn runs whole on a prefill with KV to spare (0: off).
Off by default: on the simulated 1P1D (docs/results/sim-capacity, run F, a quiet host) it held no more sessions
within warm p90 <= 500 ms than off (64 off and at 0.95, none of the points at 0.85) and raised other streams' ITL
p99 from 66 to 515-923 ms; what it buys is overload: at 80 sessions p90 552-571 ms against 3884 off."""
