"""What a bench produces and what is computed from it: the records (records), their aggregations (stats), the path
each leg measured (paths) and where a warm turn's TTFT goes (stages).

May import: the layers below pdctl.bench, nothing else of pdctl.bench.
"""
