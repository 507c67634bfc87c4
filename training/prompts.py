"""Held-out evaluation prompts per task, as chat messages (never seen in training)."""

import json
from pathlib import Path

from training import sources

TASK_SOURCES = {
    "math": ["gsm8k-test", "math500"],
    "code": ["humaneval", "mbpp-test"],
    "chat": ["mt-bench", "sharegpt-heldout"],
}


def prompts(source: str, data_dir: Path, limit: int) -> list[str]:
    """The first `limit` user prompts of one held-out source."""
    if source == "gsm8k-test":
        texts = [r["question"] for r in sources.gsm8k(data_dir, "test")[:limit]]
    elif source == "math500":
        texts = [
            r["problem"] for r in sources.read_jsonl(data_dir / "math500" / "test.jsonl")[:limit]
        ]
    elif source == "humaneval":
        texts = [sources.humaneval_prompt(r) for r in sources.humaneval()[:limit]]
    elif source == "mbpp-test":
        texts = [sources.mbpp_prompt(r) for r in sources.mbpp(data_dir, test=True)[:limit]]
    elif source == "mt-bench":
        rows = sources.read_jsonl(data_dir / "mt_bench" / "question.jsonl")
        texts = [r["turns"][0] for r in rows[:limit]]
    elif source == "sharegpt-heldout":
        texts = _sharegpt_heldout(limit)
    else:
        raise ValueError(f"unknown prompt source {source!r}; known: {sorted(all_sources())}")
    return texts


def _sharegpt_heldout(limit: int) -> list[str]:
    """First user turns from SHAREGPT_EVAL_START on that no earlier conversation contains
    (ShareGPT repeats popular prompts), at most 2,000 characters (CPU evaluation)."""
    seen = {
        m["content"]
        for messages in sources.sharegpt(0, sources.SHAREGPT_EVAL_START)
        for m in messages
        if m["role"] == "user"
    }
    texts: list[str] = []
    for messages in sources.sharegpt(sources.SHAREGPT_EVAL_START):
        text = messages[0]["content"]
        if len(texts) >= limit:
            break
        if len(text) <= 2000 and text not in seen and text not in texts:
            texts.append(text)
    return texts


def load_prompts(source: str, data_dir: Path, limit: int, prompts_file: Path | None) -> list[str]:
    """From a prompts file written by `dump` (the GPU machine has no data packages) or the data."""
    if prompts_file is None:
        return prompts(source, data_dir, limit)
    return json.loads(prompts_file.read_text())[source][:limit]


def dump(data_dir: Path, limit: int, out: Path) -> None:
    out.write_text(json.dumps({s: prompts(s, data_dir, limit) for s in all_sources()}) + "\n")


def all_sources() -> list[str]:
    return [s for names in TASK_SOURCES.values() for s in names]


def task_of(source: str) -> str:
    return next(task for task, names in TASK_SOURCES.items() if source in names)


if __name__ == "__main__":
    import sys

    dump(Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
