"""Rendering a StatusReport for people; programs get `StatusReport.to_json()`."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pdctl.lifecycle.watch.status import DecodeHeld, EngineMetrics, RetentionStatus, StatusReport


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def render_status(report: StatusReport, console: Console) -> None:
    """Two tables that fit 80 columns: the processes, then the engines' metrics (only for engines that serve)."""
    if report.not_running:
        where = ", ".join(sorted({p.node for p in report.processes}))
        console.print(f"{report.name}: not running (no process of it on {where}, no state file)", highlight=False)
        return
    with_gpu = any(p.gpu_memory_mib is not None for p in report.processes)
    table = Table(title=f"{report.name}", title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    for col in ("process", "node", "pid", "health", "uptime", *(["GPU MiB"] if with_gpu else [])):
        table.add_column(col, overflow="fold")
    for p in report.processes:
        table.add_row(
            p.name, p.node, str(p.pid) if p.pid else "-",
            Text(p.health, style="green" if p.health == "ok" else "red"), _dur(p.uptime_s),
            *([str(p.gpu_memory_mib) if p.gpu_memory_mib is not None else "-"] if with_gpu else []),
        )
    console.print(table)
    engines = [p for p in report.processes if p.metrics is not None]
    if engines:
        metrics = Table(header_style="bold", box=box.SIMPLE_HEAD)
        kept = any(p.metrics is not None and p.metrics.kv_blocks for p in engines)  # the simulator says
        for col in ("engine", "run/wait", "KV", *(["retained"] if kept else []), "NIXL xfers", "failed", "expired"):
            metrics.add_column(col, overflow="fold")
        for p in engines:
            m = p.metrics
            assert m is not None
            metrics.add_row(
                p.name, f"{m.running:g}/{m.waiting:g}", f"{m.kv_cache_usage:.1%}", *([_retained(m)] if kept else []),
                f"{m.nixl_transfers:g}", Text(f"{m.nixl_failures:g}", style="red" if m.nixl_failures else ""),
                f"{m.kv_expired:g}",
            )
        console.print(metrics)
    if report.retained:
        console.print(_retained_table(report.retained, several=len(report.routers) > 1))
    units = sorted({p.unit for p in report.processes if p.unit})
    if units:
        console.print(f"[dim]systemd units: {', '.join(units)}[/]", highlight=False)
    if report.slurm is not None:
        console.print(_slurm_line(report), highlight=False)
    for (node, gpu), procs in sorted(report.shared_gpus().items()):
        held = [p.gpu_memory_mib for p in procs if p.gpu_memory_mib is not None]
        console.print(f"GPU {gpu} of {node} is shared by {', '.join(p.name for p in procs)}"
                      + (f": {sum(held)} MiB together" if held else ""), highlight=False)
    for r in report.routers or ([report.router] if report.router else []):
        if r.error:
            console.print(f"{r.name} {r.url}: [red]stats unavailable[/] ({r.error})", highlight=False)
        else:
            console.print(
                f"{r.name} {r.url}: {r.requests_total} requests, reuse hit {r.hit} / partial {r.partial} / "
                f"miss {r.miss}, hit rate {r.hit_rate:.1%}, {r.reused_tokens_total} tokens reused, "
                + (f"{r.local_turns} turns on the decode alone, " if r.local_turns else "")
                + f"{r.live_handles} live handles",
                highlight=False,
            )
            if r.recent_window_s:
                recent = (f"{r.recent_hit_rate:.1%} over {r.recent_eligible_turns} turns"
                          if r.recent_hit_rate is not None else "no turn that could reuse")
                console.print(f"  last {r.recent_window_s:g} s: hit rate {recent}", highlight=False)
            if r.retention is not None:
                for line in _retention_lines(r.retention):
                    console.print(f"  {line}", highlight=False)
    for node, why in report.unreachable.items():
        console.print(f"[red]unreachable[/] {node}: {why}", highlight=False)
    if report.reach:
        console.print(f"[dim]{report.reach}[/]", highlight=False)
    for stray in report.strays:
        console.print(f"[yellow]not in the topology but running[/]: {stray}", highlight=False)
    if report.state_file is None:
        console.print("[dim]no state file: pids and uptime come from the hosts alone[/]")


def _retained(m: EngineMetrics) -> str:
    """The engine's blocks kept for a peer against all it has (the simulator's own count)."""
    if not m.kv_blocks:
        return "-"
    kept = m.kv_retained_blocks or 0.0
    return f"{kept:g}/{m.kv_blocks:g} ({kept / m.kv_blocks:.1%})"


def _tokens(n: float) -> str:
    return f"{n / 1000:.1f}k" if n >= 10000 else f"{n:g}"


def _retained_table(held: list[DecodeHeld], several: bool) -> Table:
    """Each decode's KV held by retained blocks (every router's pins) against its total, and by router."""
    table = Table(title="retained KV (kept on the decode for next turns)", title_justify="left",
                  header_style="bold", box=box.SIMPLE_HEAD)
    for col in ("decode", "KV used", "retained", "of its KV", "handles", "queued", *(["by router"] if several else [])):
        table.add_column(col, overflow="fold")
    for d in held:
        table.add_row(
            d.name, "-" if d.kv_usage is None else f"{d.kv_usage:.1%}",
            f"{_tokens(d.retained_tokens)} tok", "-" if d.retained_share is None else f"{d.retained_share:.1%}",
            str(d.handles), str(d.releases_queued),
            *([", ".join(f"{r} {_tokens(n)}" for r, n in d.by_router.items())] if several else []),
        )
    return table


def _retention_lines(r: RetentionStatus) -> list[str]:
    """What a router released, to make room first (its pins per decode are in the retained KV table)."""
    lines = []
    others = ", ".join(f"{why} {n}" for why, n in r.releases.items() if why != "pressure")
    lines.append(f"released under pressure: {r.released_under_pressure} handles in {r.pressure_events} polls "
                 f"(above {r.high_kv:.0%} KV, down to {r.target_kv:.0%})"
                 + (f"; other releases: {others}" if others else "")
                 + (f"; {r.release_queue} queued" if r.release_queue else ""))
    return lines


def _slurm_line(report: StatusReport) -> str:
    job = report.slurm
    assert job is not None
    if job.jobid is None:
        return "slurm: no job (`pdctl up` submits one)"
    whose = "submitted by pdctl" if job.submitted_by_pdctl else "attached (slurm.jobid)"
    if job.state != "RUNNING":
        reason = f" ({job.reason})" if job.reason and job.reason != "None" else ""
        return (f"slurm: job {job.jobid} {job.state}{reason}, {whose}: nothing of {report.name} runs; "
                "`pdctl down` clears it, `pdctl up` starts it in a new job")
    placed = ", ".join(f"{node} on {host}" for node, host in job.hosts.items())
    return f"slurm: job {job.jobid} RUNNING, {whose}, time left {job.time_left or '?'}: {placed}"
