"""pdctl's KV-cache-aware router: an ASGI app between OpenAI clients and P/D engine instances (or, in aggregated
mode, whole engines).

Modules, one concept each:
    wire          the public signals: X-PD-* headers and their reasons, the /stats document (RouterStats)
    config        RouterConfig: every knob, with its default and help
    options       RouterConfig's fields as `router serve` options
    jsonx         fast JSON (orjson when installed)
    conversation  which conversation a request belongs to (explicit id or derived from the history)
    handles       the table of decode handles: TTL by the router's clock, LRU bound, single use
    verify        prefix verification: does the decode's KV really prefix the new prompt?
    upstreams     health-checked P and D pools (generations: which process issued a handle), selection policies
    tripwire      one idle connection per decode: its closing says the process died (restart detection)
    admission     per-pool bound on requests in flight, a queue with a deadline, 429/503 + Retry-After
    disconnect    a request's upstream work is cancelled when its client leaves
    metrics       Prometheus metrics and the /stats counters
    context       RequestContext: one request's own data, created at the entry and handed down the hops
    routes        the route table: paths, methods, handlers, and what the middlewares read of them
    middleware    request id, auth, body limit + JSON (415, 408, depth) + sanitising, HTTP/1.0 replies
    prefill       the prefill hop (with its retry as a miss)
    decode        the decode hop: stream through, capture the new handle, strip internals
    sse           whole server-sent events out of an upstream's byte stream
    proxy         one completion request, start to end
    turns         one conversation turn in the router's mode: proxy (P/D) or aggregated
    aggregated    --mode aggregated: each request whole to one engine, by conversation affinity, else least load
    affinity      aggregated mode's conversation -> engine table and its choice of engine
    batches       a list of prompts (one flow each) and n > 1 (a decode alone)
    identity      conversation ids from the headers agent tools send
    chatstream    a chat answer as neutral events (whole and streamed alike)
    translated    the ASGI send that renders a chat answer in another API's shape
    rendering     TurnRenderer: the skeleton of the Messages and Responses renderers (one output open at a time)
    responses     POST /v1/responses (responses_in, responses_out, response_store)
    messages      POST /v1/messages (messages_in, messages_out; apishape: Anthropic's error shape)
    passthrough   stateless engine routes (tokenize, embeddings, ...) and /v1/models/{model}
    endpoints     the router's own /health, /stats, /metrics and /v1/models
    app           the ASGI stack and its lifespan
    listener      the client-facing HTTP protocol: head deadline (408), header limits (431), connection cap
    serve         the router's command line (`python -m pdctl.router`, `pdctl router`): options -> config -> uvicorn
"""

from pdctl.router.config import RouterConfig

__all__ = ["RouterConfig"]
