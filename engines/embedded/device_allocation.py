"""A two-phase step's allocation on the device: no host sync between draft and verify.

``policies.slot_scoring`` defines the scoring and its numpy reference; this module computes the
same on tensors, so the runner can score the draft's fresh confidence, allocate the draft slots
its token bucket pays for, and build the ragged verify's index without reading anything back
(the host learns each row's k from the step's one device->host copy at its end). Every shape
here is known on the host (rows, positions, the bucket's token count); values never leave the
device. About 40 small kernels: they queue behind the draft forward while the host goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from engines.embedded.cuda_graphs import keep_allocator_cache
from policies.slot_scoring import EQUAL_WITHIN, OPENINGS, PRICES, SlotScoring

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceScoring:
    """A ``SlotScoring``'s tables on the device (two host->device copies)."""

    capacities: torch.Tensor  # [rows] int64
    tasks: torch.Tensor  # [rows] int64
    base: torch.Tensor  # [rows, K] float64
    edges: torch.Tensor  # [bins - 1] float64
    alpha: torch.Tensor  # [tables * bins] float64
    beta: torch.Tensor
    scale: torch.Tensor
    num_bins: int
    max_log_odds: float
    min_spec_tokens: int

    @classmethod
    def upload(
        cls,
        scoring: SlotScoring,
        drafted: list[int],
        device: torch.device,
        copy: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> DeviceScoring:
        """``drafted``: what each row drafts this step (capacities are clamped to it);
        ``copy``: how a host tensor goes to the device (default ``.to(device)``; the runner's
        goes through pinned memory, so it does not wait for the draft)."""
        rows = scoring.base.shape[0]
        if len(drafted) != rows:
            raise ValueError(f"scoring has {rows} rows, the step {len(drafted)}")
        caps = np.minimum(scoring.capacities, np.asarray(drafted, dtype=np.int64))
        ints = torch.from_numpy(np.concatenate([caps, scoring.tasks]).astype(np.int64))
        tables = [scoring.alpha.ravel(), scoring.beta.ravel(), scoring.scale.ravel()]
        floats = np.concatenate([scoring.base.ravel(), scoring.edges, *tables])
        move = copy if copy is not None else (lambda t: t.to(device))
        return cls.on(move(ints), move(torch.from_numpy(floats.astype(np.float64))), scoring, rows)

    @classmethod
    def on(
        cls, ints: torch.Tensor, floats: torch.Tensor, scoring: SlotScoring, rows: int
    ) -> DeviceScoring:
        """Views of two device buffers laid out as ``upload`` and ``AllocationGraphs`` fill
        them: ints ``[capacities (rows), tasks (rows), ...]``, floats ``[base (rows x K),
        edges, alpha, beta, scale]``; the tables' shapes are ``scoring``'s."""
        positions = scoring.num_positions
        size = scoring.alpha.size
        at = rows * positions + len(scoring.edges)
        return cls(
            capacities=ints[:rows],
            tasks=ints[rows : 2 * rows],
            base=floats[: rows * positions].view(rows, positions),
            edges=floats[rows * positions : at],
            alpha=floats[at : at + size],
            beta=floats[at + size : at + 2 * size],
            scale=floats[at + 2 * size : at + 3 * size],
            num_bins=int(scoring.alpha.shape[1]),
            max_log_odds=float(scoring.max_log_odds),
            min_spec_tokens=int(scoring.min_spec_tokens),
        )

    def survival(self, confidence: torch.Tensor) -> torch.Tensor:
        """[rows, K] float64 from the draft's top-1 probabilities [rows, >= 0] (positions it
        lacks, past every row's capacity, score as confidence 0.5)."""
        rows, positions = self.base.shape
        c = confidence[:, :positions].double()
        if c.shape[1] < positions:
            c = torch.cat([c, c.new_full((rows, positions - c.shape[1]), 0.5)], dim=1)
        x = (torch.log(c) - torch.log1p(-c)).clamp(-self.max_log_odds, self.max_log_odds)
        at = self.tasks[:, None] * self.num_bins + torch.searchsorted(self.edges, x)
        z = self.scale[at] * self.base + self.beta[at] + self.alpha[at] * x
        return torch.cumprod(torch.sigmoid(z), dim=1)

    def allocate(self, confidence: torch.Tensor, slots: int | torch.Tensor) -> torch.Tensor:
        """[rows] int64 k per row: ``policies.slot_scoring.allocate`` on the device. ``slots``
        may be a 0-dim device tensor (a captured graph's)."""
        slots = max(0, slots) if isinstance(slots, int) else torch.clamp(slots, min=0)
        s = self.survival(confidence)
        if self.min_spec_tokens > 1:
            return self._bounded(s, slots)
        rows, positions = s.shape
        pos = torch.arange(positions, device=s.device)[None, :]
        caps = self.capacities
        mask = pos < caps[:, None]
        flat = torch.where(mask, s, -torch.inf).flatten()
        order = torch.sort(flat, descending=True, stable=True).indices
        every = torch.arange(order.numel(), device=s.device)
        rank = torch.empty_like(order).scatter_(0, order, every)
        selected = (rank.view(rows, positions) < slots) & mask
        return selected.sum(dim=1)

    def _bounded(self, s: torch.Tensor, slots: int | torch.Tensor) -> torch.Tensor:
        """``policies.slot_scoring.bounded_allocation`` on the device (the same prices,
        repairs, fill and openings, one batched evaluation each, no host sync)."""
        rows, positions = s.shape
        device = s.device
        caps = self.capacities
        pos = torch.arange(positions, device=device)
        inside = pos[None, :] < caps[:, None]
        zero = torch.zeros(rows, 1, dtype=s.dtype, device=device)
        gains = torch.cat([zero, torch.cumsum(torch.where(inside, s, 0.0), dim=1)], dim=1)
        ks = torch.arange(positions + 1, device=device)
        minimum = torch.clamp(caps, max=self.min_spec_tokens)
        allowed = (ks[None, :] == 0) | (
            (ks[None, :] >= minimum[:, None]) & (ks[None, :] <= caps[:, None])
        )
        # (made on the device, no copy: this runs inside a captured graph; k / 128 is exact)
        prices = torch.arange(1, len(PRICES) + 1, dtype=torch.float64, device=device) / 128.0
        value = gains[None, :, :] - prices[:, None, None] * ks[None, None, :]
        picks = torch.where(allowed[None, :, :], value, -torch.inf).argmax(dim=2)
        first = (picks.sum(dim=1) <= slots).to(torch.uint8).argmax()
        fitting = picks.gather(0, first.view(1, 1).expand(1, rows))[0]
        below = torch.clamp(first - 1, min=0)
        over_picks = picks.gather(0, below.view(1, 1).expand(1, rows))[0]
        over = over_picks.sum() - slots
        held = gains.gather(1, over_picks[:, None])[:, 0]
        drafting = over_picks > 0
        density = torch.where(drafting, held / torch.clamp(over_picks, min=1), torch.inf)
        order = torch.sort(density, stable=True).indices
        ordered = over_picks[order]
        cut = torch.zeros_like(drafting).scatter_(
            0, order, torch.cumsum(ordered, 0) - ordered < over
        )
        sparest = torch.where(cut & drafting, 0, over_picks)
        covers = drafting & (over_picks >= over)
        one = torch.arange(rows, device=device) == torch.where(covers, held, torch.inf).argmin()
        cheapest = torch.where(covers.any(), torch.where(one & covers, 0, over_picks), sparest)
        # the three candidates side by side [3, rows]: one batched fill and openings
        stacked = self._opened(
            gains,
            minimum,
            self._filled(s, inside, torch.stack([fitting, sparest, cheapest]), slots),
            slots,
        )
        values = gains.gather(1, stacked.T).sum(dim=0)
        pick = (values >= values.max() - EQUAL_WITHIN).to(torch.uint8).argmax()
        return stacked.gather(0, pick.view(1, 1).expand(1, rows))[0]

    @staticmethod
    def _filled(
        s: torch.Tensor, inside: torch.Tensor, counts: torch.Tensor, slots: int | torch.Tensor
    ) -> torch.Tensor:
        """``slot_scoring._filled`` of each candidate [n, rows]."""
        rows, positions = s.shape
        device = s.device
        n = counts.shape[0]
        room = slots - counts.sum(dim=1, keepdim=True)  # [n, 1]
        pos = torch.arange(positions, device=device)
        more = inside[None] & (pos[None, None, :] >= counts[:, :, None]) & (counts[:, :, None] > 0)
        flat = torch.where(more, s[None], -torch.inf).view(n, rows * positions)
        order = torch.sort(flat, dim=1, descending=True, stable=True).indices
        every = torch.arange(rows * positions, device=device).expand(n, -1)
        rank = torch.empty_like(order).scatter_(1, order, every)
        room = torch.minimum(room, more.view(n, -1).sum(dim=1, keepdim=True))
        taken = (rank < room).view(n, rows, positions) & more
        return counts + taken.sum(dim=2)

    @staticmethod
    def _opened(
        gains: torch.Tensor, minimum: torch.Tensor, counts: torch.Tensor, slots: int | torch.Tensor
    ) -> torch.Tensor:
        """``slot_scoring._opened`` of each candidate [n, rows]."""
        rows = counts.shape[1]
        index = torch.arange(rows, device=counts.device)
        worth = gains.gather(1, minimum[:, None])[:, 0]
        out = counts
        for _ in range(OPENINGS):
            room = slots - out.sum(dim=1, keepdim=True)
            fits = (out == 0) & (minimum > 0) & (minimum <= room)
            best = torch.where(fits, worth, -torch.inf).argmax(dim=1, keepdim=True)
            out = torch.where((index[None, :] == best) & fits, minimum, out)
        return out


def ragged_index(lengths: torch.Tensor, batch: int, width: int, num_tokens: int) -> torch.Tensor:
    """``engines.embedded.ragged.ragged_index`` on the device, from per-row lengths [rows]
    (rows <= batch, each <= width, their sum <= num_tokens: the caller's allocation ensures
    it): [2, num_tokens] int64, gather then scatter indices, the entries past the used tokens
    gathering token 0 into the scratch row ``batch * width``."""
    rows = lengths.shape[0]
    device = lengths.device
    valid = (torch.arange(width, device=device)[None, :] < lengths[:, None]).flatten()
    slot = torch.where(valid, torch.cumsum(valid, dim=0) - 1, num_tokens)
    packed = torch.zeros(num_tokens + 1, dtype=torch.long, device=device)
    packed.scatter_(0, slot, torch.arange(rows * width, device=device))
    gather = packed[:num_tokens]
    used = torch.arange(num_tokens, device=device) < lengths.sum()
    return torch.stack([torch.where(used, gather, 0), torch.where(used, gather, batch * width)])


@dataclass
class _Captured:
    """One shape's allocation graph: its static inputs and outputs."""

    ints: torch.Tensor  # [2 * batch + 1]: capacities, tasks, the step's row count
    floats: torch.Tensor  # base [batch * K], edges, alpha, beta, scale
    confidence: torch.Tensor  # [batch, K] float64
    verified: torch.Tensor  # [batch] int64
    index: torch.Tensor  # [2, num_tokens] int64
    graph: torch.cuda.CUDAGraph | None  # None: run eagerly (not a CUDA device)
    compute: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    # Host staging of ``ints`` and ``floats`` (pinned on a CUDA device: the copies then wait
    # for nothing; reused every step, as each step ends with a sync).
    host_ints: torch.Tensor
    host_floats: torch.Tensor


class AllocationGraphs:
    """A device-allocated step's allocation and ragged index as one replay: the eager ops
    (~50 kernels) cost ~1.5-4 ms of Python launch time on the H200's host (session 19), more
    than a small batch's draft runs, so the device waited for the host. Per shape (batch
    bucket, positions, verify width, token bucket, table shape, minimum k) a CUDA graph is
    captured on first use (a few ms, once; rows past the step's are padding with capacity 0)
    and replayed after one host->device copy of the tables. On a CPU the same padded
    computation runs eagerly (what the tests check against the numpy reference)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._shapes: dict[tuple[object, ...], _Captured] = {}
        self._pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None

    def __len__(self) -> int:
        return len(self._shapes)

    def run(
        self,
        scoring: SlotScoring,
        drafted: list[int],
        confidence: torch.Tensor,
        batch: int,
        width: int,
        num_tokens: int,
        upload: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """k per row [rows] and the ragged index [2, num_tokens] of a step of ``len(drafted)``
        rows (<= ``batch``) verifying at most ``num_tokens`` tokens of width ``width``.
        ``upload`` False: the device's tables are the last call's of this shape (a drafting
        burst's later steps: the same scoring), so the pinned host buffers are not rewritten
        while an earlier step's copy of them may still be in flight; only the confidence goes
        up."""
        rows, positions = scoring.base.shape
        if len(drafted) != rows or rows > batch:
            raise ValueError(f"scoring has {rows} rows, the step {len(drafted)} (batch {batch})")
        key = (
            batch,
            positions,
            width,
            num_tokens,
            scoring.alpha.shape,
            len(scoring.edges),
            scoring.min_spec_tokens,
            scoring.max_log_odds,
        )
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = self._capture(scoring, batch, width, num_tokens, key)
            upload = True
        if upload:
            self._upload(shape, scoring, drafted, batch, positions)
        used = min(positions, confidence.shape[1])
        # (a pinned host tensor, synthetic mode's draws, goes up without waiting)
        shape.confidence[:rows, :used].copy_(confidence[:, :used], non_blocking=True)
        if shape.graph is None:
            verified, index = shape.compute()
            return verified[:rows], index
        shape.graph.replay()
        return shape.verified[:rows], shape.index

    @staticmethod
    def _upload(
        shape: _Captured, scoring: SlotScoring, drafted: list[int], batch: int, positions: int
    ) -> None:
        """The scoring's tables into the shape's pinned host buffers, then up to the device
        (no sync; rows past the step's are padding with capacity 0)."""
        rows = len(drafted)
        ints = shape.host_ints.numpy()
        ints[:] = 0
        ints[:rows] = np.minimum(scoring.capacities, np.asarray(drafted, dtype=np.int64))
        ints[batch : batch + rows] = scoring.tasks
        ints[-1] = rows
        floats = shape.host_floats.numpy()
        at = batch * positions
        base = floats[:at].reshape(batch, positions)
        base[:rows] = scoring.base
        base[rows:] = 0.0
        for table in (scoring.edges, scoring.alpha, scoring.beta, scoring.scale):
            floats[at : at + table.size] = table.ravel()
            at += table.size
        shape.ints.copy_(shape.host_ints, non_blocking=True)
        shape.floats.copy_(shape.host_floats, non_blocking=True)

    def _host(self, tensor: torch.Tensor) -> torch.Tensor:
        """Pinned on a CUDA device (a non-blocking copy then does not wait for the stream)."""
        return tensor.pin_memory() if self.device.type == "cuda" else tensor.clone()

    def _capture(
        self, scoring: SlotScoring, batch: int, width: int, num_tokens: int, key: object = None
    ) -> _Captured:
        positions = scoring.num_positions
        device = self.device
        size = scoring.alpha.size
        ints = torch.zeros(2 * batch + 1, dtype=torch.long, device=device)
        floats = torch.zeros(
            batch * positions + len(scoring.edges) + 3 * size, dtype=torch.float64, device=device
        )
        confidence = torch.full((batch, positions), 0.5, dtype=torch.float64, device=device)
        scored = DeviceScoring.on(ints, floats, scoring, batch)
        rows = ints[-1]
        row_index = torch.arange(batch, device=device)

        def compute() -> tuple[torch.Tensor, torch.Tensor]:
            verified = scored.allocate(confidence, num_tokens - rows)
            lengths = torch.where(row_index < rows, verified + 1, 0)
            return verified, ragged_index(lengths, batch, width, num_tokens)

        host_ints = self._host(torch.zeros_like(ints, device="cpu"))
        host_floats = self._host(torch.zeros_like(floats, device="cpu"))
        if device.type != "cuda":
            verified, index = compute()
            return _Captured(
                ints, floats, confidence, verified, index, None, compute, host_ints, host_floats
            )
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            compute()  # warm-up outside the graph
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        try:
            with keep_allocator_cache(), torch.cuda.graph(graph, pool=self._pool):
                verified, index = compute()
        except Exception:  # the same ops, launched one by one: slower, never wrong
            logger.exception("could not capture the device allocation %s; running it eagerly", key)
            verified, index = compute()
            return _Captured(
                ints, floats, confidence, verified, index, None, compute, host_ints, host_floats
            )
        return _Captured(
            ints, floats, confidence, verified, index, graph, compute, host_ints, host_floats
        )
