"""`pdctl router ...`: the KV-cache-aware router's commands (the work lives in pdctl.router)."""

from __future__ import annotations

from typing import Annotated

import typer

from pdctl.cli.support import call
from pdctl.kv_expiry import ROUTER_EXPIRY_MARGIN_S

router_app = typer.Typer(help="The KV-cache-aware P/D router.", no_args_is_help=True)


@router_app.callback()
def _group() -> None:
    """The KV-cache-aware P/D router (keeps `serve` a subcommand when run as `python -m pdctl.router`)."""


@router_app.command("serve")
def serve(
    prefill: Annotated[list[str], typer.Option("--prefill", help="Prefill instance URL (repeat for more).")],
    decode: Annotated[list[str], typer.Option("--decode", help="Decode instance URL (repeat for more).")],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    model: Annotated[str, typer.Option(help="Served model name (used for /tokenize).")] = "default",
    block_size: Annotated[int, typer.Option(help="KV block size in tokens (partial reuse is whole blocks).")] = 16,
    handle_ttl: Annotated[float, typer.Option(help="Seconds the router trusts a decode handle.")] = 450.0,
    decoder_kv_blocks_ttl: Annotated[
        float, typer.Option(help="The decodes' decoder_kv_blocks_ttl: how long they keep a finished turn's blocks.")
    ] = 480.0,
    expiry_margin: Annotated[
        float, typer.Option(help="Seconds before decoder_kv_blocks_ttl that a handle stops being used "
                            "(at least the engine's own 5 s).")
    ] = ROUTER_EXPIRY_MARGIN_S,
    verify_prefix: Annotated[
        bool, typer.Option("--verify-prefix/--no-verify-prefix", help="Reuse only KV whose token ids match.")
    ] = True,
    partial_reuse: Annotated[
        bool, typer.Option("--partial-reuse/--no-partial-reuse", help="On divergence reuse the verified blocks.")
    ] = True,
    local_prefill_tokens: Annotated[
        int,
        typer.Option(help="Conditional disaggregation: a turn whose decode already holds all but at most this many "
                     "of the prompt's tokens is computed there, without the prefill hop; 0: always disaggregate. "
                     "Needs --verify-prefix."),
    ] = 4096,  # RouterConfig's default
    local_policy: Annotated[
        str, typer.Option(help="Which of those turns run on the decode: always; load (only while the decode has "
                          "fewer than --local-busy-streams requests in flight or the prefill is busy too); or work "
                          "(while its prompt tokens in flight are at most the prefill's plus the hop's cost).")
    ] = "always",
    local_busy_streams: Annotated[
        int, typer.Option(help="--local-policy load: requests in flight from which a decode counts as busy.")
    ] = 4,
    api_key_env: Annotated[str | None, typer.Option(help="Env var holding the API key clients must send.")] = None,
    engine_key_file: Annotated[
        str | None, typer.Option(help="File holding the API key the engines require (sent as a Bearer token).")
    ] = None,
    max_body_bytes: Annotated[int, typer.Option(help="Larger request bodies get 413.")] = 32 * 1024 * 1024,
    max_handles: Annotated[int, typer.Option(help="Most decode handles kept (least recently used go).")] = 4096,
    health_interval: Annotated[float, typer.Option(help="Seconds between upstream health checks.")] = 2.0,
    sweep_interval: Annotated[float, typer.Option(help="Seconds between sweeps of expired handles.")] = 5.0,
    eject_after: Annotated[int, typer.Option(help="Consecutive failures that eject an upstream.")] = 3,
    load_factor: Annotated[float, typer.Option(help="Bounded-load cap, x the mean outstanding requests.")] = 1.25,
    request_timeout: Annotated[float, typer.Option(help="Seconds an upstream may take to answer.")] = 600.0,
    health_timeout: Annotated[
        float, typer.Option(help="Seconds a health check waits; a timeout never ejects a role's last instance.")
    ] = 5.0,
    max_inflight_per_instance: Annotated[
        int, typer.Option(help="Requests in flight per healthy instance before new ones queue.")
    ] = 256,
    max_queue: Annotated[int, typer.Option(help="Queued requests per role before 429 + Retry-After.")] = 1024,
    queue_timeout: Annotated[float, typer.Option(help="Seconds a request may queue before 503 + Retry-After.")] = 30.0,
    header_timeout: Annotated[float, typer.Option(help="Seconds a client has to send a request's headers.")] = 10.0,
    body_timeout: Annotated[float, typer.Option(help="Seconds a client has to send a request's body.")] = 60.0,
    idle_timeout: Annotated[float, typer.Option(help="Seconds an idle client connection stays open.")] = 30.0,
    max_client_connections: Annotated[
        int, typer.Option(help="Open client connections before new ones get 503; 0: half the open-file limit.")
    ] = 0,
    conversation_header: Annotated[
        list[str] | None,
        typer.Option("--conversation-header",
                     help="Header naming a request's conversation, in order of precedence (repeat for more); "
                     "default: X-Conversation-Id, X-Session-ID, X-LiteLLM-Session-Id, X-Session-Affinity, "
                     "X-Correlation-Id."),
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Serve the router: chat/completions, completions, Responses and Anthropic Messages over P/D instances."""
    from pdctl.router.config import RouterConfig
    from pdctl.router.identity import DEFAULT_HEADERS
    from pdctl.router.serve import api_key_from_env, engine_key_from_file
    from pdctl.router.serve import serve as run

    call(lambda: _check_log_level(log_level))
    config = call(lambda: RouterConfig(
        prefill=tuple(prefill), decode=tuple(decode), model=model, block_size=block_size, handle_ttl=handle_ttl,
        decoder_kv_blocks_ttl=decoder_kv_blocks_ttl, expiry_margin=expiry_margin, verify_prefix=verify_prefix,
        partial_reuse=partial_reuse, local_prefill_tokens=local_prefill_tokens,
        local_policy=local_policy, local_busy_streams=local_busy_streams,  # type: ignore[arg-type]
        api_key=api_key_from_env(api_key_env), engine_key=engine_key_from_file(engine_key_file),
        max_body_bytes=max_body_bytes,
        max_handles=max_handles, health_interval=health_interval, sweep_interval=sweep_interval,
        eject_after=eject_after, load_factor=load_factor, request_timeout=request_timeout,
        health_timeout=health_timeout, max_inflight_per_instance=max_inflight_per_instance, max_queue=max_queue,
        queue_timeout=queue_timeout, header_timeout=header_timeout, body_timeout=body_timeout,
        idle_timeout=idle_timeout, max_client_connections=max_client_connections,
        conversation_headers=tuple(h.lower() for h in conversation_header) if conversation_header else DEFAULT_HEADERS,
    ))
    run(config, host, port, log_level.lower())


LOG_LEVELS = ("debug", "info", "warning", "error")


def _check_log_level(given: str) -> None:
    from pdctl.errors import UsageError

    if given.lower() not in LOG_LEVELS:
        raise UsageError(f"--log-level {given!r} is not one of {', '.join(LOG_LEVELS)}", hint="e.g. --log-level info")


def register(app: typer.Typer) -> None:
    app.add_typer(router_app, name="router")
