"""What the router chose for each warm turn (X-PD-KV-Choice, recorded per request as `kv_choice*`), beside what the
turn then did (`paths.warm_sources`: X-PD-KV-Reuse and the prefills' counters), and how well it predicted the time to
first token the bench measured.

The two can differ: the router may choose a D->P read and the prefill find the history in its own cache (no read),
or the read fail and the prefill recompute. A leg's "path" (paths.py) is what ran; its choice mix is what the
router's cost model decided. Both are counted over the successful warm turns (turn >= 1); a warm turn without the
header (an OFF leg, an aggregated engine, a turn whose handle was gone, a router without the model) counts as
`NONE`.

Predicted against measured, per chosen source, over the turns the model chose (basis `model`, the only ones with a
prediction) and the bench timed: the p50 of each, and the p50 of measured / predicted per turn (> 1: the model was
optimistic). Both are wall-clock milliseconds; the measured TTFT is the client's, so it includes the router's
own time and the network the prediction leaves out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pdctl.bench.results.paths import warm_sources
from pdctl.bench.results.records import LegResult, RequestRecord
from pdctl.bench.results.stats import percentile

NONE = "none"  # a warm turn the router sent no choice for


@dataclass(frozen=True)
class SourceCost:
    """One chosen source: its turns, what they then ran as, and predicted against measured TTFT."""

    source: str
    turns: int
    ran: dict[str, int] = field(default_factory=dict)  # what the turns did instead (warm_sources) -> turns
    predicted_turns: int = 0  # model-chosen turns with both a prediction and a measured TTFT
    predicted_p50_ms: float | None = None
    measured_p50_ms: float | None = None
    ratio_p50: float | None = None  # p50 of measured / predicted per turn

    def to_json(self) -> dict[str, Any]:
        return {"turns": self.turns, "ran": self.ran, "predicted_turns": self.predicted_turns,
                "predicted_ttft_p50_ms": _r(self.predicted_p50_ms), "measured_ttft_p50_ms": _r(self.measured_p50_ms),
                "measured_over_predicted_p50": _r(self.ratio_p50, 3)}


@dataclass(frozen=True)
class LegChoices:
    """A leg's warm turns by the source the router chose, the basis and refusals, and the cost per source."""

    warm_turns: int
    chosen: dict[str, int]  # source -> turns, largest first, then NONE
    basis: dict[str, int]  # model | default -> turns (NONE turns not counted)
    refused: dict[str, int]  # why the decode alone was refused -> turns
    sources: list[SourceCost]

    @property
    def shares(self) -> dict[str, float]:
        return {s: n / self.warm_turns for s, n in self.chosen.items()} if self.warm_turns else {}

    @property
    def reported(self) -> bool:
        """The router sent a choice for at least one warm turn."""
        return any(s != NONE for s in self.chosen)

    @property
    def mix(self) -> str:
        """`decode_read 12 (60%), recomputed 8 (40%)`, or `-` without warm turns."""
        return ", ".join(f"{s} {n} ({self.shares[s]:.0%})" for s, n in self.chosen.items()) or "-"

    def to_json(self) -> dict[str, Any]:
        return {"warm_turns": self.warm_turns, "chosen": self.chosen,
                "shares": {s: round(v, 4) for s, v in self.shares.items()}, "basis": self.basis,
                "local_refused": self.refused, "by_source": {c.source: c.to_json() for c in self.sources}}


def leg_choices(records: Sequence[RequestRecord]) -> LegChoices:
    """The choices over `records`' successful warm turns (a leg's, or one point's)."""
    sourced = warm_sources(records)
    chosen = Counter(r.kv_choice or NONE for r, _ in sourced)
    basis = Counter(r.kv_choice_basis or "default" for r, _ in sourced if r.kv_choice)
    refused = Counter(r.kv_choice_refused for r, _ in sourced if r.kv_choice and r.kv_choice_refused)
    costs = []
    for source, turns in _largest_first(chosen).items():
        if source == NONE:
            continue
        mine = [(r, ran) for r, ran in sourced if r.kv_choice == source]
        pairs = [(r.kv_choice_predicted_ms, r.ttft_ms) for r, _ in mine
                 if r.kv_choice_predicted_ms is not None and r.ttft_ms is not None]
        ratios = [m / p for p, m in pairs if p > 0]
        costs.append(SourceCost(
            source, turns, _largest_first(Counter(ran for _, ran in mine)), len(pairs),
            percentile([p for p, _ in pairs], 50) if pairs else None,
            percentile([m for _, m in pairs], 50) if pairs else None,
            percentile(ratios, 50) if ratios else None))
    return LegChoices(len(sourced), _largest_first(chosen), _largest_first(basis), _largest_first(refused), costs)


def of_leg(leg: LegResult) -> LegChoices:
    return leg_choices(leg.records)


def _largest_first(c: Counter[str]) -> dict[str, int]:
    """Largest first; NONE (no choice sent) last."""
    return dict(sorted(c.items(), key=lambda kv: (kv[0] == NONE, -kv[1], kv[0])))


def _r(x: float | None, digits: int = 1) -> float | None:
    return None if x is None else round(x, digits)
