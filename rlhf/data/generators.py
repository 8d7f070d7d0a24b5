"""Offline, seeded task generators: arithmetic, GSM8K-format word problems, Countdown.

No machine here reaches a dataset hub, so these make the data every CPU test and demo
trains on. Each returns rows in the verl schema (see `rlhf.data.schema`). Train and test
splits never share a problem: each problem's split is fixed by a hash of the problem
itself (not by the seed), so `split="test"` with any seed is held out from
`split="train"` with any seed. The seed only picks which problems, in which order.
"""

from __future__ import annotations

import hashlib
import json
import operator
import random
from collections.abc import Callable
from typing import Literal

Split = Literal["train", "test"]

TEST_PERCENT = 10
"""Share of all problems (by hash) that belong to the test split."""

GSM8K_INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."
"""verl's GSM8K instruction, appended to every question (verl examples/data_preprocess/gsm8k.py)."""


def problem_split(key: str, test_percent: int = TEST_PERCENT) -> Split:
    """The split a problem belongs to, from a sha256 of its canonical key (process-independent).

    test_percent: the share of all keys (in %) that belong to the test split.
    """
    bucket = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") % 100
    return "test" if bucket < test_percent else "train"


def _check_args(generator: str, n: int, split: str) -> None:
    if split not in ("train", "test"):
        raise ValueError(f'{generator}: split must be "train" or "test", got {split!r}')
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"{generator}: n must be a non-negative int, got {n!r}")


def _rng(generator: str, seed: int, split: str) -> random.Random:
    # A string seed is hashed with sha512 by `random`, so streams are stable across
    # processes and PYTHONHASHSEED, and differ between generators and splits.
    return random.Random(f"{generator}/{split}/{seed}")


# ---------------------------------------------------------------------------- arithmetic


def arithmetic_pairs(split: Split) -> list[tuple[int, int]]:
    """All (a, b) with a, b in 10..99 that belong to `split` (7309 train, 791 test)."""
    return [(a, b) for a in range(10, 100) for b in range(10, 100) if problem_split(f"{a}+{b}") == split]


def arithmetic_rows(n: int, *, seed: int = 0, split: Split = "train") -> list[dict]:
    """`n` two-digit additions "What is a+b?" with the decimal sum as ground truth.

    The prompt is short because the tiny test model is byte-level. Train cycles through
    fresh shuffles of its pairs when `n` exceeds them (sampling with replacement, every
    pair equally often); test never repeats a pair and refuses a larger `n`.
    """
    _check_args("arithmetic_rows", n, split)
    pairs = arithmetic_pairs(split)
    if split == "test" and n > len(pairs):
        raise ValueError(
            f"arithmetic_rows: asked for {n} test rows but the test split has only {len(pairs)} "
            f"distinct pairs. Fix: ask for n <= {len(pairs)} (test rows never repeat)."
        )
    rng = _rng("arithmetic", seed, split)
    chosen: list[tuple[int, int]] = []
    while len(chosen) < n:
        order = pairs[:]
        rng.shuffle(order)
        chosen.extend(order[: n - len(chosen)])
    rows = []
    for index, (a, b) in enumerate(chosen):
        question = f"{a}+{b}"
        rows.append(
            {
                "data_source": "arithmetic",
                "prompt": [{"role": "user", "content": f"What is {question}?"}],
                "ability": "arithmetic",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"split": split, "index": index, "question": question, "answer": str(a + b)},
            }
        )
    return rows


# ---------------------------------------------------------------------- gsm8k-like


_ARITH: dict[str, Callable[[int, int], int]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.floordiv,  # templates only divide exactly; checked below
}


class _Steps:
    """Collects GSM8K-style solution lines: 'text a*b = <<a*b=c>>c unit.'"""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, before: str, a: int, op: str, b: int, after: str) -> int:
        value = _ARITH[op](a, b)
        if op == "/" and value * b != a:
            raise AssertionError(f"template divided inexactly: {a}/{b}")
        expr = f"{a}{op}{b}"
        self.lines.append(f"{before}{expr} = <<{expr}={value}>>{value}{after}")
        return value

    def solution(self, answer: int) -> str:
        return "\n".join(self.lines + [f"#### {answer}"])


_NAMES = ("Maria", "James", "Aisha", "Tom", "Lena", "Carlos", "Priya", "Noah", "Mei", "Omar", "Sofia", "Ben")


def _shopping(r: random.Random, s: _Steps) -> tuple[str, int]:
    name = r.choice(_NAMES)
    item1, item2 = r.sample(["notebooks", "pens", "apples", "candles", "mugs", "socks"], 2)
    n1, p1, n2, p2 = r.randint(2, 9), r.randint(2, 15), r.randint(2, 9), r.randint(1, 12)
    cost1 = s(f"The {item1} cost ", n1, "*", p1, " dollars.")
    cost2 = s(f"The {item2} cost ", n2, "*", p2, " dollars.")
    total = s("Together they cost ", cost1, "+", cost2, " dollars.")
    bill = r.choice([b for b in (50, 100, 200, 500) if b > total])
    change = s(f"{name} gets back ", bill, "-", total, " dollars.")
    question = (
        f"{name} buys {n1} {item1} for ${p1} each and {n2} {item2} for ${p2} each. "
        f"{name} pays with a ${bill} bill. How much change, in dollars, does {name} get back?"
    )
    return question, change


def _ages(r: random.Random, s: _Steps) -> tuple[str, int]:
    name = r.choice(_NAMES)
    age, times, gap, years = r.randint(3, 15), r.randint(2, 4), r.randint(20, 35), r.randint(2, 20)
    mother = s("The mother is ", age, "*", times, " years old.")
    grandpa = s("The grandfather is ", mother, "+", gap, " years old.")
    future = s(f"In {years} years he will be ", grandpa, "+", years, " years old.")
    question = (
        f"{name} is {age} years old. {name}'s mother is {times} times as old as {name}. "
        f"{name}'s grandfather is {gap} years older than the mother. "
        f"How old will the grandfather be in {years} years?"
    )
    return question, future


def _distance(r: random.Random, s: _Steps) -> tuple[str, int]:
    speed1, hours1, speed2, hours2 = r.randint(40, 120), r.randint(2, 9), r.randint(30, 90), r.randint(2, 6)
    vehicle = r.choice(["train", "bus", "truck", "car"])
    leg1 = s("First it travels ", speed1, "*", hours1, " miles.")
    leg2 = s("Then it travels ", speed2, "*", hours2, " miles.")
    total = s("In total it travels ", leg1, "+", leg2, " miles.")
    question = (
        f"A {vehicle} travels at {speed1} miles per hour for {hours1} hours, then at {speed2} "
        f"miles per hour for {hours2} hours. How many miles does the {vehicle} travel in total?"
    )
    return question, total


def _sharing(r: random.Random, s: _Steps) -> tuple[str, int]:
    name = r.choice(_NAMES)
    friends, each, kept = r.randint(2, 8), r.randint(3, 20), r.randint(1, 12)
    per_batch = r.choice([6, 8, 10, 12, 24])
    # Make the total divisible into batches: round the shared part up to a whole number of batches.
    total = friends * each + kept
    batches = -(-total // per_batch)
    kept += batches * per_batch - total
    made = s(f"{name} bakes ", batches, "*", per_batch, " cookies.")
    rest = s("After keeping some there are ", made, "-", kept, " cookies left.")
    share = s("Each friend gets ", rest, "/", friends, " cookies.")
    question = (
        f"{name} bakes {batches} batches of {per_batch} cookies. {name} keeps {kept} cookies and "
        f"shares the rest equally among {friends} friends. How many cookies does each friend get?"
    )
    return question, share


def _factory(r: random.Random, s: _Steps) -> tuple[str, int]:
    per_day, days, weeks = r.randint(120, 950), r.randint(4, 6), r.randint(2, 8)
    thing = r.choice(["widgets", "bottles", "bricks", "toys"])
    weekly = s("Each week it makes ", per_day, "*", days, f" {thing}.")
    total = s(f"In {weeks} weeks it makes ", weekly, "*", weeks, f" {thing}.")
    question = (
        f"A factory makes {per_day} {thing} per day and works {days} days each week. "
        f"How many {thing} does it make in {weeks} weeks?"
    )
    return question, total


def _savings(r: random.Random, s: _Steps) -> tuple[str, int]:
    name = r.choice(_NAMES)
    wage, hours, weeks = r.randint(10, 30), r.randint(10, 40), r.randint(3, 12)
    earned = wage * hours
    spend = r.randint(earned // 4, earned * 3 // 4)
    weekly = s(f"{name} earns ", wage, "*", hours, " dollars a week.")
    saved = s(f"{name} saves ", weekly, "-", spend, " dollars a week.")
    total = s(f"After {weeks} weeks {name} has saved ", saved, "*", weeks, " dollars.")
    question = (
        f"{name} earns ${wage} an hour and works {hours} hours a week. {name} spends ${spend} "
        f"each week. How many dollars does {name} save in {weeks} weeks?"
    )
    return question, total


def _garden(r: random.Random, s: _Steps) -> tuple[str, int]:
    rows_, per_row, box = r.randint(3, 12), r.randint(4, 15), r.choice([4, 5, 6, 10, 12])
    per_plant = box * r.randint(1, 4)
    plants = s("There are ", rows_, "*", per_row, " plants.")
    tomatoes = s("They give ", plants, "*", per_plant, " tomatoes.")
    boxes = s("That fills ", tomatoes, "/", box, " boxes.")
    question = (
        f"A farmer plants {rows_} rows of {per_row} tomato plants. Each plant gives {per_plant} "
        f"tomatoes. The farmer packs them in boxes of {box}. How many boxes does the farmer fill?"
    )
    return question, boxes


GSM8K_TEMPLATES: tuple[Callable[[random.Random, _Steps], tuple[str, int]], ...] = (
    _shopping, _ages, _distance, _sharing, _factory, _savings, _garden,
)
"""Word-problem templates: each draws numbers, records its steps, returns (question, answer)."""


def _unique_problems(generator: str, n: int, split: Split, make: Callable, key_of: Callable) -> list:
    """Draw problems until `n` distinct ones of `split` are found (bounded, so never hangs)."""
    problems, seen = [], set()
    attempts = 0
    max_attempts = 200 * n + 10_000
    while len(problems) < n:
        attempts += 1
        if attempts > max_attempts:
            raise ValueError(
                f"{generator}: found only {len(problems)} distinct {split} problems of the {n} "
                f"asked for in {max_attempts} draws. Fix: ask for fewer rows or widen the ranges."
            )
        problem = make()
        if problem is None:
            continue
        key = key_of(problem)
        if key in seen or problem_split(key) != split:
            continue
        seen.add(key)
        problems.append(problem)
    return problems


def gsm8k_like_rows(n: int, *, seed: int = 0, split: Split = "train") -> list[dict]:
    """`n` GSM8K-format word problems with worked solutions ending "#### N".

    Rows look like verl's preprocessed openai/gsm8k: the question plus verl's instruction,
    the integer answer as ground truth, and `extra_info.answer` a worked solution with
    <<a*b=c>> calculator annotations. Answers reach the thousands, so comma handling
    in scorers gets exercised.
    """
    _check_args("gsm8k_like_rows", n, split)
    rng = _rng("gsm8k_like", seed, split)

    def make() -> tuple[str, str, int]:
        steps = _Steps()
        question, answer = rng.choice(GSM8K_TEMPLATES)(rng, steps)
        return question, steps.solution(answer), answer

    problems = _unique_problems("gsm8k_like_rows", n, split, make, key_of=lambda p: p[0])
    return [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"{question} {GSM8K_INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(answer)},
            "extra_info": {"split": split, "index": index, "answer": solution, "question": question},
        }
        for index, (question, solution, answer) in enumerate(problems)
    ]


# ------------------------------------------------------------------------- countdown

_OPS = ("+", "-", "*", "/")
_INT_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.floordiv}


def _random_expression(rng: random.Random, numbers: list[int]) -> tuple[str, int] | None:
    """A random expression using every number once, or None when a division is inexact.

    Intermediate values stay integers (inexact divisions are rejected), which keeps
    the stored solutions readable and the arithmetic fast.
    """
    terms: list[tuple[str, int, bool]] = [(str(x), x, True) for x in numbers]
    rng.shuffle(terms)
    while len(terms) > 1:
        i = rng.randrange(len(terms) - 1)
        (left, lv, l_atom), (right, rv, r_atom) = terms[i], terms[i + 1]
        op = rng.choice(_OPS)
        if op == "/" and (rv == 0 or lv % rv):
            return None
        value = _INT_OPS[op](lv, rv)
        text = f"{left if l_atom else f'({left})'} {op} {right if r_atom else f'({right})'}"
        terms[i : i + 2] = [(text, value, False)]
    return terms[0][0], terms[0][1]


COUNTDOWN_PROMPT = (
    "Using the numbers {numbers}, create an equation that equals {target}. You can use basic "
    "arithmetic operations (+, -, *, /) and each number can only be used once. Show your work "
    "in <think> </think> tags. And return the final answer in <answer> </answer> tags, for "
    "example <answer> (1 + 2) / 3 </answer>."
)
"""TinyZero's Countdown instruction (its chat-template variant)."""


def countdown_rows(
    n: int,
    *,
    seed: int = 0,
    split: Split = "train",
    num_count: int = 3,
    max_target: int = 100,
    max_number: int = 99,
) -> list[dict]:
    """`n` TinyZero-style Countdown puzzles, each solvable by construction.

    num_count: how many numbers a puzzle gives (TinyZero uses 3 and 4).
    max_target: targets lie in 1..max_target.
    max_number: numbers lie in 1..max_number.
    The known solution is in `extra_info.solution`; the ground truth is the JSON string
    {"target": T, "numbers": [...]}.
    """
    _check_args("countdown_rows", n, split)
    if not 2 <= num_count <= 6:
        raise ValueError(f"countdown_rows: num_count must be in 2..6, got {num_count!r}")
    if max_target < 1 or max_number < 1:
        raise ValueError(f"countdown_rows: max_target and max_number must be >= 1, got {max_target}, {max_number}")
    rng = _rng(f"countdown{num_count}", seed, split)

    def make() -> tuple[list[int], int, str] | None:
        numbers = [rng.randint(1, max_number) for _ in range(num_count)]
        built = _random_expression(rng, numbers)
        if built is None:
            return None
        expression, value = built
        if not 1 <= value <= max_target:
            return None
        return numbers, value, expression

    problems = _unique_problems(
        "countdown_rows", n, split, make, key_of=lambda p: f"{p[1]}:{sorted(p[0])}"
    )
    return [
        {
            "data_source": "countdown",
            "prompt": [{"role": "user", "content": COUNTDOWN_PROMPT.format(numbers=numbers, target=target)}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": json.dumps({"target": target, "numbers": numbers})},
            "extra_info": {"split": split, "index": index, "solution": solution},
        }
        for index, (numbers, target, solution) in enumerate(problems)
    ]


# ------------------------------------------------------------------------ long addition


def long_addition_rows(n: int, *, digits: int = 4, seed: int = 0, split: Split = "train") -> list[dict]:
    """`n` additions of two `digits`-digit numbers, "What is 4821+7390?", the sum as ground truth.

    Too long for the tiny model to add itself in a few minutes of training, short enough to copy
    into a calculator call (experiments/tool_calculator.py). `extra_info` keeps the operands `a`,
    `b`. Each problem's split comes from its hash, like every generator here; duplicates are drawn
    again (train and test never share a problem).
    """
    _check_args("long_addition_rows", n, split)
    if digits < 1:
        raise ValueError(f"long_addition_rows: digits must be >= 1, got {digits}")
    low, high = 10 ** (digits - 1), 10**digits - 1
    rng = _rng(f"long_addition{digits}", seed, split)

    def make() -> tuple[int, int]:
        return rng.randint(low, high), rng.randint(low, high)

    pairs = _unique_problems(f"long_addition{digits}", n, split, make, key_of=lambda p: f"{p[0]}+{p[1]}")
    return [
        {
            "data_source": "long_addition",
            "prompt": [{"role": "user", "content": f"What is {a}+{b}?"}],
            "ability": "arithmetic",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": split, "index": index, "a": a, "b": b},
        }
        for index, (a, b) in enumerate(pairs)
    ]


def long_multiplication_rows(n: int, *, digits: int = 3, seed: int = 0, split: Split = "train") -> list[dict]:
    """`n` products of two `digits`-digit numbers, "What is 482*937?", the product as ground truth.

    Beyond what a small model multiplies in its head (SmolLM2-135M gets essentially none of the
    three-digit ones), short enough to copy into a calculator call (experiments/smollm2_agent.py).
    `extra_info` keeps the operands `a`, `b`; the split comes from each problem's hash.
    """
    _check_args("long_multiplication_rows", n, split)
    if digits < 1:
        raise ValueError(f"long_multiplication_rows: digits must be >= 1, got {digits}")
    low, high = 10 ** (digits - 1), 10**digits - 1
    rng = _rng(f"long_multiplication{digits}", seed, split)

    def make() -> tuple[int, int]:
        return rng.randint(low, high), rng.randint(low, high)

    pairs = _unique_problems(f"long_multiplication{digits}", n, split, make, key_of=lambda p: f"{p[0]}*{p[1]}")
    return [
        {
            "data_source": "long_multiplication",
            "prompt": [{"role": "user", "content": f"What is {a}*{b}?"}],
            "ability": "arithmetic",
            "reward_model": {"style": "rule", "ground_truth": str(a * b)},
            "extra_info": {"split": split, "index": index, "a": a, "b": b},
        }
        for index, (a, b) in enumerate(pairs)
    ]


# ------------------------------------------------------------------------- topic prompts

TOPICS = tuple("""
volcano rainbow library ocean moon computer bicycle piano garden river desert forest bridge castle camera umbrella
penguin elephant tiger dolphin butterfly spider mountain island cloud glacier planet comet battery magnet telescope
compass lighthouse train airplane rocket submarine tomato potato apple banana pizza guitar violin drum museum
hospital market farm village kitchen candle mirror clock map newspaper password vaccine robot diamond owl eagle shark
whale horse rabbit frog bee ant cactus mushroom tornado earthquake snowflake keyboard lamp tractor windmill canoe
helmet backpack ladder kite balloon volcano waterfall cave beach lake skyscraper tunnel highway bakery orchestra
microscope thermometer calculator printer smartphone satellite parachute compass hammer scissors bridge pyramid
statue fountain garden zebra giraffe kangaroo octopus jellyfish parrot squirrel hedgehog lion camel peacock coral
""".split())
"""Countable things to ask about (duplicates are dropped where the prompts are made)."""

TOPIC_TEMPLATES = (
    "What is {a} {t}?", "Describe {a} {t} in one sentence.", "Tell me a fun fact about the {t}.",
    "Why is the {t} useful?", "Give me one tip about using a {t}.", "Write a short note about the {t}.",
    "Explain the {t} to a child.", "What do you know about the {t}?", "How does {a} {t} work?",
    "What makes the {t} special?", "Say something interesting about the {t}.", "Who would need {a} {t}?",
)
"""Ways of asking about a topic; some are answered by naming it first, some rarely (room for a direct style)."""


def topic_prompt_rows(n: int | None = None, *, seed: int = 0, split: Split = "train", test_percent: int = 20) -> list[dict]:
    """Chat prompts about everyday things ("What is a comet?", "Give me one tip about using a kite."), a topic
    from `TOPICS` in one of `TOPIC_TEMPLATES`, with the topic as ground truth and data_source
    "direct_answer" (its gold rule: rlhf.rewards.direct_answer). A prompt's split is fixed by its hash
    (`test_percent` of all prompts are test: ~330 of ~1600); `n` of them in a seeded order (None: all).
    """
    if n is not None:
        _check_args("topic_prompt_rows", n, split)
    prompts = []
    for topic in dict.fromkeys(TOPICS):
        article = "an" if topic[0] in "aeiou" else "a"
        for template in TOPIC_TEMPLATES:
            text = template.format(t=topic, a=article)
            if problem_split(f"topic/{text}", test_percent) == split:
                prompts.append((topic, text))
    _rng("topic_prompts", seed, split).shuffle(prompts)
    if n is not None and n > len(prompts):
        raise ValueError(f"topic_prompt_rows: n={n} but the {split} split has {len(prompts)} prompts")
    return [
        {
            "data_source": "direct_answer",
            "prompt": [{"role": "user", "content": text}],
            "ability": "chat",
            "reward_model": {"style": "rule", "ground_truth": topic},
            "extra_info": {"split": split, "index": index, "topic": topic},
        }
        for index, (topic, text) in enumerate(prompts[:n])
    ]
