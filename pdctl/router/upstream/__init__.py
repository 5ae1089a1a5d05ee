"""The engines as the router reaches them: health-checked pools, the HTTP transport, admission, restart detection,
server-sent events. May import the base modules only.

    pools       health-checked P and D pools (generations: which process issued a handle), selection policies
    transport   the fast HTTP transport to the engines
    admission   per-pool bound on requests in flight, a queue with a deadline, 429/503 + Retry-After
    tripwire    one idle connection per decode: its closing says the process died
    sse         whole server-sent events out of an upstream's byte stream
"""
