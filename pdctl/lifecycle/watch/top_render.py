"""`pdctl top` in the terminal: the tables of one TopView (lifecycle/watch/top.py)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from pdctl.lifecycle.watch.top import TopView
from pdctl.router.wire import REASON_TEXT


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def _n(v: float) -> str:
    return f"{v:.0f}" if v == int(v) else f"{v:.1f}"


def _retained_table(v: TopView) -> Table:
    several = len(v.release_queue) > 1
    table = Table(title="retained KV (blocks kept on the decode for next turns)", title_justify="left", box=None)
    for col in ("decode", "KV use", "retained", "of its KV", "handles", *(["by router"] if several else []),
                *(["kept (engine)"] if any(d.kept_blocks is not None for d in v.retained) else [])):
        table.add_column(col, justify="left" if col in ("decode", "by router") else "right")
    for d in v.retained:
        table.add_row(
            d.process, "-" if d.kv_use is None else f"{d.kv_use:.0%}",
            _n(d.retained_blocks) + ("" if d.capacity_blocks is None else f"/{_n(d.capacity_blocks)}"),
            "-" if d.retained_share is None else f"{d.retained_share:.1%}", _n(d.handles),
            *([", ".join(f"{r} {_n(n)}" for r, n in d.by_router.items())] if several else []),
            *([_n(d.kept_blocks) if d.kept_blocks is not None else "-"]
              if any(x.kept_blocks is not None for x in v.retained) else []),
        )
    return table


def _choice_table(v: TopView) -> Table:
    """The warm turns' KV source as the cost model chose it: in the interval, its share, since start, TTFT."""
    table = Table(title="KV source chosen (warm turns)", title_justify="left", box=None)
    for col in ("source", "turns", "share", "total", "TTFT predicted", "measured (p50 ms)"):
        table.add_column(col, justify="left" if col == "source" else "right")
    for source, total in v.kv_choice_total.items():
        ttft = v.kv_choice_ttft_s.get(source, {})
        share = v.kv_choice_share.get(source)
        table.add_row(source, _n(v.kv_choice.get(source, 0.0)), "-" if share is None else f"{share:.0%}",
                      _n(total), _ms(ttft.get("predicted")), _ms(ttft.get("measured")))
    refused = ", ".join(f"{k} {_n(n)}" for k, n in v.kv_choice_refused.items() if n)
    probes = f", probes of the decode {_n(v.kv_choice_probe)}" if v.kv_choice_probe else ""
    table.caption = (f"by the rule (rates not yet measured): {_n(v.kv_choice_default)}{probes}; decode alone refused: "
                     f"{refused or 'none'}; |measured - predicted| p50 {_ms(v.kv_choice_error_s.get('p50'))} "
                     f"p90 {_ms(v.kv_choice_error_s.get('p90'))} ms")
    table.caption_justify = "left"
    return table


def render_top(v: TopView, console: Console) -> None:
    hit = "-" if v.hit_rate is None else f"{v.hit_rate:.0%}"
    console.print(f"[bold]{v.deployment}[/]  {v.turns_per_s:.2f} turns/s over {v.interval_s:.1f}s  hit rate {hit}",
                  highlight=False)
    lat = Table(title="latency (ms)", title_justify="left", box=None)
    for col in ("", "p50", "p90", "p99"):
        lat.add_column(col, justify="right" if col else "left")
    for name, q in (("TTFT router", v.ttft_s), ("TTFT decode", v.engine_ttft_s), ("ITL decode", v.itl_s)):
        lat.add_row(name, *(_ms(q.get(p)) for p in ("p50", "p90", "p99")))
    console.print(lat)
    reuse = Table(title="reuse (turns in the interval)", title_justify="left", box=None)
    reuse.add_column("outcome: reason")
    reuse.add_column("turns", justify="right")
    reuse.add_column("why")
    for key, n in sorted(v.reasons.items(), key=lambda kv: -kv[1]):
        reuse.add_row(key, _n(n), REASON_TEXT.get(key.split(": ", 1)[-1], ""))
    if v.diverged_at_tokens is not None:
        reuse.add_row("prefix diverged at", f"~{v.diverged_at_tokens:.0f}", "tokens (median first differing block)")
    console.print(reuse)
    kv = Table(title="KV", title_justify="left", box=None)
    kv.add_column("")
    kv.add_column("value")
    kv.add_row("source", ", ".join(f"{k} {_n(n)}" for k, n in v.kv_source.items() if n) or "-")
    kv.add_row("moved/turn", ", ".join(f"{k} {_n(n)} tok" for k, n in v.moved_tokens_per_turn.items()) or "-")
    kv.add_row("NIXL/turn", ", ".join(f"{k} {n / 2**20:.1f} MiB" for k, n in v.nixl_bytes_per_turn.items()) or "-")
    kv.add_row("pinned", ", ".join(f"decode {i} {_n(p)}" + (f"/{_n(b)}" if b else "") for i, (p, b)
                                   in sorted(v.pinned.items())) or "-")
    kv.add_row("admission", ", ".join(f"{r} {_n(a)}/{_n(c)} queued {_n(q)}" for r, (a, q, c)
                                      in v.admission.items()) or "-")
    kv.add_row("refused", ", ".join(f"{k} {_n(n)}" for k, n in v.refusals.items() if n) or "none")
    if v.release_queue:
        kv.add_row("released", ", ".join(f"{k} {_n(n)} (total {_n(v.releases_total.get(k, 0.0))})"
                                         for k, n in sorted(v.releases.items()) if v.releases_total.get(k))
                   or "none")
        kv.add_row("release queue", ", ".join(f"{r} {_n(n)}" for r, n in v.release_queue.items()))
    console.print(kv)
    if v.retained:
        console.print(_retained_table(v))
    if v.kv_choice_total:
        console.print(_choice_table(v))
    inst = Table(title="instances", title_justify="left", box=None)
    for col in ("process", "up", "pool", "running", "waiting", "KV use", "router→"):
        inst.add_column(col, justify="left" if col in ("process", "up", "pool") else "right")
    for i in v.instances:
        pool = "-" if i.router_healthy is None else "in" if i.router_healthy else "[red]out[/]"
        inst.add_row(i.process, "yes" if i.up else "[red]no[/]", pool, _n(i.running), _n(i.waiting),
                     f"{i.kv_use:.0%}", _n(i.router_outstanding))
    console.print(inst)
