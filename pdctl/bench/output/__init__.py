"""A bench's output: the report directory (report), its plots (plots), the terminal summary (render) and progress
(progress).

May import: pdctl.bench.runner, pdctl.bench.leg, pdctl.bench.traffic, pdctl.bench.results, and the layers below
pdctl.bench.
"""
