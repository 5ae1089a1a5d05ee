"""The simulator's NIXL side channel (VLLM_NIXL_SIDE_CHANNEL_HOST:PORT): what a peer engine asks of this one's
KV store (kv.py) over HTTP, where vLLM's NIXL agents use their own transport.

    GET  /handshake   this engine's KV layout, as a peer checks it before the first transfer
    POST /read        {"request_id", "block_ids"}: the tokens those blocks hold, for a peer's read (D->P or P->D)
    POST /notify      {"request_ids": [...]} or {"request_id"}: a peer is done with these requests' blocks; they
                      are freed (a batch is one request: the peers' readers send them so)

A malformed body is a 400 with what was wrong; the gauges are refreshed after every read and notify."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from pdctl.sim.engine import Engine


class SideChannel:
    """The side channel's routes over one engine's KV store, as a Starlette app (`app`)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.app = Starlette(routes=[
            Route("/handshake", self.handshake), Route("/read", self.read, methods=["POST"]),
            Route("/notify", self.notify, methods=["POST"]),
        ])

    async def handshake(self, _: Request) -> JSONResponse:
        return JSONResponse(self.engine.store.handshake())

    async def read(self, request: Request) -> JSONResponse:
        try:
            body = await request.json()
            ids = [int(b) for b in body["block_ids"]]
            tokens = self.engine.store.serve_read(str(body["request_id"]), ids)
        except (ValueError, KeyError, TypeError) as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        self.engine.gauges()
        return JSONResponse({"tokens": tokens})

    async def notify(self, request: Request) -> JSONResponse:
        """A peer is done with these requests' blocks: `{"request_ids": [...]}` (a batch) or `{"request_id": ...}`."""
        try:
            body = await request.json()
            ids = body["request_ids"] if "request_ids" in body else [body["request_id"]]
            if not isinstance(ids, list):
                raise TypeError("request_ids must be a list of request ids")
            freed = sum(self.engine.store.release(str(rid), "released") for rid in ids)
        except (ValueError, KeyError, TypeError) as e:
            return JSONResponse({"error": f"notify body: {e}"}, status_code=400)
        self.engine.gauges()
        return JSONResponse({"freed": freed, "ids": len(ids)})
