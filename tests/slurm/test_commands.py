"""The `slurm:` block without a cluster: validation with file:line, and what `pdctl plan` shows."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdctl.cli import app
from tests.lifecycle.conftest import topology_yaml

runner = CliRunner()


def _write(tmp_path: Path, slurm: str, nodes: list[dict[str, object]] | None = None) -> Path:
    name = f"sl-{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.yaml"
    nodes = nodes or [{"name": n} for n in ("p", "d", "r")]
    path.write_text(topology_yaml(name, tmp_path / "work", nodes=nodes, placement=("p", "d", "r"),
                                  extra_yaml=f"slurm: {slurm}\n"))
    return path


def _line(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_plan_shows_the_sbatch_line_and_each_srun_line(tmp_path: Path) -> None:
    topo = _write(tmp_path, '{partition: gpu, nodelist: [n1, n2, n3], time: "04:00:00", account: lab, '
                  'gpus_per_node: 8, extra_sbatch: ["--qos=high"]}')
    name = topo.stem
    res = runner.invoke(app, ["plan", "-t", str(topo)])
    assert res.exit_code == 0, res.output
    assert f"sbatch --parsable --job-name pdctl-{name} --nodes 3 --partition gpu --nodelist n1,n2,n3 --time " \
        "04:00:00 --account lab --exclusive --gpus-per-node 8 --output /dev/null --qos=high --wrap " \
        "'sleep infinity'" in res.stdout
    assert f"decode-0: srun --jobid '<job>' --overlap -N1 -n1 -w n2 --job-name pdctl-{name}-decode-0 --quiet " \
        "sh -s" in res.stdout
    assert f"router: srun --jobid '<job>' --overlap -N1 -n1 -w n3 --job-name pdctl-{name}-router" in res.stdout
    assert "--host n1 " in res.stdout  # prefill listens on its host's address, resolved on the host at `up`


def test_plan_of_an_attached_job_submits_nothing(tmp_path: Path) -> None:
    nodes: list[dict[str, object]] = [{"name": "p", "slurm_node": "gpu7"}, {"name": "d"}, {"name": "r"}]
    res = runner.invoke(app, ["plan", "-t", str(_write(tmp_path, "{jobid: 42}", nodes))])
    assert res.exit_code == 0, res.output
    assert "attach to job 42 (slurm.jobid): nothing is submitted" in res.stdout and "sbatch" not in res.stdout
    assert "prefill-0: srun --jobid 42 --overlap -N1 -n1 -w gpu7 " in res.stdout
    assert "decode-0: srun --jobid 42 --overlap -N1 -n1 -w '<host 1 of the job>' " in res.stdout


def test_every_slurm_problem_is_reported_with_its_line(tmp_path: Path) -> None:
    nodes: list[dict[str, object]] = [
        {"name": "p", "slurm_node": "n12"}, {"name": "d", "transport": "local"}, {"name": "r"}]
    topo = _write(tmp_path, "{nodelist: [n1, n2], time: 4:00:00, exclusiv: false}", nodes)
    res = runner.invoke(app, ["validate", "-t", str(topo)])
    assert res.exit_code == 2
    slurm = _line(topo, "slurm:")
    assert f"{topo}:{slurm}: slurm.exclusiv: unknown key (did you mean `exclusive`?)" in res.stderr
    assert f'{topo}:{slurm}: slurm.time: quote the time, e.g. time: "04:00:00" (YAML reads unquoted ' \
        "hours:minutes:seconds as a number) (got 14400)" in res.stderr

    fixed = _write(tmp_path, "{nodelist: [n1, n2]}", nodes)
    res = runner.invoke(app, ["validate", "-t", str(fixed)])
    assert res.exit_code == 2
    assert f"{fixed}:{_line(fixed, 'n12')}: nodes[0].slurm_node: `n12` is not in slurm.nodelist (did you mean `n2`?)" \
        in res.stderr
    assert f"{fixed}:{_line(fixed, 'local')}: nodes[1].transport: a node of a Slurm topology is reached through " \
        "srun, not locally (remove `transport` from the node)" in res.stderr
    assert f"{fixed}:{_line(fixed, 'slurm:')}: slurm.nodelist: 2 host(s) listed for 3 topology node(s)" in res.stderr
    assert "invalid topology (3 problems)" in res.stderr


def test_slurm_node_needs_a_slurm_block(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    nodes: list[dict[str, object]] = [{"name": "local", "transport": "local", "slurm_node": "n1"}]
    path.write_text(topology_yaml("plain", tmp_path / "work", nodes=nodes))
    res = runner.invoke(app, ["validate", "-t", str(path)])
    assert res.exit_code == 2
    assert f"{path}:{_line(path, 'slurm_node')}: nodes[0].slurm_node: slurm_node without a `slurm:` block (add a " \
        "`slurm:` block or remove slurm_node)" in res.stderr


def test_a_vllm_job_must_request_gpus(tmp_path: Path) -> None:
    topo = _write(tmp_path, "{partition: gpu}")
    res = runner.invoke(app, ["validate", "-t", str(topo), "--set", "engine=vllm", "--set", "prefill[0].gpus=[0]",
                              "--set", "decode[0].gpus=[0]"])
    assert res.exit_code == 2
    # the file asks for no GPUs; only `--set engine=vllm` makes that a problem, so the message blames the --set
    assert "--set engine=vllm: slurm: the job requests no GPUs, so its steps get none (set " \
        "slurm.gpus_per_node (or slurm.gres, e.g. gpu:8))" in res.stderr
    ok = runner.invoke(app, ["validate", "-t", str(topo), "--set", "engine=vllm", "--set", "prefill[0].gpus=[0]",
                             "--set", "decode[0].gpus=[0]", "--set", "slurm.gpus_per_node=8"])
    assert ok.exit_code == 0, ok.output


def test_a_machine_without_the_slurm_tools_is_told_where_to_run(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PDCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    res = runner.invoke(app, ["up", "-t", str(_write(tmp_path, "{}")), "--skip-provision"])
    assert res.exit_code == 1, res.output
    # the first Slurm command `up` runs is `scontrol ping` (is the controller there?)
    assert "Error: `scontrol` is not installed on this machine" in res.stderr
    assert "hint: run pdctl on a login node of the cluster: it needs sbatch, srun, squeue, scontrol, scancel and " \
        "sinfo" in res.stderr
