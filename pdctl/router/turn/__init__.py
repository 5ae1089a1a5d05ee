"""One conversation turn, stage by stage (pipeline.py reads it top to bottom), and what it carries: the request's
context, the router's state and its counters. May import kv, upstream and the base modules; never api or server.

    pipeline      the turn: request -> placement -> handle -> verification -> prefill hop -> decode hop -> keep
    request       what is refused before any engine, whose conversation it is, admission
    overflow      placement: whole on a prefill when the decode is short of KV (router.overflow_kv)
    local         placement: on the decode that holds the conversation, alone (conditional disaggregation)
    placement     the local/prefill policies and the load they weigh
    history       what a handle's decode last ran, and a bound on what a request adds to it
    verification  what the turn does with its handle (verify: the prefix rules; /tokenize)
    prefill       the prefill hop, retried as a miss
    decode        the decode hop: stream through, capture the new handle, strip internals (capture)
    keep          the decode's answer becomes the conversation's next handle
    aggregated    --mode aggregated: each turn whole on one engine (whole: the forwarding it shares with overflow)
    disconnect    a turn's upstream work is cancelled when its client leaves
    context       RequestContext: one request's own data, created at the entry and handed down
    state         RouterState: everything one router instance holds
    metrics       Prometheus metrics and the /stats counters
"""
