"""The edits pdctl's two vLLM patches make, per vLLM version: lines to insert next to exact anchor lines.

`streaming` makes a vLLM older than 0.33.0 stream `kv_transfer_params`; `prefix-check` copies
`pdctl/prefix_check.py` next to the NIXL pull scheduler, calls its `check` before anything reads
`remote_num_tokens`, returns its report, and frees a router release's own block at once. pdctl.vllm_compat
finds, checks and applies them.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

PATCHED_MARKER = "# pdctl-compat: kv_transfer_params on the final streaming chunk, as vLLM 0.33.0 does"
PREFIX_MARKER = "# pdctl-compat: pdctl's prefix check, before anything reads remote_num_tokens (pdctl/prefix_check.py)"
FIRST_NATIVE = (0, 33, 0)
BACKUP_SUFFIX = ".pdctl-orig"
STREAMING = "streaming"
PREFIX_CHECK = "prefix-check"
PATCHES = (STREAMING, PREFIX_CHECK)
NIXL = "vllm/distributed/kv_transfer/kv_connector/v1/nixl"
PREFIX_COPY = f"{NIXL}/pdctl_prefix_check.py"
# pdctl's own prefix check, read as a file: this module imports nothing of pdctl.
PREFIX_SOURCE = Path(__file__).parents[1] / "prefix_check.py"



@dataclass(frozen=True)
class Edit:
    """Insert `insert`, indented like `anchor`, next to `anchor` inside the block that `scope` opens ("": the
    whole file)."""

    path: str
    scope: str
    anchor: tuple[str, ...]
    insert: str
    before: bool = False
    marker: str = PATCHED_MARKER

    def lines(self, indent: str) -> list[str]:
        body = [self.marker, *textwrap.dedent(self.insert).strip("\n").splitlines()]
        return [indent + line for line in body]


_FIELD = """
    kv_transfer_params: dict[str, Any] | None = Field(
        default=None, description="KVTransfer parameters."
    )
"""

_V0_26_0 = (
    Edit(
        path="vllm/entrypoints/openai/chat_completion/protocol.py",
        scope="class ChatCompletionStreamResponse(OpenAIBaseModel):",
        anchor=("    metrics: PerRequestTimingMetrics | None = None",),
        insert=_FIELD,
    ),
    Edit(
        path="vllm/entrypoints/openai/completion/protocol.py",
        scope="class CompletionStreamResponse(OpenAIBaseModel):",
        anchor=("    metrics: PerRequestTimingMetrics | None = None",),
        insert=_FIELD,
    ),
    Edit(
        path="vllm/entrypoints/openai/chat_completion/serving.py",
        scope="    async def chat_completion_stream_generator(",
        anchor=(
            "                    # Stamp the fingerprint on terminal chunks only (those with",
            "                    # finish_reason set). When ``include_usage`` is on, the",
        ),
        insert="""
            if finish_reason_sent[i]:
                chunk.kv_transfer_params = res.kv_transfer_params
        """,
        before=True,
    ),
    Edit(
        path="vllm/entrypoints/openai/completion/serving.py",
        scope="    async def completion_stream_generator(",
        anchor=(
            "                    # Stamp on terminal chunk only when no trailing usage chunk",
            "                    # will follow (that one is the true final message).",
        ),
        insert="""
            if finish_reason is not None:
                chunk.kv_transfer_params = res.kv_transfer_params
        """,
        before=True,
    ),
)

_PULL = f"{NIXL}/pull_scheduler.py"
_PREFIX_V0_26_0 = (
    Edit(
        path=_PULL,
        scope="",
        anchor=("from vllm.logger import init_logger",),
        insert="from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pdctl_prefix_check import check as pdctl_check",
        marker=PREFIX_MARKER,
    ),
    Edit(
        path=_PULL,
        scope="    def get_num_new_matched_tokens(",
        anchor=(
            "        params = request.kv_transfer_params",
            "        logger.debug(",
            '            "NIXLConnector get_num_new_matched_tokens: "',
            '            "num_computed_tokens=%s, kv_transfer_params=%s",',
            "            num_computed_tokens,",
            "            params,",
            "        )",
        ),
        # check() takes the spec out of params: asked again while the request waits for blocks, it is a no-op.
        insert="""
            if params is not None and "pdctl_prefix" in params and params.get("do_remote_decode"):
                pdctl_check(params, request.prompt_token_ids or [], num_computed_tokens)
        """,
        marker=PREFIX_MARKER,
    ),
    # A router's release (pdctl/router/release.py) has notified the decode already (update_state_after_alloc):
    # its own block is freed at once, as vLLM frees an aborted request's, rather than kept for a decode's pull.
    Edit(
        path=_PULL,
        scope="    def request_finished(",
        anchor=('        is_p_node = bool(params.get("do_remote_decode"))',),
        insert="""
            if params.get("pdctl_release"):
                self._reqs_not_processed.add(request.request_id)
                return False, None
        """,
        before=True,
        marker=PREFIX_MARKER,
    ),
    Edit(
        path=_PULL,
        scope="    def request_finished(",
        anchor=("            remote_blocks_expiry_time=blocks_expiry_time,",),
        insert='pdctl_reuse=params.get("pdctl_reuse"),',
        marker=PREFIX_MARKER,
    ),
)

_EDITS: dict[str, dict[tuple[int, int, int], tuple[Edit, ...]]] = {
    STREAMING: {(0, 26, 0): _V0_26_0},
    PREFIX_CHECK: {(0, 26, 0): _PREFIX_V0_26_0},
}
