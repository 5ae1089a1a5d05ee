"""One request's own data: created once at the router's entry (server/app.py's Router) and handed down.

The entry steps fill it in (JsonBody: the parsed body and its `conversation_id`; ConversationHeaders: a header's
id), the dispatcher runs its route's handler with it, and the hops read it rather than long parameter lists: the
request id, the engine path, the body, the conversation it resolved to, the handle it took. It also travels in
the ASGI scope under SCOPE_KEY, the one channel the ASGI contract gives an app's layers. A translated request
(Responses, Messages) and each prompt of a batch are served as a copy with their own path or body.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final, Protocol

from pdctl.router.kv.handles import HandleTable, Taken
from pdctl.router.wire import NOT_ELIGIBLE

if TYPE_CHECKING:
    from pdctl.router.kv.conversation import Derivation
    from pdctl.router.turn.cost import Choice
    from pdctl.router.turn.trace import Trace

SCOPE_KEY: Final = "pdctl.request"
CHAT: Final = "/v1/chat/completions"
NOT_TAKEN: Final = Taken(None, NOT_ELIGIBLE)
# The body until JsonBody parses one (a GET's for good): shared, never written, as only POST routes read a body.
NO_BODY: Final[dict[str, Any]] = {}


class RouteInfo(Protocol):
    """What the stack reads of a request's route (server/routes.py's Route; the dispatcher also runs its handler)."""

    @property
    def path(self) -> str: ...
    @property
    def method(self) -> str: ...
    @property
    def prefix(self) -> bool: ...
    @property
    def auth(self) -> bool: ...
    @property
    def anthropic(self) -> bool: ...
    @property
    def json_body(self) -> bool: ...


@dataclass(slots=True, eq=False)
class RequestContext:
    rid: str
    t0: float  # perf_counter at entry: the router-in stage counts body reading and JSON parsing
    method: str
    path: str  # the client's path; a translated request's is the chat route its hops call
    headers: list[tuple[bytes, bytes]]  # the client's, as the server gave them
    query: bytes
    route: RouteInfo | None  # the client's route (None: no such path)
    body: dict[str, Any]  # NO_BODY, or the parsed JSON object (the JSON body step, middleware.JsonBody)
    status: int = 500  # of the response, once it started
    cid: object = None  # the client's conversation id: the body's `conversation_id` (any JSON), else a header's
    cid_in_body: bool = False
    conversation: str | None = None  # the one it runs under: pinned by a front (previous_response_id) or resolved
    derivation: Derivation | None = None  # how a derived conversation id was found (to key the reply)
    taken: Taken = NOT_TAKEN  # the conversation's decode handle, taken for this turn
    released: bool = False  # the taken handle's lease is given back (once: the turn's end, or its failure)
    spent: bool = False  # a prefill got the taken handle (it read the blocks or told the decode to free them)
    started: float = 0.0  # when the completion began (the TTFT metric's origin)
    trace: Trace | None = None  # the turn's spans (turn/trace.py); None: tracing off, or not sampled
    # usage.prompt_tokens_details.cached_tokens for the client: the prefill's own report (its prefix-cache hit plus
    # what it read from the decode) where it made one, else `cached_default` (the X-PD-KV-Reuse tokens) unless the
    # decode's answer carries its own (a local turn).
    cached_tokens: int | None = None
    cached_default: int | None = None
    choice: Choice | None = None  # a warm turn's KV source as the cost model chose it (turn/cost.py)
    decode_sent: float = 0.0  # perf_counter when the decode request went out (the last attempt's)
    first_byte: float = 0.0  # perf_counter when the client's response started (0: not yet)

    @property
    def chat(self) -> bool:
        return self.path == CHAT

    @property
    def holder(self) -> str:
        """The decode holding the conversation's KV ("" when this turn took no handle)."""
        h = self.taken.handle
        return h.decode_url if h is not None else ""

    def release(self, handles: HandleTable) -> None:
        """Give back the lease on the handle this turn took (once): the conversation's next turn may take a new one."""
        if not self.released and self.taken.handle is not None and self.conversation is not None:
            self.released = True
            handles.release(self.conversation)

    def translated(self, body: dict[str, Any]) -> RequestContext:
        """The chat completion an agent-API request is served as: the chat route, its translated body."""
        return replace(self, path=CHAT, body=body)

    def prompt(self, i: int, prompt: Any) -> RequestContext:
        """Prompt `i` of a batch, a conversation of its own (an explicit id gets `#<i>` appended)."""
        return replace(self, body={**self.body, "prompt": prompt}, cid=f"{self.cid}#{i}" if self.cid is not None
                       else None)
