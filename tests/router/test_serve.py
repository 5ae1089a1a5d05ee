"""`router serve`: its options are RouterConfig's fields, `python -m pdctl.router` loads none of pdctl's CLI, and
a bad value is one line and exit 2 on either entry point."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from pdctl.cli import app as pdctl_app
from pdctl.router.config import RouterConfig
from pdctl.router.serve import router_app

URLS = ["--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2"]

ENTRY = """\
import runpy, sys
sys.argv = ["pdctl.router", "serve", *sys.argv[1:]]
try:
    runpy.run_module("pdctl.router", run_name="__main__")
except SystemExit as done:
    cli_side = ("pdctl.cli", "pdctl.bench", "pdctl.lifecycle", "pdctl.topology", "pdctl.remote", "matplotlib")
    loaded = sorted(m for m in sys.modules if m.startswith(cli_side))
    print("loaded:", loaded, "exit:", done.code)
"""


def _serve_options() -> dict[str, typer.core.TyperOption]:
    group = typer.main.get_command(router_app())
    serve = group.commands["serve"]  # type: ignore[attr-defined]
    return {p.name: p for p in serve.params if isinstance(p, typer.core.TyperOption)}


def test_every_knob_is_an_option_with_the_fields_default_and_help() -> None:
    options = _serve_options()
    knobs = [f for f in dataclasses.fields(RouterConfig) if "help" in f.metadata]
    assert {f.name for f in knobs} == set(options) - {"host", "port", "api_key_env", "engine_key_file", "log_level"}
    for f in knobs:
        option = options[f.name]
        assert option.help == f.metadata["help"]
        if f.default is dataclasses.MISSING:
            assert option.required, f.name
        else:
            assert option.default == (list(f.default) if isinstance(f.default, tuple) else f.default), f.name
    assert options["conversation_headers"].opts == ["--conversation-header"]
    assert options["verify_prefix"].secondary_opts == ["--no-verify-prefix"]
    assert "api_key" not in options and "engine_key" not in options  # keys come from env and a file, not argv


def test_the_options_build_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    got: list[tuple[RouterConfig, str, int, str]] = []
    monkeypatch.setenv("ROUTER_TEST_KEY", "sk-client")
    args = ["serve", *URLS, "--prefill", "http://127.0.0.1:3", "--no-verify-prefix", "--max-headers", "10",
            "--conversation-header", "X-Thread", "--api-key-env", "ROUTER_TEST_KEY", "--port", "9",
            "--log-level", "DEBUG"]
    result = CliRunner().invoke(router_app(run=lambda *a: got.append(a)), args)
    assert result.exit_code == 0, result.output
    [(config, host, port, level)] = got
    assert (host, port, level) == ("127.0.0.1", 9, "debug")
    assert config.prefill == ("http://127.0.0.1:1", "http://127.0.0.1:3")
    assert config.decode == ("http://127.0.0.1:2",)
    assert (config.verify_prefix, config.max_headers, config.conversation_headers) == (False, 10, ("X-Thread",))
    assert config.api_key == "sk-client" and config.engine_key is None
    defaults = RouterConfig(prefill=("http://p",), decode=("http://d",))
    assert (config.handle_ttl, config.block_size, config.local_policy) == (
        defaults.handle_ttl, defaults.block_size, defaults.local_policy)


def test_python_m_pdctl_router_loads_no_cli_and_refuses_a_bad_value_in_one_line() -> None:
    done = subprocess.run([sys.executable, "-c", ENTRY, *URLS, "--max-headers", "0"], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.splitlines() == ["loaded: [] exit: 2"], done.stderr
    assert done.stderr.splitlines() == [
        "Error: invalid router options: --max-headers must be >= 1, got 0",
        "hint: see `pdctl router serve --help`",
    ]


def test_pdctl_router_serve_refuses_the_same_value_the_same_way() -> None:
    result = CliRunner().invoke(pdctl_app, ["router", "serve", *URLS, "--max-headers", "0"])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        "Error: invalid router options: --max-headers must be >= 1, got 0",
        "hint: see `pdctl router serve --help`",
    ]
