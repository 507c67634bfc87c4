"""What the simulated engine charges for a decode step: padded ragged verify + block-wide draft."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from engines.cost_tables import load_cost_table
from policies.model import GoodputSpec
from policies.types import Task
from sim.choosers import GoodputChooser
from sim.instance import Instance
from sim.request import SimRequest
from sim.runner import engine_cost
from sim.scenario import Scenario
from sim.server import SimServer
from sim.stats import RunStats
from sim.workload import Workload

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "cost_tables" / "qwen3-8b-h200.json"


class Alternating:
    """Fake k chooser: k = 0 for even batch slots, ``k`` for odd; remembers each step."""

    name = "alternating"

    def __init__(self, k: int):
        self.k = k
        self.steps: list[tuple[int, list[int], tuple[float, float, float]]] = []

    def choose(self, batch: Sequence[SimRequest], now_s: float) -> list[int]:
        return [0 if i % 2 == 0 else self.k for i in range(len(batch))]

    def record(
        self,
        batch: Sequence[SimRequest],
        spec_tokens: Sequence[int],
        accept_lengths: Sequence[int],
        step: tuple[float, float, float],
    ) -> None:
        self.steps.append((len(batch), list(spec_tokens), step))


def _scenario(
    tmp_path: Path, concurrency: int, batch_verify: str = "ragged", overhead_s: float = 0.0
) -> Scenario:
    lines = [{"task": "math", "block_size": 8, "accept_lengths": [8, 3, 1, 5] * 20}]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return Scenario.model_validate(
        {
            "name": "cost-check",
            "block_size": 8,
            "cost": {
                "table": str(TABLE),
                "draft_cost_fraction": 0.16,
                "batch_verify": batch_verify,
                "step_overhead_s": overhead_s,
            },
            "acceptance": {"traces": str(tmp_path / "t.jsonl")},
            "phases": [
                {"name": "p", "duration_s": 0.5, "concurrency": concurrency, "mix": {"math": 1}}
            ],
        }
    )


@pytest.mark.parametrize("k", [4, 7])
def test_a_step_costs_the_padded_ragged_verify_plus_the_drafting_rows_block_draft(
    tmp_path: Path, k: int
) -> None:
    scenario = _scenario(tmp_path, concurrency=4)
    table = load_cost_table(TABLE)
    chooser = Alternating(k)
    SimServer(scenario, Workload(scenario), chooser, engine_cost(scenario, table)).run()
    size, ks, (seconds, width, drafting) = chooser.steps[0]
    assert size == 4 and ks == [0, k, 0, k]
    # Widths 1 (plain) and k + 1 padded to 8 -> the batch verifies 18 tokens: 4.5 per row.
    assert width == pytest.approx(4.5)
    assert drafting == pytest.approx(0.5)
    # The draft proposes a whole block (8) for each drafting row, whatever its k.
    expected = table.time_s(4, 4.5) + 0.16 * table.time_s(2, 8)
    assert seconds == pytest.approx(expected)


@pytest.mark.parametrize("overhead_s", [0.0, 0.002])
def test_a_step_without_drafting_pays_no_draft_forward(tmp_path: Path, overhead_s: float) -> None:
    scenario = _scenario(tmp_path, concurrency=1, overhead_s=overhead_s)  # slot 0 never drafts
    table = load_cost_table(TABLE)
    chooser = Alternating(7)
    SimServer(scenario, Workload(scenario), chooser, engine_cost(scenario, table)).run()
    _, ks, (seconds, width, drafting) = chooser.steps[0]
    assert ks == [0] and width == 1 and drafting == 0
    assert seconds == pytest.approx(table.time_s(1, 1) + overhead_s)


def test_padded_batches_charge_every_row_the_widest_width_and_the_draft(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path, concurrency=4, batch_verify="padded")
    table = load_cost_table(TABLE)
    chooser = Alternating(4)
    SimServer(scenario, Workload(scenario), chooser, engine_cost(scenario, table)).run()
    _, ks, (seconds, width, drafting) = chooser.steps[0]
    assert ks == [0, 4, 0, 4]
    # As the embedded engine runs it: one width (8) for all rows, the draft for all rows.
    assert (width, drafting) == (8.0, 1.0)
    assert seconds == pytest.approx(table.time_s(4, 8) + 0.16 * table.time_s(4, 8))


def test_goodput_on_a_padded_engine_picks_one_k_for_the_whole_batch(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path, concurrency=64, batch_verify="padded")
    table = load_cost_table(TABLE)
    workload = Workload(scenario)
    batch = [SimRequest(spec=workload.request(0, c, 0), client=c, arrival_s=0.0) for c in range(64)]
    # Half the requests accepted the full block every step so far, half never a draft.
    for i, request in enumerate(batch):
        request.k_history, request.accept_history = [7] * 20, [8 if i % 2 else 1] * 20
    spec = GoodputSpec(prior_accept_rates={t: [0.6] for t in Task}, draft_cost_fraction=0.16)
    ragged = GoodputChooser(spec, table, 8, seed=0, min_k=4)
    padded = GoodputChooser(spec, table, 8, seed=0, min_k=4, padded=True)
    # Per request (ragged engine) the hard rows stop drafting at batch 64; padded, every row
    # pays for the width-8 step the easy rows want, so all ride along at k = 7.
    assert ragged.choose(batch, 0.0) == [0, 7] * 32
    assert padded.choose(batch, 0.0) == [7] * 64


@pytest.mark.parametrize(("batching", "forwards"), [("batched", 1), ("per_request", 4)])
def test_prefill_pays_its_base_per_forward(tmp_path: Path, batching: str, forwards: int) -> None:
    scenario = _scenario(tmp_path, concurrency=4)
    scenario = scenario.model_copy(
        update={"cost": scenario.cost.model_copy(update={"prefill_batching": batching})}
    )
    table = load_cost_table(TABLE)
    stats = RunStats([(p.name, p.duration_s) for p in scenario.phases], scenario.bin_s)
    cost = engine_cost(scenario, table)
    instance = Instance(128, scenario.cost, Alternating(7), cost, stats, lambda *_: None)
    workload = Workload(scenario)
    for client in range(4):
        instance.submit(SimRequest(spec=workload.request(0, client, 0), client=client, arrival_s=0))
    prompts = sum(r.spec.prompt_tokens for r in instance.waiting)
    instance.step()  # one prefill of all four clients' first requests
    assert len(instance.running) == 4
    cost = scenario.cost
    want = forwards * cost.prefill_base_s + cost.prefill_s_per_token * prompts
    assert instance.now_s == pytest.approx(want)


def test_padded_oracle_tries_every_captured_width(tmp_path: Path) -> None:
    from sim.choosers import Oracle

    # Block 16: one row would accept 15 drafts, the other 63 only 3 each.
    lines = [
        {"task": "math", "block_size": 16, "accept_lengths": [16] * 30},
        {"task": "chat", "block_size": 16, "accept_lengths": [4] * 30},
    ]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    scenario = Scenario.model_validate(
        {
            "name": "oracle-check",
            "block_size": 16,
            "cost": {"table": str(TABLE), "draft_cost_fraction": 0.16, "batch_verify": "padded"},
            "acceptance": {"traces": str(tmp_path / "t.jsonl")},
            "phases": [
                {"name": "p", "duration_s": 1, "concurrency": 64, "mix": {"math": 1, "chat": 63}}
            ],
        }
    )
    workload = Workload(scenario)
    specs = [workload.request(0, c, 0) for c in range(400)]
    math = next(r for r in specs if r.task is Task.MATH)
    chat = [r for r in specs if r.task is Task.CHAT][:63]
    batch = [SimRequest(spec=r, client=c, arrival_s=0.0) for c, r in enumerate([math, *chat])]
    assert [r.peek_accepted(15) for r in batch] == [15] + [3] * 63
    oracle = Oracle(engine_cost(scenario, load_cost_table(TABLE)), 16, 4, padded=True)
    # Width 16 (k = 15) would cover the longest run, but at batch 64 it costs far more than
    # width 8, which covers every other row's run of 3 and 7 of the long one.
    assert oracle.choose(batch, 0.0) == [7] * 64
