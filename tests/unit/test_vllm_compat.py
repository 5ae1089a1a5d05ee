from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pdctl import vllm_compat
from pdctl.vllm_compat import PATCHED_MARKER, apply, main, status

FIXTURE = Path(__file__).parents[1] / "fixtures" / "vllm-0.26.0"
REPO = Path(__file__).parents[2]
OPENAI = "vllm/entrypoints/openai"
CHAT_SERVING = f"{OPENAI}/chat_completion/serving.py"
FILES = [
    f"{OPENAI}/chat_completion/protocol.py",
    f"{OPENAI}/completion/protocol.py",
    CHAT_SERVING,
    f"{OPENAI}/completion/serving.py",
]


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "site-packages"
    shutil.copytree(FIXTURE, root)
    return root


def _texts(root: Path) -> dict[str, str]:
    return {rel: (root / rel).read_text() for rel in FILES}


def _class_body(text: str, header: str) -> str:
    start = text.index(header)
    end = text.find("\nclass ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_apply_patches_the_four_files(site: Path) -> None:
    changed = apply(site, "0.26.0")

    assert sorted(changed) == sorted(site / rel for rel in FILES)
    for rel, text in _texts(site).items():
        compile(text, rel, "exec")
        assert text.count(PATCHED_MARKER) == 1
        assert (site / f"{rel}.pdctl-orig").read_text() == (FIXTURE / rel).read_text()
    texts = _texts(site)
    for rel, header in [
        (f"{OPENAI}/chat_completion/protocol.py", "class ChatCompletionStreamResponse("),
        (f"{OPENAI}/completion/protocol.py", "class CompletionStreamResponse("),
    ]:
        assert "    kv_transfer_params: dict[str, Any] | None = Field(" in _class_body(texts[rel], header)
    assert (
        "                    if finish_reason_sent[i]:\n"
        "                        chunk.kv_transfer_params = res.kv_transfer_params\n"
    ) in texts[CHAT_SERVING]
    assert (
        "                    if finish_reason is not None:\n"
        "                        chunk.kv_transfer_params = res.kv_transfer_params\n"
    ) in texts[f"{OPENAI}/completion/serving.py"]


def test_the_non_streaming_response_is_left_alone(site: Path) -> None:
    apply(site, "0.26.0")

    text = (site / f"{OPENAI}/chat_completion/protocol.py").read_text()
    assert PATCHED_MARKER not in _class_body(text, "class ChatCompletionResponse(")


def test_second_apply_changes_nothing(site: Path) -> None:
    apply(site, "0.26.0")
    once = _texts(site)

    assert apply(site, "0.26.0") == []
    assert _texts(site) == once
    assert (site / f"{CHAT_SERVING}.pdctl-orig").read_text() == (FIXTURE / CHAT_SERVING).read_text()


def test_status_goes_from_needs_patch_to_patched(site: Path) -> None:
    assert status(site, "0.26.0") == "needs-patch"
    apply(site, "0.26.0")
    assert status(site, "0.26.0") == "patched"


@pytest.mark.parametrize("version", ["0.33.0", "0.33.1+cu130", "0.40.0"])
def test_native_versions_are_not_touched(site: Path, version: str) -> None:
    assert status(site, version) == "native"
    assert apply(site, version) == []
    assert _texts(site) == {rel: (FIXTURE / rel).read_text() for rel in FILES}


def test_unlisted_version_with_the_known_layout_is_patched(site: Path) -> None:
    assert status(site, "0.31.2") == "needs-patch"
    assert len(apply(site, "0.31.2")) == 4


def test_unknown_layout_is_refused_with_file_and_anchor(site: Path) -> None:
    serving = site / CHAT_SERVING
    serving.write_text(serving.read_text().replace("# Stamp the fingerprint on terminal", "# Stamp terminal"))

    assert status(site, "0.26.0") == "unknown-layout"
    with pytest.raises(ValueError) as info:
        apply(site, "0.26.0")
    message = str(info.value)
    assert str(serving) in message
    assert "'                    # Stamp the fingerprint on terminal chunks only (those with'" in message
    assert "unknown to pdctl" in message
    assert not any(PATCHED_MARKER in text for text in _texts(site).values())


def test_missing_file_is_unknown_layout(site: Path) -> None:
    (site / f"{OPENAI}/completion/serving.py").unlink()
    assert status(site, "0.26.0") == "unknown-layout"


def test_anchor_outside_its_scope_does_not_count(site: Path) -> None:
    protocol = site / f"{OPENAI}/completion/protocol.py"
    text = protocol.read_text().replace("class CompletionStreamResponse(", "class RenamedStreamResponse(")
    protocol.write_text(text)
    assert status(site, "0.26.0") == "unknown-layout"


def test_cli_status_apply_and_unknown_layout(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--site-packages", str(site), "--version", "0.26.0"]
    assert main(["status", *args]) == 0
    assert main(["apply", *args]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"needs-patch vllm 0.26.0 {site}", f"patched vllm 0.26.0 {site} (4 files changed)"]

    (site / CHAT_SERVING).write_text("")
    assert main(["status", *args]) == 2
    assert main(["apply", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == f"unknown-layout vllm 0.26.0 {site}\n"
    assert "error: cannot patch vLLM 0.26.0: " in captured.err


def test_cli_reads_the_version_from_metadata(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    info = site / "vllm-0.26.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.26.0\n")

    assert main(["status", "--site-packages", str(site)]) == 0
    assert capsys.readouterr().out == f"needs-patch vllm 0.26.0 {site}\n"


def test_cli_without_vllm_installed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--site-packages", str(tmp_path)]) == 2
    assert "vllm is not installed" in capsys.readouterr().err


def test_runs_as_a_module(site: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = ["apply", "--site-packages", str(site), "--version", "0.26.0"]
    result = subprocess.run(
        [sys.executable, "-m", "pdctl.vllm_compat", *command],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert (result.returncode, result.stdout) == (0, f"patched vllm 0.26.0 {site} (4 files changed)\n")


def test_parse_version() -> None:
    assert vllm_compat.parse_version("0.26.0+cu130") == (0, 26, 0)
    assert vllm_compat.parse_version("0.33") == (0, 33, 0)
    with pytest.raises(ValueError, match="not a vLLM version"):
        vllm_compat.parse_version("latest")
