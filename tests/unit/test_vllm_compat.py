from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pdctl import vllm_compat
from pdctl.vllm_compat import PATCHED_MARKER, PREFIX_MARKER, apply, main, patch_status, status

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
NIXL = "vllm/distributed/kv_transfer/kv_connector/v1/nixl"
PULL = f"{NIXL}/pull_scheduler.py"
COPY = f"{NIXL}/pdctl_prefix_check.py"
SOURCE = REPO / "pdctl" / "prefix_check.py"
BOTH = "(streaming: patched, prefix-check: patched"
NEEDS = "(streaming: needs-patch, prefix-check: needs-patch"


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "site-packages"
    shutil.copytree(FIXTURE, root)
    return root


def _texts(root: Path) -> dict[str, str]:
    return {rel: (root / rel).read_text() for rel in [*FILES, PULL]}


def _class_body(text: str, header: str) -> str:
    start = text.index(header)
    end = text.find("\nclass ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_apply_patches_the_four_files_and_the_pull_scheduler(site: Path) -> None:
    changed = apply(site, "0.26.0")

    assert sorted(changed) == sorted(site / rel for rel in [*FILES, PULL, COPY])
    for rel, text in _texts(site).items():
        compile(text, rel, "exec")
        assert text.count(PATCHED_MARKER) == (rel != PULL)
        assert text.count(PREFIX_MARKER) == 4 * (rel == PULL)
        assert (site / f"{rel}.pdctl-orig").read_text() == (FIXTURE / rel).read_text()
    assert (site / COPY).read_bytes() == SOURCE.read_bytes()
    assert not (site / f"{COPY}.pdctl-orig").exists()
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
    for rel in (CHAT_SERVING, PULL):
        assert (site / f"{rel}.pdctl-orig").read_text() == (FIXTURE / rel).read_text()


def test_status_goes_from_needs_patch_to_patched(site: Path) -> None:
    assert status(site, "0.26.0") == "needs-patch"
    apply(site, "0.26.0", only=["streaming"])
    assert patch_status(site, "0.26.0") == {"streaming": "patched", "prefix-check": "needs-patch"}
    assert status(site, "0.26.0") == "needs-patch"
    apply(site, "0.26.0")
    assert patch_status(site, "0.26.0") == {"streaming": "patched", "prefix-check": "patched"}
    assert status(site, "0.26.0") == "patched"


def test_only_the_prefix_check(site: Path) -> None:
    assert sorted(apply(site, "0.26.0", only=["prefix-check"])) == [site / COPY, site / PULL]
    assert patch_status(site, "0.26.0") == {"streaming": "needs-patch", "prefix-check": "patched"}


def test_a_changed_copy_needs_the_patch_again_and_apply_rewrites_only_it(site: Path) -> None:
    apply(site, "0.26.0")
    copy = site / COPY
    copy.write_text(SOURCE.read_text().replace("VERSION = 1", "VERSION = 0"))  # an older pdctl's copy
    pull = (site / PULL).read_text()

    assert patch_status(site, "0.26.0") == {"streaming": "patched", "prefix-check": "needs-patch"}
    assert apply(site, "0.26.0") == [copy]
    assert copy.read_bytes() == SOURCE.read_bytes()
    assert (site / PULL).read_text() == pull
    assert status(site, "0.26.0") == "patched"


@pytest.mark.parametrize("version", ["0.33.0", "0.33.1+cu130", "0.40.0"])
def test_native_streaming_still_gets_the_prefix_check(site: Path, version: str) -> None:
    assert patch_status(site, version) == {"streaming": "native", "prefix-check": "needs-patch"}
    assert sorted(apply(site, version)) == [site / COPY, site / PULL]
    assert {rel: (site / rel).read_text() for rel in FILES} == {rel: (FIXTURE / rel).read_text() for rel in FILES}
    assert patch_status(site, version) == {"streaming": "native", "prefix-check": "patched"}
    assert status(site, version) == "patched"


def test_native_streaming_with_an_unknown_scheduler_refuses_the_prefix_check(site: Path) -> None:
    pull = site / PULL
    pull.write_text(pull.read_text().replace("        params = request.kv_transfer_params\n", "        p = 1\n", 1))

    assert patch_status(site, "0.34.0") == {"streaming": "native", "prefix-check": "unknown-layout"}
    assert status(site, "0.34.0") == "unknown-layout"
    with pytest.raises(ValueError) as info:
        apply(site, "0.34.0")
    assert str(info.value) == (
        f"cannot apply pdctl's prefix-check patch to vLLM 0.34.0: {pull} has no line"
        " '        params = request.kv_transfer_params' inside 'def get_num_new_matched_tokens(';"
        " this layout is unknown to pdctl (set router.verify_at: router, or use vLLM 0.26.0)"
    )
    assert not (site / COPY).exists()
    assert apply(site, "0.34.0", only=["streaming"]) == []


def test_unlisted_version_with_the_known_layout_is_patched(site: Path) -> None:
    assert status(site, "0.31.2") == "needs-patch"
    assert len(apply(site, "0.31.2")) == 6


def test_unknown_layout_is_refused_with_file_and_anchor(site: Path) -> None:
    serving = site / CHAT_SERVING
    serving.write_text(serving.read_text().replace("# Stamp the fingerprint on terminal", "# Stamp terminal"))

    assert status(site, "0.26.0") == "unknown-layout"
    with pytest.raises(ValueError) as info:
        apply(site, "0.26.0")
    message = str(info.value)
    assert str(serving) in message
    assert "'                    # Stamp the fingerprint on terminal chunks only (those with'" in message
    assert message.startswith("cannot apply pdctl's streaming patch to vLLM 0.26.0: ")
    assert message.endswith("this layout is unknown to pdctl (use vLLM >= 0.33.0, which streams"
                            " kv_transfer_params natively)")
    assert not any(PATCHED_MARKER in text or PREFIX_MARKER in text for text in _texts(site).values())
    assert not (site / COPY).exists()  # all or nothing: the prefix check waits too


def test_missing_file_is_unknown_layout(site: Path) -> None:
    (site / f"{OPENAI}/completion/serving.py").unlink()
    assert status(site, "0.26.0") == "unknown-layout"


def test_missing_scheduler_is_unknown_layout(site: Path) -> None:
    (site / PULL).unlink()
    assert patch_status(site, "0.26.0") == {"streaming": "needs-patch", "prefix-check": "unknown-layout"}
    with pytest.raises(ValueError, match=r"pull_scheduler\.py has no line '\(file not found\)' inside the module"):
        apply(site, "0.26.0")
    assert _untouched_streaming(site)


def _untouched_streaming(root: Path) -> bool:
    return all((root / rel).read_text() == (FIXTURE / rel).read_text() for rel in FILES)


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
    assert out == [
        f"needs-patch vllm 0.26.0 {site} {NEEDS})",
        f"patched vllm 0.26.0 {site} {BOTH}; 6 files changed)",
    ]

    (site / CHAT_SERVING).write_text("")
    assert main(["status", *args]) == 2
    assert main(["apply", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == f"unknown-layout vllm 0.26.0 {site} (streaming: unknown-layout, prefix-check: patched)\n"
    assert captured.err.splitlines() == [
        f"error: vLLM 0.26.0 at {site} has a layout unknown to pdctl's streaming patch; run apply to see where",
        f"error: cannot apply pdctl's streaming patch to vLLM 0.26.0: {site / CHAT_SERVING} has no line"
        " '    async def chat_completion_stream_generator(' inside"
        " 'async def chat_completion_stream_generator('; this layout is unknown to pdctl (use vLLM >= 0.33.0,"
        " which streams kv_transfer_params natively)",
    ]


def test_cli_apply_only(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--site-packages", str(site), "--version", "0.26.0"]
    assert main(["apply", "--only", "streaming", *args]) == 0
    assert capsys.readouterr().out == (
        f"needs-patch vllm 0.26.0 {site} (streaming: patched, prefix-check: needs-patch; 4 files changed)\n"
    )


def test_cli_reads_the_version_from_metadata(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    info = site / "vllm-0.26.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.26.0\n")

    assert main(["status", "--site-packages", str(site)]) == 0
    assert capsys.readouterr().out == f"needs-patch vllm 0.26.0 {site} {NEEDS})\n"


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
    assert (result.returncode, result.stdout) == (0, f"patched vllm 0.26.0 {site} {BOTH}; 6 files changed)\n")


def test_parse_version() -> None:
    assert vllm_compat.parse_version("0.26.0+cu130") == (0, 26, 0)
    assert vllm_compat.parse_version("0.33") == (0, 33, 0)
    with pytest.raises(ValueError, match="not a vLLM version"):
        vllm_compat.parse_version("latest")
