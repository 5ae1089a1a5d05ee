"""What a valid topology says that pdctl will not do as its writer may expect: said as notes, never errors.

    model.local_dir with engine: sim   the simulator reads no weights and has its own tokenizer, so the directory
                                       is ignored (and may not exist): say so, and where it does not exist here
"""

from __future__ import annotations

from pathlib import Path

from pdctl.topology.model import Topology


def notes(topo: Topology) -> list[str]:
    """One line per thing to say; empty for most topologies."""
    said: list[str] = []
    local = topo.model.local_dir
    if topo.engine == "sim" and local:
        here = all(topo.node(inst.node).transport == "local" for _, _, inst in topo.instances())
        missing = f", and {local} does not exist" if here and not Path(local).expanduser().exists() else ""
        said.append(
            f"model.local_dir {local} is not used with engine: sim{missing}: the simulator reads no weights and "
            "has its own tokenizer (`pdctl tokenizer --out DIR` writes it); with engine: vllm, `up` needs "
            f"{local}/config.json on every engine node"
        )
    return said
