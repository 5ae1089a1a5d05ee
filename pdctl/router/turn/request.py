"""A turn's first stage: what the router refuses before any engine sees it, and whose conversation it is.

The conversation is the body's `conversation_id` or a header's (server/conversation_headers.py), an agent-API
front's pinned one (a Responses `previous_response_id`), else derived from the history (kv/conversation.py),
always scoped to its owner so nobody learns or spends another's KV by knowing its id.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from pdctl.router.kv.conversation import Derivation, explicit_id, new_id
from pdctl.router.turn.context import RequestContext
from pdctl.router.turn.state import RouterState
from pdctl.router.upstream.pools import Pool

_SCOPE_KEY = os.urandom(16)


def _header(headers: list[tuple[bytes, bytes]], names: tuple[bytes, ...]) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in headers if k in names}


def unsupported(chat: bool, body: dict[str, Any]) -> str | None:
    """Why the router refuses this request before any engine sees it, or None.

    One conversation turn maps to one prefill and one decode: api/batches.py serves several choices (`n`,
    `best_of`) and prompt lists before this; any that still reach here (another front) are refused rather than
    half-run.
    """
    if chat and not (isinstance(body.get("messages"), list) and body["messages"]):
        return "`messages` must be a non-empty list"
    if not chat and body.get("prompt") in (None, "", []):
        return "`prompt` is required"
    for name in ("n", "best_of"):
        value = body.get(name)
        if value is not None and value != 1:
            return f"`{name}` must be 1 (got {value!r}): send one request per choice"
    prompt = body.get("prompt")
    if not chat and isinstance(prompt, list) and len(prompt) > 1 and not isinstance(prompt[0], int):
        return f"`prompt` is a list of {len(prompt)} prompts: send one prompt per request"
    return None


def owner(ctx: RequestContext) -> str:
    """Whose conversations these are: the client's credentials (`Authorization`, Anthropic's `x-api-key`) and its
    `cache_salt`. Handles and derived conversations never cross owners, so nobody learns or spends another's KV by
    knowing its conversation id."""
    auth = b"\0".join(v for k, v in ctx.headers if k in (b"authorization", b"x-api-key"))
    salt = ctx.body.get("cache_salt")
    if not auth and salt is None:
        return ""
    mac = hashlib.blake2b(auth + b"\0" + repr(salt).encode(), key=_SCOPE_KEY, digest_size=12)
    return mac.hexdigest()


def conversation(state: RouterState, ctx: RequestContext) -> tuple[str | None, Derivation | None]:
    """The conversation id (None: this request cannot take part in reuse) and, if derived, its derivation."""
    body = ctx.body
    if (body.get("n") or 1) != 1 or (body.get("best_of") or 1) != 1:
        return None, None
    pinned = ctx.conversation
    if pinned is not None:  # already resolved by an agent-API front (a Responses previous_response_id)
        return pinned, None
    who = owner(ctx)
    given = explicit_id(ctx.cid, _header(ctx.headers, (b"x-conversation-id", b"x-session-id")))
    if given is not None:
        return (f"{who}|{given}" if who else given), None
    index = state.index
    d = index.derive_chat(body["messages"], who) if ctx.chat else index.derive_prompt(body["prompt"], who)
    if d.kind == "none":
        return None, None
    return d.cid or new_id(), d


def resolve(state: RouterState, ctx: RequestContext) -> str | None:
    """Why the router refuses this request (a 400), else None with the conversation it runs under resolved on the
    context (`conversation`, `derivation`)."""
    problem = unsupported(ctx.chat, ctx.body)
    if problem is None:
        ctx.conversation, ctx.derivation = conversation(state, ctx)
    return problem


def unavailable(pool: Pool) -> str:
    return f"no healthy {pool.role} instance ({len(pool.healthy())} of {len(pool.members)} healthy)"

