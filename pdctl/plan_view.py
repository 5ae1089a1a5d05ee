"""Rendering a plan for people (rich) and for programs (JSON)."""

from __future__ import annotations

import json
import re
import shlex

from rich.console import Console
from rich.table import Table

from pdctl.plan import ProcessSpec
from pdctl.secret import shown

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def plan_json(specs: list[ProcessSpec]) -> str:
    return json.dumps([s.to_json() for s in specs], indent=2)


def shell_line(spec: ProcessSpec, only_env: set[str] | None = None) -> str:
    """The process as one line a user can paste into a shell on its node: `~/` paths expand there."""
    env = [_assignment(k, shown(v)) for k, v in spec.env.items() if only_env is None or k in only_env]
    env += [f'{k}="$(cat {shell_word(p)})"' for k, p in spec.secret_env.items() if only_env is None or k in only_env]
    return " ".join([*env, *(shell_word(a) for a in spec.argv)])


def shell_word(arg: str) -> str:
    """`arg` quoted for a POSIX shell, a leading `~/` left bare so that the shell expands it to the home."""
    if arg == "~":
        return arg
    if arg.startswith("~/"):
        return "~/" + shlex.quote(arg[2:]) if arg[2:] else "~/"
    return shlex.quote(arg)


def _assignment(key: str, value: str) -> str:
    """`KEY=value` for the front of a command line; the shell expands a `~/` right after `=` as well."""
    if _NAME.fullmatch(key) and (value == "~" or value.startswith("~/")):
        return f"{key}={shell_word(value)}"
    return shlex.quote(f"{key}={value}")


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
