"""Bad bench input is refused before anything is deployed, with a message that says how to fix it."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdctl.bench.leg.legs import DEFAULT_LEGS, LegSpec, parse_leg, parse_legs
from pdctl.cli import app
from pdctl.errors import UsageError


def test_leg_syntax() -> None:
    assert parse_leg("b128:model.block_size=128,prefill[*].prefix_caching=true") == LegSpec(
        "b128", ("model.block_size=128", "prefill[*].prefix_caching=true")
    )
    assert parse_leg("gpus:prefill[0].gpus=[0,1],model.block_size=64").overrides == (
        "prefill[0].gpus=[0,1]",
        "model.block_size=64",
    )
    assert parse_leg("plain") == LegSpec("plain", ())
    assert parse_legs(None) == list(DEFAULT_LEGS)
    with pytest.raises(UsageError, match="bad override 'nonsense'"):
        parse_leg("x:nonsense")
    with pytest.raises(UsageError, match="repeated: a"):
        parse_legs(["a:x=1", "a:y=2"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lengths", "2k"], "--lengths '2k' is not a list of integers"),
        (["--api", "grpc"], "--api 'grpc' is not chat, completions, responses or messages"),
        (["--turns", "0"], "--turns must be at least 1"),
        (["--leg", "bad name:x=1"], "bad leg name"),
        (["--leg", "bogus"], "--leg 'bogus' has no overrides and is not one of off, on"),
        (["--leg", "x:connector.bidirectional_kvxfer=true"], "bidirectional_kvxfer"),
        (["--no-redeploy", "--leg", "a:model.block_size=64"], "--leg overrides need a redeploy"),
        (["--profile", "huge"], "--profile 'huge' is not one of quick, full"),
        (["--profile", "agent"], "a capacity run needs --sweep sessions=... or --slo KEY=MS to search"),
        (["--sweep", "sessions=0,2"], "--sweep 'sessions=0,2': session counts must be >= 1"),
        (["--slo", "ttft_p90=fast"], "--slo ttft_p90='fast' is not a number of milliseconds"),
        (["--sweep", "sessions=2", "--tool-tokens", "9-2"], "--tool-tokens '9-2' must be >= 0 with low <= high"),
    ],
)
def test_usage_errors_exit_2(args: list[str], message: str) -> None:
    topo = Path(__file__).parents[2] / "configs" / "local-sim.yaml"
    result = CliRunner().invoke(app, ["bench", "-t", str(topo), *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr


def test_a_missing_corpus_is_refused_before_deploying(tmp_path: Path) -> None:
    topo = Path(__file__).parents[2] / "configs" / "local-sim.yaml"
    result = CliRunner().invoke(app, ["bench", "-t", str(topo), "--input", str(tmp_path / "nope.txt")])
    assert result.exit_code == 2
    assert "cannot read corpus" in result.stderr and "hint: pass an existing file" in result.stderr


def test_a_bare_leg_name_is_a_default_leg_or_refused() -> None:
    topo = Path(__file__).parents[2] / "configs" / "local-sim.yaml"
    result = CliRunner().invoke(app, ["bench", "-t", str(topo), "--leg", "on", "--leg", "bogus"])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        "Error: --leg 'bogus' has no overrides and is not one of off, on",
        "hint: a leg is NAME:key=value,... (e.g. --leg b128:model.block_size=128); `--leg bogus:` benches the "
        "topology as it is",
    ]
    from pdctl.bench.runner.options import BenchArgs, bench_options

    opts = bench_options(BenchArgs(topology=topo, legs=["on", "mine:"]))
    assert [(leg.name, leg.overrides) for leg in opts.legs] == [("on", ("connector.bidirectional_kv_xfer=true",)),
                                                               ("mine", ())]
