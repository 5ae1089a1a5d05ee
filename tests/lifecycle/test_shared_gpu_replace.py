"""A live change of an engine whose GPU memory a peer holds: vLLM engines sharing a GPU (or one node's engines
talking over UCX cuda_ipc) cannot be replaced one at a time, since the peer keeps the old engine's memory mapped
and the replacement would find too little free. `up` refuses before it stops anything and says what to run;
`--dry-run` says the same. Simulated engines hold no GPU memory: their live replacement goes on.

The decision is pure (a vLLM plan against a faked state and host listing); the refusal is tested on a running
simulated deployment (real processes on loopback) whose topology is then switched to `engine: vllm`, so that
nothing stops and every pid stays the same."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from pdctl.errors import LaunchError
from pdctl.lifecycle import UpOptions, down, up
from pdctl.lifecycle.bringup.decision import decide, gpu_peers, refusal
from pdctl.plan import ProcessSpec, plan
from pdctl.remote.procs import HostProcess
from pdctl.state import DeploymentState, ProcessRecord, StateStore, argv_hash
from pdctl.topology import Topology, load
from tests.conftest import free_port
from tests.lifecycle.conftest import dry_run


def _yaml(name: str, work: Path, engine: str, ports: dict[str, int], decode_gpus: str = "[0]",
          backend: str = "") -> str:
    connector = f"connector: {{backend: {backend}}}\n" if backend else ""
    return f"""name: {name}
engine: {engine}
nodes:
  - {{name: local, address: 127.0.0.1, transport: local, gpus: 2}}
model: {{id: Qwen/Qwen3-32B, served_name: Qwen, max_model_len: 32768, max_num_seqs: 8, block_size: 16,
         gpu_memory_utilization: 0.45}}
prefill:
  - {{node: local, port: {ports['p']}, side_channel_port: {ports['ps']}, gpus: [0]}}
decode:
  - {{node: local, port: {ports['d']}, side_channel_port: {ports['ds']}, gpus: {decode_gpus}}}
router: {{node: local, port: {ports['r']}}}
sim: {{speed: 200, num_blocks: 4000}}
python: {{venv: null}}
work_dir: {work}
{connector}"""


def _ports() -> dict[str, int]:
    return {k: free_port() for k in ("p", "ps", "d", "ds", "r")}


def _running(topo: Topology, changed: Topology) -> tuple[list[ProcessSpec], DeploymentState,
                                                          dict[str, dict[str, list[HostProcess]]]]:
    """`changed`'s plan against a state file and host listing of `topo` running in full."""
    state = DeploymentState(name=topo.name, topology=topo.name)
    live: dict[str, dict[str, list[HostProcess]]] = {"local": {}}
    for pid, spec in enumerate(plan(topo), start=100):
        state.processes[spec.name] = ProcessRecord(spec.name, spec.role, spec.node, spec.host, pid, None,
                                                   spec.log_path, list(spec.ports), spec.url, spec.health_url, 0.0,
                                                   argv_hash(spec))
        live["local"][spec.name] = [HostProcess(pid, pid, "S", spec.name, "local")]
    return plan(changed), state, live


def _load(tmp_path: Path, text: str, overrides: list[str] | None = None) -> Topology:
    path = tmp_path / "topo.yaml"
    path.write_text(text)
    return load(path, overrides or [])


def test_a_prefill_setting_on_a_shared_vllm_gpu_is_held_with_its_peer(tmp_path: Path) -> None:
    text = _yaml("h39live-pure", tmp_path / "work", "vllm", _ports())
    topo = _load(tmp_path, text)
    specs, state, live = _running(topo, _load(tmp_path, text, ["prefill.0.prefix_caching=false"]))
    assert gpu_peers(specs, "vllm") == {
        "prefill-0": {"decode-0": "shares GPU 0 of node `local` with decode-0"},
        "decode-0": {"prefill-0": "shares GPU 0 of node `local` with prefill-0"},
    }
    decision = decide(specs, state, live, engine="vllm")
    assert [s.name for s in decision.replace] == ["prefill-0"]  # the router takes live membership
    assert decision.held == {"prefill-0": "shares GPU 0 of node `local` with decode-0"}
    error = refusal(topo, decision)
    assert error is not None
    assert error.message.startswith("h39live-pure: cannot replace prefill-0 while the deployment runs: prefill-0 "
                                    "shares GPU 0 of node `local` with decode-0. vLLM sizes its KV")
    assert error.message.endswith("Nothing was stopped")
    assert error.hint == (f"restart the deployment: `pdctl up -t {topo.file} --restart` (every engine stops, then "
                          f"starts; each conversation's next turn misses once), or `pdctl down -t {topo.file}` then "
                          f"`pdctl up -t {topo.file}`")

    # a peer that does not run holds nothing: the replacement goes ahead
    del live["local"]["decode-0"]
    assert decide(specs, state, live, engine="vllm").held == {}
    # simulated engines hold no GPU memory: never held
    live["local"]["decode-0"] = [HostProcess(1, 1, "S", "decode-0", "local")]
    assert gpu_peers(specs, "sim") == {} and decide(specs, state, live, engine="sim").held == {}


def test_a_rolling_restart_of_vllm_engines_on_one_node_over_ucx_is_refused(tmp_path: Path) -> None:
    """Different GPUs of one node, KV over UCX: cuda_ipc maps the peer's KV all the same."""
    text = _yaml("h39live-ucx", tmp_path / "work", "vllm", _ports(), decode_gpus="[1]", backend="UCX")
    topo = _load(tmp_path, text)
    specs, state, live = _running(topo, topo)
    assert decide(specs, state, live, engine="vllm").held == {}  # nothing changed: nothing replaced
    decision = decide(specs, state, live, rolling=True, engine="vllm")
    assert decision.held == {"decode-0": "moves KV with prefill-0 over UCX on node `local` (cuda_ipc)",
                             "prefill-0": "moves KV with decode-0 over UCX on node `local` (cuda_ipc)"}
    error = refusal(topo, decision, rolling=True)
    assert error is not None and "without --rolling: `pdctl up -t" in error.hint
    # LIBFABRIC between GPUs of one node maps nothing of the peer's
    libfabric = _load(tmp_path, _yaml("h39live-efa", tmp_path / "work", "vllm", _ports(), decode_gpus="[1]",
                                      backend="LIBFABRIC"))
    assert gpu_peers(plan(libfabric), "vllm") == {}


@pytest.mark.slow
def test_up_refuses_before_anything_stops_and_the_simulator_still_replaces_live(
        tmp_path: Path, pdctl_home: Path, console: Console) -> None:
    name = "h39live-shared"
    ports = _ports()
    sim_file, vllm_file = tmp_path / "sim.yaml", tmp_path / "vllm.yaml"
    sim_file.write_text(_yaml(name, tmp_path / "work", "sim", ports))
    vllm_file.write_text(_yaml(name, tmp_path / "work", "vllm", ports))
    topo = load(sim_file)
    store = StateStore(name)

    def pids() -> dict[str, int]:
        state = store.load()
        assert state is not None
        return {n: r.pid for n, r in state.processes.items()}

    try:
        up(topo, console, UpOptions(smoke=False))
        before = pids()
        change = ["--set", "prefill.0.prefix_caching=false"]

        shown = dry_run(vllm_file, *change, exit_code=1)
        lines = shown.stdout.splitlines()
        assert "  prefill-0: would restart (its argv changed, but not live: it shares GPU 0 of node `local` with " \
               "decode-0; `pdctl up --restart` restarts the deployment)" in lines
        stop = [line for line in lines if line.startswith("up would stop here: ")]
        assert len(stop) == 1 and "cannot replace decode-0, prefill-0 while the deployment runs" in stop[0], lines
        assert stop[0].endswith(f"`up` refuses before it stops anything (restart the deployment: `pdctl up -t "
                                f"{vllm_file} --restart` (every engine stops, then starts; each conversation's next "
                                f"turn misses once), or `pdctl down -t {vllm_file}` then `pdctl up -t {vllm_file}`)")

        with pytest.raises(LaunchError) as refused:
            up(load(vllm_file, [change[1]]), console, UpOptions(smoke=False))
        assert "cannot replace decode-0, prefill-0" in refused.value.message
        assert refused.value.message.endswith("Nothing was stopped")
        assert f"`pdctl down -t {vllm_file}` then `pdctl up -t {vllm_file}`" in refused.value.hint
        assert pids() == before  # refused before anything stopped
        from pdctl.remote.local import LocalTransport

        running = {p.process: p.pid for p in LocalTransport().find_by_marker(name)}
        assert all(running.get(n) == pid for n, pid in before.items()), (running, before)

        # simulated engines on the same GPU: the prefill is replaced live, nothing else restarts
        out = up(load(sim_file, [change[1]]), console, UpOptions(smoke=False))
        assert out.changed == ["prefill-0 replaced"] and out.started == []
        after = pids()
        assert after["prefill-0"] != before["prefill-0"]
        assert {n: after[n] for n in ("decode-0", "router")} == {n: before[n] for n in ("decode-0", "router")}
    finally:
        down(topo, console)


@pytest.mark.slow
def test_a_replacement_that_never_serves_is_stopped_said_and_started_again_by_the_next_up(
        tmp_path: Path, pdctl_home: Path, console: Console) -> None:
    name = "h39live-broken"
    path = tmp_path / "topo.yaml"
    path.write_text(_yaml(name, tmp_path / "work", "sim", _ports()))
    topo = load(path)
    store = StateStore(name)
    try:
        up(topo, console, UpOptions(smoke=False))
        with pytest.raises(LaunchError) as failed:  # a prefill that cannot start: its Python has no home
            up(load(path, ["env.prefill.PYTHONHOME=/nonexistent"]), console, UpOptions(smoke=False))
        assert failed.value.message.startswith(
            "prefill-0's replacement did not become healthy, so it is stopped again (the deployment has no prefill "
            "now: the router answers 503 until one is healthy): prefill-0 on local exited before it served")
        assert "`pdctl up` with the setting fixed (or as it was) starts it again" in failed.value.hint
        state = store.load()
        assert state is not None and sorted(state.processes) == ["decode-0", "router"]
        from pdctl.remote.local import LocalTransport

        assert "prefill-0" not in {p.process for p in LocalTransport().find_by_marker(name)}

        back = up(topo, console)  # as it was: the prefill starts again, and the smoke test goes through it
        assert back.started == ["prefill-0"] and back.smoke is not None and back.smoke.turn2.outcome == "hit"
    finally:
        down(topo, console)
