"""Facts about the NVIDIA GPUs, the driver and the processes on them: the only place pdctl runs `nvidia-smi`."""

from __future__ import annotations

from dataclasses import dataclass

from pdctl.facts.base import Fact, HostLayout

QUERY = "index,name,pci.bus_id,memory.total,driver_version"


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    bus_id: str
    memory_mib: int
    driver: str


@dataclass(frozen=True)
class Gpus:
    gpus: list[Gpu]
    error: str | None = None

    @property
    def driver(self) -> str | None:
        return self.gpus[0].driver if self.gpus else None


class NvidiaSmi(Fact[Gpus]):
    """Every GPU with its name, PCI bus id, memory and driver version; `error` carries nvidia-smi's complaint."""

    name = "gpu.NvidiaSmi"
    result = Gpus
    requires_command = "nvidia-smi"

    def command(self, layout: HostLayout) -> str:
        return f"nvidia-smi --query-gpu={QUERY} --format=csv,noheader"

    def process(self, lines: list[str]) -> Gpus:
        gpus: list[Gpu] = []
        other: list[str] = []
        for line in lines:
            cols = [c.strip() for c in line.split(",")]
            if len(cols) == 5 and cols[0].isdigit():
                memory = cols[3].removesuffix("MiB").strip()
                gpus.append(Gpu(int(cols[0]), cols[1], cols[2], int(memory) if memory.isdigit() else 0, cols[4]))
            elif line.strip():
                other.append(line.strip())
        return Gpus(gpus, " ".join(other) or None if not gpus else None)

    def default(self) -> Gpus:
        return Gpus([], "nvidia-smi not found (no NVIDIA driver installed)")


@dataclass(frozen=True)
class GpuMemoryUse:
    index: int
    total_mib: int
    used_mib: int
    free_mib: int


class GpuMemory(Fact[list[GpuMemoryUse]]):
    """Memory of every GPU right now (MiB): what `doctor` weighs the instances' gpu_memory_utilization against, and
    what `down` compares with the reading `up` took before starting anything."""

    name = "gpu.GpuMemory"
    result = list[GpuMemoryUse]
    requires_command = "nvidia-smi"

    def command(self, layout: HostLayout) -> str:
        return "nvidia-smi --query-gpu=index,memory.total,memory.used,memory.free --format=csv,noheader,nounits"

    def process(self, lines: list[str]) -> list[GpuMemoryUse]:
        found: list[GpuMemoryUse] = []
        for line in lines:
            cols = [c.strip() for c in line.split(",")]
            if len(cols) == 4 and all(c.isdigit() for c in cols):
                found.append(GpuMemoryUse(*(int(c) for c in cols)))
        return found

    def default(self) -> list[GpuMemoryUse]:
        return []


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_mib: int | None
    """None where the driver does not say (`[N/A]`: MIG instances, some containers)."""


class GpuProcesses(Fact[list[GpuProcess]]):
    """Every process holding GPU memory right now: what `status` sums per process and `down` proves gone."""

    name = "gpu.GpuProcesses"
    result = list[GpuProcess]
    requires_command = "nvidia-smi"

    def command(self, layout: HostLayout) -> str:
        return "nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits"

    def process(self, lines: list[str]) -> list[GpuProcess]:
        found: list[GpuProcess] = []
        for line in lines:
            cols = [c.strip() for c in line.split(",")]
            if len(cols) == 2 and cols[0].isdigit():
                found.append(GpuProcess(int(cols[0]), int(cols[1]) if cols[1].isdigit() else None))
        return found

    def default(self) -> list[GpuProcess]:
        return []
