"""The prefill hop: the non-streaming `max_tokens=1` call, retried as a miss, and where it verifies the prefix.

With `verify_at: prefill` (the default) the prefill gets the client's request as it is, with the handle's params
at `remote_num_tokens` 0 and the digests of the held tokens; it checks them against its own tokenization and
reports what it read (`verify.settle`). A prefill that reports nothing does not run pdctl's check: it read
nothing, the turn is a miss (`prefill_unchecked`), and the log says so once per instance.
With `verify_at: router` the router verifies first (`tokenize`), and the prefill gets the ids it was verified
against as a token-id completion, so that tokenization replaces the one the prefill would do.

A turn that reads nothing from a decode (a miss) carries a queued release to its prefill (release.py, `take`): the
handle's params at `remote_num_tokens` 0, which make the prefill notify that decode while it computes the turn.

A failed or expired KV read must never reach the client: a prefill that fails while holding a decode handle is
retried once as a miss (on another healthy prefill when there is one). A miss that cannot reach its prefill
(refused, reset, timed out) is retried once elsewhere too; that counts against the prefill's health. An error
answer to a miss is that request's own answer (a bad or poison prompt): relayed, sanitised, and never held
against the prefill, so one client's requests cannot eject an instance that serves everyone else.
"""

from __future__ import annotations

import logging
import time
from array import array
from dataclasses import dataclass
from typing import Any

import httpx

from pdctl.router import jsonx, wire
from pdctl.router.errors import error_body, relayed_error
from pdctl.router.kv.release import release_params
from pdctl.router.turn.context import RequestContext
from pdctl.router.turn.state import RouterState
from pdctl.router.turn.verify import Verdict, miss, settle
from pdctl.router.upstream.client import Whole
from pdctl.router.upstream.pools import Upstream

log = logging.getLogger("pdctl.router")

# Fields the prefill must not get: its one token is thrown away, only its KV matters.
_PREFILL_DROP = ("max_completion_tokens", "min_tokens", "stream_options", "n", "best_of", "logprobs",
                 "top_logprobs", "prompt_logprobs", "return_token_ids", "echo")
# What a token-id prefill keeps: whatever decides its KV besides the ids (the model or LoRA, the cache salt).
_IDS_KEEP = ("model", "cache_salt", "priority")


@dataclass
class PrefillResult:
    verdict: Verdict
    upstream: Upstream | None
    params: dict[str, Any] | None
    ms: float
    status: int = 200
    error: bytes = b""
    cached: int | None = None  # its usage.prompt_tokens_details.cached_tokens, where it reported them


def text_only(body: dict[str, Any]) -> bool:
    """Whether a chat request's prompt is its rendering alone (no images or audio the ids would leave out)."""
    if "truncate_prompt_tokens" in body or "mm_processor_kwargs" in body:
        return False
    for m in body.get("messages") or ():
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list) and any(not isinstance(c, dict) or c.get("type") != "text" for c in content):
            return False
    return True


def prefill_request(path: str, body: dict[str, Any], params: dict[str, Any],
                    ids: array[int] | None = None) -> tuple[str, bytes]:
    """The prefill's path and body. With the prompt's verified ids, a token-id completion of exactly those ids:
    the prefill computes what was verified, and does not render and tokenize the history again (the router's
    /tokenize did that work on the critical path already)."""
    if ids is not None and ("messages" in body or isinstance(body.get("prompt"), str)) and text_only(body):
        out = {k: body[k] for k in _IDS_KEEP if k in body}
        out["prompt"] = ids.tolist()
        path = "/v1/completions"
    else:
        out = {k: v for k, v in body.items() if k not in _PREFILL_DROP}
    out["stream"] = False
    out["max_tokens"] = 1
    out["kv_transfer_params"] = params
    return path, jsonx.dumps(out)


async def _call(state: RouterState, p: Upstream, path: str, payload: bytes, rid: str,
                traceparent: tuple[bytes, bytes] | None = None) -> Whole | str:
    """The response, or a short reason when the prefill could not be reached or timed out."""
    headers = {"content-type": "application/json", "x-request-id": rid}
    if traceparent is not None:
        headers["traceparent"] = traceparent[1].decode()
    p.outstanding += 1
    try:
        return await state.http.post_whole(f"{p.url}{path}", payload, headers)
    except httpx.TimeoutException:
        return "timeout"
    except httpx.HTTPError:
        return "connect"
    finally:
        p.outstanding -= 1


async def run(state: RouterState, ctx: RequestContext, p: Upstream, verdict: Verdict,
              ids: array[int] | None = None, span: bytes | None = None) -> PrefillResult:
    """The prefill hop; `error` of a failed result is an OpenAI error body ready for the client. `span`: the id of
    the hop's span in the turn's trace, sent as the request's `traceparent`."""
    started = time.perf_counter()
    rid, key = ctx.rid, ctx.conversation or ctx.rid
    parent = ctx.trace.traceparent(span) if ctx.trace is not None and span is not None else None
    tried: list[Upstream] = []

    def done(status: int = 200, error: bytes = b"", params: dict[str, Any] | None = None,
             up: Upstream | None = None, cached: int | None = None) -> PrefillResult:
        return PrefillResult(verdict, up, params, (time.perf_counter() - started) * 1000, status, error, cached)

    for attempt in range(2):
        carry = state.releaser.take(p) if verdict.outcome == "miss" else None
        sent = verdict.params
        if carry is not None:  # the prefill notifies that decode while it computes this turn
            sent = {**sent, **release_params(carry.handle.params, alone=False)}
        resp = await _call(state, p, *prefill_request(ctx.path, ctx.body, sent, ids), rid, parent)
        if carry is not None:
            state.releaser.carried(carry, p, not isinstance(resp, str) and resp.status_code == 200)
        with_handle = verdict.outcome != "miss"
        if with_handle and resp != "connect":
            ctx.spent = True
        if not isinstance(resp, str) and resp.status_code == 200:
            state.prefill.succeeded(p)
            params, cached = _answer(resp.content)
            if params is None:
                state.metrics.error("prefill", "no_kv_transfer_params")
            verdict = _settled(state, p, verdict, params)
            return done(params=params, up=p, cached=cached)
        kind = resp if isinstance(resp, str) else f"http_{resp.status_code}"
        state.metrics.error("prefill", kind)
        if not isinstance(resp, str) and not with_handle:
            status = 502 if resp.status_code >= 500 else resp.status_code
            log.warning("[%s] prefill answered %d; relaying it (the request's own answer)", rid, resp.status_code)
            return done(status, relayed_error(status, resp.content, "prefill"), up=p)
        if isinstance(resp, str):  # unreachable or silent: its health, not the request's fault
            if resp == "connect":
                state.prefill.lost(p)
            state.prefill.failed(p, slow=resp == "timeout")
            tried.append(p)
        log.warning("[%s] prefill failed (%s)%s%s", rid, kind, " reading a decode handle" if with_handle else "",
                    "; retrying" + (" as a miss" if with_handle else "") if attempt == 0 else "")
        if with_handle:
            verdict = miss(wire.PREFILL_FAILED)
        nxt = state.prefill_policy.pick(state.prefill, key, exclude=tried) if attempt == 0 else None
        if nxt is None:
            break
        p = nxt
    return done(502, error_body(502, "no prefill instance could serve the request"))


def _settled(state: RouterState, p: Upstream, verdict: Verdict, params: dict[str, Any] | None) -> Verdict:
    settled = settle(verdict, params)
    if settled is not None:
        return settled
    if p.url not in state.unchecked:
        state.unchecked.add(p.url)
        log.warning("prefill %s does not run pdctl's prefix check (its answer has no readable pdctl_reuse "
                    "report): it reads nothing from the decodes, every warm turn through it is a miss (%s); "
                    "re-provision it with pdctl (`pdctl up` patches vLLM) or set `router.verify_at: router`",
                    p.url, wire.PREFILL_UNCHECKED)
    return miss(wire.PREFILL_UNCHECKED)


def _answer(content: bytes) -> tuple[dict[str, Any] | None, int | None]:
    """The prefill's kv_transfer_params, and its cached prompt tokens where it reports them (vLLM's
    --enable-prompt-tokens-details: its prefix-cache hit plus what it read from the decode)."""
    try:
        obj = jsonx.loads(content)
    except jsonx.DecodeError:
        return None, None
    if not isinstance(obj, dict):
        return None, None
    params = obj.get("kv_transfer_params")
    usage = obj.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    ok = isinstance(cached, int) and not isinstance(cached, bool) and cached >= 0
    return (params if isinstance(params, dict) else None), (cached if ok else None)
