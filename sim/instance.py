"""One simulated continuous-batching engine: its queue, its batch and its clock.

Recipe per ``step()``: admit waiting requests that fit (a prefill step emits their first
token), otherwise one decode step: the chooser picks k per request, the step costs
T(B, mean padded verify width) + the draft forward (``cost.batch_verify``: ragged, or padded
to the widest row), each request advances by its accepted drafts + 1. Finished requests are
handed to ``on_finish`` (the closed loop sends the client's next request from there).
``SimServer`` runs one instance; ``FleetServer`` runs several behind a router.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from policies.costmodel import CostModel, padded_width
from sim.choosers import KChooser
from sim.request import SimRequest
from sim.scenario import Costs
from sim.stats import RunStats

FinishHook = Callable[[SimRequest, float], None]


class Instance:
    def __init__(
        self,
        max_batch_size: int,
        costs: Costs,
        chooser: KChooser,
        cost: CostModel,
        stats: RunStats,
        on_finish: FinishHook,
    ):
        self._max_batch_size = max_batch_size
        self._costs = costs
        self._chooser = chooser
        self._cost = cost
        self._stats = stats
        self._on_finish = on_finish
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.now_s = 0.0

    @property
    def is_busy(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def load(self) -> int:
        """Requests on this instance (running + waiting): what a least-loaded router reads."""
        return len(self.running) + len(self.waiting)

    def submit(self, request: SimRequest) -> None:
        """Queue ``request``; an idle instance's clock jumps to its arrival."""
        if not self.is_busy:
            self.now_s = max(self.now_s, request.arrival_s)
        self.waiting.append(request)

    def step(self) -> None:
        """One prefill or decode step (the instance must be busy)."""
        assert self.is_busy, "step() on an idle instance"
        if not self._admit():
            self._decode_step()

    def _admit(self) -> bool:
        """Prefill waiting requests that fit; returns whether a prefill step ran."""
        admitted: list[SimRequest] = []
        while self.waiting and len(self.running) < self._max_batch_size:
            admitted.append(self.waiting.popleft())
        if not admitted:
            return False
        cost = self._costs
        prompt = sum(r.spec.prompt_tokens for r in admitted)
        forwards = len(admitted) if cost.prefill_batching == "per_request" else 1
        self.now_s += forwards * cost.prefill_base_s + cost.prefill_s_per_token * prompt
        for request in admitted:
            request.first_token_s = self.now_s
            request.position = 1
            self._stats.add_first_token(request.arrival_s, self.now_s - request.arrival_s)
        self._stats.add_tokens(self.now_s, len(admitted))
        self.running.extend(admitted)
        self._retire([r for r in admitted if r.remaining <= 0])
        return True

    def _decode_step(self) -> None:
        batch = self.running
        size = len(batch)
        ks = self._chooser.choose(batch, self.now_s)
        mean_width, drafting = batch_shape(ks, self._costs)
        # A policy that read the draft's confidence drafted before it chose k: rows it then
        # gave k = 0 still paid for their draft.
        drafted = getattr(self._chooser, "last_drafted_share", None)
        seconds = 0.0
        if drafted is not None:
            drafting = max(drafting, drafted)
            # ... and the device idled while the host allocated (the two-phase wait)
            seconds = self._costs.two_phase_wait_s + size * self._costs.two_phase_wait_per_row_s
        seconds += self._cost.base_step_time_s(size, mean_width, drafting)
        seconds -= self._narrow_draft_saving_s(size, ks, mean_width, drafting)
        self.now_s += seconds
        emitted = [r.advance(k) for r, k in zip(batch, ks, strict=True)]
        lengths = [r.accept_history[-1] for r in batch]
        self._chooser.record(batch, ks, lengths, (seconds, mean_width, drafting))
        self._stats.add_tokens(self.now_s, sum(emitted))
        self._stats.add_step(self.now_s, ks)
        self._retire([r for r in batch if r.remaining <= 0])

    def _narrow_draft_saving_s(
        self, size: int, ks: Sequence[int], mean_width: float, drafting: float
    ) -> float:
        """What a narrow draft saves (``cost.narrow_draft_factor``): the step's rows drafted at
        most ``narrow_draft_positions`` positions (a two-phase chooser says what it drafted;
        a one-phase step drafts its widest k)."""
        costs = self._costs
        if costs.narrow_draft_factor is None or drafting <= 0:
            return 0.0
        drafted = getattr(self._chooser, "last_drafted_positions", None)
        positions = max(ks) if drafted is None else drafted
        if positions > costs.narrow_draft_positions:
            return 0.0
        draft_s = self._cost.base_step_time_s(size, mean_width, drafting)
        draft_s -= self._cost.base_step_time_s(size, mean_width, 0.0)
        return (1.0 - costs.narrow_factor(size)) * draft_s

    def _retire(self, finished: list[SimRequest]) -> None:
        if not finished:
            return
        done = {id(r) for r in finished}
        self.running = [r for r in self.running if id(r) not in done]
        for request in finished:
            request.finish_s = self.now_s
            assert request.first_token_s is not None, "finished before its first token"
            generated = max(1, request.spec.num_output_tokens - 1)
            tpot_s = (self.now_s - request.first_token_s) / generated
            self._stats.add_finish(self.now_s, tpot_s, request.arrival_s)
            self._on_finish(request, self.now_s)


def batch_shape(spec_tokens: Sequence[int], cost: Costs) -> tuple[float, float]:
    """(verify tokens per row, share of rows that run the draft) for one decode step."""
    widths = [padded_width(k, cost.verify_width_multiple) for k in spec_tokens]
    drafting = sum(1 for k in spec_tokens if k > 0) / len(spec_tokens)
    if cost.batch_verify == "padded":
        return float(max(widths)), 1.0 if drafting else 0.0
    return sum(widths) / len(widths), drafting
