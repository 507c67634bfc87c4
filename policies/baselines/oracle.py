"""A clairvoyant step policy, and a throughput bound that holds for every policy.

``ClairvoyantOracle`` reads ahead, for each row, how many drafted positions the acceptance
source *will* accept this step (``lookahead``: in synthetic-acceptance mode the engine's own
draw for that request and step, e.g. ``accept_run(request_key, step, k_max)``; it must be
side-effect free, so that the step then draws the same run), and verifies the k with the most
tokens per second for this step:

    k* = argmax over k in {0} U [min_k, max_k] of  sum_r (min(k, run_r, cap_r) + 1) / T(B, k)

(first maximum: the smallest such k). **This is a per-step greedy choice, not an upper bound on
throughput.** A run is a sequence of steps whose composition depends on earlier choices: k
changes how many tokens each request gets per step, hence which step it finishes on, which
requests are batched together afterwards, when new ones are admitted and prefilled, and (when
runs are drawn per request step) which draws later steps see. Overall tokens/s is
sum(tokens) / sum(time) along that one trajectory; maximising every step's ratio on the
oracle's own trajectory does not maximise the ratio along another policy's, so a policy can
beat it (the simulator shows it: docs/goodput.md, mixed-shift c8-chat, oracle 1613 vs goodput
1629 tok/s). Even "the per-step maximum assuming each step independent" is no bound on a
closed-loop trace, for the same reason: the steps another policy runs are not the oracle's.

``roofline_tok_s`` is a bound: no step of B rows verifying k drafts emits more than B (k + 1)
tokens, so no step's rate exceeds max over B, k of B (k + 1) / T(B, k); a prefill of P
requests emits P first tokens and, if it costs at least a plain step of P rows, stays under
the k = 0 term; idle time only lowers the rate; and a run's overall rate, a ratio of sums of
step tokens over step times, cannot exceed its best step's rate. It holds for any policy and
any acceptance, as far as T is the true step time; it is loose (every draft accepted).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from policies.baselines.base import StepChoice, row_capacity
from policies.types import StepCost, StepRow

# (row, max_k) -> drafted positions this step would accept if max_k were verified (>= 0).
Lookahead = Callable[[StepRow, int], int]


class ClairvoyantOracle:
    """Per-step greedy choice with the step's acceptance known (see the module docstring)."""

    name = "oracle"

    def __init__(
        self, cost: StepCost, max_spec_tokens: int, min_spec_tokens: int, lookahead: Lookahead
    ):
        if max_spec_tokens < 1:
            raise ValueError(f"max_spec_tokens must be >= 1, got {max_spec_tokens}")
        self._cost = cost
        self._max_k = max_spec_tokens
        self._min_k = max(1, min(min_spec_tokens, max_spec_tokens))
        self._lookahead = lookahead

    def runs(self, rows: Sequence[StepRow]) -> list[int]:
        """Drafts each row would accept at its full capacity this step."""
        out = []
        for row in rows:
            capacity = row_capacity(row, self._max_k)
            out.append(max(0, min(self._lookahead(row, self._max_k), capacity)))
        return out

    def decide_step(self, rows: Sequence[StepRow], batch_size: int) -> StepChoice:
        if not rows or batch_size < 1:
            return StepChoice(0, f"{self.name}: empty batch -> k=0")
        runs = self.runs(rows)
        n = len(rows)
        plain = n / self._cost.step_time_s(batch_size, 0)
        best_k, best = 0, plain
        for k in range(self._min_k, self._max_k + 1):
            rate = (n + sum(min(k, run) for run in runs)) / self._cost.step_time_s(batch_size, k)
            if rate > best:
                best_k, best = k, rate
        reason = (
            f"{self.name}: B={batch_size} k={best_k} accepted={sum(min(best_k, r) for r in runs)}"
            f"/{sum(runs)} {best / plain:.2f}x plain"
        )
        return StepChoice(best_k, reason)


def roofline_tok_s(cost: StepCost, max_batch_size: int, max_spec_tokens: int) -> float:
    """Tokens/s no policy exceeds at batch sizes 1..max_batch_size (the module docstring)."""
    if max_batch_size < 1 or max_spec_tokens < 0:
        raise ValueError("max_batch_size must be >= 1 and max_spec_tokens >= 0")
    return max(
        b * (k + 1) / cost.step_time_s(b, k)
        for b in range(1, max_batch_size + 1)
        for k in range(max_spec_tokens + 1)
    )
