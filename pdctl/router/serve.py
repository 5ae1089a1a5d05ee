"""`pdctl router serve`: options -> RouterConfig -> uvicorn (uvloop and httptools when installed)."""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

from pdctl.errors import UsageError
from pdctl.router.config import RouterConfig

LOG_FORMAT = "%(asctime)s [%(levelname)s] %(name)s: %(message)s"


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


def serve(config: RouterConfig, host: str, port: int, log_level: str = "info") -> None:
    import uvicorn

    from pdctl.router.app import create_app
    from pdctl.router.listener import Limits, connection_cap, protocol_class, raise_nofile

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
        lifespan="on",
        backlog=4096,
        timeout_keep_alive=max(1, round(config.idle_timeout)),
    )
