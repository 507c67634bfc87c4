"""The labelled corpus, deduplicated, with its deterministic held-out and validation masks.

The corpus is the public sources (``corpus.py``) followed by the generated examples built
from them (``synthetic.py``, ``switches.py``); ``all_examples`` puts them in that order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from controller.classifier.text import DEFAULT_MAX_CHARS, request_text
from training.classifier.chatterbot_source import chatterbot_examples
from training.classifier.code_fragments import fragment_examples
from training.classifier.corpus import (
    Example,
    champ,
    gsm8k,
    human_eval,
    math500,
    mbpp,
    mt_bench,
    sharegpt_turns,
)
from training.classifier.foreign_requests import foreign_examples
from training.classifier.phrasings import phrasing_examples
from training.classifier.pygments_source import DEFAULT_SDIST_DIR, fetch_sdist, source_files
from training.classifier.split import DEFAULT_HELD_OUT_PERCENT, is_held_out, is_validation
from training.classifier.switches import is_single_turn, topic_switches
from training.classifier.synthetic import synthetic_math


@dataclass
class Dataset:
    """Examples with their extracted text; ``is_test[i]`` marks held-out examples."""

    examples: list[Example] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    is_test: list[bool] = field(default_factory=list)
    sharegpt_counts: dict[str, int] = field(default_factory=dict)
    num_duplicates: int = 0
    max_chars: int = DEFAULT_MAX_CHARS

    def subset(self, is_test: bool) -> list[int]:
        return [i for i, flag in enumerate(self.is_test) if flag == is_test]

    def train_rows(self, validation_percent: int = 0) -> list[int]:
        """Training examples, less the validation groups when ``validation_percent`` > 0."""
        rows = self.subset(is_test=False)
        if not validation_percent:
            return rows
        return [i for i in rows if not is_validation(self.examples[i].group, validation_percent)]

    def eval_rows(self, validation_percent: int = 0) -> list[int]:
        """What ``classifier eval`` scores: the validation split when ``validation_percent`` >
        0, else the held-out split."""
        if validation_percent:
            return self.validation_rows(validation_percent)
        return self.subset(is_test=True)

    def validation_rows(self, validation_percent: int) -> list[int]:
        """The training examples whose group is in the validation split (never held out)."""
        rows = self.subset(is_test=False)
        return [i for i in rows if is_validation(self.examples[i].group, validation_percent)]


def all_examples(
    shared: Path, sharegpt_counts: dict[str, int], sdist_dir: Path = DEFAULT_SDIST_DIR
) -> Iterator[Example]:
    """Every labelled example in source order: the public sets, the ShareGPT turns (their
    label counts go to ``sharegpt_counts``), the ChatterBot corpus (real chat in ~30 human
    languages; not used for system prompts or switches), synthetic maths, the phrasings of
    ``phrasings.py`` (source files from the Pygments sdist in ``sdist_dir``, fetched with pip
    when absent), then topic switches built from all single-turn requests before them, then
    short bare fragments of the source files (``code_fragments.py``)."""
    public = [*gsm8k(shared), *math500(shared), *mbpp(shared), *mt_bench(shared)]
    public += [*human_eval(), *champ()]
    conversations = list(sharegpt_turns(sharegpt_counts))
    singles = [example for example in public + conversations if is_single_turn(example)]
    files = list(source_files(fetch_sdist(sdist_dir)))
    phrased = list(phrasing_examples(shared, files, singles))
    yield from public
    yield from conversations
    yield from chatterbot_examples(sdist_dir)
    yield from synthetic_math()
    yield from phrased
    phrased_singles = [example for example in phrased if is_single_turn(example)]
    yield from topic_switches(public + conversations + phrased_singles)
    # Last, so that the sources above (and their deduplication) are those of the rounds
    # before the fragments.
    yield from fragment_examples(files)
    # After the fragments, for the same reason: tool requests and maths problems in Russian,
    # Ukrainian, Japanese, Korean and Chinese (#17, fourth follow-up).
    yield from foreign_examples()


def build_dataset(
    examples: Iterable[Example],
    held_out_percent: int = DEFAULT_HELD_OUT_PERCENT,
    max_chars: int = DEFAULT_MAX_CHARS,
) -> Dataset:
    """Extract each example's text as the daemon would and drop exact duplicate texts.

    The first occurrence of a text wins, so the result depends only on source order.
    """
    dataset = Dataset(max_chars=max_chars)
    seen: set[str] = set()
    for example in examples:
        text = request_text(example.body, max_chars)
        if text in seen:
            dataset.num_duplicates += 1
            continue
        seen.add(text)
        dataset.examples.append(example)
        dataset.texts.append(text)
        dataset.is_test.append(is_held_out(example.group, held_out_percent))
    return dataset


def load_dataset(
    shared_data: Path,
    held_out_percent: int = DEFAULT_HELD_OUT_PERCENT,
    max_chars: int = DEFAULT_MAX_CHARS,
    sdist_dir: Path = DEFAULT_SDIST_DIR,
) -> Dataset:
    counts: dict[str, int] = {}
    examples = all_examples(shared_data, counts, sdist_dir)
    dataset = build_dataset(examples, held_out_percent, max_chars)
    dataset.sharegpt_counts = counts
    return dataset
