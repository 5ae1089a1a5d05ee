"""RouterConfig's fields as command-line options: each option's flag, type, default and help come from the field,
so `router serve` restates no knob.

A field is an option when it carries help (`config.knob`); the keys (`api_key`, `engine_key`) carry none and
reach the router through an environment variable and a file, never as values in argv.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal

import typer

from pdctl.router.config import RouterConfig

KEYWORD = inspect.Parameter.KEYWORD_ONLY


def with_config_options(command: Callable[..., None]) -> Callable[..., None]:
    """`command`, taking RouterConfig's options through its `**knobs` as well as its own named ones."""
    own = [
        p.replace(kind=KEYWORD) for p in inspect.signature(command, eval_str=True).parameters.values()
        if p.kind is not inspect.Parameter.VAR_KEYWORD
    ]
    knobs = config_parameters()
    required = [p for p in knobs if p.default is inspect.Parameter.empty]
    optional = [p for p in knobs if p.default is not inspect.Parameter.empty]
    command.__signature__ = inspect.Signature([*required, *own, *optional])  # type: ignore[attr-defined]
    return command


def config_parameters() -> list[inspect.Parameter]:
    hints = typing.get_type_hints(RouterConfig)
    params = []
    for f in dataclasses.fields(RouterConfig):
        if "help" not in f.metadata:
            continue
        kind = _option_type(hints[f.name])
        flag = f.metadata["flag"] or "--" + f.name.replace("_", "-")
        option = typer.Option(f"{flag}/--no-{flag[2:]}" if kind is bool else flag, help=f.metadata["help"])
        default = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        if isinstance(default, tuple):
            default = list(default)
        params.append(inspect.Parameter(f.name, KEYWORD, default=default, annotation=Annotated[kind, option]))
    return params


def config_from(knobs: dict[str, Any], api_key: str | None, engine_key: str | None) -> RouterConfig:
    """The RouterConfig the parsed options describe (repeatable options arrive as lists)."""
    values: dict[str, Any] = {name: tuple(v) if isinstance(v, list) else v for name, v in knobs.items()}
    return RouterConfig(**values, api_key=api_key, engine_key=engine_key)


def _option_type(hint: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin is tuple:
        return list[typing.get_args(hint)[0]]  # type: ignore[misc]
    if origin is Literal:
        return str  # RouterConfig checks the value and names the choices
    return hint
