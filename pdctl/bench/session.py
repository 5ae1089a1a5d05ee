"""One `pdctl bench` from checked options to written report: the estimate, the legs (redeployed through the
lifecycle unless `no_redeploy`) with progress on `console`, and the report files.

    result, files = bench(opts, console, out_dir=None)
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from rich.console import Console

from pdctl.bench.output import report
from pdctl.bench.output.progress import make_progress
from pdctl.bench.output.report import ReportFiles
from pdctl.bench.results.records import BenchResult
from pdctl.bench.runner.options import estimate_line
from pdctl.bench.runner.run import BenchOptions, run_bench


def bench(opts: BenchOptions, console: Console, out_dir: Path | None = None) -> tuple[BenchResult, ReportFiles]:
    """Run every leg and write the report to `out_dir` (default bench-out/NAME-TIME), then restore the
    deployment."""
    deployer = None
    if not opts.no_redeploy:
        from pdctl.bench.leg.deploy import LifecycleDeployer

        deployer = LifecycleDeployer(console, opts.ssh)
    console.print(estimate_line(opts), highlight=False, markup=False)
    written: list[ReportFiles] = []

    def save(result: BenchResult) -> None:  # before the deployment is put back: a Ctrl-C there loses nothing
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        written.append(report.write(result, out_dir or Path("bench-out") / f"{result.topology}-{stamp}"))

    with make_progress(console, opts.workload.turns) as progress:
        result = run_bench(opts, deployer, progress, save)
    return result, written[0]
