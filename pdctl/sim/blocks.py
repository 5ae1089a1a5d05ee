"""A KV block pool with vLLM's allocation order and prefix cache, holding the token ids of every block.

Free blocks sit in one queue: allocation takes from the front (evicting a cached block's hash); freeing walks a
request's blocks tail first, appends blocks with a hash (prefix-cached, evicted last) and puts blocks without
one back at the front. That reproduces the block orders a real engine hands out (e.g. [5,4,3,2,1,6,7,8] on a
prefill node without prefix caching), and with them the fragmentation that makes NIXL reads slow.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


class PoolExhausted(Exception):
    """Not enough free blocks right now."""


@dataclass
class Block:
    id: int
    tokens: tuple[int, ...] = ()
    hash: int | None = None
    ref: int = 0


@dataclass
class BlockPool:
    num_blocks: int
    block_size: int
    prefix_caching: bool = True
    blocks: list[Block] = field(init=False)
    free: OrderedDict[int, None] = field(init=False)
    cached: dict[int, int] = field(init=False)
    on_free: Callable[[], None] | None = field(default=None, init=False)  # told after blocks return to the pool

    def __post_init__(self) -> None:
        # Block 0 is vLLM's null block: never handed out.
        self.blocks = [Block(i) for i in range(self.num_blocks + 1)]
        self.free = OrderedDict((i, None) for i in range(1, self.num_blocks + 1))
        self.cached = {}

    @property
    def num_free(self) -> int:
        return len(self.free)

    def usage(self) -> float:
        return 1.0 - len(self.free) / self.num_blocks

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def lookup_prefix(self, tokens: Sequence[int], max_tokens: int) -> list[int]:
        """Cached full blocks that hold a prefix of `tokens` (at most `max_tokens` of them); takes a reference."""
        if not self.prefix_caching:
            return []
        hit: list[int] = []
        parent = 0
        bs = self.block_size
        for start in range(0, max_tokens - bs + 1, bs):
            parent = hash((parent, tuple(tokens[start : start + bs])))
            block_id = self.cached.get(parent)
            if block_id is None:
                break
            hit.append(block_id)
        for block_id in hit:
            self._ref(block_id)
        return hit

    def allocate(self, n: int) -> list[int]:
        if n > len(self.free):
            raise PoolExhausted(f"need {n} blocks, {len(self.free)} free")
        out = []
        for _ in range(n):
            block_id, _ = self.free.popitem(last=False)
            block = self.blocks[block_id]
            if block.hash is not None and self.cached.get(block.hash) == block_id:
                del self.cached[block.hash]
            block.hash, block.tokens, block.ref = None, (), 1
            out.append(block_id)
        return out

    def write(
        self, ids: Sequence[int], tokens: Sequence[int], first_block: int = 0, held: Sequence[int] | None = None
    ) -> None:
        """Fill `ids`, blocks `first_block...` of the sequence `tokens`. They are hashed by `tokens`, as vLLM
        hashes by request, but hold `held` where given: what a remote read really delivered."""
        held = tokens if held is None else held
        bs = self.block_size
        parent = 0
        if self.prefix_caching:
            for b in range(first_block):
                parent = hash((parent, tuple(tokens[b * bs : (b + 1) * bs])))
        for offset, block_id in enumerate(ids):
            b = first_block + offset
            chunk = tuple(tokens[b * bs : (b + 1) * bs])
            block = self.blocks[block_id]
            block.tokens = tuple(held[b * bs : (b + 1) * bs])
            if self.prefix_caching and len(chunk) == bs:
                parent = hash((parent, chunk))
                block.hash = parent
                self.cached.setdefault(parent, block_id)

    def contents(self, ids: Sequence[int]) -> list[list[int]]:
        return [list(self.blocks[i].tokens) for i in ids]

    def valid(self, ids: Sequence[int]) -> bool:
        return all(isinstance(i, int) and 1 <= i <= self.num_blocks for i in ids)

    def free_blocks(self, ids: Sequence[int]) -> None:
        front: list[int] = []
        for block_id in reversed(ids):
            block = self.blocks[block_id]
            block.ref -= 1
            if block.ref > 0:
                continue
            if block.hash is not None:
                self.free[block_id] = None
            else:
                front.append(block_id)
        for block_id in reversed(front):
            self.free[block_id] = None
            self.free.move_to_end(block_id, last=False)
        if self.on_free is not None:
            self.on_free()

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix: no later lookup hits. Blocks in use keep their tokens (a retained handle's
        read still gets them) but are no longer found by prefix."""
        self.cached.clear()
        for block in self.blocks:
            block.hash = None

    def _ref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref == 0:
            self.free.pop(block_id, None)
        block.ref += 1
