"""Cancel a request's work when its client disconnects while nothing is being sent.

A non-streaming request sends nothing until its whole answer is ready, so a relay loop never
gets the chance to notice that the client left; without this the backend would generate to
the end for nobody. One watcher task per such request waits on ASGI ``receive`` (which, once
the body has been read, returns only ``http.disconnect``) and cancels the request task.

Race-free by construction: ``stop()`` runs right after the watched work without an await in
between, so a cancellation requested before it is delivered inside the work, never after.
"""

from __future__ import annotations

import asyncio

from starlette.types import Receive


class ClientWatch:
    def __init__(self, receive: Receive) -> None:
        task = asyncio.current_task()
        assert task is not None, "ClientWatch needs a running task"
        self._task = task
        self.is_gone = False
        self._is_watching = True
        self._watcher = asyncio.ensure_future(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if self._is_watching:
            self.is_gone = True
            self._task.cancel()

    def stop(self) -> None:
        """Stop watching; if the client left, undo the cancellation (it was handled)."""
        self._is_watching = False
        self._watcher.cancel()
        if self.is_gone:
            self._task.uncancel()
