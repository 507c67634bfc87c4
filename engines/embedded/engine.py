"""The synchronous engine: each ``step()`` admits waiting requests (prefill), asks every running
request's controller for k, runs one batched speculative step, and reports per request.

    schedule (admit + prefill) -> choose k per request -> runner.step -> postprocess (emit, release)
"""

from __future__ import annotations

import logging

import torch

from engines.embedded.events import RequestView, StepReport, TokenEvent
from engines.embedded.request import Request
from engines.embedded.runner import ModelRunner
from engines.embedded.scheduler import Scheduler

logger = logging.getLogger(__name__)


class Engine:
    def __init__(self, runner: ModelRunner, max_batch_size: int, max_seq_len: int) -> None:
        self.runner = runner
        self.block_size = runner.block_size
        self.max_seq_len = max_seq_len
        self.scheduler = Scheduler(max_batch_size)
        self._generators: dict[str, torch.Generator] = {}
        self._shared_generator = torch.Generator().manual_seed(0)

    def add(self, request: Request) -> None:
        total = len(request.prompt_ids) + request.params.max_new_tokens
        if not request.prompt_ids:
            raise ValueError(f"request {request.request_id}: prompt_ids is empty")
        if total > self.max_seq_len:
            raise ValueError(
                f"request {request.request_id}: prompt ({len(request.prompt_ids)} tokens) + "
                f"max_new_tokens ({request.params.max_new_tokens}) = {total} exceeds "
                f"max_seq_len={self.max_seq_len}; shorten it or load with a larger max_seq_len"
            )
        if request.params.seed is not None:
            self._generators[request.request_id] = torch.Generator().manual_seed(
                request.params.seed
            )
        self.scheduler.add(request)

    def abort(self, request_id: str) -> None:
        if self.scheduler.cancel_waiting(request_id):
            return
        for request in self.scheduler.running:
            if request.request_id == request_id:
                self._release(request)
                return

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def step(self) -> list[tuple[Request, TokenEvent]]:
        events = [self._prefill(r) for r in self.scheduler.admit()]
        for request, event in events:  # done after the first token: never join the step
            if event.finished:
                self._release(request)
        rows = list(self.scheduler.running)
        if rows:
            spec_tokens = [self._spec_tokens(r, len(rows)) for r in rows]
            uniforms = torch.stack([self._uniforms(r) for r in rows])
            result = self.runner.step(rows, spec_tokens, uniforms)
            for i, request in enumerate(rows):
                report = StepReport(
                    spec_tokens=spec_tokens[i],
                    accept_length=len(result.new_tokens[i]),
                    accepted=result.accepted[i],
                    step_time_s=result.step_time_s,
                    batch_size=len(rows),
                )
                request.accept_lengths.append(report.accept_length)
                events.append((request, self._event(request, result.new_tokens[i], report)))
        for request, event in sorted(events, key=lambda e: -e[0].slot):
            if event.finished and request.slot >= 0:  # highest slot first: fewest cache moves
                self._release(request)
        return events

    def _prefill(self, request: Request) -> tuple[Request, TokenEvent]:
        first = self.runner.prefill(request, self._uniforms(request))
        return request, self._event(request, [first], None)

    def _event(self, request: Request, tokens: list[int], report: StepReport | None) -> TokenEvent:
        kept = request.append(tokens)
        reason = request.finish_reason
        return TokenEvent(kept, report, reason is not None, reason)

    def _release(self, request: Request) -> None:
        moved = self.scheduler.release(request)
        if moved is not None:
            mover = self.scheduler.running[moved[1]]
            self.runner.release_slot(moved, mover.position)
        self._generators.pop(request.request_id, None)

    def _spec_tokens(self, request: Request, batch_size: int) -> int:
        """k from the request's controller, clamped to [0, block_size - 1] and to what can still
        be emitted. A controller that raises gets k = 0 for this step (logged, never fatal)."""
        view = RequestView(
            request_id=request.request_id,
            step_index=len(request.accept_lengths),
            accept_lengths=request.accept_lengths,
            batch_size=batch_size,
            num_generated=len(request.output_ids),
            context=request.context,
        )
        try:
            k = int(request.controller(view))
        except Exception:
            logger.exception("spec controller failed for request %s; using k=0", request.request_id)
            k = 0
        return max(0, min(k, self.block_size - 1, request.num_remaining - 1))

    def _uniforms(self, request: Request) -> torch.Tensor:
        """2 * block_size + 1 uniforms: draft sampling, accept tests, bonus (greedy: zeros)."""
        size = 2 * self.block_size + 1
        if request.params.temperature <= 0:
            return torch.zeros(size)
        generator = self._generators.get(request.request_id, self._shared_generator)
        return torch.rand(size, generator=generator)
