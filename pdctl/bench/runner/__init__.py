"""Running a bench: from command-line values to options (options), its cost before it starts (estimate), the run leg
by leg (run), the engines' figures (collect), side reads of a deployment (probe) and the capacity sweep (capacity).

May import: pdctl.bench.leg, pdctl.bench.traffic, pdctl.bench.results, and the layers below pdctl.bench.
"""
