"""Admission and slot bookkeeping for continuous batching (no torch).

Running requests occupy cache slots ``0..len(running)-1`` in order, so a batch's rows are a
plain slice of the cache. When a request leaves, the last running request moves into its slot
(the caller copies that slot's cache).
"""

from __future__ import annotations

from collections import deque

from engines.embedded.request import Request


class Scheduler:
    def __init__(self, max_batch_size: int) -> None:
        self.max_batch_size = max_batch_size
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def admit(self) -> list[Request]:
        """Move waiting requests into free slots; return the newly admitted ones."""
        admitted = []
        while self.waiting and len(self.running) < self.max_batch_size:
            request = self.waiting.popleft()
            request.slot = len(self.running)
            self.running.append(request)
            admitted.append(request)
        return admitted

    def release(self, request: Request) -> tuple[int, int] | None:
        """Remove a running request; return (src_slot, dst_slot) if another request moved."""
        index = request.slot
        assert self.running[index] is request, "slot bookkeeping out of sync"
        last = self.running.pop()
        request.slot = -1
        if last is request:
            return None
        self.running[index] = last
        source, last.slot = last.slot, index
        return source, index

    def cancel_waiting(self, request_id: str) -> bool:
        for request in self.waiting:
            if request.request_id == request_id:
                self.waiting.remove(request)
                return True
        return False

    def reset(self) -> list[Request]:
        """Drop every request, running and waiting (after an engine-loop crash); return them."""
        dropped = [*self.running, *self.waiting]
        for request in self.running:
            request.slot = -1
        self.running.clear()
        self.waiting.clear()
        return dropped

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)
