"""The environment variables that tag a process as one of a deployment's: how `down` finds it without state.

The plan sets `MARKER` for every process; launch adds the node and process names. Children inherit all three.
"""

from __future__ import annotations

MARKER = "PDCTL_DEPLOYMENT"
NODE_VAR = "PDCTL_NODE"
PROCESS_VAR = "PDCTL_PROCESS"
