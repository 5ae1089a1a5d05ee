"""The bench on a terminal: a rich progress bar on stderr while it runs, the summary table and verdict after;
and the same data as JSON for `--json`.
"""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pdctl.bench.output.plots import axis, label
from pdctl.bench.output.report import ReportFiles
from pdctl.bench.results import choices
from pdctl.bench.results.paths import leg_path
from pdctl.bench.results.records import BenchResult, RequestRecord
from pdctl.bench.results.stats import ratios, reuse_counts, summarize, warm_mean


class RichProgress:
    """One bar per leg, counting requests; failures turn the description red."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.task: Any = None
        self.failed = 0

    def __enter__(self) -> RichProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def leg_started(self, name: str, total: int) -> None:
        self.failed = 0
        self.task = self.bar.add_task(f"leg {name}", total=total)

    def request_done(self, record: RequestRecord) -> None:
        if self.task is None:
            return
        if not record.ok:
            self.failed += 1
            self.bar.update(self.task, description=f"[red]leg {record.leg} ({self.failed} failed)")
        self.bar.advance(self.task)

    def note(self, text: str) -> None:
        self.bar.console.print(f"[dim]{text}[/]", highlight=False)


def summary_table(result: BenchResult) -> Table:
    rows = summarize(result.legs)
    names = [leg.name for leg in result.legs]
    ratio = ratios(rows, names)
    table = Table(title=f"Mean TTFT of turns 2+ (ms) — {label(result)}", title_justify="left")
    table.add_column(axis(result), justify="right")
    for name in names:
        table.add_column(name, justify="right")
    for name in names[1:]:
        table.add_column(f"{names[0]}/{name}", justify="right")
    for n in sorted({r.length for r in rows}):
        cells = [_f(warm_mean(rows, name, n)) for name in names]
        cells += [_f(ratio[name][n], 2) for name in names[1:]]
        table.add_row(str(n), *cells)
    hits = ["hit rate"] + [_pct(reuse_counts(leg.records).rate) for leg in result.legs] + [""] * (len(names) - 1)
    table.add_row(*hits, style="dim")
    return table


def print_outcome(result: BenchResult, files: ReportFiles, console: Console) -> None:
    console.print(summary_table(result))
    for leg in result.legs:
        p = leg_path(leg)
        gib = "GiB not metered" if math.isnan(p.gib_per_turn) else f"{p.gib_per_turn:.3f} GiB"
        console.print(f"leg {p.label}; {p.transfers_per_turn:.2f} D->P transfers and {gib} per warm turn",
                      highlight=False)
        chose = choices.of_leg(leg)
        if chose.reported:
            console.print(f"leg {leg.name}: the router chose {chose.mix} (X-PD-KV-Choice; what ran is the path above)",
                          highlight=False)
        if p.flag:
            console.print(f"[bold yellow]flag:[/] {p.flag}", highlight=False)
        if leg.passed:
            console.print(f"[green]leg {leg.name}: passed[/]", highlight=False)
        for failure in leg.failures:
            console.print(f"[bold red]leg {leg.name} FAILED:[/] {failure}", highlight=False)
    console.print(f"report: {files.report}", highlight=False)
    console.print(f"plots:  {files.ttft_png}", highlight=False)
    console.print(f"        {files.prefill_png}", highlight=False)
    console.print(f"        {files.stages_png}", highlight=False)
    if result.deployment:
        style = "bold red" if result.restore_failed else "bold" if result.deployment_state == "down" else "green"
        console.print(f"[{style}]deployment:[/] {escape(result.deployment)}", highlight=False)
    if result.interrupted:
        console.print(f"[bold red]bench interrupted[/] after {result.wall_s:.0f} s: the report holds the "
                      f"{len(result.records)} requests that finished", highlight=False)
        return
    verdict = "[green]bench passed[/]" if result.passed else "[bold red]bench FAILED[/]"
    console.print(f"{verdict} in {result.wall_s:.0f} s", highlight=False)


def as_json(result: BenchResult, files: ReportFiles) -> dict[str, Any]:
    rows = summarize(result.legs)
    return {
        "passed": result.passed,
        "interrupted": result.interrupted,
        "deployment": {"state": result.deployment_state, "said": result.deployment} if result.deployment else None,
        "topology": result.topology,
        "simulated": result.simulated,
        "wall_s": round(result.wall_s, 2),
        "out": str(files.out),
        "files": {k: str(v) for k, v in vars(files).items() if k != "out"},
        "workload": result.workload,
        "legs": [
            {**leg.to_json(), "hit_rate": _nan_none(reuse_counts(leg.records).rate),
             "kv_choice": choices.of_leg(leg).to_json()} for leg in result.legs
        ],
        "summary": [r.csv_row() for r in rows],
        "ratios": {
            k: {str(n): _nan_none(x) for n, x in v.items()}
            for k, v in ratios(rows, [x.name for x in result.legs]).items()
        },
    }


def _f(x: float, digits: int = 0) -> str:
    return "-" if math.isnan(x) else f"{x:.{digits}f}"


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.0%}"


def _nan_none(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 4)
