"""The router as an HTTP server: the listener, the ASGI app and its entry steps, the route table, the router's own
endpoints, stateless passthrough, timers and options. May import every router stage below it (api, turn, kv,
upstream) and the base modules (wire, config, errors, jsonx).

    listener    the client-facing HTTP protocol: head deadline (408), header limits (431), connection cap
    app         the ASGI app: each request's entry steps in one callable, the dispatcher and lifespan (the shared
                httpx client, the timers)
    middleware  the entry steps: request id, API key, body limit + JSON (415, 408, depth) + sanitising, HTTP/1.0
    conversation_headers  a conversation id from the headers agent tools send
    anthropic_errors      errors in Anthropic's shape on the routes marked `anthropic`
    routes      the route table: paths, methods, handlers, and what the entry steps read of them
    endpoints   the router's own /health, /stats, /metrics and /v1/models
    passthrough stateless engine routes (tokenize, embeddings, ...) and /v1/models/{model}
    timers      health checks that eject and re-admit upstreams, the handle sweep
    retention   the pin journal opened and earlier routers' pins released at start; the decodes' KV polled
    options     RouterConfig's fields as `router serve` options
"""
