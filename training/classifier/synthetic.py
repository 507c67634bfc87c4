"""Short maths requests made from templates, to cover what the public sets lack.

GSM8K and CHAMP are long word problems and MATH-500 is LaTeX, so the first models read short
plain-text maths ("Solve for x: 2x + 3 = 11", "What is 17 * 23?") as chat. These templates
fill that gap. They are labelled ``synthetic_math`` and reported apart from the real sources;
the split holds out whole templates, so held-out accuracy measures unseen phrasings.
The numbers come from a seeded generator, so the set is the same on every run.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from policies.types import Task
from training.classifier.corpus import Example, user

TEMPLATES = (
    "Solve for x: {a}x + {b} = {c}",
    "Solve {a}x - {b} = {c} for x.",
    "What is {a} * {b}?",
    "What is {a} + {b} * {c}?",
    "Calculate {a} divided by {b}.",
    "What is {a}% of {b}?",
    "Compute the integral of x^{p} from 0 to {a}.",
    "Find the derivative of {a}x^{p} + {b}x - {c}.",
    "Find all real x such that x^2 - {s}x + {q} = 0.",
    "What is the square root of {sq}?",
    "Simplify ({a}x + {b}) - ({c}x - {a}).",
    "If f(x) = {a}x^2 + {b}, what is f({c})?",
    "How many ways can {a} people sit in a row of {a} chairs?",
    "What is the probability of rolling a sum of {d} with two dice?",
    "Find the area of a circle with radius {a}.",
    "Evaluate the limit of ({a}x^2 + {b}) / ({c}x^2 - 1) as x goes to infinity.",
    "Is {prime} a prime number? Show your reasoning.",
    "Convert {a}/{b} to a decimal.",
    "What is the greatest common divisor of {a} and {big}?",
    "Find the sum of the first {a} positive integers.",
    "A rectangle is {a} cm by {b} cm. What is its perimeter?",
    "Solve the system: x + y = {a}, x - y = {b}.",
    "What is {a}^{p} mod {b}?",
    "Factor x^2 + {s}x + {q}.",
)
NUM_PER_TEMPLATE = 40


def synthetic_math(seed: int = 0) -> Iterator[Example]:
    rng = random.Random(seed)
    for index, template in enumerate(TEMPLATES):
        for _ in range(NUM_PER_TEMPLATE):
            r, t = rng.randint(1, 9), rng.randint(1, 9)
            values = {
                "a": rng.randint(2, 40),
                "b": rng.randint(2, 40),
                "c": rng.randint(2, 99),
                "p": rng.randint(2, 5),
                "d": rng.randint(2, 12),
                "s": r + t,
                "q": r * t,
                "sq": rng.randint(2, 30) ** 2,
                "prime": rng.randint(11, 500),
                "big": rng.randint(41, 999),
            }
            text = template.format(**values)
            yield Example(user(text), Task.MATH, "synthetic_math", f"synthetic/{index}")
