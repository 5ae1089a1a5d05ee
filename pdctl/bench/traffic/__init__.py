"""The load a bench plays: the multi-turn conversations (workload), agent-shaped sessions (agent), the async client
that plays and times them (client), and the player run on the router's node (remote_play).

May import: pdctl.bench.results, and the layers below pdctl.bench.
"""
