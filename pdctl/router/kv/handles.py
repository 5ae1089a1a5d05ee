"""The table of decode handles: one per conversation, bounded (LRU), expiring by the router's clock, single use.

A handle is a decode's `kv_transfer_params` from a conversation's previous turn plus what the router knows about
it: which decode holds the blocks, which token ids they hold, and when it stops trusting it. The decode's own
`remote_blocks_expiry_time` is in the decode's process clock; it is carried opaquely and never compared here.

`take()` removes the handle so concurrent turns of one conversation never share it (a handle is single use:
the decode frees its blocks after the first read). Conversations the table has seen but holds no handle for
keep a bounded tombstone with the reason, so the next turn's miss says why (expired, evicted, ...).

A handle also records the `generation` of the decode that issued it (upstream/pools.py): when that decode may have
died since, its blocks are gone or hold someone else's tokens, and the handle is dropped unused (`RESTARTED`).

Every handle the table drops unread (replaced, evicted, expired) still pins its blocks on the decode: `on_drop`
hears of it with the reason, and the router releases them (release.py). The table also keeps each
decode's pinned tokens (pins.py); a handle that takes its decode over its `budget` (by decode URL) drops
that decode's least recently used handles (reason `pressure`, next turn's miss `released`). A handle whose decode
restarted is dropped without a word: its blocks went with the process.

Under KV pressure on a decode (retention.py) `shed` releases its least valuable handles: a conversation that never
took a second turn (`Handle.continued` false) first, then the oldest, then the shortest. A `journal` (journal.py)
hears of every handle that enters or leaves the table, so a router that dies leaves a record of its pins.
"""

from __future__ import annotations

import time
from array import array
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pdctl.router.kv.pins import pinned_tokens
from pdctl.router.wire import DECODE_RESTARTED as RESTARTED
from pdctl.router.wire import EVICTED, EXPIRED, NEW_CONVERSATION, NOT_ELIGIBLE, PREVIOUS_TURN_FAILED, RELEASED
from pdctl.router.wire import HANDLE_IN_USE as IN_USE

Stale = Callable[["Handle"], bool]
Dropped = Callable[["Handle", str], None]


class Pins(Protocol):
    """What the table tells the pin journal (journal.py): a handle's blocks are pinned by it, or no longer."""

    def pin(self, h: Handle) -> None: ...

    def unpin(self, h: Handle) -> None: ...

# Why a handle was dropped unread (the `reason` label of the router's release counters).
REPLACED = "replaced"
PRESSURE = "pressure"
UNREAD = "unread"
SINGLE_TURN = "single_turn"  # a turn the router can tell ends its conversation: its KV is released at once
RECLAIMED = "reclaimed_at_start"  # an earlier router's pin, released by the router that started after it
SHUTDOWN = "shutdown"  # released by a router that stops on purpose


@dataclass(frozen=True)
class History:
    """A turn's prompt and reply as the next request repeats them: `size` messages (chat) or characters (a text
    prompt), and their salted in-process hash; `tokens` the decode's token ids for them (0: not known) and `nbytes`
    their text's bytes, the conversation's own tokens per byte (turn/history.py)."""

    size: int
    key: int
    tokens: int = 0
    nbytes: int = 0


@dataclass
class Handle:
    conversation: str
    params: dict[str, Any]
    decode_url: str
    tokens: array[int] | None
    received: float
    deadline: float
    derived_key: Hashable | None = field(default=None, compare=False)
    # Token ids the decode computed for this conversation in local turns after the handle's own (its prefix
    # cache holds them, unpinned); None until a turn ran on the decode alone.
    cached: array[int] | None = field(default=None, compare=False)
    generation: int = field(default=0, compare=False)
    # The digest chain of `tokens` a prefill checks before it reads (pdctl.prefix_check.spec; verify_at prefill),
    # made when the handle is stored so that no turn computes it on its way to the prefill.
    spec: dict[str, Any] | None = field(default=None, compare=False)
    # What the decode last ran for the conversation, as the next request must extend it (turn/history.py).
    history: History | None = field(default=None, compare=False)
    # The conversation took more than one turn (a handle, a lease or a miss reason came before this one): under
    # KV pressure a conversation that never continued is released first.
    continued: bool = field(default=False, compare=False)

    @property
    def num_tokens(self) -> int:
        n = self.params.get("remote_num_tokens")
        return n if isinstance(n, int) else 0

    @property
    def request_id(self) -> object:
        """The decode's request whose blocks the handle names (the same in a handle put back after a local turn)."""
        return self.params.get("remote_request_id")


@dataclass(frozen=True)
class Taken:
    handle: Handle | None
    reason: str

    @property
    def eligible(self) -> bool:
        """Whether this turn had a handle or should have had one (counts towards the hit rate)."""
        return self.handle is not None or self.reason not in (NEW_CONVERSATION, NOT_ELIGIBLE)


class KeyIndex(Protocol):
    """Where derived conversation keys point (conversation.DerivedIndex); kept in step with the table."""

    def add(self, key: Hashable, cid: str) -> None: ...

    def discard(self, key: Hashable, cid: str) -> None: ...


class HandleTable:
    def __init__(
        self, max_size: int, clock: Callable[[], float] = time.monotonic, index: KeyIndex | None = None,
        on_drop: Dropped | None = None, budget: Callable[[str], int] | None = None, block_size: int = 1,
        journal: Pins | None = None,
    ) -> None:
        self.max_size = max_size
        self.clock = clock
        self.index = index
        self.on_drop = on_drop
        self.budget = budget
        self.block_size = block_size
        self.journal = journal
        self._live: OrderedDict[str, Handle] = OrderedDict()
        self._tombs: OrderedDict[str, str] = OrderedDict()
        # A tombstoned conversation's derived key, so that its next turn finds it (and its miss reason) without an
        # id, as a client that sends one does: no handle came back (bidirectional off), the next turn is still warm.
        self._tomb_keys: dict[str, Hashable] = {}
        self._leased: dict[str, int] = {}
        self._pinned: dict[str, int] = {}
        self._on: dict[str, int] = {}  # decode URL -> its live handles (read a few times a second: no table walk)
        # Per decode: how many live handles hold each whole chunk of their prefix, by the chunk's digest in the
        # handle's prefix-check chain (Handle.spec): a chunk two conversations share, the shared system prompt,
        # sits in one set of the decode's prefix-cached blocks and counts once.
        self._chunks: dict[str, Counter[str]] = {}

    def __len__(self) -> int:
        return len(self._live)

    def put(self, handle: Handle) -> None:
        """Store a conversation's newest handle; an older one is replaced (its blocks expire on the decode)."""
        cid = handle.conversation
        if self.continues(cid):
            handle.continued = True
        old = self._live.pop(cid, None)
        if old is not None:
            self._dropped(old)
            if old.request_id != handle.request_id:
                self._unread(old, REPLACED)
        self._tombs.pop(cid, None)
        self._forget_key(cid)
        self._live[cid] = handle
        self._count(handle, +1)
        if self.journal is not None:
            self.journal.pin(handle)
        if self.index is not None and handle.derived_key is not None:
            self.index.add(handle.derived_key, cid)
        while len(self._live) > self.max_size:
            _, evicted = self._live.popitem(last=False)
            self._dropped(evicted)
            self.mark(evicted.conversation, EVICTED)
            self._unread(evicted, EVICTED)
        self._relieve(handle)

    def continues(self, cid: str) -> bool:
        """Whether the conversation took a turn before (it has a handle, a lease, or a miss reason): a turn of it
        is not its first."""
        return cid in self._live or cid in self._tombs or cid in self._leased

    def _relieve(self, newest: Handle) -> None:
        """Release the least recently used handles of `newest`'s decode while it is over the budget.

        One at a time, from the least recent: what a release frees depends on which handles still share its chunks.
        A newest handle larger than the budget on its own stays, with everything else on its decode gone."""
        url = newest.decode_url
        budget = self.budget(url) if self.budget is not None else 0
        while 0 < budget < self._pinned.get(url, 0):  # under budget (every put but a few): no walk of the table
            # The least recent handle on that decode: the table's first with one decode, never a walk of it all.
            cid = next((c for c, h in self._live.items() if h.decode_url == url and h is not newest), None)
            if cid is None:
                return
            h = self._live.pop(cid)
            self._dropped(h)
            self.mark(h.conversation, RELEASED)
            self._unread(h, PRESSURE)

    def shed(self, url: str, tokens: int, reason: str = PRESSURE, most: int = 0) -> int:
        """Release handles on the decode at `url`, least valuable first (never continued, then oldest, then
        shortest), until they free about `tokens` (or `most` handles, when > 0); return how many went. Their next
        turns miss (`released`)."""
        order = sorted((h for h in self._live.values() if h.decode_url == url),
                       key=lambda h: (h.continued, h.received, h.num_tokens))
        freed = gone = 0
        for h in order:
            if (most and gone >= most) or (not most and freed >= tokens):
                break
            freed += self._freed_by(h)
            del self._live[h.conversation]
            self._dropped(h)
            self.mark(h.conversation, RELEASED)
            self._unread(h, reason)
            gone += 1
        return gone

    def drop_all(self, reason: str) -> int:
        """Release every live handle (the router stops): their next turns, at another router, miss."""
        return sum(self.drop(cid, reason, RELEASED) for cid in list(self._live))

    def pinned(self) -> dict[str, int]:
        """Tokens the live handles pin, per decode URL (whole blocks; a prefix chunk shared by several handles
        counted once where the handles carry their digest chain, in full where they do not)."""
        return {url: n for url, n in self._pinned.items() if n}

    def _links(self, h: Handle) -> tuple[list[str], int]:
        """The handle's chunk digests and the tokens each stands for ([] when it carries no chain)."""
        chain = h.spec.get("chain") if h.spec is not None else None
        step = h.spec.get("step") if h.spec is not None else None
        if not isinstance(chain, list) or not isinstance(step, int) or step <= 0:
            return [], 0
        return [d for d in chain if isinstance(d, str)], step

    def _tail(self, h: Handle, links: list[str], step: int) -> int:
        """The handle's tokens past its whole chunks (`_links(h)`), in whole blocks."""
        return pinned_tokens(h.num_tokens - len(links) * step, self.block_size)

    def _count(self, h: Handle, sign: int) -> None:
        """Add (+1) or take away (-1) the handle, and its pinned tokens, on its decode."""
        url = h.decode_url
        on = self._on.get(url, 0) + sign
        if on > 0:
            self._on[url] = on
        else:
            self._on.pop(url, None)
        links, step = self._links(h)
        tokens = self._tail(h, links, step)
        if not links:  # no chain: the tail is all it pins
            left = self._pinned.get(url, 0) + sign * tokens
            if left > 0:
                self._pinned[url] = left
            else:
                self._pinned.pop(url, None)
            return
        chunks = self._chunks.setdefault(url, Counter())
        for d in links:
            before = chunks[d]
            chunks[d] = before + sign
            if (before == 0) if sign > 0 else (before == 1):
                tokens += step
            if chunks[d] <= 0:
                del chunks[d]
        left = self._pinned.get(url, 0) + sign * tokens
        if left > 0:
            self._pinned[url] = left
        else:
            self._pinned.pop(url, None)
        if not chunks:
            self._chunks.pop(url, None)

    def _freed_by(self, h: Handle) -> int:
        """What releasing `h` alone would free now: its tail and the chunks no other live handle holds."""
        links, step = self._links(h)
        chunks = self._chunks.get(h.decode_url, Counter())
        return self._tail(h, links, step) + step * sum(1 for d in links if chunks[d] == 1)

    def _unread(self, h: Handle, reason: str) -> None:
        if self.on_drop is not None:
            self.on_drop(h, reason)

    def take(self, cid: str, stale: Stale | None = None) -> Taken:
        """Remove and return the conversation's handle if it is still alive, else why there is none.

        `stale` says whether the decode that issued a handle may have died since (its KV is then not there)."""
        handle = self._live.pop(cid, None)
        if handle is not None:
            self._dropped(handle)
            if self.clock() >= handle.deadline:
                self.mark(cid, EXPIRED)
                self._unread(handle, EXPIRED)
                return Taken(None, EXPIRED)
            if stale is not None and stale(handle):
                self.mark(cid, RESTARTED)
                return Taken(None, RESTARTED)
            self._leased[cid] = self._leased.get(cid, 0) + 1
            self.mark(cid, PREVIOUS_TURN_FAILED)
            return Taken(handle, "")
        if cid in self._leased:
            return Taken(None, IN_USE)
        return Taken(None, self._tombs.get(cid, NEW_CONVERSATION))

    def drop(self, cid: str, reason: str, tomb: str) -> bool:
        """Give up the conversation's live handle (its turns run elsewhere now): its blocks are released (`reason`),
        and the next turn that looks for it is told `tomb`. False when there was none."""
        h = self._live.pop(cid, None)
        if h is None:
            return False
        self._dropped(h)
        self.mark(cid, tomb)
        self._unread(h, reason)
        return True

    def drop_decode(self, url: str, reason: str, tomb: str) -> int:
        """Give up every live handle on the decode at `url` (it leaves the deployment): `drop` for each."""
        gone = [cid for cid, h in self._live.items() if h.decode_url == url]
        return sum(self.drop(cid, reason, tomb) for cid in gone)

    def on(self, url: str) -> int:
        """Live handles whose KV sits on the decode at `url`."""
        return self._on.get(url, 0)

    def release(self, cid: str) -> None:
        """The turn that took the handle is over (whatever happened to it)."""
        n = self._leased.get(cid, 0) - 1
        if n > 0:
            self._leased[cid] = n
        else:
            self._leased.pop(cid, None)

    def mark(self, cid: str, reason: str, key: Hashable | None = None) -> None:
        """Remember why a conversation has no handle, for its next turn's miss reason; `key`: the derived key its
        next turn is found by (a conversation without an id)."""
        self._tombs[cid] = reason
        self._tombs.move_to_end(cid)
        if key is not None and self.index is not None:
            self._forget_key(cid)
            self._tomb_keys[cid] = key
            self.index.add(key, cid)
        while len(self._tombs) > self.max_size:
            old, _ = self._tombs.popitem(last=False)
            self._forget_key(old)

    def _forget_key(self, cid: str) -> None:
        key = self._tomb_keys.pop(cid, None)
        if key is not None and self.index is not None:
            self.index.discard(key, cid)

    def sweep(self, stale: Stale | None = None) -> int:
        """Drop every expired handle, and every one `stale` says its decode may have lost; return how many."""
        now = self.clock()
        gone = [(cid, EXPIRED if now >= h.deadline else RESTARTED) for cid, h in self._live.items()
                if now >= h.deadline or (stale is not None and stale(h))]
        for cid, reason in gone:
            h = self._live.pop(cid)
            self._dropped(h)
            self.mark(cid, reason)
            if reason == EXPIRED:
                self._unread(h, EXPIRED)
        return len(gone)

    def get(self, cid: str) -> Handle | None:
        """Peek without taking (selection uses it to find the decode that holds a conversation's blocks)."""
        return self._live.get(cid)

    def _dropped(self, handle: Handle) -> None:
        """`handle` left the table (taken or dropped): its blocks no longer count as pinned by a live handle."""
        self._count(handle, -1)
        if self.journal is not None:
            self.journal.unpin(handle)
        if self.index is not None and handle.derived_key is not None:
            self.index.discard(handle.derived_key, handle.conversation)
