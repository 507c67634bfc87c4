"""A two-phase step's allocation on the device: no host sync between draft and verify.

``policies.slot_scoring`` defines the scoring and its numpy reference; this module computes the
same on tensors, so the runner can score the draft's fresh confidence, allocate the draft slots
its token bucket pays for, and build the ragged verify's index without reading anything back
(the host learns each row's k from the step's one device->host copy at its end). Every shape
here is known on the host (rows, positions, the bucket's token count); values never leave the
device. About 40 small kernels: they queue behind the draft forward while the host goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from policies.slot_scoring import SlotScoring


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
        rows, positions = scoring.base.shape
        if len(drafted) != rows:
            raise ValueError(f"scoring has {rows} rows, the step {len(drafted)}")
        caps = np.minimum(scoring.capacities, np.asarray(drafted, dtype=np.int64))
        ints = torch.from_numpy(np.concatenate([caps, scoring.tasks]).astype(np.int64))
        tables = [scoring.alpha.ravel(), scoring.beta.ravel(), scoring.scale.ravel()]
        floats = np.concatenate([scoring.base.ravel(), scoring.edges, *tables])
        move = copy if copy is not None else (lambda t: t.to(device))
        ints_d = move(ints)
        floats_d = move(torch.from_numpy(floats.astype(np.float64)))
        size = scoring.alpha.size
        at = rows * positions
        edges = floats_d[at : at + len(scoring.edges)]
        at += len(scoring.edges)
        return cls(
            capacities=ints_d[:rows],
            tasks=ints_d[rows:],
            base=floats_d[: rows * positions].view(rows, positions),
            edges=edges,
            alpha=floats_d[at : at + size],
            beta=floats_d[at + size : at + 2 * size],
            scale=floats_d[at + 2 * size : at + 3 * size],
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

    def allocate(self, confidence: torch.Tensor, slots: int) -> torch.Tensor:
        """[rows] int64 k per row: ``policies.slot_scoring.allocate`` on the device."""
        s = self.survival(confidence)
        rows, positions = s.shape
        pos = torch.arange(positions, device=s.device)[None, :]
        caps = self.capacities
        mask = pos < caps[:, None]
        flat = torch.where(mask, s, -torch.inf).flatten()
        values, order = torch.sort(flat, descending=True, stable=True)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.numel(), device=s.device)
        selected = (rank.view(rows, positions) < max(0, slots)) & mask
        counts = selected.sum(dim=1)
        low = self.min_spec_tokens
        if low <= 1:
            return counts
        take = torch.clamp(mask.sum(), max=max(0, slots))
        last = values[torch.clamp(take - 1, min=0)]
        marginal = torch.where(take > 0, last, torch.ones_like(last))
        width = torch.clamp(caps, max=low)
        head = torch.where(pos < width[:, None], s, 0.0).sum(dim=1) / width.clamp(min=1)
        short = (counts > 0) & (counts < low)
        raised = short & (head >= marginal)
        bounded = torch.where(short, torch.where(raised, width, 0), counts)
        excess = bounded.sum() - max(0, slots)
        removable = (pos >= low) & (pos < bounded[:, None])
        # Lowest survival first; equal ones latest (row-major) first, so rows keep prefixes.
        backwards = torch.where(removable, s, torch.inf).flatten().flip(0)
        order = torch.sort(backwards, stable=True).indices
        drop_rank = torch.empty_like(order)
        drop_rank[order] = torch.arange(order.numel(), device=s.device)
        removed = (drop_rank.flip(0).view(rows, positions) < excess) & removable
        trimmed = bounded - removed.sum(dim=1)
        fits = excess <= 0
        enough = removable.sum() >= excess
        fallback = torch.where(raised, 0, bounded)
        return torch.where(fits, bounded, torch.where(enough, trimmed, fallback))


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
