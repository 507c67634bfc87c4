"""Cost table interpolation, verify-width padding and online correction."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from policies.costmodel import CostModel, CostTable, padded_width

TABLE = CostTable(
    batch_sizes=(1, 8, 64),
    tokens_per_request=(1, 8, 16),
    step_time_s=((1.0, 1.1, 1.2), (1.2, 1.5, 2.0), (2.0, 6.0, 10.0)),
)


def test_interpolation_hits_grid_and_interpolates_between() -> None:
    assert TABLE.time_s(8, 8) == pytest.approx(1.5)
    assert TABLE.time_s(36, 1) == pytest.approx(1.6)
    assert TABLE.time_s(64, 12) == pytest.approx(8.0)
    # Linear extrapolation past the largest batch.
    assert TABLE.time_s(120, 1) == pytest.approx(2.0 + 56 * (0.8 / 56))


@pytest.mark.parametrize(
    ("k", "multiple", "want"), [(0, 8, 1), (4, 8, 8), (7, 8, 8), (8, 8, 16), (5, 1, 6)]
)
def test_padded_width(k: int, multiple: int, want: int) -> None:
    assert padded_width(k, multiple) == want


def test_step_cost_pads_and_adds_the_draft_forward() -> None:
    model = CostModel(TABLE, block_size=16, verify_width_multiple=8, draft_cost_fraction=0.1)
    snap = model.snapshot()
    assert snap.step_time_s(64, 0) == pytest.approx(2.0)
    # k = 4 verifies a padded width of 8: same cost as k = 7.
    assert snap.step_time_s(64, 4) == pytest.approx(6.0 + 0.1 * 10.0)
    assert snap.step_time_s(64, 4) == snap.step_time_s(64, 7)


def test_observed_step_times_correct_the_table() -> None:
    model = CostModel(TABLE, verify_width_multiple=8, draft_cost_fraction=0.0, learning_rate=0.2)
    for _ in range(100):
        model.observe_step(64, 16.0, 1.0, 15.0)  # the engine is 1.5x slower than the table
    snap = model.snapshot()
    assert snap.step_time_s(64, 15) == pytest.approx(15.0, rel=0.01)
    # Rows far from the observations keep the table value.
    assert snap.step_time_s(1, 0) == pytest.approx(1.0)


def test_a_per_step_host_overhead_is_learned_apart_from_the_forward() -> None:
    # The engine adds 3 s of host work to every step on top of the table's forward (units are
    # the table's). Plain steps (2.0) and width-16 steps (10.0) at batch 64 take 5 and 13.
    model = CostModel(TABLE, verify_width_multiple=8, draft_cost_fraction=0.0, learning_rate=0.1)
    for i in range(200):
        width, table_s = (1.0, 2.0) if i % 2 else (16.0, 10.0)
        model.observe_step(64, width, 0.0, table_s + 3.0)
    snap = model.snapshot()
    assert snap.overhead_s(64) == pytest.approx(3.0, rel=0.02)
    assert snap.correction(64) == pytest.approx(1.0, rel=0.02)
    assert snap.step_time_s(64, 0) == pytest.approx(5.0, rel=0.01)
    assert snap.step_time_s(64, 15) == pytest.approx(13.0, rel=0.01)
    # A ratio alone would have said 1.5 and mispriced both: 3.0 plain, 15.0 wide.


def test_one_kind_of_step_only_fits_a_ratio_and_implausible_fits_fall_back() -> None:
    model = CostModel(TABLE, verify_width_multiple=8, draft_cost_fraction=0.0, learning_rate=0.1)
    for _ in range(100):
        model.observe_step(64, 16.0, 0.0, 13.0)  # only wide steps: no way to split
    snap = model.snapshot()
    assert snap.overhead_s(64) == 0.0
    assert snap.correction(64) == pytest.approx(1.3, rel=0.01)
    # Wide steps relatively *more* expensive than the table says (negative intercept): no
    # overhead, ratio of means.
    other = CostModel(TABLE, verify_width_multiple=8, draft_cost_fraction=0.0, learning_rate=0.1)
    for i in range(200):
        width, observed = (1.0, 1.0) if i % 2 else (16.0, 15.0)
        other.observe_step(64, width, 0.0, observed)
    assert other.snapshot().overhead_s(64) == 0.0
    assert other.snapshot().correction(64) == pytest.approx(16.0 / 12.0, rel=0.02)


def test_saved_fits_round_trip_and_bad_ones_name_the_key() -> None:
    model = CostModel(TABLE)
    rows = len(TABLE.batch_sizes)
    model.load_corrections([1.2] * rows, [0.5] * rows)
    assert model.snapshot().step_time_s(1, 0) == pytest.approx(1.2 * 1.0 + 0.5)
    with pytest.raises(ValueError, match="cost_overhead_s needs"):
        model.load_corrections([1.0] * rows, [-1.0] * rows)


def test_a_configured_host_overhead_prices_steps_until_the_fit_measures_one() -> None:
    model = CostModel(
        TABLE,
        verify_width_multiple=8,
        draft_cost_fraction=0.0,
        learning_rate=0.1,
        prior_overhead_s=0.5,
        prior_overhead_per_request_s=0.05,
    )
    # Before any step: table + 0.5 + B x 0.05.
    assert model.snapshot().step_time_s(64, 15) == pytest.approx(10.0 + 0.5 + 3.2)
    assert model.snapshot().step_time_s(1, 0) == pytest.approx(1.0 + 0.55)
    # Only wide steps seen (13.0 observed): the overhead cannot be split off, the configured
    # one stays and the factor covers the rest ((13 - 3.7) / 10).
    for _ in range(100):
        model.observe_step(64, 16.0, 0.0, 13.0)
    snap = model.snapshot()
    assert snap.overhead_s(64) == pytest.approx(3.7)
    assert snap.correction(64) == pytest.approx(0.93, rel=0.01)
    assert snap.step_time_s(64, 15) == pytest.approx(13.0, rel=0.01)
    # Plain and wide steps with a true overhead of 3: the fit replaces the configured one.
    for i in range(300):
        width, table_s = (1.0, 2.0) if i % 2 else (16.0, 10.0)
        model.observe_step(64, width, 0.0, table_s + 3.0)
    assert model.snapshot().overhead_s(64) == pytest.approx(3.0, rel=0.05)


def test_a_width_premium_the_table_misses_is_learned() -> None:
    """Fault 3 of issue 13: on the H200 the measured 8B table prices width 16 at ~1.0x width 8
    at batch 1 while the engine's steps took 1.072x. One scale and overhead per batch size
    cannot fit that (the old model stayed at 0.996x); a ratio per padded width can."""
    path = Path(__file__).resolve().parents[2] / "cost_tables/qwen3-8b-h200.json"
    table = CostTable.from_dict(json.loads(path.read_text()))
    model = CostModel(table, block_size=16, verify_width_multiple=8, draft_cost_fraction=0.14)
    before = model.snapshot()
    assert before.step_time_s(1, 15) / before.step_time_s(1, 7) == pytest.approx(1.0, abs=0.01)
    observed = {0: (1.0, 7.8e-3), 7: (8.0, 10.0e-3), 15: (16.0, 10.72e-3)}
    for i in range(300):
        width, seconds = observed[(0, 7, 15)[i % 3]]
        model.observe_step(1, width, 1.0 if width > 1 else 0.0, seconds)
    snap = model.snapshot()
    assert snap.step_time_s(1, 15) / snap.step_time_s(1, 7) == pytest.approx(1.072, abs=0.005)
    assert snap.step_time_s(1, 0) == pytest.approx(7.8e-3, rel=0.01)
    # Other batch sizes keep the table's shape until their own steps are seen.
    assert snap.step_time_s(64, 15) / snap.step_time_s(64, 7) == pytest.approx(
        before.step_time_s(64, 15) / before.step_time_s(64, 7)
    )


def test_a_width_seen_rarely_blends_from_the_row_fit_to_its_own_ratio() -> None:
    model = CostModel(TABLE, verify_width_multiple=8, draft_cost_fraction=0.0, learning_rate=0.1)
    for _ in range(200):
        model.observe_step(64, 8.0, 1.0, 7.2)  # width 8: 1.2x the table
    assert model.snapshot().step_time_s(64, 15) == pytest.approx(12.0, rel=0.01)  # the row's
    model.observe_step(64, 16.0, 1.0, 15.0)  # one width-16 step at 1.5x: weight 0.1 ...
    assert 12.0 < model.snapshot().step_time_s(64, 15) < 13.0
    for _ in range(45):  # ... then 1 - 0.9^46
        model.observe_step(64, 16.0, 1.0, 15.0)
    assert model.snapshot().step_time_s(64, 15) == pytest.approx(15.0, rel=0.01)
    # (width 8's fit is within its grace: 46 steps of other widths since its own last one)
    assert model.snapshot().step_time_s(64, 7) == pytest.approx(7.2, rel=0.01)


def test_a_width_not_run_for_a_while_fades_back_to_the_row_fit_and_is_tried_again() -> None:
    """Call s42b (the real pair, H100): 16 plain 64-row steps at ~3.4x the table early in the
    warm pass priced the plain width out of use, and nothing ever ran it again. A width's own
    fit is kept whole for ``_WIDTH_GRACE_STEPS`` steps of its row at other widths, then halves
    every ``_WIDTH_HALF_LIFE_STEPS``; its ratio stays, so steps of its own pick up from it."""
    from policies import costmodel

    model = CostModel(TABLE, verify_width_multiple=8, draft_cost_fraction=0.0)
    plain_table = TABLE.time_s(64, 1.0)
    model.observe_steps([(64, 1.0, 0.0, 3.4 * plain_table)] * 16)  # the slow plain steps
    model.observe_steps([(64, 8.0, 1.0, TABLE.time_s(64, 8.0))] * 20)
    row = TABLE.batch_sizes.index(64)
    weight = model.width_fits()[row][0][1]
    assert weight == pytest.approx(1 - 0.95**16)  # (in its grace: whole)
    assert model.snapshot().step_time_s(64, 0) > 2.0 * plain_table
    grace, half = costmodel._WIDTH_GRACE_STEPS, costmodel._WIDTH_HALF_LIFE_STEPS
    more = int(grace) - 20 + int(2 * half)  # past the grace, then two half-lives
    model.observe_steps([(64, 8.0, 1.0, TABLE.time_s(64, 8.0))] * more)
    ratio, faded = model.width_fits()[row][0]
    assert faded == pytest.approx(weight / 4, rel=1e-6)
    assert ratio == pytest.approx(3.4)
    # the row's fit (drafting steps at the table) prices most of it again
    assert model.snapshot().step_time_s(64, 0) < 1.7 * plain_table
    # folded together or one at a time: the same fade
    one = CostModel(TABLE, verify_width_multiple=8, draft_cost_fraction=0.0)
    steps = [(64, 1.0, 0.0, 3.4 * plain_table)] * 16 + [(64, 8.0, 1.0, 8.0)] * (20 + more)
    for step in steps:
        one.observe_step(*step)
    assert one.width_fits()[row][0][1] == pytest.approx(faded, rel=1e-9)


def test_an_engine_profile_prices_a_plain_step_on_its_own_path_until_plain_steps_run() -> None:
    """Call s42b: at the row of 8 the real pair's drafting steps ran 0.86-0.95x its start-up
    profile and plain steps 1.03x; the row's fit (0.88, from drafting steps) priced the plain
    step at 0.91 ms where it took 1.09, and the chat phase ran plain where k = 7 was 1.16x
    faster. A whole-step table (the engine's profile, ``includes_draft``) floors a plain
    step's price at what it measured until the plain width's own steps say otherwise (above
    it the row's fit stands: the 8B arm's plain steps ran 1.08x the table, as its drafting
    steps' ratio said); a table of forwards (pools) keeps the row's fit, which carries what
    the table leaves out."""
    profile = CostTable(
        TABLE.batch_sizes, TABLE.tokens_per_request, TABLE.step_time_s, includes_draft=True
    )
    plain_table = profile.time_s(8, 1.0)
    models = {}
    for table, expected in ((profile, plain_table), (TABLE, 0.88 * plain_table)):
        model = models[table.includes_draft] = CostModel(
            table, verify_width_multiple=8, draft_cost_fraction=0.0
        )
        model.observe_steps([(8, 8.0, 1.0, 0.88 * table.time_s(8, 8.0))] * 60)
        assert model.snapshot().step_time_s(8, 0) == pytest.approx(expected, rel=1e-6)
        assert model.snapshot().step_time_s(8, 7) == pytest.approx(
            0.88 * table.time_s(8, 8.0), rel=1e-6
        )
    model = models[True]
    model.observe_steps([(8, 1.0, 0.0, 1.06 * plain_table)] * 80)  # its own plain steps
    assert model.snapshot().step_time_s(8, 0) == pytest.approx(1.06 * plain_table, rel=0.02)
    above = CostModel(profile, verify_width_multiple=8, draft_cost_fraction=0.0)
    above.observe_steps([(8, 8.0, 1.0, 1.08 * profile.time_s(8, 8.0))] * 60)
    assert above.snapshot().step_time_s(8, 0) == pytest.approx(1.08 * plain_table, rel=1e-6)


def test_saved_width_fits_round_trip_and_bad_ones_name_the_key() -> None:
    model = CostModel(TABLE, verify_width_multiple=8, draft_cost_fraction=0.0, learning_rate=0.2)
    for i in range(100):
        model.observe_step(8, (1.0, 16.0)[i % 2], 0.0, (1.3, 2.6)[i % 2])
    snap = model.snapshot()
    other = CostModel(TABLE, verify_width_multiple=8, draft_cost_fraction=0.0)
    other.load_corrections(snap.corrections, snap.overheads_s, model.width_fits())
    for k in (0, 7, 15):
        assert other.snapshot().step_time_s(8, k) == pytest.approx(snap.step_time_s(8, k))
    rows = len(TABLE.batch_sizes)
    with pytest.raises(ValueError, match="cost_width_fits needs 3 rows of 3"):
        other.load_corrections([1.0] * rows, [], [[(1.0, 0.5)]] * rows)


def test_steps_folded_together_leave_the_same_fits_as_one_at_a_time() -> None:
    """The step controller folds the steps between two spaced decisions in one call."""
    rng = random.Random(3)
    steps = [
        (rng.choice((1, 3, 8, 40, 64)), float(rng.choice((1, 8, 16))), 1.0, rng.uniform(1, 12))
        for _ in range(200)
    ]
    one, many = CostModel(TABLE), CostModel(TABLE)
    for step in steps:
        one.observe_step(*step)
    for start in range(0, len(steps), 7):
        many.observe_steps(steps[start : start + 7])
    a, b = one.snapshot(), many.snapshot()
    for batch in (1, 5, 8, 30, 64):
        for k in (0, 4, 7, 15):
            assert b.step_time_s(batch, k) == pytest.approx(a.step_time_s(batch, k), rel=1e-12)


def test_a_width_the_row_has_barely_run_is_not_priced_below_the_rows_mean_ratio() -> None:
    """Fault found on the H200 (2026-12-02, task-split trace): real 8B-shape decode steps of
    33-64 rows cost the same (width 8: 28.8-29.2 ms), unlike the table's interpolation between
    its rows 32 and 64. Fitted across those batch sizes, the row of 64 found a tiny scale and a
    large overhead and priced width 16 at 1.03x width 8 (measured 1.49x), so a math batch of
    64 ran width 16 until that width's own ratio had learned otherwise."""
    path = Path(__file__).resolve().parents[2] / "cost_tables/qwen3-8b-h200.json"
    table = CostTable.from_dict(json.loads(path.read_text()))
    model = CostModel(table, block_size=16, verify_width_multiple=8, draft_cost_fraction=0.16)
    measured = {  # (rows, width): seconds, decode steps of the H200 run
        (16, 8): 13.01e-3,
        (16, 16): 15.19e-3,
        (32, 8): 17.95e-3,
        (40, 8): 28.7e-3,
        (48, 8): 28.77e-3,
        (56, 8): 28.9e-3,
        (64, 8): 29.15e-3,
    }
    steps = [(b, float(w), 1.0, s) for (b, w), s in measured.items() for _ in range(60)]
    random.Random(1).shuffle(steps)
    model.observe_steps(steps)
    snap = model.snapshot()
    assert snap.step_time_s(64, 15) / snap.step_time_s(64, 7) > 1.3  # measured 1.49
    assert snap.step_time_s(64, 7) == pytest.approx(29.15e-3, rel=0.15)


def test_a_width_the_row_has_never_run_is_not_priced_from_an_overhead_fitted_at_one_width() -> None:
    """Fault found in the real pair's H100 run (call s37c, 2026-12-05): a row that has run one
    width only still fitted an overhead, from the spread that batches between two rows give
    the table's interpolation, and priced the plain step it had never run far above the
    table's shape (here 28.2 ms, about a k = 7 step; table 11.5). Drafting then looked
    better than it was, and the plain step, never tried, was never corrected. One width
    seen: the row's ratio of means scales every width."""
    path = Path(__file__).resolve().parents[2] / "cost_tables/qwen3-8b-h200.json"
    table = CostTable.from_dict(json.loads(path.read_text()))
    model = CostModel(table, block_size=16, verify_width_multiple=8, draft_cost_fraction=0.16)
    measured = {(40, 8): 28.7e-3, (48, 8): 28.77e-3, (56, 8): 28.9e-3, (64, 8): 29.15e-3}
    steps = [(b, 8.0, 1.0, s) for (b, w), s in measured.items() for _ in range(60)]
    random.Random(2).shuffle(steps)
    model.observe_steps(steps)
    snap = model.snapshot()
    row = table.batch_sizes.index(64)
    assert model.widths_seen(row) == 1
    assert snap.overhead_s(64) == 0.0
    plain_table = model.base_step_time_s(64, 1.0, 0.0)
    ratio = snap.correction(64)
    assert snap.step_time_s(64, 0) == pytest.approx(plain_table * ratio, rel=1e-6)
    assert snap.step_time_s(64, 0) < 0.6 * snap.step_time_s(64, 7)
    # Once the row runs plain steps too, the overhead is separated across the two widths.
    model.observe_steps([(64, 1.0, 0.0, plain_table + 2e-3)] * 40)
    assert model.widths_seen(row) == 2
    assert model.snapshot().step_time_s(64, 0) == pytest.approx(plain_table + 2e-3, rel=0.05)


def test_each_width_fit_counts_its_steps_and_keeps_its_most_out_of_line_one() -> None:
    """``width_steps``: for people reading a fit far from the table (session 41's real pair),
    how many steps made it, how many were clipped as stalls, and the one furthest above its
    prediction (its own time, clipped or not); pricing ignores it."""
    model = CostModel(TABLE, verify_width_multiple=8, draft_cost_fraction=0.0)
    row = TABLE.batch_sizes.index(64)
    assert all(s == c == 0 and w is None for s, c, w in model.width_steps(row))
    for seconds in (2.1, 9.0, 2.0):  # plain steps at 64 rows (table 2.0 s), one a stall
        model.observe_step(64, 1.0, 0.0, seconds)
    model.observe_step(64, 8.0, 1.0, 6.6)  # width 8: 1.1x
    by_width = dict(zip(model.widths, model.width_steps(row), strict=True))
    assert by_width[1] == (3, 0, (64, pytest.approx(2.0), 9.0))  # (too early to clip)
    assert by_width[8] == (1, 0, (64, pytest.approx(6.0), 6.6))
    assert by_width[16] == (0, 0, None)
    # 32 rows: shared between the rows of 8 and 64, each fit counts it
    model.observe_step(32, 8.0, 1.0, 4.0)
    assert dict(zip(model.widths, model.width_steps(row), strict=True))[8][0] == 2


def test_a_stall_is_folded_in_at_a_multiple_of_the_price_once_the_row_has_seen_steps() -> None:
    """One stall (a step 60x its price: a collector's pause, host work the sync waited for)
    moved the plain width's fit to ~4.7x the table at a weight of ~0.5 (session 41's real
    pair, call s41b), and priced so, a plain step was never run again. Clipped at
    ``_STALL_MULTIPLE`` x the current price it moves the fit by at most a few percent; a real
    change of speed still gets in, a step at a time."""
    plain_table = TABLE.time_s(64, 1.0)

    def learnt(stall_s: float) -> tuple[float, CostModel]:
        model = CostModel(TABLE, verify_width_multiple=8, draft_cost_fraction=0.0)
        model.observe_steps([(64, 1.0, 0.0, plain_table)] * 10)
        model.observe_step(64, 1.0, 0.0, stall_s)
        model.observe_steps([(64, 1.0, 0.0, plain_table)] * 5)
        return model.snapshot().step_time_s(64, 0) / plain_table, model

    ratio, model = learnt(60 * plain_table)
    row = TABLE.batch_sizes.index(64)
    steps, clipped, worst = model.width_steps(row)[0]
    assert (steps, clipped) == (16, 1) and worst is not None
    assert worst[2] == pytest.approx(60 * plain_table)  # what it took, for people
    # clipped to 3x: as if the step had taken 3x the price, not 60x
    assert ratio == pytest.approx(learnt(3 * plain_table)[0], rel=1e-9)
    assert 1.0 < ratio < 1.15
    # Unclipped (a step under the multiple) it counts in full; before the row has seen
    # ``_CLIP_AFTER`` steps nothing is clipped (a table far off learns from its first step).
    assert learnt(2.5 * plain_table)[0] > 1.05
    cold = CostModel(TABLE, verify_width_multiple=8, draft_cost_fraction=0.0)
    cold.observe_step(64, 1.0, 0.0, 50 * plain_table)
    assert cold.snapshot().step_time_s(64, 0) == pytest.approx(50 * plain_table, rel=1e-6)
    # A lasting slow-down (5x) is learnt through the clip, within about twenty steps.
    model.observe_steps([(64, 1.0, 0.0, 5 * plain_table)] * 25)
    assert model.snapshot().step_time_s(64, 0) > 4.0 * plain_table


def test_a_two_phase_step_that_verified_nothing_is_no_plain_step_on_an_engine_profile() -> None:
    """Call s42b (the real pair, H100): the auto step mode's first 64-row steps were two-phase,
    and the allocator gave every row k = 0: the whole draft ran, then a plain verify, 4.3-4.5
    ms a step. Recorded at their mean width, 1, they were the plain width's steps: it learnt
    3.4x the table (1.3 ms) and priced plain out of use. On a table of whole engine steps a
    drafting step is at least the narrowest width the table measured with the draft."""
    profile = CostTable(
        TABLE.batch_sizes, TABLE.tokens_per_request, TABLE.step_time_s, includes_draft=True
    )
    model = CostModel(profile, verify_width_multiple=1, draft_cost_fraction=0.0)
    narrowest = min(t for t in profile.tokens_per_request if t > 1)
    drafted_s = profile.time_s(64, float(narrowest))
    model.observe_steps([(64, 1.0, 1.0, drafted_s)] * 20)  # two-phase, nothing verified
    row = profile.batch_sizes.index(64)
    plain, at_narrowest = model.width_fits()[row][0], model.width_fits()[row][narrowest - 1]
    assert plain[1] == 0.0  # the plain width's fit saw none of them
    assert at_narrowest[1] > 0.6 and at_narrowest[0] == pytest.approx(1.0)
    assert model.snapshot().step_time_s(64, 0) == pytest.approx(profile.time_s(64, 1.0))
    # a table of forwards prices the draft apart (draft_cost_fraction): width 1 with the draft
    forwards = CostModel(TABLE, verify_width_multiple=1, draft_cost_fraction=0.0)
    forwards.observe_steps([(64, 1.0, 1.0, TABLE.time_s(64, 1.0))] * 20)
    assert forwards.width_fits()[row][0][1] > 0.6
