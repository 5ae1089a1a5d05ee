"""pdctl's KV-cache-aware router: an ASGI app between OpenAI clients and P/D engine instances (or, in aggregated
mode, whole engines).

A folder per stage; each imports only the stages below it (tests/test_layering.py):

    server/     the HTTP server: listener, ASGI app and its entry steps, route table, own endpoints, passthrough
    api/        chat and completions, the Responses API, Anthropic Messages: request in -> turn -> response out
    turn/       one conversation turn, stage by stage (turn/pipeline.py), its context and the router's state
    kv/         conversation identity, decode handles, pins and their release, KV use, kept responses
    upstream/   the engine pools, transport, admission, restart detection, SSE
and the base every stage may use:
    wire        the public signals: the X-PD-* headers; re-exports reasons and documents
    reasons     why a turn hit or missed (each reason in words) and where its KV came from (kv_source)
    documents   the /stats document (RouterStats) and the members file (Members)
    config      RouterConfig: every knob, with its default and help
    errors      the one error body (OpenAI's shape; Anthropic's on /v1/messages) and the helpers that send it
    jsonx       fast JSON (orjson when installed)
    lean_metrics  prometheus_client's Counter and Histogram, the same series, counted without a lock or a bucket walk
    serve       the router's command line (`python -m pdctl.router`, `pdctl router`): options -> config -> uvicorn;
                it sits with server/, at the top
"""

from pdctl.router.config import RouterConfig

__all__ = ["RouterConfig"]
