"""Rendering a plan for people (rich) and for programs (JSON)."""

from __future__ import annotations

import json
import shlex

from rich.console import Console
from rich.table import Table

from pdctl.plan import ProcessSpec
from pdctl.secret import shown


def plan_json(specs: list[ProcessSpec]) -> str:
    return json.dumps([s.to_json() for s in specs], indent=2)


def shell_line(spec: ProcessSpec, only_env: set[str] | None = None) -> str:
    env = [shlex.quote(f"{k}={shown(v)}") for k, v in spec.env.items() if only_env is None or k in only_env]
    return " ".join([*env, *(shlex.quote(a) for a in spec.argv)])


def render_plan(specs: list[ProcessSpec], console: Console) -> None:
    table = Table(title="processes, in start order", show_lines=True)
    for col in ("name", "node", "ports", "gpus", "health"):
        table.add_column(col, overflow="fold")
    for s in specs:
        table.add_row(
            s.name, f"{s.node} ({s.host})", ",".join(map(str, s.ports)), ",".join(map(str, s.gpus)) or "-",
            s.health_url,
        )
    console.print(table)
    for s in specs:
        console.print(f"\n[bold]{s.name}[/] on {s.node}, log {s.log_path}, cwd {s.workdir}", highlight=False)
        console.print(shell_line(s), highlight=False, markup=False, soft_wrap=True)
