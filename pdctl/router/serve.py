"""`router serve`: options -> RouterConfig -> uvicorn (uvloop and httptools when installed).

`router_app()` is the router's whole command line, for `python -m pdctl.router` (which loads nothing of pdctl's
CLI) and, behind pdctl's own error boundary, for `pdctl router`.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Protocol, TypeVar

import typer

from pdctl.defaults import ROUTER_PORT
from pdctl.errors import PdctlError, UsageError
from pdctl.router.config import RouterConfig
from pdctl.router.server.options import config_from, with_config_options

T = TypeVar("T")
LOG_FORMAT = "%(asctime)s [%(levelname)s] %(name)s: %(message)s"
LOG_LEVELS = ("debug", "info", "warning", "error")


Serve = Callable[[RouterConfig, str, int, str], None]


class Boundary(Protocol):
    def __call__(self, fn: Callable[[], T], /) -> T: ...


def reported(fn: Callable[[], T]) -> T:
    """The router's own error boundary: a PdctlError becomes its line and hint on stderr, and its exit code."""
    try:
        return fn()
    except PdctlError as exc:
        typer.echo(f"Error: {exc.message}", err=True)
        if exc.hint:
            typer.echo(f"hint: {exc.hint}", err=True)
        raise typer.Exit(exc.exit_code) from None


def router_app(call: Boundary = reported, run: Serve | None = None) -> typer.Typer:
    """The `serve` command; `call` is the error boundary, `run` what serves the config (default: uvicorn)."""
    app = typer.Typer(help="The KV-cache-aware P/D router.", no_args_is_help=True, add_completion=False,
                      pretty_exceptions_enable=False)

    @app.callback()
    def _group() -> None:
        """The KV-cache-aware P/D router (keeps `serve` a subcommand when run as `python -m pdctl.router`)."""

    @app.command("serve")
    @with_config_options
    def _serve(
        host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="Port to listen on.")] = ROUTER_PORT,
        api_key_env: Annotated[str | None, typer.Option(help="Env var holding the API key clients must send.")] = None,
        engine_key_file: Annotated[
            str | None, typer.Option(help="File holding the API key the engines require (sent as a Bearer token).")
        ] = None,
        log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
        **knobs: Any,
    ) -> None:
        """Serve the router: chat/completions, completions, Responses and Anthropic Messages over P/D instances."""
        call(lambda: check_log_level(log_level))
        config = call(lambda: config_from(knobs, api_key=api_key_from_env(api_key_env),
                                          engine_key=engine_key_from_file(engine_key_file)))
        call(lambda: check_state_dir(config.state_dir))
        (run or serve)(config, host, port, log_level.lower())

    return app


def check_log_level(given: str) -> None:
    if given.lower() not in LOG_LEVELS:
        raise UsageError(f"--log-level {given!r} is not one of {', '.join(LOG_LEVELS)}", hint="e.g. --log-level info")


def api_key_from_env(var: str | None) -> str | None:
    if not var:
        return None
    key = os.environ.get(var)
    if not key:
        raise UsageError(f"--api-key-env {var}: the environment variable is not set or empty",
                         hint=f"export {var}=<key> before starting the router, or drop --api-key-env")
    return key


def engine_key_from_file(path: str | None) -> str | None:
    """The engines' API key, read from the file `pdctl up` wrote on this node (the value never travels in argv)."""
    if not path:
        return None
    try:
        key = Path(path).expanduser().read_text().strip()
    except OSError as exc:
        raise UsageError(f"--engine-key-file {path}: cannot read it ({exc.strerror})",
                         hint="`pdctl up` writes it; rerun `pdctl up`") from None
    if not key:
        raise UsageError(f"--engine-key-file {path} is empty", hint="rerun `pdctl up --restart` to write a new key")
    return key


def check_state_dir(path: str | None) -> None:
    """The pin journal's directory exists or can be made, and this user can write it."""
    if not path:
        return
    from pdctl.router.kv.journal import SUBDIR

    where = Path(path).expanduser() / SUBDIR
    try:
        where.mkdir(parents=True, exist_ok=True)
        ok = os.access(where, os.W_OK | os.X_OK)
    except OSError as exc:
        raise UsageError(f"--state-dir {path}: cannot make {where} ({exc.strerror})",
                         hint="give a directory this user can write, or leave --state-dir out") from None
    if not ok:
        raise UsageError(f"--state-dir {path}: {where} is not writable by this user",
                         hint="give a directory this user can write, or leave --state-dir out")


def serve(config: RouterConfig, host: str, port: int, log_level: str = "info") -> None:
    import uvicorn

    from pdctl.router.server.app import create_app
    from pdctl.router.server.listener import Limits, connection_cap, protocol_class, raise_nofile

    logging.basicConfig(level=log_level.upper(), format=LOG_FORMAT, datefmt="%Y-%m-%d %H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream call would drown the log
    nofile = raise_nofile()
    cap = connection_cap(config.max_client_connections, nofile)
    logging.getLogger("pdctl.router").info("open-file limit %d; at most %d client connections", nofile, cap)
    limits = Limits(config.header_timeout, config.max_headers, config.max_header_bytes, cap)
    uvicorn.run(
        create_app(config),
        host=host,
        port=port,
        loop="uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio",
        http=protocol_class(limits),
        log_level=log_level,
        access_log=False,
        proxy_headers=False,  # nothing reads the client's address: no X-Forwarded-* middleware per request
        lifespan="on",
        backlog=4096,
        timeout_keep_alive=max(1, round(config.idle_timeout)),
    )
