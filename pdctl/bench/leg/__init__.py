"""One leg of a bench: its topology overrides and endpoints (legs), its (re)deploy through the lifecycle library
(deploy), and the guards that fail it (guards).

May import: pdctl.bench.results, pdctl.bench.traffic, and the layers below pdctl.bench (pdctl.lifecycle included).
"""
