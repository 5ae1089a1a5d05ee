"""Pure: a validated Topology -> the ordered processes to run (decodes, prefills, then the router).

No I/O here. Paths may start with `~/`; the transport expands them on the host.
`vllm` and `sim` engines differ only in argv; both read the same NIXL environment variables and
`--kv-transfer-config` JSON.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pdctl.defaults import (
    ITL_SLO_MS,
    LOCAL_BUSY_STREAMS,
    LOCAL_POLICY,
    LOCAL_PREFILL_TOKENS,
    LOCAL_STALL_RATIO,
    MIN_READ_TOKENS,
    OVERFLOW_KV,
    PIN_BUDGET_FRACTION,
    PIN_BUDGET_TOKENS,
    RETAIN_HIGH_KV,
    RETAIN_TARGET_KV,
    VERIFY_AT,
    VERIFY_PREFIX,
)
from pdctl.markers import MARKER
from pdctl.secret import EnvValue, mark, shown
from pdctl.topology import SHARED_GPU_UCX_ENV, Instance, Role, Topology

ProcessRole = Literal["prefill", "decode", "router", "lb"]


@dataclass(frozen=True)
class ProcessSpec:
    """One process of a deployment, with everything needed to start, find, check and stop it."""

    name: str
    role: ProcessRole
    node: str
    host: str
    argv: tuple[str, ...]
    env: dict[str, EnvValue]
    workdir: str
    log_path: str
    health_url: str
    url: str
    ports: tuple[int, ...]
    gpus: tuple[int, ...] = field(default=())
    secret_env: dict[str, str] = field(default_factory=dict)
    """Environment variables read from a file on the node when the process starts (name -> path): the value is
    never part of the plan."""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["argv"] = list(self.argv)
        data["ports"] = list(self.ports)
        data["gpus"] = list(self.gpus)
        data["env"] = {k: shown(v) for k, v in self.env.items()}
        return data


ENGINE_KEY_VAR = "VLLM_API_KEY"
DEV_MODE_VAR = "VLLM_SERVER_DEV_MODE"
# usage.prompt_tokens_details.cached_tokens in every answer: the router reports the prefill's to clients.
TOKENS_DETAILS_FLAG = "--enable-prompt-tokens-details"


def engine_key_path(topo: Topology, node: str) -> str:
    """Where the deployment's engine API key lives on `node` (mode 0600; written by `up`, never printed)."""
    return f"{run_dir(topo, node)}/engine.key"


def members_path(topo: Topology, node: str | None = None) -> str:
    """The routers' members file on a router's node (pdctl.router.upstream.members): `up` rewrites it and sends
    SIGHUP when prefill or decode instances come or go, so a membership change restarts no router."""
    return f"{run_dir(topo, node or topo.router.node)}/router-members.json"


def lb_config_path(topo: Topology) -> str:
    """HAProxy's configuration on the router node (`router.replicas` > 1), written by `up`."""
    return f"{run_dir(topo, topo.router.node)}/haproxy.cfg"


def lb_socket_path(topo: Topology) -> str:
    """HAProxy's admin socket (mode 0600): how `up` drains one router for a rolling restart."""
    return f"{run_dir(topo, topo.router.node)}/haproxy.sock"


MEMBER_FLAGS = ("--prefill", "--decode")


def without_members(argv: tuple[str, ...]) -> tuple[str, ...]:
    """A router's argv less its --prefill/--decode URLs: what a membership change leaves alone."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a in MEMBER_FLAGS:
            skip = True
        else:
            out.append(a)
    return tuple(out)


def engine_bind(topo: Topology, node: str) -> str:
    n = topo.node(node)
    return n.bind or n.address


def plan(topo: Topology, self_python: str = sys.executable) -> list[ProcessSpec]:
    """Every process of the deployment, in start order. `self_python` runs pdctl where python.venv is null.

    `mode: aggregated` is one engine per decode instance (`aggregated-<i>`): one alone takes the clients itself, no
    router; two or more sit behind the router in its aggregated mode.
    """
    specs = [_engine(topo, role, i, inst, self_python) for role, i, inst in topo.instances()]
    if not topo.has_router():
        return specs
    build = _router if topo.mode != "aggregated" else _aggregated_router
    places = topo.router.replica_places()
    if not places:
        return [*specs, build(topo, specs, self_python, Place("router", topo.router.node, topo.router.port))]
    routers = [build(topo, specs, self_python, Place(f"router-{i}", n, p)) for i, (n, p) in enumerate(places)]
    return [*specs, *routers, _lb(topo)]


@dataclass(frozen=True)
class Place:
    """Where one router runs: its process name, node and port."""

    name: str
    node: str
    port: int


def entry(specs: list[ProcessSpec]) -> ProcessSpec:
    """The process clients talk to: the load balancer, else the router, else the aggregated engine."""
    return next((s for s in specs if s.role == "lb"), next((s for s in specs if s.role == "router"), specs[0]))


def run_dir(topo: Topology, node: str | None = None) -> str:
    """The deployment's directory on `node` (its `work_dir`, else the topology's)."""
    work = topo.work_dir_for(node) if node else topo.work_dir.rstrip("/")
    return f"{work}/{topo.name}"


def python_for(topo: Topology, self_python: str = sys.executable, node: str | None = None) -> str:
    """The interpreter that runs pdctl on `node`: its venv's (nodes[].venv, else python.venv) or `self_python`."""
    venv = topo.venv_for(node) if node else topo.python.venv
    return f"{venv.rstrip('/')}/bin/python" if venv else self_python


def secret_names(topo: Topology) -> list[str]:
    """Env names whose values are masked beyond those named like secrets: `env.secret`, the router's key."""
    return [*topo.env.secret, *([topo.router.api_key_env] if topo.router.api_key_env else [])]


def kv_transfer_config(topo: Topology, role: Role, inst: Instance) -> dict[str, Any]:
    conn = topo.connector_for(inst)
    extra: dict[str, Any] = {
        "backends": [conn.backend],
        "kv_recompute_threshold": conn.kv_recompute_threshold,
        "decoder_kv_blocks_ttl": conn.decoder_kv_blocks_ttl,
        "bidirectional_kv_xfer": conn.bidirectional_kv_xfer,
    }
    if conn.kv_lease_duration is not None:
        extra["kv_lease_duration"] = conn.kv_lease_duration
    extra.update(conn.extra_config)
    return {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
        "kv_buffer_device": conn.kv_buffer_device,
        "kv_load_failure_policy": conn.kv_load_failure_policy,
        "kv_connector_extra_config": extra,
    }


def _engine(topo: Topology, role: Role, i: int, inst: Instance, self_python: str) -> ProcessSpec:
    node = topo.node(inst.node)
    aggregated = topo.mode == "aggregated"
    name = f"aggregated-{i}" if aggregated else f"{role}-{i}"
    env = {
        **topo.env.all,
        MARKER: topo.name,
        "PYTHONUNBUFFERED": "1",
        # Also the address peers are told to dial, so always the node's own, whatever `bind` says.
        "VLLM_NIXL_SIDE_CHANNEL_HOST": node.address,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(inst.side_channel_port),
    }
    if inst.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in inst.gpus)
    if topo.engine == "vllm":
        if topo.connector.backend == "LIBFABRIC":
            env["FI_PROVIDER"] = "efa"
        else:
            env.setdefault("UCX_NET_DEVICES", "all")
            if topo.shares_gpu(role, i):
                for key, value in SHARED_GPU_UCX_ENV.items():
                    env.setdefault(key, value)
        if topo.efa.required:
            env["NIXL_LOG_LEVEL"] = "DEBUG"
        if topo.hf_home:
            env["HF_HOME"] = topo.hf_home
        # Serves POST /reset_prefix_cache, which the router's own route of that name calls on every engine.
        env[DEV_MODE_VAR] = "1"
    env.update(getattr(topo.env, role))
    secret_env: dict[str, str] = {}
    if not topo.has_router():
        # The one engine is where clients connect, so it takes the clients' key (router.api_key_env), not the
        # deployment's engine key, which only the router and pdctl hold.
        client_key_env = topo.router.api_key_env
        router_env = {**topo.env.all, **topo.env.router}
        if client_key_env and router_env.get(client_key_env):
            env[ENGINE_KEY_VAR] = router_env[client_key_env]
    else:
        # VLLM_API_KEY, not --api-key: argv is visible to every user of the node and is part of the plan.
        secret_env[ENGINE_KEY_VAR] = engine_key_path(topo, node.name)
    marked = mark(env, secret_names(topo))
    argv = _vllm_argv(topo, role, inst) if topo.engine == "vllm" else _sim_argv(topo, role, inst, self_python)
    side = tuple(inst.side_channel_port + r for r in range(inst.data_parallel_size))
    url = f"http://{node.address}:{inst.port}"
    return ProcessSpec(
        name=name,
        role=role,
        node=node.name,
        host=node.address,
        argv=tuple(argv),
        env=marked,
        workdir=run_dir(topo, node.name),
        log_path=f"{run_dir(topo, node.name)}/logs/{name}.log",
        health_url=f"{url}/health",
        url=url,
        ports=(inst.port, *side),
        gpus=tuple(inst.gpus),
        secret_env=secret_env,
    )


def _model_args(topo: Topology, inst: Instance) -> list[str]:
    model = topo.model_for(inst)
    return ["--served-model-name", model.name, "--dtype", model.dtype]


def _vllm_argv(topo: Topology, role: Role, inst: Instance) -> list[str]:
    model = topo.model_for(inst)
    venv = topo.venv_for(inst.node)
    vllm = f"{venv}/bin/vllm" if venv else "vllm"
    argv = [vllm, "serve", model.local_dir or model.id, *_model_args(topo, inst)]
    argv += ["--tensor-parallel-size", str(inst.tp)]
    if inst.data_parallel_size > 1:
        argv += ["--data-parallel-size", str(inst.data_parallel_size)]
    argv += ["--max-model-len", str(model.max_model_len), "--max-num-seqs", str(model.max_num_seqs)]
    if model.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(model.max_num_batched_tokens)]
    if not topo.prefix_caching_for(inst):
        argv.append("--no-enable-prefix-caching")
    argv += _details(getattr(topo.extra_args, role))
    argv += ["--host", engine_bind(topo, inst.node), "--port", str(inst.port)]
    if topo.mode != "aggregated":
        argv += ["--kv-transfer-config", json.dumps(kv_transfer_config(topo, role, inst), separators=(",", ":"))]
    if not topo.block_size_left_to_vllm(inst):
        argv += ["--block-size", str(topo.block_size_for(inst))]
    if model.revision and not model.local_dir:
        argv += ["--revision", model.revision]
    if model.load_format:
        argv += ["--load-format", model.load_format]
    if model.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", f"{model.gpu_memory_utilization:g}"]
    if model.enforce_eager:
        argv.append("--enforce-eager")
    extra: list[str] = getattr(topo.extra_args, role)
    return argv + extra


def _details(extra: list[str]) -> list[str]:
    return [] if TOKENS_DETAILS_FLAG in extra else [TOKENS_DETAILS_FLAG]


def _sim_argv(topo: Topology, role: Role, inst: Instance, self_python: str) -> list[str]:
    model = topo.model_for(inst)
    node = topo.node(inst.node)
    argv = [python_for(topo, self_python, node.name), "-m", "pdctl.sim", "serve", model.id, "--role", role]
    argv += ["--host", engine_bind(topo, node.name), "--port", str(inst.port), *_model_args(topo, inst)]
    argv += ["--max-model-len", str(model.max_model_len), "--max-num-seqs", str(model.max_num_seqs)]
    if model.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(model.max_num_batched_tokens)]
    argv += ["--block-size", str(topo.block_size_for(inst)), "--num-gpu-blocks", str(topo.sim.num_blocks)]
    if not topo.prefix_caching_for(inst):
        argv.append("--no-enable-prefix-caching")
    argv += _details([*topo.sim.args, *getattr(topo.extra_args, role)])
    if topo.mode != "aggregated":
        argv += ["--kv-transfer-config", json.dumps(kv_transfer_config(topo, role, inst), separators=(",", ":"))]
    argv += ["--speed", f"{topo.sim.speed:g}", *topo.sim.args]
    extra: list[str] = getattr(topo.extra_args, role)
    return argv + extra


def _aggregated_router(topo: Topology, engines: list[ProcessSpec], self_python: str, at: Place) -> ProcessSpec:
    """The router in front of aggregated engines: whole requests and no handles, so none of the KV knobs."""
    node = topo.node(at.node)
    argv = [python_for(topo, self_python, node.name), "-m", "pdctl.router", "serve"]
    argv += ["--host", _router_bind(topo, at), "--port", str(at.port), "--mode", "aggregated"]
    argv += [a for e in engines for a in ("--decode", e.url)]
    argv += ["--model", topo.model.name]
    return _router_spec(topo, argv + _tracing(topo) + _client_side(topo, at), at)


def _router_bind(topo: Topology, at: Place) -> str:
    """`router.bind` is where clients connect: the one router's, or the load balancer's in front of several."""
    node = topo.node(at.node)
    if topo.router.replicas > 1:
        return node.bind or node.address
    return topo.router.bind or node.address


def _router(topo: Topology, engines: list[ProcessSpec], self_python: str, at: Place) -> ProcessSpec:
    node = topo.node(at.node)
    r = topo.router
    argv = [python_for(topo, self_python, node.name), "-m", "pdctl.router", "serve"]
    argv += ["--host", _router_bind(topo, at), "--port", str(at.port)]
    argv += [a for e in engines if e.role == "prefill" for a in ("--prefill", e.url)]
    argv += [a for e in engines if e.role == "decode" for a in ("--decode", e.url)]
    _, ttl = topo.decode_kv_ttl()
    argv += ["--handle-ttl", f"{r.handle_ttl:g}", "--decoder-kv-blocks-ttl", str(ttl)]
    argv += ["--block-size", str(topo.block_size_for(topo.decode[0])), "--model", topo.model.name]
    # Left out where the topology holds the router's own default (both take it from pdctl.defaults).
    if r.verify_prefix != VERIFY_PREFIX:
        argv.append("--verify-prefix" if r.verify_prefix else "--no-verify-prefix")
    if r.verify_prefix and r.verify_at != VERIFY_AT:
        argv += ["--verify-at", r.verify_at]
    if r.verify_prefix and r.min_read_tokens != MIN_READ_TOKENS:
        argv += ["--min-read-tokens", str(r.min_read_tokens)]
    if r.local_prefill_tokens != LOCAL_PREFILL_TOKENS:
        argv += ["--local-prefill-tokens", str(r.local_prefill_tokens)]
    if r.local_prefill_tokens and (r.local_policy, r.local_busy_streams) != (LOCAL_POLICY, LOCAL_BUSY_STREAMS):
        argv += ["--local-policy", r.local_policy, "--local-busy-streams", str(r.local_busy_streams)]
    itl_slo_ms = router_itl_slo_ms(topo)
    if r.local_prefill_tokens and itl_slo_ms != ITL_SLO_MS:
        argv += ["--itl-slo-ms", f"{itl_slo_ms:g}"]
    if r.local_prefill_tokens and r.local_stall_ratio != LOCAL_STALL_RATIO:
        argv += ["--local-stall-ratio", f"{r.local_stall_ratio:g}"]
    budget = decode_batch_tokens(topo)
    if r.local_prefill_tokens and budget:
        argv += ["--decode-batch-tokens", str(budget)]
    if not r.release:
        argv.append("--no-release")
    elif r.pin_budget_tokens != PIN_BUDGET_TOKENS:
        argv += ["--pin-budget-tokens", str(r.pin_budget_tokens)]
    elif r.pin_budget_fraction != PIN_BUDGET_FRACTION:
        argv += ["--pin-budget-fraction", f"{r.pin_budget_fraction:g}"]
    if (r.overflow_kv or 0.0) != OVERFLOW_KV:
        argv += ["--overflow-kv", f"{r.overflow_kv or 0.0:g}"]
    if r.release and (r.retain_high_kv, r.retain_target_kv) != (RETAIN_HIGH_KV, RETAIN_TARGET_KV):
        argv += ["--retain-high-kv", f"{r.retain_high_kv:g}", "--retain-target-kv", f"{r.retain_target_kv:g}"]
    argv += ["--members-file", members_path(topo, at.node)]
    if r.release:  # the routers' pin journals (pdctl.router.kv.journal): a restarted one releases what they left
        argv += ["--state-dir", run_dir(topo, at.node)]
    return _router_spec(topo, argv + _tracing(topo) + _client_side(topo, at), at)


def router_itl_slo_ms(topo: Topology) -> float:
    """The router's ITL budget on its own clock. router.itl_slo_ms is the engines' time (on simulated engines,
    modelled time, the time the bench reports); the router measures the decode's steps in wall time, which a
    simulator at sim.speed runs `speed` times faster: its budget is itl_slo_ms / speed, so that its check of a
    local prefill's stall and the ITL the bench measures use one clock (speed inf: no delays, nothing to scale)."""
    speed = topo.sim.speed if topo.engine == "sim" else 1.0
    return topo.router.itl_slo_ms / speed if math.isfinite(speed) else topo.router.itl_slo_ms


def decode_batch_tokens(topo: Topology) -> int:
    """The decodes' smallest max_num_batched_tokens where every decode sets one (the router's
    --decode-batch-tokens: how a local turn's prompt is chunked); 0 where one takes the engine's default."""
    budgets = [topo.model_for(d).max_num_batched_tokens for d in topo.decode]
    return min(b for b in budgets if b is not None) if budgets and None not in budgets else 0


def _tracing(topo: Topology) -> list[str]:
    """The router's OTLP exporter (router.otlp_endpoint), in either mode."""
    r = topo.router
    return ["--otlp-endpoint", r.otlp_endpoint] if r.otlp_endpoint else []


def _client_side(topo: Topology, at: Place) -> list[str]:
    """The router arguments of either mode about its clients and its key to the engines."""
    r = topo.router
    argv = ["--api-key-env", r.api_key_env] if r.api_key_env else []
    for name in r.conversation_headers or ():
        argv += ["--conversation-header", name]
    return [*argv, "--engine-key-file", engine_key_path(topo, at.node)]


def _router_spec(topo: Topology, argv: list[str], at: Place) -> ProcessSpec:
    node = topo.node(at.node)
    env = {**topo.env.all, MARKER: topo.name, "PYTHONUNBUFFERED": "1", **topo.env.router}
    url = f"http://{node.address}:{at.port}"
    return ProcessSpec(
        name=at.name,
        role="router",
        node=node.name,
        host=node.address,
        argv=tuple(argv),
        env=mark(env, secret_names(topo)),
        workdir=run_dir(topo, node.name),
        log_path=f"{run_dir(topo, node.name)}/logs/{at.name}.log",
        health_url=f"{url}/health",
        url=url,
        ports=(at.port,),
    )


def _lb(topo: Topology) -> ProcessSpec:
    """HAProxy in front of the routers: master-worker (`-W`) in the foreground (`-db`), so pdctl's pid is the
    master's, which a SIGUSR2 reloads (a new config, new worker; the old one finishes what it holds); its stdout
    is its log. `up` writes its config (pdctl.lb_config) first; it carries the deployment's marker like every
    other process, and no key."""
    r = topo.router
    node = topo.node(r.node)
    url = f"http://{node.address}:{r.port}"
    return ProcessSpec(
        name="lb",
        role="lb",
        node=node.name,
        host=node.address,
        argv=(r.lb_binary, "-W", "-db", "-f", lb_config_path(topo)),
        env={MARKER: topo.name},
        workdir=run_dir(topo, node.name),
        log_path=f"{run_dir(topo, node.name)}/logs/lb.log",
        health_url=f"{url}/health",
        url=url,
        ports=(r.port,),
    )
