"""The pictures of a bench: warm-turn TTFT against prompt length (one line per leg), the prefill duration of
each length as paired bars, legs with bidirectional transfer split into KV transfer and compute, and for a
capacity run the goodput plot (sessions against TTFT and inter-token gap, the SLO drawn).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from pdctl.bench.results.paths import leg_path, title_suffix
from pdctl.bench.results.records import BenchResult, LegResult
from pdctl.bench.results.stages import STAGES, StageRow
from pdctl.bench.results.stats import SummaryRow, lengths_of, warm_mean
from pdctl.bench.runner.capacity import Point, Slo

TTFT_PNG = "ttft_vs_length.png"
PREFILL_PNG = "prefill_split.png"
GOODPUT_PNG = "goodput.png"
STAGES_PNG = "ttft_stages.png"


def _pyplot() -> ModuleType:
    """matplotlib, imported only when a plot is drawn: it costs a second of CLI start-up otherwise."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): the backend must be chosen first

    return plt


def label(result: BenchResult) -> str:
    return "simulated engines (pdctl.sim)" if result.simulated else "vLLM"


def axis(result: BenchResult) -> str:
    """What a bench's points are, as its tables name the column: prompt lengths (the sweep), or numbers of agent
    sessions (a capacity run, whose records carry their point's sessions as their length)."""
    return "sessions" if result.workload.get("profile") == "agent" else "length"


def axis_label(result: BenchResult) -> str:
    return "concurrent agent sessions" if axis(result) == "sessions" else "prompt length at turn 1 (tokens of history)"


@dataclass(frozen=True)
class PrefillSplit:
    """Mean prefill duration of the warm turns of one leg and length, and how much of it was KV transfer."""

    leg: str
    length: int
    total_ms: float
    kv_ms: float

    @property
    def compute_ms(self) -> float:
        return max(0.0, self.total_ms - self.kv_ms)


def prefill_splits(result: BenchResult, rows: list[SummaryRow]) -> list[PrefillSplit]:
    out = []
    for leg in result.legs:
        for length in lengths_of(leg.records):
            total = warm_mean(rows, leg.name, length, "prefill_ms")
            kv = _kv_ms_per_request(leg, length) if leg_path(leg).moved_kv else 0.0
            out.append(PrefillSplit(leg.name, length, total, min(kv, total) if not math.isnan(total) else kv))
    return out


def _kv_ms_per_request(leg: LegResult, length: int) -> float:
    """Prefill-side KV transfer time per reusing warm turn: the length's span delta over its reuse count."""
    reused = [r for r in leg.records if r.length == length and r.turn >= 1 and r.reuse in ("hit", "partial")]
    if not reused:
        return 0.0
    kv = leg.kv_by_length.get(length)
    if kv is None:
        all_reused = sum(1 for r in leg.records if r.turn >= 1 and r.reuse in ("hit", "partial"))
        return leg.kv.xfer_ms / all_reused if all_reused else 0.0
    return kv.xfer_ms / len(reused)


def plot_ttft(result: BenchResult, rows: list[SummaryRow], path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for leg in result.legs:
        lengths = lengths_of(leg.records)
        ys = [warm_mean(rows, leg.name, n) for n in lengths]
        ax.plot(lengths, ys, marker="o", label=_leg_label(leg))
    ax.set_xlabel(axis_label(result))
    # A capacity run's goodput plot and capacity table are in modelled time on the simulator; this one is not.
    ax.set_ylabel("mean TTFT of turns 2+ (ms" + (", wall clock)" if result.simulated and axis(result) == "sessions"
                                                  else ")"))
    ax.set_title(_title(f"Multi-turn TTFT vs {'sessions' if axis(result) == 'sessions' else 'prompt length'}",
                        result), fontsize=8)
    ax.grid(True, alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.legend()
    _save(plt, fig, path)


def plot_prefill(result: BenchResult, splits: list[PrefillSplit], path: Path) -> None:
    lengths = sorted({s.length for s in splits})
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, leg in enumerate(result.legs):
        by_len = {s.length: s for s in splits if s.leg == leg.name}
        xs, width = _bars(i, len(result.legs), len(lengths))
        compute = [_nz(by_len[n].compute_ms) if n in by_len else 0.0 for n in lengths]
        kv = [_nz(by_len[n].kv_ms) if n in by_len else 0.0 for n in lengths]
        color = colors[i % len(colors)]
        if leg_path(leg).moved_kv:  # a leg that moved nothing draws no KV-transfer bar
            ax.bar(xs, kv, width, color=color, alpha=0.45, hatch="//", label=f"{leg.name}: KV transfer (D→P)")
            ax.bar(xs, compute, width, bottom=kv, color=color, label=f"{leg.name}: compute")
        else:
            ax.bar(xs, compute, width, color=color, label=f"{leg.name}: compute")
    ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
    ax.set_xlabel(axis_label(result))
    ax.set_ylabel("mean prefill duration of turns 2+ (ms, X-PD-Prefill-Ms)")
    ax.set_title(_title(f"Prefill duration per {axis(result)}", result), fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    _save(plt, fig, path)


def plot_goodput(points: Sequence[Point], slo: Slo, title: str, path: Path) -> None:
    """Sessions against warm-turn TTFT p50/p90 and the p99 inter-token gap, one colour per leg, the SLO drawn."""
    plt = _pyplot()
    fig, (ax_t, ax_i) = plt.subplots(1, 2, figsize=(12, 5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, leg in enumerate(dict.fromkeys(p.leg for p in points)):
        mine = sorted((p for p in points if p.leg == leg), key=lambda p: p.sessions)
        xs, color = [p.sessions for p in mine], colors[i % len(colors)]
        ax_t.plot(xs, [p.ttft_p90 for p in mine], marker="o", color=color, label=f"{leg} p90")
        ax_t.plot(xs, [p.ttft_p50 for p in mine], marker=".", linestyle="--", color=color, label=f"{leg} p50")
        ax_i.plot(xs, [p.itl_p99 for p in mine], marker="o", color=color, label=leg)
    counts = sorted({p.sessions for p in points})
    for ax, limit, what in ((ax_t, slo.ttft_p90, "SLO p90"), (ax_i, slo.itl_p99, "SLO p99")):
        if math.isfinite(limit):
            ax.axhline(limit, color="black", linestyle=":", label=what)
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(n) for n in counts])  # the measured counts, as numbers (not 2^k)
        ax.minorticks_off()
        ax.set_xlabel("concurrent agent sessions")
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    finite = [p.ttft_p90 for p in points if math.isfinite(p.ttft_p90)]
    if math.isfinite(slo.ttft_p90) and finite and max(finite) > 6 * slo.ttft_p90:
        ax_t.set_ylim(0, 6 * slo.ttft_p90)  # a leg far past the SLO would flatten the ones near it
        ax_t.set_title(f"clipped at {6 * slo.ttft_p90:g} ms", fontsize=8)
    ax_t.set_ylabel("TTFT of warm turns (ms)")
    ax_i.set_ylabel("p99 of each request's largest inter-token gap (ms)")
    fig.suptitle(title)
    _save(plt, fig, path)


def plot_stages(result: BenchResult, rows: list[StageRow], path: Path) -> None:
    """Warm-turn TTFT per length as stacked stages, one bar per leg (stages.py)."""
    legs = [leg.name for leg in result.legs]
    lengths = sorted({r.length for r in rows})
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 5.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, leg in enumerate(legs):
        by_len = {r.length: r for r in rows if r.leg == leg}
        xs, width = _bars(i, len(legs), len(lengths))
        bottom = [0.0] * len(lengths)
        for k, stage in enumerate(STAGES):
            ys = [by_len[n].stages[stage] if n in by_len else 0.0 for n in lengths]
            ax.bar(xs, ys, width, bottom=bottom, color=colors[k % len(colors)], edgecolor="white",
                   hatch="" if i == 0 else "//", label=stage if i == 0 else None)
            bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
        for x, top in zip(xs, bottom, strict=True):
            if top:
                ax.annotate(leg, (x, top), ha="center", va="bottom", fontsize=7, rotation=90)
    ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
    ax.set_xlabel(axis_label(result))
    ax.set_ylabel("mean TTFT of turns 2+ (ms), by stage")
    ax.set_title(_title("Where warm-turn TTFT goes", result), fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    _save(plt, fig, path)


def _bars(i: int, legs: int, lengths: int) -> tuple[list[float], float]:
    """Where leg i's bar stands at each length (the legs' bars side by side around the length's tick), and its width."""
    width = 0.8 / max(1, legs)
    return [j + (i - (legs - 1) / 2) * width for j in range(lengths)], width


def _save(plt: ModuleType, fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _leg_label(leg: LegResult) -> str:
    """The path the leg measured, with each source's share (pdctl.bench.results.paths), never only what it asked for."""
    return leg_path(leg).label


def _title(what: str, result: BenchResult) -> str:
    """A plot's title: what it shows, the engines, and each leg's measured path on a line of its own."""
    return f"{what} — {label(result)}\n{title_suffix(result.legs)}"


def _nz(x: float) -> float:
    return 0.0 if math.isnan(x) else x
