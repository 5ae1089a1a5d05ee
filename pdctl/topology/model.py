"""The topology's pydantic schema: one YAML document describing a P/D deployment.

Every field carries its description and default here, in one place (defaults the router shares come from
pdctl.defaults). Reading a file is `topology.file`, the cross-field rules are `topology.checks`; this module
imports neither. A loaded topology is frozen.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator

from pdctl.defaults import (
    UCX_BLOCK_SIZE,
    VLLM_BLOCK_SIZE,
    VLLM_DECODER_KV_BLOCKS_TTL_S,
)
from pdctl.kv_expiry import shortest_ttl
from pdctl.topology.router_section import Router
from pdctl.topology.strict import Strict
from pdctl.topology.strings import (
    Address,
    DottedVersion,
    EnvKey,
    GitRef,
    HostPath,
    InstallerSource,
    ModelId,
    NodeName,
    PackageVersion,
    PipRequirement,
    ServedName,
    Sha256,
    SlurmName,
    SlurmTime,
    SshAlias,
    Text,
    UserName,
    Word,
)

Role = Literal["prefill", "decode"]

SHARED_GPU_LIMIT = 0.95
"""Instances may share a GPU when each sets gpu_memory_utilization and their sum stays below this."""

SHARED_GPU_UCX_ENV = {"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y"}
"""What instances sharing a GPU get over UCX. UCX turns cuda_ipc's get (NIXL READ, vLLM's pull) off when it finds
no active NVLink, so on one GPU the reads fell back to TCP: 0.45 GB/s; with get forced on, 58-62 GB/s for 512 KiB
descriptors and 1.4 TB/s for one large one (docs/results/h200-1gpu/nixl-same-gpu)."""

_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


class Node(Strict):
    name: NodeName = Field(description="Name used by instances and the router to refer to this node.")
    address: Address = Field("127.0.0.1", description="Address other nodes and the CLI use to reach this node.")
    bind: Address | None = Field(
        None, description="Address this node's engines listen on; default: `address` (0.0.0.0 only if you mean "
        "every interface: the engines would then be reachable from anywhere that routes to the node).",
    )
    user: UserName | None = Field(None, description="SSH user; default from ~/.ssh/config or the local user.")
    port: int = Field(22, ge=1, le=65535, description="SSH port.")
    ssh_alias: SshAlias | None = Field(None, description="Host alias in ~/.ssh/config (HostName, ProxyJump...).")
    transport: Literal["ssh", "local"] = Field("ssh", description="How pdctl reaches the node.")
    gpus: int = Field(0, ge=0, description="Number of GPUs on the node (0: not checked).")
    venv: HostPath | None = Field(
        None, description="This node's venv, where it differs from python.venv (default: python.venv)."
    )
    work_dir: HostPath | None = Field(
        None, description="This node's directory for logs, run files and uploads (default: work_dir)."
    )
    slurm_node: SlurmName | None = Field(
        None, description="With `slurm:`, the allocation's host this node runs on (default: the next one in order)."
    )


class Slurm(Strict):
    """Run inside a Slurm allocation: every node is a host of one job, every process an `srun` step."""

    partition: SlurmName | None = Field(None, description="Partition of the holder job (default: the cluster's).")
    nodes: int | None = Field(None, ge=1, description="Hosts to allocate (default: one per topology node).")
    nodelist: list[SlurmName] | None = Field(None, min_length=1, description="Exactly these hosts (sbatch -w).")
    time: SlurmTime | None = Field(None, description="Time limit of the holder job, e.g. 04:00:00.")
    account: SlurmName | None = Field(None, description="Account to charge (sbatch -A).")
    exclusive: bool = Field(True, description="Allocate whole hosts (sbatch --exclusive).")
    gres: SlurmName | None = Field(None, description="Generic resources per host, e.g. gpu:8 (sbatch --gres).")
    gpus_per_node: int | None = Field(None, ge=1, description="GPUs per host (sbatch --gpus-per-node).")
    job_name: SlurmName | None = Field(None, description="Name of the holder job (default: pdctl-<name>).")
    extra_sbatch: list[Text] = Field(default_factory=list, description="More sbatch options, passed as given.")
    jobid: int | None = Field(
        None, ge=1, description="Attach to this running job (salloc/sbatch) instead of submitting one; `down` "
        "then leaves it running.",
    )

    @field_validator("time", mode="before")
    @classmethod
    def _quoted_time(cls, value: object) -> object:
        if isinstance(value, int) and not isinstance(value, bool):
            raise ValueError('quote the time, e.g. time: "04:00:00" '
                             "(YAML reads unquoted hours:minutes:seconds as a number)")
        return value

    def job_name_for(self, deployment: str) -> str:
        return self.job_name or f"pdctl-{deployment}"


class Model(Strict):
    id: ModelId = Field(description="Hugging Face model id, e.g. Qwen/Qwen3-32B.")
    revision: GitRef | None = Field(None, description="Model revision (commit or tag) to pin.")
    served_name: ServedName | None = Field(None, description="Name clients use (--served-model-name); default: id.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field("bfloat16", description="Weights dtype.")
    max_model_len: int = Field(32768, gt=0, description="Longest prompt + output, in tokens.")
    max_num_seqs: int = Field(8, gt=0, description="Most requests an engine runs at once.")
    max_num_batched_tokens: int | None = Field(
        None, gt=0, description="Tokens one engine step computes at most (the chunked-prefill budget); default: "
        "the engine's (vLLM: 8192 on a GPU with >= 70 GiB)."
    )
    block_size: int | None = Field(
        None,
        gt=0,
        description=f"KV block size in tokens; default: {UCX_BLOCK_SIZE} for vLLM over UCX (measured on NVLink: "
        f"docs/results), else the engine's ({VLLM_BLOCK_SIZE}).",
    )
    local_dir: HostPath | None = Field(None, description="Model directory on the nodes; replaces the hub download.")
    load_format: Word | None = Field(None, description="vLLM --load-format, e.g. `dummy` for random weights.")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="vLLM --gpu-memory-utilization.")
    enforce_eager: bool = Field(False, description="vLLM --enforce-eager (no CUDA graphs).")

    @property
    def name(self) -> str:
        return self.served_name or self.id


class ModelOverride(Strict):
    """Per-instance model settings; every field left out takes the topology's `model` value."""

    id: ModelId | None = None
    dtype: Literal["auto", "bfloat16", "float16", "float32"] | None = None
    block_size: int | None = Field(None, gt=0)
    max_num_batched_tokens: int | None = Field(None, gt=0)


class Connector(Strict):
    backend: Literal["LIBFABRIC", "UCX"] = Field("UCX", description="NIXL backend: LIBFABRIC (EFA) or UCX.")
    bidirectional_kv_xfer: bool = Field(True, description="Decode hands its KV back to prefill next turn.")
    kv_recompute_threshold: int = Field(64, ge=0, description="Pull only when at least this many tokens.")
    decoder_kv_blocks_ttl: int = Field(
        VLLM_DECODER_KV_BLOCKS_TTL_S, gt=0, description="Seconds decode keeps a finished turn's blocks."
    )
    kv_lease_duration: int | None = Field(None, gt=0, description="Seconds prefill keeps blocks for decode.")
    kv_buffer_device: Literal["cuda", "cpu"] = Field("cuda", description="Where NIXL registers the KV buffer.")
    kv_load_failure_policy: Literal["fail", "recompute"] = Field("fail", description="On a failed KV read.")
    extra_config: dict[str, Any] = Field(
        default_factory=dict, description="More kv_connector_extra_config keys, passed through."
    )


class ConnectorOverride(Strict):
    """Per-instance connector settings; every field left out takes the topology's `connector` value."""

    bidirectional_kv_xfer: bool | None = None
    kv_recompute_threshold: int | None = Field(None, ge=0)
    decoder_kv_blocks_ttl: int | None = Field(None, gt=0)
    kv_load_failure_policy: Literal["fail", "recompute"] | None = None


class Instance(Strict):
    node: str = Field(description="Node that runs this instance.")
    gpus: list[int] = Field(default_factory=list, description="GPU ids (CUDA_VISIBLE_DEVICES).")
    tp: int = Field(1, ge=1, description="Tensor-parallel size.")
    port: int = Field(ge=1, le=65535, description="HTTP port of the OpenAI-compatible server.")
    side_channel_port: int = Field(5600, ge=1, le=65535, description="NIXL side-channel base port.")
    data_parallel_size: int = Field(1, ge=1, description="Engines behind this server; side channel base+rank.")
    prefix_caching: bool | None = Field(
        None, description="Prefix caching (false: --no-enable-prefix-caching); default: on, on both roles."
    )
    model: ModelOverride | None = Field(None, description="Model settings that differ for this instance.")
    connector: ConnectorOverride | None = Field(None, description="Connector settings for this instance.")

    @field_validator("gpus")
    @classmethod
    def _non_negative(cls, gpus: list[int]) -> list[int]:
        if any(g < 0 for g in gpus):
            raise ValueError("GPU ids are >= 0")
        return gpus


class Efa(Strict):
    required: bool = Field(False, description="Install and check EFA; fail when transfers fall back to TCP.")
    installer_version: DottedVersion | None = Field(None, description="aws-efa-installer version to install.")
    sha256: Sha256 | None = Field(None, description="sha256 of aws-efa-installer-<version>.tar.gz.")
    devices: int = Field(16, ge=1, description="EFA devices expected per node (16 on p5en.48xlarge).")
    installer: InstallerSource | None = Field(
        None,
        description="Installer tarball: a URL fetched on the node, or a file on the CLI's machine that is "
        "uploaded; default: AWS's URL for installer_version.",
    )


class Python(Strict):
    venv: HostPath | None = Field(
        "~/.pdctl/venv", description="Venv on the nodes; null: the CLI's own interpreter (local nodes only)."
    )
    vllm_version: PackageVersion = Field(
        "0.33.0",
        description="vLLM version installed on the nodes. The GPU results ran 0.26.0; 0.33.0 (torch 2.14) has had "
        "only pdctl's compatibility patches checked against its wheel (docs/topology.md).",
    )
    nixl_version: PackageVersion = Field("1.5.1", description="NIXL version installed on the nodes.")
    packages: list[PipRequirement] = Field(
        default_factory=list, description="More requirements to install on the nodes."
    )
    wheelhouse: HostPath | None = Field(None, description="Local wheel directory: install offline from it.")
    system_site_packages: bool = Field(
        False,
        description="Create the venv with --system-site-packages (reuse the image's torch, say); an existing "
        "venv is switched to it.",
    )
    no_deps: bool = Field(
        False,
        description="Install every wheel of python.wheelhouse as it is, with --no-deps: for a verified wheel "
        "set whose metadata pins conflict.",
    )


class Sim(Strict):
    speed: float = Field(1.0, gt=0, description="Simulator time scale: 1 = H200-calibrated, 100 = 100x faster.")
    num_blocks: int = Field(40000, gt=0, description="KV blocks per simulated instance.")
    args: list[Text] = Field(default_factory=list, description="More `pdctl.sim serve` arguments.")


class RoleEnv(Strict):
    all: dict[EnvKey, Text] = Field(default_factory=dict, description="Env for every process.")
    prefill: dict[EnvKey, Text] = Field(default_factory=dict)
    decode: dict[EnvKey, Text] = Field(default_factory=dict)
    router: dict[EnvKey, Text] = Field(default_factory=dict)
    secret: list[EnvKey] = Field(
        default_factory=list,
        description="More env names whose values are secrets, shown as *** everywhere (names like HF_TOKEN, "
        "*_TOKEN, *_KEY, *_SECRET and *PASSWORD* always are).",
    )


class RoleArgs(Strict):
    prefill: list[Text] = Field(default_factory=list, description="Extra engine arguments for prefill.")
    decode: list[Text] = Field(default_factory=list, description="Extra engine arguments for decode.")


class Topology(Strict):
    name: str = Field(description="Deployment name: lowercase letters, digits, dashes.")
    engine: Literal["vllm", "sim"] = Field("vllm", description="vllm on GPUs, or pdctl's simulator.")
    mode: Literal["disaggregated", "aggregated"] = Field(
        "disaggregated",
        description="disaggregated: prefill and decode instances behind the router. aggregated: the baseline a "
        "user would run instead: one engine per decode instance (its node, GPUs and port; `prefill` is not run), "
        "each serving whole requests with prefix caching and no KV connector. With one, clients talk to it "
        "directly; with more, the router forwards each request whole to one of them: a conversation's later "
        "turns to the engine that served its last one, a new conversation to the least loaded.",
    )
    nodes: list[Node] = Field(min_length=1)
    model: Model
    prefill: list[Instance] = Field(min_length=1)
    decode: list[Instance] = Field(min_length=1)
    connector: Connector = Field(default_factory=Connector)
    router: Router
    efa: Efa = Field(default_factory=Efa)
    python: Python = Field(default_factory=Python)
    sim: Sim = Field(default_factory=Sim)
    env: RoleEnv = Field(default_factory=RoleEnv)
    extra_args: RoleArgs = Field(default_factory=RoleArgs)
    work_dir: HostPath = Field("~/.pdctl", description="Per-node directory for logs and run files.")
    hf_home: HostPath | None = Field(None, description="HF_HOME on the nodes (model cache).")
    slurm: Slurm | None = Field(None, description="Run the deployment inside a Slurm allocation (see docs/slurm.md).")
    _source: str | None = PrivateAttr(None)  # the file it was read from, for the commands hints print

    @property
    def file(self) -> str:
        """The topology file as a command line names it (`pdctl down -t FILE`), `<topology>` when not from one."""
        return shlex.quote(self._source) if self._source else "<topology>"

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _NAME.match(name):
            raise ValueError("use lowercase letters, digits and dashes, starting with a letter or digit")
        return name

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def venv_for(self, node: str) -> str | None:
        """The venv pdctl and vLLM run from on `node` (None: the CLI's own interpreter), without a trailing /."""
        venv = self.node(node).venv or self.python.venv
        return venv.rstrip("/") if venv else None

    def work_dir_for(self, node: str) -> str:
        return (self.node(node).work_dir or self.work_dir).rstrip("/")

    def instances(self) -> list[tuple[Role, int, Instance]]:
        """Every engine instance that runs, decodes first (the order they are started in)."""
        if self.mode == "aggregated":
            return [("decode", i, d) for i, d in enumerate(self.decode)]
        return [("decode", i, d) for i, d in enumerate(self.decode)] + [
            ("prefill", i, p) for i, p in enumerate(self.prefill)
        ]

    def has_router(self) -> bool:
        """Whether the router runs: always disaggregated; aggregated only in front of two or more engines."""
        return self.mode != "aggregated" or len(self.decode) > 1

    def model_for(self, inst: Instance) -> Model:
        if inst.model is None:
            return self.model
        return self.model.model_copy(update=inst.model.model_dump(exclude_none=True))

    def connector_for(self, inst: Instance) -> Connector:
        if inst.connector is None:
            return self.connector
        return self.connector.model_copy(update=inst.connector.model_dump(exclude_none=True))

    def decode_kv_ttl(self) -> tuple[int, int]:
        """(index, decoder_kv_blocks_ttl) of the decode that frees a finished turn's blocks first."""
        return shortest_ttl([self.connector_for(d).decoder_kv_blocks_ttl for d in self.decode])

    def block_size_for(self, inst: Instance) -> int:
        """The KV block size the instance runs with: its own, else UCX_BLOCK_SIZE, else vLLM's VLLM_BLOCK_SIZE.

        Over UCX (NVLink), D->P reads cost per descriptor (blocks x layers x 2), not per byte: block size 256 cut
        the median ON TTFT at 24k tokens from 543 to 345 ms on two H200s (docs/results). EFA is not measured yet,
        so it keeps vLLM's.
        """
        size = self.model_for(inst).block_size
        if size is not None:
            return size
        return UCX_BLOCK_SIZE if self._ucx_vllm() else VLLM_BLOCK_SIZE

    def block_size_left_to_vllm(self, inst: Instance) -> bool:
        """Nothing sets this vLLM engine's block size: it runs vLLM's default and the plan passes no --block-size."""
        return self.engine == "vllm" and self.model_for(inst).block_size is None and not self._ucx_vllm()

    def _ucx_vllm(self) -> bool:
        return self.engine == "vllm" and self.connector.backend == "UCX"

    def prefix_caching_for(self, inst: Instance) -> bool:
        """On unless the instance turns it off. On a prefill it computes only a cold turn's task tokens behind the
        shared system prompt, and reads back only the blocks it lacks (docs/results/sim-capacity, run E)."""
        if self.mode == "aggregated":
            return True
        return inst.prefix_caching is not False

    def shared_gpus(self) -> dict[tuple[str, int], list[str]]:
        """(node, GPU id) -> the instances that run on it, for GPUs given to more than one running instance."""
        owners: dict[tuple[str, int], list[str]] = {}
        for role, i, inst in self.instances():
            for gpu in inst.gpus:
                owners.setdefault((inst.node, gpu), []).append(f"{role}[{i}]")
        return {key: names for key, names in owners.items() if len(names) > 1}

    def shares_gpu(self, role: Role, i: int) -> bool:
        return any(f"{role}[{i}]" in names for names in self.shared_gpus().values())

