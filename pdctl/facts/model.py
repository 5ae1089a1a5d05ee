"""Facts about the model weights on a node: a local directory, or a snapshot in the Hugging Face cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pdctl.facts.base import Fact, HostLayout, path

DEFAULT_HF_HOME = "~/.cache/huggingface"


@dataclass(frozen=True)
class Snapshot:
    present: bool
    path: str | None = None
    files: int = 0


def hub_dir(hf_home: str, model_id: str) -> str:
    return f"{hf_home.rstrip('/')}/hub/models--{model_id.replace('/', '--')}"


@dataclass(frozen=True)
class ModelSnapshot(Fact[Snapshot]):
    """Whether the weights are there: `local_dir/config.json`, or the hub snapshot of `revision` (or main).

    A revision that names a branch or tag is resolved through the cache's `refs/` as `hf download` writes it.
    """

    model_id: str
    revision: str | None = None
    hf_home: str | None = None
    local_dir: str | None = None
    name: ClassVar[str] = "model.ModelSnapshot"
    result: ClassVar[object] = Snapshot

    def command(self, layout: HostLayout) -> str:
        if self.local_dir:
            d = path(self.local_dir.rstrip("/"))
            return f'd={d}; if [ -f "$d/config.json" ]; then echo "present $d $(ls "$d" | wc -l)"; fi'
        repo = path(hub_dir(self.hf_home or DEFAULT_HF_HOME, self.model_id))
        rev = path(self.revision or "main")
        return (
            f"r={repo}; rev={rev}; "
            'if [ -f "$r/refs/$rev" ]; then rev=$(cat "$r/refs/$rev"); fi; '
            'd="$r/snapshots/$rev"; '
            'if [ -f "$d/config.json" ]; then echo "present $d $(ls "$d" | wc -l)"; fi'
        )

    def process(self, lines: list[str]) -> Snapshot:
        for line in lines:
            if line.startswith("present "):
                rest, _, count = line[len("present ") :].rpartition(" ")
                return Snapshot(True, rest, int(count) if count.strip().isdigit() else 0)
        return Snapshot(False)

    def default(self) -> Snapshot:
        return Snapshot(False)
