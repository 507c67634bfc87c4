"""A fake OpenAI-compatible upstream (aiohttp) shaped like vLLM, to test the gateway above it.

It never stands in for vLLM itself (tests/integration runs the real one); it lets gateway
tests choose failures: refuse with 503, die mid-stream, stall, or report spec metrics.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Behaviour:
    num_chunks: int = 5
    chunk_delay_s: float = 0.0
    status: int = 200  # non-200: answer every completion request with this status
    die_after_chunks: int | None = None  # close the connection mid-stream
    is_healthy: bool = True
    health_delay_s: float = 0.0  # GET /health answers after this long
    # Reported as vLLM's metrics.speculative_decoding (None: a pool without speculation).
    spec: dict[str, Any] | None = None
    received: list[dict[str, Any]] = field(default_factory=list)
    whole_delay_s: float = 0.0  # non-streaming answers wait this long
    num_client_gone: int = 0  # streams the gateway dropped before the end


def vllm_spec_metrics(num_spec_tokens: int = 7) -> dict[str, Any]:
    """A vLLM 0.32 SpeculativeDecodingMetrics object: 4 steps, 10 of 28 drafts accepted."""
    return {
        "mean_acceptance_length": 3.5,
        "draft_acceptance_rate": 10 / 28,
        "acceptance_histogram": [0, 1, 1, 1, 1, 0, 0, 0][: num_spec_tokens + 1],
        "num_spec_steps": 4,
        "num_accepted_draft_tokens": 10,
        "num_draft_tokens": 28,
        "num_spec_tokens": num_spec_tokens,
    }


def _chunk(model: str, obj: str, index: int, text: str, finish: str | None) -> dict[str, Any]:
    if obj == "chat.completion.chunk":
        choice: dict[str, Any] = {"index": index, "delta": {"content": text}}
    else:
        choice = {"index": index, "text": text}
    choice["logprobs"] = None
    choice["finish_reason"] = finish
    return {"id": "cmpl-fake", "object": obj, "created": 1, "model": model, "choices": [choice]}


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class FakeUpstream:
    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.behaviour = behaviour or Behaviour()
        self.app = web.Application()
        self.app.router.add_get("/health", self._health)
        self.app.router.add_post("/v1/chat/completions", self._chat)
        self.app.router.add_post("/v1/completions", self._completions)
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        self._runner = web.AppRunner(self.app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _health(self, request: web.Request) -> web.Response:
        if self.behaviour.health_delay_s:
            await asyncio.sleep(self.behaviour.health_delay_s)
        return web.Response(status=200 if self.behaviour.is_healthy else 503)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "chat.completion")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "text_completion")

    async def _complete(self, request: web.Request, obj: str) -> web.StreamResponse:
        b = self.behaviour
        body = await request.json()
        b.received.append(body)
        if b.status != 200:
            error = {"error": {"message": "fake failure", "type": "server_error"}}
            return web.json_response(error, status=b.status)
        model = body["model"]
        if not body.get("stream"):
            await asyncio.sleep(b.whole_delay_s)
            return web.json_response(self._whole(model, obj))
        return await self._stream(
            request, body, model, obj + ("" if obj.startswith("text") else ".chunk")
        )

    def _whole(self, model: str, obj: str) -> dict[str, Any]:
        b = self.behaviour
        text = "tok " * b.num_chunks
        if obj == "chat.completion":
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text}
        choice["finish_reason"] = "length"
        out: dict[str, Any] = {
            "id": "cmpl-fake",
            "object": obj,
            "created": 1,
            "model": model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": 3,
                "completion_tokens": b.num_chunks,
                "total_tokens": 3 + b.num_chunks,
            },
        }
        if b.spec is not None:
            out["metrics"] = {"speculative_decoding": b.spec}
        return out

    async def _stream(
        self, request: web.Request, body: dict[str, Any], model: str, obj: str
    ) -> web.StreamResponse:
        b = self.behaviour
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(b.num_chunks):
            if b.die_after_chunks is not None and i == b.die_after_chunks:
                request.transport.close()  # type: ignore[union-attr]
                return resp
            finish = "length" if i == b.num_chunks - 1 else None
            try:
                await resp.write(_sse(_chunk(model, obj, 0, "tok ", finish)))
            except ConnectionResetError:
                b.num_client_gone += 1
                return resp
            if b.chunk_delay_s:
                await asyncio.sleep(b.chunk_delay_s)
        if (body.get("stream_options") or {}).get("include_usage"):
            usage: dict[str, Any] = {
                "id": "cmpl-fake",
                "object": obj,
                "created": 1,
                "model": model,
                "choices": [],
                "usage": {
                    "prompt_tokens": 3,
                    "completion_tokens": b.num_chunks,
                    "total_tokens": 3 + b.num_chunks,
                },
            }
            if b.spec is not None:
                usage["metrics"] = {"speculative_decoding": b.spec}
            await resp.write(_sse(usage))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
