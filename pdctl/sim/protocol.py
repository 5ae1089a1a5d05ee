"""vLLM's OpenAI request validation and response shapes, as plain dicts (field names from vLLM 0.26.0 bodies)."""

from __future__ import annotations

import functools
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from pdctl.sim.engine import EngineError
from pdctl.sim.tokenizer import decode, decode_piece, encode, render_chat
from pdctl.sim.tools import ToolCall, decide

FINGERPRINT = "vllm-0.26.0-pdctl-sim"
# Without max_tokens the simulator stops as if it sampled EOS after this many tokens.
DEFAULT_CHAT_TOKENS = 64
DEFAULT_COMPLETION_TOKENS = 16


def error_body(status: int, message: str, err_type: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def validation_error(loc: str, kind: str, msg: str, value: Any) -> EngineError:
    """Pydantic-style 400, the shape vLLM's request validation produces."""
    detail = f"1 validation error:\n  {{'type': '{kind}', 'loc': ('body', '{loc}'), 'msg': '{msg}', " \
        f"'input': {value!r}}}"
    return EngineError(400, detail, "Bad Request", f"body.{loc}")


@dataclass
class Parsed:
    chat: bool
    model: str
    prompt: list[int]
    max_tokens: int
    finish_reason: str
    stream: bool
    include_usage: bool
    return_token_ids: bool
    kv_params: dict[str, Any] | None
    thinking: bool
    n: int = 1
    tool: ToolCall | None = None


def parse(body: Any, chat: bool, served: tuple[str, ...], max_model_len: int) -> Parsed:
    if not isinstance(body, dict):
        raise validation_error("0", "model_attributes_type", "Input should be a valid dictionary", body)
    model = body.get("model")
    if model is None:
        raise validation_error("model", "missing", "Field required", body)
    if not isinstance(model, str):
        raise validation_error("model", "string_type", "Input should be a valid string", model)
    if model not in served:
        raise EngineError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
    prompt = _chat_prompt(body) if chat else _completion_prompt(body)
    if not prompt:
        raise EngineError(400, "The prompt cannot be empty.", "BadRequestError", "prompt")
    raw_max = body.get("max_completion_tokens") if chat and body.get("max_tokens") is None else body.get("max_tokens")
    if raw_max is not None and (not isinstance(raw_max, int) or isinstance(raw_max, bool)):
        raise validation_error("max_tokens", "int_type", "Input should be a valid integer", raw_max)
    if raw_max is not None and raw_max < 1:
        raise EngineError(400, f"max_tokens must be at least 1, got {raw_max}.", "BadRequestError", "max_tokens")
    default = DEFAULT_CHAT_TOKENS if chat else DEFAULT_COMPLETION_TOKENS
    max_tokens = raw_max if raw_max is not None else max(1, min(default, max_model_len - len(prompt)))
    min_tokens = body.get("min_tokens", 0)
    if not isinstance(min_tokens, int) or min_tokens < 0 or min_tokens > max_tokens:
        raise EngineError(400, f"min_tokens must be between 0 and max_tokens={max_tokens}, got {min_tokens}.",
                          "BadRequestError", "min_tokens")
    n = body.get("n", 1) or 1
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 16:
        raise EngineError(400, f"n must be an integer from 1 to 16, got {n!r}.", "BadRequestError", "n")
    if len(prompt) + max_tokens > max_model_len:
        total = len(prompt) + max_tokens
        raise EngineError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{max_tokens} output tokens and your prompt contains {len(prompt)} input tokens, for a total of "
            f"{total} tokens. Please reduce the length of the input prompt or the number of requested output "
            f"tokens. (parameter=input_tokens, value={len(prompt)})",
            "BadRequestError", "input_tokens",
        )
    kv = body.get("kv_transfer_params")
    if kv is not None and not isinstance(kv, dict):
        raise validation_error("kv_transfer_params", "dict_type", "Input should be a valid dictionary", kv)
    options = body.get("stream_options") or {}
    kwargs = body.get("chat_template_kwargs") or {}
    tool = decide(body, prompt, max_tokens) if chat and n == 1 else None
    return Parsed(
        chat=chat, model=model, prompt=prompt, max_tokens=max_tokens, n=n, tool=tool,
        finish_reason="tool_calls" if tool else "length" if raw_max is not None else "stop",
        stream=bool(body.get("stream", False)),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        return_token_ids=bool(body.get("return_token_ids", False)),
        kv_params=kv, thinking=bool(isinstance(kwargs, dict) and kwargs.get("enable_thinking")),
    )


def _completion_prompt(body: dict[str, Any]) -> list[int]:
    prompt = body.get("prompt")
    if prompt is None:
        raise validation_error("prompt", "missing", "Field required", body)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return encode(prompt)
    if isinstance(prompt, list) and set(map(type, prompt)) <= {int}:  # one C pass over 25k ids; bools are not int
        return list(prompt)
    raise EngineError(400, "prompt must be a string, a list of token ids, or a batch of one of those.",
                      "BadRequestError", "prompt")


def _chat_prompt(body: dict[str, Any]) -> list[int]:
    messages = body.get("messages")
    if messages is None:
        raise validation_error("messages", "missing", "Field required", body)
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise EngineError(400, "messages must be a list of objects with a role.", "BadRequestError", "messages")
    return render_chat(messages, add_generation_prompt=body.get("add_generation_prompt", True))


def tokenize_prompt(body: Any) -> list[int]:
    if not isinstance(body, dict):
        raise validation_error("0", "model_attributes_type", "Input should be a valid dictionary", body)
    if "messages" in body:
        return _chat_prompt(body)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise validation_error("prompt", "missing", "Field required", body)
    return encode(prompt)


def new_ids(chat: bool, header_id: str | None) -> tuple[str, str]:
    """(response id, internal request id) as vLLM forms them: `cmpl-<X-Request-Id or random>`, `<id>-0-<rand>`."""
    base = header_id or uuid.uuid4().hex[:16]
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{base}"
    return rid, f"{rid}-0-{uuid.uuid4().hex[:8]}"


def usage(prompt: int, completion: int, cached: int | None = None) -> dict[str, Any]:
    """vLLM's usage; `cached` (with --enable-prompt-tokens-details): prompt tokens whose KV was not computed."""
    details = {"cached_tokens": cached} if cached is not None else None
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            "prompt_tokens_details": details}


def full_body(p: Parsed, rid: str, model: str, outputs: list[list[int]], kv: dict[str, Any] | None,
              cached: int | None = None) -> dict[str, Any]:
    """The whole response; `outputs` holds one token list per choice (n of them)."""
    pids = p.prompt if p.return_token_ids else None
    base = {"id": rid, "object": "chat.completion" if p.chat else "text_completion", "created": int(time.time()),
            "model": model}
    choices: list[dict[str, Any]] = []
    for i, output in enumerate(outputs):
        text = decode(output)
        tids = output if p.return_token_ids else None
        if p.chat:
            calls = [p.tool.openai()] if p.tool else []
            message: dict[str, Any] = {"role": "assistant", "content": None if p.tool else text, "refusal": None,
                       "annotations": None, "audio": None, "function_call": None, "tool_calls": calls,
                       "reasoning": None}
            choices.append({"index": i, "message": message, "logprobs": None, "finish_reason": p.finish_reason,
                            "stop_reason": None, "token_ids": tids})
        else:
            choices.append({"index": i, "text": text, "logprobs": None, "finish_reason": p.finish_reason,
                            "stop_reason": None, "token_ids": tids, "prompt_logprobs": None,
                            "prompt_token_ids": pids, "routed_experts": None})
    extra = {"prompt_logprobs": None, "prompt_token_ids": pids} if p.chat else {}
    return {**base, "choices": choices, "service_tier": None, "system_fingerprint": FINGERPRINT,
            "usage": usage(len(p.prompt), sum(len(o) for o in outputs), cached), **extra, "kv_transfer_params": kv,
            "ec_transfer_params": None, "metrics": None}


def chunk(p: Parsed, rid: str, created: int, model: str, token: int | None, first: bool, final: bool,
          kv: dict[str, Any] | None = None, index: int = 0, delta: dict[str, Any] | None = None) -> dict[str, Any]:
    """One SSE chunk; the final one (finish_reason set) carries kv_transfer_params, as vLLM 0.33 does."""
    finish = p.finish_reason if final else None
    tids = [token] if p.return_token_ids and token is not None else None
    out: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk" if p.chat else "text_completion",
                           "created": created, "model": model}
    piece = decode_piece(token) if token is not None else ""
    if p.chat:
        if delta is None:
            delta = {"role": "assistant", "content": ""} if token is None else {"content": piece}
        out["choices"] = [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish,
                           "stop_reason": None, "token_ids": tids}]
        if first and p.return_token_ids:
            out["prompt_token_ids"] = p.prompt
    else:
        out["choices"] = [{"index": index, "text": piece, "logprobs": None, "finish_reason": finish,
                           "stop_reason": None,
                           "prompt_token_ids": p.prompt if first and p.return_token_ids else None,
                           "token_ids": tids}]
    if final and not p.include_usage:
        out["system_fingerprint"] = FINGERPRINT
    out["kv_transfer_params"] = kv if final else None
    return out


_SENTINEL = -7777777


def middle_template(p: Parsed, rid: str, created: int, model: str) -> str:
    """The SSE line of a chunk that is neither first nor final, as a str.format template ({piece}, {tid}),
    so that streaming costs one format call per token rather than a JSON encode."""
    line = sse(chunk(p, rid, created, model, _SENTINEL, first=False, final=False))
    line = line.replace("{", "{{").replace("}", "}}")
    return line.replace(json.dumps(decode_piece(_SENTINEL))[1:-1], "{piece}").replace(str(_SENTINEL), "{tid}")


@functools.lru_cache(maxsize=65536)
def escaped_piece(token_id: int) -> str:
    """A generated token's text as it goes inside a JSON string in `middle_template`'s {piece}: a token that is a
    double quote or a backslash (the vocabulary has both) would otherwise end the string early."""
    return json.dumps(decode_piece(token_id))[1:-1]


def dumps_bytes(data: Any) -> bytes:
    """A JSON body as the engine sends it; the time a real engine takes is modelled, not this process's own."""
    return _dumps(data).encode()


def sse(data: dict[str, Any]) -> str:
    return f"data: {_dumps(data)}\n\n"


try:  # vLLM writes its chunks with pydantic-core's Rust serializer: a first chunk's 25k prompt ids take ~1 ms,
    import orjson  # not the ~7 ms of the stdlib's

    def _dumps(data: Any) -> str:
        return orjson.dumps(data).decode()
except ImportError:  # pragma: no cover - orjson comes with pdctl

    def _dumps(data: Any) -> str:
        return json.dumps(data, separators=(",", ":"))


def usage_chunk(p: Parsed, rid: str, created: int, model: str, completion: int,
                cached: int | None = None) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion.chunk" if p.chat else "text_completion", "created": created,
            "model": model, "choices": [], "usage": usage(len(p.prompt), completion, cached),
            "system_fingerprint": FINGERPRINT}
