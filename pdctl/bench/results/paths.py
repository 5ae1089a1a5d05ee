"""Which path each leg measured, from what it did, not from what it asked for (issue 29).

A leg with `bidirectional_kv_xfer` on may still move no KV at all: every warm turn on its decode alone (conditional
disaggregation), or every one served from the prefill's own prefix cache. Its label says so: the measured share of
each source of the warm turns' history KV (the router's X-PD-KV-Reuse, `pdctl.router.wire.kv_source`), the D->P
transfers and GiB per warm turn the prefills metered (a leg not metered: the turns that reported a read, `read=R`
in their header, and GiB unknown). A warm turn served from the prefill's cache that held under 90 % of its history
counts as a recompute (`warm_sources`). Only a leg that moved KV from a decode is labelled
bidirectional; one that claims it and moved none is flagged.

    OFF                       bidirectional off (the prefill's prefix cache, or recompute, on every turn)
    ON via prefill            >= 90 % of warm turns read their history from the decode (D->P)
    ON local                  >= 90 % ran on their decode alone
    ON prefill cache          >= 90 % found their history in the prefill's own cache (nothing moved)
    ON mixed                  anything else; the shares say what
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from pdctl.bench.results.records import LegResult, RequestRecord
from pdctl.router.wire import DECODE_CACHE, DECODE_READ, PREFILL_CACHE, PREFILL_WHOLE, RECOMPUTED

DOMINANT = 0.9
HELD = 0.9  # a prefill-cache turn whose cache held less of its history than this recomputed it (warm_sources)
_NAMES = {DECODE_READ: "D->P read", DECODE_CACHE: "local", PREFILL_CACHE: "prefill cache",
          PREFILL_WHOLE: "whole on a prefill", RECOMPUTED: "recompute"}
_PATHS = {DECODE_READ: "ON via prefill (bidirectional)", DECODE_CACHE: "ON local", PREFILL_CACHE: "ON prefill cache",
          PREFILL_WHOLE: "ON whole on a prefill", RECOMPUTED: "ON recompute"}


@dataclass(frozen=True)
class LegPath:
    """What one leg measured: its path's name, each source's share of its warm turns, the KV it moved."""

    leg: str
    path: str
    shares: dict[str, float]
    warm_turns: int
    transfers_per_turn: float
    gib_per_turn: float
    flag: str | None = None

    @property
    def label(self) -> str:
        """The leg as a plot legend or table names it: its name, the path, the shares."""
        shown = ", ".join(f"{_NAMES[s]} {v:.0%}" for s, v in sorted(self.shares.items(), key=lambda x: -x[1]) if v)
        return f"{self.leg}: {self.path}" + (f" ({shown})" if shown and self.path != "OFF" else "")

    @property
    def moved_kv(self) -> bool:
        return self.transfers_per_turn > 0 or self.gib_per_turn > 0  # nan (unmetered) compares False


def warm_sources(records: Sequence[RequestRecord]) -> list[tuple[RequestRecord, str]]:
    """Each successful warm turn and where its history KV came from: the router's account (`kv_source`), except
    that a turn served from the prefill's prefix cache which held under HELD of its history (the shared system
    prompt, say, while the session's own tokens were evicted) counts as recomputed, which is what that prefill
    mostly did. Its history: the previous turn's prompt and output."""
    history = {(r.conversation_id, r.turn): (r.input_num_tokens or 0) + r.output_num_tokens for r in records}
    out = []
    for r in records:
        if r.turn < 1 or not r.ok:
            continue
        source = r.source or RECOMPUTED
        held = history.get((r.conversation_id, r.turn - 1), 0)
        if source == PREFILL_CACHE and held and (r.reuse_cached or 0) < HELD * held:
            source = RECOMPUTED
        out.append((r, source))
    return out


def leg_path(leg: LegResult) -> LegPath:
    sourced = warm_sources(leg.records)
    warm = [r for r, _ in sourced]
    counts = Counter(source for _, source in sourced)
    shares = {s: counts[s] / len(warm) for s in _NAMES} if warm else {}
    n = max(len(warm), 1)
    transfers, gib = leg.kv.transfers / n, leg.kv.bytes / 2**30 / n
    if leg.kv.source == "none" and not leg.kv.transfers:
        # Not metered (a capacity leg): the prefills' own reports in the turns' headers (read=R) say what moved.
        transfers, gib = sum(1 for r in warm if r.reuse_read) / n, math.nan
    if leg.mode == "aggregated":
        return LegPath(leg.name, "aggregated", {}, len(warm), 0.0, 0.0)
    if not leg.bidirectional:
        return LegPath(leg.name, "OFF", shares, len(warm), transfers, gib)
    top = max(shares, key=lambda s: shares[s]) if shares else RECOMPUTED
    path = _PATHS[top] if shares.get(top, 0.0) >= DOMINANT else "ON mixed"
    if path == "ON mixed" and shares.get(DECODE_READ, 0.0) > 0:
        path = "ON mixed (bidirectional)"
    moved = transfers > 0 or leg.kv.bytes > 0
    flag = None
    if not moved:
        # Whatever the turns' headers said, nothing crossed from a decode: not a measurement of bidirectional
        # transfer, and never labelled one.
        path = path.replace(" (bidirectional)", "").replace("ON via prefill", "ON, no KV moved")
        shown = ", ".join(f"{_NAMES[s]} {v:.0%}" for s, v in shares.items() if v) or "no warm turns"
        flag = (f"leg {leg.name} has bidirectional_kv_xfer on but moved no KV from a decode (0 D->P transfers, "
                f"0 GiB): its warm turns ran {shown}; it does not measure bidirectional transfer")
    return LegPath(leg.name, path, shares, len(warm), transfers, gib, flag)


def paths(legs: list[LegResult]) -> list[LegPath]:
    return [leg_path(leg) for leg in legs]


def title_suffix(legs: list[LegResult]) -> str:
    """A plot title's account of its legs' paths: `off: OFF; on: ON local (local 100%)`."""
    return "; ".join(p.label for p in paths(legs))
