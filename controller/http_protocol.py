"""uvicorn's httptools connection with read timeouts: a silent or slow client cannot hold a
connection (and the memory of its half-read request) for good.

uvicorn closes a keep-alive connection that idles between requests (``timeout_keep_alive``)
but never times out a connection that opened and sent nothing, a request head that trickles
in, or a body that stops halfway. Here a new connection must start a request within
``header_timeout_s``, a request's head must be complete within ``header_timeout_s`` of its
first byte and its body within ``body_timeout_s`` of the head; otherwise the client gets a
408 OpenAI error and the connection is closed. A request whose head and body arrive in one
read, the common case, arms no timer: one is armed only when a read ends mid-request, and
it is re-armed, not replaced, when the deadline moves. Bytes that do not parse as HTTP get
uvicorn's 400 with an OpenAI error body (code ``invalid_http``) instead of its plain text.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from controller.openai_errors import ApiError, read_timeout

Phase = Literal["header", "body"]
# After an error response written before any app ran (408 in the header phase, 400 for bytes
# that are not HTTP), how long the connection stays half-closed, discarding what the client
# still sends, before it is closed (see ``_close_after_response``).
LINGER_S = 2.0


class ReadTimeoutProtocol(HttpToolsProtocol):
    header_timeout_s = 10.0
    body_timeout_s = 60.0

    @classmethod
    def configured(
        cls, header_timeout_s: float, body_timeout_s: float
    ) -> type[ReadTimeoutProtocol]:
        """This protocol with its limits set (uvicorn builds protocols from a class)."""
        limits = {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s}
        return type("ConfiguredReadTimeoutProtocol", (cls,), limits)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase: Phase | None = None  # what is being read; None between requests
        self._deadline_s = 0.0  # loop time by which the phase must end
        self._timer: asyncio.TimerHandle | None = None
        self._linger: asyncio.TimerHandle | None = None  # set once the response is final

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start("header", self.header_timeout_s)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop()
        if self._linger is not None:
            self._linger.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._linger is not None:
            return  # the error response is out: what the client still sends is dropped
        super().data_received(data)  # runs the parser callbacks below
        if self._phase is not None and self._timer is None:
            self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._start("header", self.header_timeout_s)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._start("body", self.body_timeout_s)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._stop()

    def _start(self, phase: Phase, timeout_s: float) -> None:
        self._phase = phase
        self._deadline_s = self.loop.time() + timeout_s

    def _stop(self) -> None:
        self._phase = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            delay_s = max(0.0, self._deadline_s - self.loop.time())
            self._timer = self.loop.call_later(delay_s, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._phase is None or self.transport.is_closing():
            return
        now_s = self.loop.time()
        if now_s >= self._deadline_s and self._is_other_response_going_out():
            # A 408 now would land inside an earlier pipelined request's response.
            limit_s = self.header_timeout_s if self._phase == "header" else self.body_timeout_s
            self._deadline_s = now_s + limit_s
        if now_s < self._deadline_s:
            self._arm()  # the deadline moved on (a new request began): wait for it
            return
        self._expire(self._phase)

    def _is_other_response_going_out(self) -> bool:
        if self._phase == "header":  # self.cycle is still the previous request's
            return self.cycle is not None and not self.cycle.response_complete
        return bool(self.pipeline)  # this request's cycle waits behind another one

    def send_400_response(self, msg: str) -> None:
        """Bytes that do not parse as HTTP: uvicorn's 400, with an OpenAI error body instead of
        its plain text (``msg`` is e.g. "Invalid HTTP request received.")."""
        self._stop()
        error = ApiError(400, f"{msg} Send a well-formed HTTP/1.1 request.", code="invalid_http")
        self.transport.write(_response(b"400 Bad Request", error.body_bytes()))
        self._close_after_response()

    def _expire(self, phase: Phase) -> None:
        """Answer 408 unless this request's response already started (then just close)."""
        self._phase = None
        # In the body phase the app is waiting for the body: closing wakes it with a
        # disconnect, and what it sends after that is dropped by uvicorn.
        if phase == "header" or not self.cycle.response_started:
            limit_s = self.header_timeout_s if phase == "header" else self.body_timeout_s
            body = read_timeout(phase, limit_s).body_bytes()
            self.transport.write(_response(b"408 Request Timeout", body))
        if phase == "header":
            self._close_after_response()
        else:  # the app waits for the body: the close wakes it with a disconnect
            self.transport.close()

    def _close_after_response(self) -> None:
        """Close so that the client reads the response: half-close (FIN after it), drop what the
        client still sends for up to LINGER_S, then close. A plain close while a client is still
        sending (one trickling its head) makes the kernel answer its next bytes with a reset,
        which can discard the unread response on the client's side."""
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self._linger = self.loop.call_later(LINGER_S, self.transport.close)


def _response(status: bytes, body: bytes) -> bytes:
    """A whole response that closes the connection (written before any app runs)."""
    head = (
        b"HTTP/1.1 %s\r\n"
        b"content-type: application/json\r\n"
        b"content-length: %d\r\n"
        b"connection: close\r\n\r\n"
    )
    return head % (status, len(body)) + body
