"""`pdctl bench`: a multi-turn TTFT A/B benchmark. workload -> client -> collect -> report, one leg at a time.

The bench only uses public surfaces: the router's API, its `X-PD-*` headers and `/stats`, and the engines'
`/metrics`, `/tokenize` and logs.
"""
