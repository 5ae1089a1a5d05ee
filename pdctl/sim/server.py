"""The simulator's HTTP surfaces: vLLM's OpenAI API on --host:--port and the NIXL side channel (side_channel.py) on
VLLM_NIXL_SIDE_CHANNEL_HOST:PORT, both served by one uvicorn server and told apart by local port."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from pdctl.sim import agentapi, protocol, timing
from pdctl.sim.auth import authorized
from pdctl.sim.config import SimConfig
from pdctl.sim.engine import Engine, EngineError, GenRequest, Run
from pdctl.sim.gone import ClientGone, collect, unless_gone
from pdctl.sim.metrics import SimMetrics, log_stats
from pdctl.sim.protocol import sse
from pdctl.sim.side_channel import SideChannel
from pdctl.sim.tokenizer import decode, generate, token_str, unknown_share

log = logging.getLogger("vllm.entrypoints.openai.api_server")
BATCH_CHUNKS = 16


def _error(e: EngineError) -> JSONResponse:
    return JSONResponse(protocol.error_body(e.status, e.message, e.err_type, e.param), status_code=e.status)


async def _not_found(_: Request, __: Exception) -> JSONResponse:
    return JSONResponse({"detail": "Not Found"}, status_code=404)  # FastAPI's answer for a route vLLM lacks


async def _not_allowed(_: Request, __: Exception) -> JSONResponse:
    return JSONResponse({"detail": "Method Not Allowed"}, status_code=405)


class SimServer:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.metrics = SimMetrics(cfg.model_name)
        self.metrics.cache_config(cfg.block_size, cfg.num_gpu_blocks)
        self.served_names = cfg.served_model_names or (cfg.model,)
        self.engine = Engine(cfg, self.metrics)
        self.finished = 0
        self.unknown_prompts, self.unknown_warned = 0, -60.0
        self.api = Starlette(routes=[
            Route("/health", self.health), Route("/v1/models", self.models),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/responses", self.responses, methods=["POST"]),
            Route("/v1/messages", self.messages, methods=["POST"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]), Route("/metrics", self.metrics_page),
            Route("/version", lambda _: JSONResponse({"version": "0.26.0+pdctl.sim"})),
            Route("/reset_prefix_cache", self.reset_prefix_cache, methods=["POST"]),
        ], exception_handlers={404: _not_found, 405: _not_allowed})
        self.side = SideChannel(self.engine).app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.api(scope, receive, send)
            return
        server = scope.get("server") or (None, None)
        if server[1] == self.cfg.side_channel_port:
            await self.side(scope, receive, send)
        elif self.cfg.api_key and not authorized(scope, self.cfg.api_key):
            await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
        else:
            await self.api(scope, receive, send)

    # -- OpenAI API ---------------------------------------------------------------------------------------
    async def health(self, _: Request) -> Response:
        return Response(status_code=200)

    async def models(self, _: Request) -> JSONResponse:
        now = int(time.time())
        data: list[dict[str, Any]] = [
            {"id": name, "object": "model", "created": now, "owned_by": "vllm", "root": self.cfg.model,
             "parent": None, "max_model_len": self.cfg.max_model_len, "permission": []}
            for name in self.served_names]
        return JSONResponse({"object": "list", "data": data})

    async def metrics_page(self, _: Request) -> Response:
        self.engine.gauges()
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def tokenize(self, request: Request) -> Response:
        started = time.perf_counter()
        try:
            body = await self._json(request)
            ids = protocol.tokenize_prompt(body)
        except EngineError as e:
            return _error(e)
        strs = [token_str(i) for i in ids] if body.get("return_token_strs") else None  # vLLM: only when asked
        resp = Response(protocol.dumps_bytes({"count": len(ids), "max_model_len": self.cfg.max_model_len,
                                              "tokens": ids, "token_strs": strs}), media_type="application/json")
        await self._spend(timing.tokenize_ms(len(ids), strs is not None), started)
        self.metrics.lab(self.metrics.tokenize_calls).inc()
        self.metrics.lab(self.metrics.tokenize_bytes).inc(len(resp.body))
        return resp

    async def _spend(self, model_ms: float, started: float) -> None:
        """Take `model_ms` of modelled time since `started`, counting what this process really spent."""
        pacer = timing.Pacer(self.cfg.speed)
        spent = (time.perf_counter() - started) * 1000 / pacer.scale if pacer.scale else 0.0
        await pacer.wait_ms(model_ms - spent)

    async def detokenize(self, request: Request) -> JSONResponse:
        try:
            body = await self._json(request)
            tokens = body.get("tokens") if isinstance(body, dict) else None
            if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
                raise protocol.validation_error("tokens", "list_type", "Input should be a valid list", tokens)
        except EngineError as e:
            return _error(e)
        return JSONResponse({"prompt": decode(tokens).lstrip(" ")})

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def _json(self, request: Request) -> Any:
        raw = await request.body()
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            msg = getattr(e, "msg", str(e))
            raise EngineError(
                400,
                f"1 validation error:\n  {{'type': 'json_invalid', 'loc': ('body', {getattr(e, 'pos', 0)}), "
                f"'msg': 'JSON decode error', 'input': {{}}, 'ctx': {{'error': '{msg}'}}}}",
                "Bad Request", f"body.{getattr(e, 'pos', 0)}",
            ) from e

    async def _generate(self, request: Request, chat: bool) -> Response:
        started = time.perf_counter()
        try:
            body = await self._json(request)
            marker = self.cfg.poison_marker
            if marker and marker in json.dumps(body):
                raise EngineError(500, "Internal server error: the engine failed on this request "
                                  "(--poison-marker)", "InternalServerError")
            p = protocol.parse(body, chat, self.served_names, self.cfg.max_model_len)
            self._unknown(p.prompt)
            if chat or isinstance(body.get("prompt"), str):  # token-id prompts skip the tokenizer
                self.metrics.lab(self.metrics.encoded).inc(len(p.prompt))
                await self._spend(timing.encode_ms(len(p.prompt)), started)
            rid, internal = protocol.new_ids(chat, request.headers.get("x-request-id"))
            if p.n > 1:
                return await self._samples(request, p, rid, internal)
            forced = p.tool.ids if p.tool else None
            encoded = chat or isinstance(body.get("prompt"), str)  # then _spend took the time so far already
            start = self.engine.start(GenRequest(internal, p.prompt, p.max_tokens, p.kv_params, p.thinking, forced,
                                                 time.perf_counter() if encoded else started))
            run = await unless_gone(request, start)
        except EngineError as e:
            return _error(e)
        except ClientGone:
            return Response(status_code=499)
        if p.stream:
            stream = self._stream(p, rid, run) if p.tool is None else self._stream_slow(p, rid, [run])
            return StreamingResponse(stream, media_type="text/event-stream")
        try:
            output = await unless_gone(request, collect(run))
            kv = run.finish()
        except ClientGone:  # vLLM aborts a request whose client disconnected, streaming or not
            return Response(status_code=499)
        finally:
            run.abort()
        self._count_finished()
        return JSONResponse(protocol.full_body(p, rid, p.model, [output], kv, self._cached(run)))

    async def responses(self, request: Request) -> Response:
        return await self._agent(request, anthropic=False)

    async def messages(self, request: Request) -> Response:
        return await self._agent(request, anthropic=True)

    async def _agent(self, request: Request, anthropic: bool) -> Response:
        """/v1/responses and /v1/messages: the request through the chat template, the answer in the API's shape."""
        try:
            body = await self._json(request)
            chat = agentapi.messages_chat(body) if anthropic else agentapi.responses_chat(body)
            p = protocol.parse(chat, True, self.served_names, self.cfg.max_model_len)
            rid, internal = protocol.new_ids(True, request.headers.get("x-request-id"))
            rid = rid.replace("chatcmpl-", "resp_")
            run = await self.engine.start(GenRequest(internal, p.prompt, p.max_tokens, p.kv_params, p.thinking,
                                                     p.tool.ids if p.tool else None))
        except EngineError as e:
            if anthropic:
                kind = {404: "not_found_error"}.get(e.status, "invalid_request_error")
                return JSONResponse({"type": "error", "error": {"type": kind, "message": e.message}},
                                    status_code=e.status)
            return _error(e)
        if p.stream:
            async def tokens() -> AsyncIterator[int]:
                async for t in run.tokens():
                    yield t
                run.finish()

            async def events() -> AsyncIterator[str]:
                try:
                    stream = agentapi.message_events(p, tokens()) if anthropic else \
                        agentapi.response_events(p, rid, tokens())
                    async for e in stream:
                        yield e
                finally:
                    run.abort()
                self._count_finished()

            return StreamingResponse(events(), media_type="text/event-stream")
        try:
            output = [t async for t in run.tokens()]
            kv = run.finish()
        finally:
            run.abort()
        self._count_finished()
        if anthropic:
            return JSONResponse(agentapi.message_object(p, output, kv))
        return JSONResponse(agentapi.response_object(p, rid, output))

    async def _samples(self, request: Request, p: protocol.Parsed, rid: str, internal: str) -> Response:
        """n > 1: one run per sample, sample i > 0 writing its own tokens (vLLM fans out child requests)."""
        runs: list[Run] = []
        try:
            for i in range(p.n):
                forced = generate([*p.prompt, i], p.max_tokens) if i else None
                runs.append(await self.engine.start(GenRequest(f"{internal}-{i}", p.prompt, p.max_tokens,
                                                               p.kv_params, p.thinking, forced)))
        except BaseException:
            for run in runs:
                run.abort()
            raise
        if p.stream:
            return StreamingResponse(self._stream_slow(p, rid, runs), media_type="text/event-stream")
        try:
            outputs = [await unless_gone(request, collect(run)) for run in runs]
            for run in runs:
                run.finish()
        except ClientGone:  # as for one sample: vLLM aborts the request (all its children)
            return Response(status_code=499)
        finally:
            for run in runs:
                run.abort()
        self._count_finished()
        return JSONResponse(protocol.full_body(p, rid, p.model, outputs, None))

    async def _stream_slow(self, p: protocol.Parsed, rid: str, runs: list[Run]) -> AsyncIterator[str]:
        """Token by token without the fast path's template: tool calls and n > 1 (choice after choice)."""
        created = int(time.time())
        try:
            for index, run in enumerate(runs):
                last = len(run.output) - 1
                if p.chat:
                    yield sse(protocol.chunk(p, rid, created, p.model, None, first=True, final=False, index=index))
                i = 0
                async for token in run.tokens():
                    kv = run.finish() if i == last else None
                    delta = p.tool.delta(i) if p.tool else None
                    yield sse(protocol.chunk(p, rid, created, p.model, token, first=i == 0 and not p.chat,
                                             final=i == last, kv=kv if self.cfg.stream_kv_params else None,
                                             index=index, delta=delta))
                    i += 1
            if p.include_usage:
                yield sse(protocol.usage_chunk(p, rid, created, p.model, sum(len(r.output) for r in runs)))
            yield "data: [DONE]\n\n"
        finally:
            for run in runs:
                run.abort()
        self._count_finished()

    async def _stream(self, p: protocol.Parsed, rid: str, run: Run) -> AsyncIterator[str]:
        created = int(time.time())
        last = len(run.output) - 1
        try:
            if p.chat:
                yield sse(protocol.chunk(p, rid, created, p.model, None, first=True, final=False))
            middle = protocol.middle_template(p, rid, created, p.model)
            # With no delays to honour, several SSE events per write keep the server off the critical path.
            batch, pending = run.pacer.scale == 0.0, []
            i = 0
            async for token in run.tokens():
                if i == last:
                    kv = run.finish()
                    yield sse(protocol.chunk(p, rid, created, p.model, token, first=i == 0 and not p.chat,
                                             final=True, kv=kv if self.cfg.stream_kv_params else None))
                elif i == 0 and not p.chat:
                    yield sse(protocol.chunk(p, rid, created, p.model, token, first=True, final=False))
                elif batch:
                    pending.append(middle.format(piece=protocol.escaped_piece(token), tid=token))
                    if len(pending) >= BATCH_CHUNKS or i + 1 == last:
                        yield "".join(pending)
                        pending.clear()
                else:
                    yield middle.format(piece=protocol.escaped_piece(token), tid=token)
                i += 1
            if p.include_usage:
                yield sse(protocol.usage_chunk(p, rid, created, p.model, len(run.output), self._cached(run)))
            yield "data: [DONE]\n\n"
        finally:
            run.abort()
        self._count_finished()

    def _unknown(self, prompt: list[int]) -> None:
        """Warn (once a minute) of prompts mostly `<unk>`: a client's tokenizer that did not know its text made them
        (AIPerf and GuideLLM build prompts by decoding token ids), so every such prompt is the same."""
        share = unknown_share(prompt)
        if share < 0.5:
            return
        self.unknown_prompts += 1
        now = time.monotonic()
        if now - self.unknown_warned >= 60:
            self.unknown_warned = now
            log.warning("pdctl-sim: %d prompt(s) mostly `<unk>` (this one %.0f%% of %d tokens): the client's "
                        "tokenizer does not know its text, so its prompts are all alike. Point it at the simulated "
                        "model's tokenizer: `pdctl tokenizer --out DIR`, then e.g. `aiperf --tokenizer DIR`",
                        self.unknown_prompts, share * 100, len(prompt))

    def _cached(self, run: Run) -> int | None:
        return run.cached if self.cfg.prompt_tokens_details else None

    async def reset_prefix_cache(self, _: Request) -> Response:
        """vLLM's dev-mode route (VLLM_SERVER_DEV_MODE=1): forget every cached prefix; 200 with no body."""
        self.engine.pool.reset_prefix_cache()
        log.info("pdctl-sim: prefix cache reset")
        return Response(status_code=200)

    def _count_finished(self) -> None:
        self.finished += 1
        if self.cfg.die_after and self.finished >= self.cfg.die_after:
            log.error("pdctl-sim: --die-after %d reached, exiting", self.cfg.die_after)
            asyncio.get_running_loop().call_later(0.2, os._exit, 1)

    # -- background -----------------------------------------------------------------------------------------
    async def housekeeping(self) -> None:
        next_stats = time.monotonic() + self.cfg.log_stats_interval
        while True:
            await asyncio.sleep(min(0.5, self.cfg.log_stats_interval))
            if self.engine.store.sweep():
                self.engine.gauges()
            if time.monotonic() >= next_stats:
                next_stats = time.monotonic() + self.cfg.log_stats_interval
                log_stats(self.metrics)


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted sockets inherit it; without it a keep-alive response body waits ~40 ms for delayed ACKs
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def freeze_startup_heap() -> int:
    """As vLLM does once its engine is built (EngineCore.__init__'s freeze_gc_heap() in vllm/v1/engine/core.py; the
    API server's lifespan in vllm/entrypoints/openai/api_server.py): collect, then mark what is left as static so
    the garbage collector never scans it again. Here that is every KV block's Block, two million with a large
    --num-gpu-blocks: an oldest-generation collection walked them all (0.2-0.45 s with the event loop stopped,
    about one per 10,000 requests under load in the router CPU bench), a pause every stream on the engine felt.
    Returns how many objects are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


async def serve(cfg: SimConfig) -> None:
    sim = SimServer(cfg)
    sim.metrics.gc_frozen.set(freeze_startup_heap())
    sockets = [_listen(cfg.host, cfg.port), _listen(cfg.side_channel_host, cfg.side_channel_port)]
    config = uvicorn.Config(sim, log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=30,
                            timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    keeper = asyncio.create_task(sim.housekeeping())
    log.info("Starting vLLM API server (pdctl simulator, role %s) on http://%s:%d, NIXL side channel %s:%d",
             cfg.role, cfg.host, cfg.port, cfg.side_channel_host, cfg.side_channel_port)
    try:
        await server.serve(sockets=sockets)
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
        await sim.engine.reader.aclose()
