"""The deployment's state file on the CLI machine: `$PDCTL_HOME/deployments/<name>.json`.

Every started process is recorded the moment it starts (so an interrupted `up` can be taken down), and every
write is atomic (tempfile + os.replace), so a crash never leaves half a file. Losing the file loses nothing
essential: `down` also finds processes by their environment marker.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pdctl.errors import StateError
from pdctl.plan import ProcessSpec, without_members
from pdctl.secret import reveal

VERSION = 1


def pdctl_home() -> Path:
    return Path(os.environ.get("PDCTL_HOME") or Path.home() / ".pdctl")


def state_path(name: str) -> Path:
    return pdctl_home() / "deployments" / f"{name}.json"


def argv_hash(spec: ProcessSpec) -> str:
    """Identity of what a process runs: argv and environment; a change means it must be restarted. A router's
    members are left out: they change through its members file, without a restart
    (pdctl.lifecycle.changes.membership)."""
    env = sorted((k, reveal(v)) for k, v in spec.env.items())  # a new token restarts; only a hash is kept
    argv = without_members(spec.argv) if spec.role == "router" and "--members-file" in spec.argv else spec.argv
    data = json.dumps([list(argv), env], separators=(",", ":"))
    return hashlib.sha256(data.encode()).hexdigest()[:16]


@dataclass
class ProcessRecord:
    name: str
    role: str
    node: str
    host: str
    pid: int
    unit: str | None
    log_path: str
    ports: list[int]
    url: str
    health_url: str
    started_at: float
    argv_hash: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessRecord:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


@dataclass
class DeploymentState:
    name: str
    topology: str = ""
    created_at: float = field(default_factory=time.time)
    processes: dict[str, ProcessRecord] = field(default_factory=dict)
    router_url: str | None = None
    smoke: dict[str, Any] | None = None
    gpu_memory_before: dict[str, dict[str, int]] | None = None  # node -> GPU id -> MiB used before `up` started
    slurm: dict[str, Any] | None = None
    """`{"jobid": J, "submitted": bool}`: the Slurm job the deployment runs in, and whether `up` submitted it."""
    version: int = VERSION

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["processes"] = {k: asdict(v) for k, v in self.processes.items()}
        return data


def _parse(raw: bytes) -> DeploymentState:
    data = json.loads(raw.decode("utf-8"))
    if not isinstance(data, dict):
        raise TypeError(f"the document is a {type(data).__name__}, not an object")
    procs = data.pop("processes", {})
    if not isinstance(procs, dict) or not all(isinstance(v, dict) for v in procs.values()):
        raise TypeError("`processes` is not an object of process records")
    records = {str(k): ProcessRecord.from_json(v) for k, v in procs.items()}
    fields = set(DeploymentState.__dataclass_fields__) - {"processes"}
    state = DeploymentState(**{k: v for k, v in data.items() if k in fields}, processes=records)
    if not isinstance(state.name, str) or not all(_well_typed(r) for r in records.values()):
        raise TypeError("a process record has a field of the wrong type")
    return state


def _well_typed(r: ProcessRecord) -> bool:
    texts = (r.name, r.role, r.node, r.host, r.log_path, r.url, r.health_url, r.argv_hash)
    return (
        all(isinstance(t, str) for t in texts) and isinstance(r.pid, int) and not isinstance(r.pid, bool)
        and (r.unit is None or isinstance(r.unit, str)) and isinstance(r.ports, list)
        and all(isinstance(p, int) for p in r.ports)
    )


class StateStore:
    """Reads and atomically rewrites one deployment's state; safe to record from several threads."""

    def __init__(self, name: str, path: Path | None = None) -> None:
        self.path = path or state_path(name)
        self.name = name
        self._lock = threading.Lock()

    def load(self) -> DeploymentState | None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            raise StateError(
                f"{self.path} is a directory, not a pdctl state file",
                hint=f"remove it (`rm -r {self.path}`); `pdctl down` still finds the processes of {self.name} "
                "by their marker",
            ) from None
        except OSError as exc:
            raise StateError(f"cannot read {self.path}: {exc}") from None
        try:
            return _parse(raw)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:  # UnicodeDecodeError is a ValueError
            raise StateError(
                f"{self.path} is not a pdctl state file ({type(exc).__name__}: {str(exc)[:200]})",
                hint=f"move it away; `pdctl down` still finds the processes of {self.name} by their marker",
            ) from None

    def save(self, state: DeploymentState) -> None:
        with self._lock:
            self._write(state)

    def record(self, state: DeploymentState, record: ProcessRecord) -> None:
        with self._lock:
            state.processes[record.name] = record
            self._write(state)

    def forget(self, state: DeploymentState, name: str) -> None:
        with self._lock:
            state.processes.pop(name, None)
            self._write(state)

    def delete(self) -> None:
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:  # a directory, or a read-only deployments directory
            raise StateError(
                f"cannot remove {self.path}: {exc.strerror}",
                hint=f"remove it by hand (`rm -r {self.path}`)",
            ) from None

    def _write(self, state: DeploymentState) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(state.to_json(), fh, indent=2)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
