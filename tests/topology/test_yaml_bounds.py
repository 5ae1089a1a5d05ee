"""The loader's bounds and encodings: each bad file is exit 2 with its file:line and a fix, no traceback."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from pdctl.cli import app
from tests.topology.minimal import MINIMAL

runner = CliRunner()

VALID = MINIMAL


def validate(path: Path, *extra: str) -> tuple[int, str]:
    result = runner.invoke(app, ["validate", "-t", str(path), *extra])
    assert "Traceback" not in result.output and "Internal error" not in result.output, result.output
    return result.exit_code, " ".join(result.output.split())


def write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "topo.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def test_billion_laughs(tmp_path: Path) -> None:
    lol = ["x:", '  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 10):
        prev, name = chr(96 + i), chr(97 + i)
        lol.append(f"  {name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    code, output = validate(write(tmp_path, VALID + "\n".join(lol) + "\n"))
    assert code == 2
    assert "topo.yaml:23: more than 100,000 values (aliases counted expanded) (anchors and aliases (&a / *a) " \
        "may share settings, not multiply them)" in output, output


def test_recursive_alias(tmp_path: Path) -> None:
    code, output = validate(write(tmp_path, VALID + "x: &r [1, *r]\n"))
    assert code == 2
    assert "topo.yaml:17: alias *r refers to itself (a value cannot contain itself; copy the settings instead)" \
        in output, output


def test_deep_nesting(tmp_path: Path) -> None:
    code, output = validate(write(tmp_path, VALID + "x: " + "[" * 10_000 + "]" * 10_000 + "\n"))
    assert code == 2
    assert "topo.yaml:17: nested deeper than 64 levels (a topology needs a handful of levels; flatten it)" \
        in output, output


def test_huge_int(tmp_path: Path) -> None:
    code, output = validate(write(tmp_path, VALID.replace("  port: 8000", "  port: " + "9" * 5000)))
    assert code == 2
    assert "topo.yaml:14: a number of 5000 characters (ports, counts and seconds are small numbers; quote it if " \
        "it is text)" in output, output


def test_file_too_large(tmp_path: Path) -> None:
    code, output = validate(write(tmp_path, VALID + "#" + "x" * (2 << 20) + "\n"))
    assert code == 2
    assert "topo.yaml: the file is larger than 1 MiB (a topology is a few hundred lines; is this the right file?)" \
        in output, output


def test_utf16(tmp_path: Path) -> None:
    code, output = validate(write(tmp_path, VALID.encode("utf-16")))
    assert code == 2
    assert "topo.yaml:1: the file is UTF-16 (or holds NUL bytes), not UTF-8 (save it as UTF-8, e.g. " \
        "`iconv -f UTF-16 -t UTF-8 FILE > topo.yaml`)" in output, output


def test_not_utf8(tmp_path: Path) -> None:
    text = VALID.encode().replace(b"  id: Qwen/Qwen3-32B", b"  id: Qwen/Qwen3-32B\n  served_name: caf\xe9")
    code, output = validate(write(tmp_path, text))
    assert code == 2
    assert "topo.yaml:8: the file is not UTF-8 (byte 0xe9) (save it as UTF-8, e.g. " \
        "`iconv -f LATIN1 -t UTF-8 FILE > topo.yaml`)" in output, output


def test_utf8_bom_is_fine(tmp_path: Path) -> None:
    code, output = validate(write(tmp_path, b"\xef\xbb\xbf" + VALID.encode()))
    assert code == 0, output


def test_bad_set_yaml(tmp_path: Path) -> None:
    code, output = validate(write(tmp_path, VALID), "--set", "model=[: bad")
    assert code == 2
    assert "invalid topology (1 problem): --set model=[: bad: model: the value '[: bad' is not valid YAML (YAML " \
        "syntax error: expected the node content, but found ':') (quote a text value: --set 'model=\"...\"')" \
        in output, output


def test_set_value_is_bounded_too(tmp_path: Path) -> None:
    code, output = validate(write(tmp_path, VALID), "--set", "model=" + "[" * 100 + "]" * 100)
    assert code == 2
    assert f"invalid topology (1 problem): --set model={'[' * 54}...: model: the value '[[[" in output
    assert "is not valid YAML (nested deeper than 64 levels)" in output, output


def test_duplicate_key_names_both_lines(tmp_path: Path) -> None:
    code, output = validate(write(tmp_path, VALID.replace("  port: 8000\n", "  port: 8000\n  port: 8001\n")))
    assert code == 2
    assert "topo.yaml:15: router.port: duplicate key (first set at line 14) (keep one of the two; YAML would " \
        "silently use the last)" in output, output


def test_merge_key_override_is_not_a_duplicate(tmp_path: Path) -> None:
    text = VALID.replace(
        "prefill:\n  - {node: a, port: 8100, side_channel_port: 5600}\n",
        "prefill:\n  - &p {node: a, port: 8100, side_channel_port: 5600}\n",
    ).replace("decode:\n  - {node: a, port: 8200, side_channel_port: 5601}\n",
              "decode:\n  - <<: *p\n    port: 8200\n    side_channel_port: 5601\n")
    code, output = validate(write(tmp_path, text))
    assert code == 0, output
