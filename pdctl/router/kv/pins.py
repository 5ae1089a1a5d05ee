"""How much KV a decode's live handles pin, and each decode's budget for them (pure; the table, handles.py, releases
the least recent handles of a decode over its budget).

A handle pins the blocks of its turn on the decode that issued it (`remote_num_tokens` tokens, rounded up to whole
blocks) until a prefill reads them or the decode's `decoder_kv_blocks_ttl` runs out. Conversations that share a
prefix (a system prompt) share those blocks in the decode's prefix cache: the table (handles.py) counts
a whole chunk that several handles hold once, by its digest in their prefix-check chain, and counts in full what
it cannot tell apart (handles without a chain, the partial chunk at the end), so it errs towards releasing early.
"""

from __future__ import annotations

import re

_INFO = re.compile(r"^vllm:cache_config_info\{([^}]*)\}", re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def pinned_tokens(num_tokens: int, block_size: int) -> int:
    """The tokens' worth of whole blocks a handle of `num_tokens` tokens pins."""
    if num_tokens <= 0:
        return 0
    return -(-num_tokens // block_size) * block_size


def kv_capacity(metrics: str) -> int | None:
    """A vLLM engine's KV capacity in tokens (num_gpu_blocks x block_size) from its /metrics text, if it says."""
    m = _INFO.search(metrics)
    if m is None:
        return None
    labels = dict(_LABEL.findall(m.group(1)))
    blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
    return int(blocks) * int(size) if blocks.isdigit() and size.isdigit() else None


def budget_for(tokens: int, fraction: float, capacity: int | None) -> int:
    """A decode's pin budget: `tokens` when set, else `fraction` of its capacity (0, no budget, when unknown)."""
    if tokens > 0:
        return tokens
    if fraction <= 0 or capacity is None:
        return 0
    return max(1, int(capacity * fraction))
