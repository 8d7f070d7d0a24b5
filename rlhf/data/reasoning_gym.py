"""Prompt rows from reasoning-gym's procedural tasks (an optional dependency: the `tasks` extra).

`reasoning_gym_rows("leg_counting", 200, split="test")` gives verl-schema rows like our own generators
(`rlhf.data.generators`), with data_source "reasoning_gym/leg_counting"; their reward is the task's own
scorer on the response's final answer (`rlhf.rewards.reasoning_gym`), which needs no other setting.

Train and test never share a question, whatever the seeds and sizes: each question belongs to one split
by a sha256 of its text (`problem_split`, half the questions each), and each split draws from its own
generator seed, skipping the other split's questions. Test rows also never repeat a question (held-out
accuracy counts each once); train rows are the draws as they come.

The same arguments give the same rows in every process. Some of reasoning-gym's generators draw from a set of
strings (isomorphic_strings: `rng.choice(list(letters - used))`), whose order follows Python's per-process hash
seed (8 of its 106 tasks did in a scan of 30 questions each); so the questions are always drawn as under
PYTHONHASHSEED=0 (`rlhf.data.hash_seed`).
"""

from __future__ import annotations

import hashlib
from typing import Any

from rlhf.data.generators import Split, problem_split
from rlhf.data.hash_seed import call_with_fixed_hash_seed
from rlhf.rewards.reasoning_gym import SOURCE_PREFIX, check_task, metadata_json, task_dataset

ANSWER_INSTRUCTION = 'End your reply with "The answer is <answer>."'
"""Appended to every question: a form `rlhf.rewards.final_answer.final_answer` reads, and one a small instruct model
follows: SmolLM2-135M-Instruct ended 23 of 24 greedy replies with it, against 1 of 24 for a last line "Answer: ..."
(two-term arithmetic; 0 of 64 on leg counting)."""

TEST_PERCENT = 50
"""Share of a task's questions (by hash) that belong to the test split: half, so each split draws ~2x."""

DRAWS_PER_ROW = 8
"""A split gives up (with a ValueError) after this many draws per row asked for, plus 1000."""


def generator_seed(task: str, seed: int, split: Split) -> int:
    """reasoning-gym's seed for (task, seed, split): distinct per split, stable across processes."""
    digest = hashlib.sha256(f"reasoning_gym/{task}/{split}/{seed}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def _entries(task: str, n: int, seed: int, split: Split, difficulty: dict[str, Any]) -> list[dict]:
    """`n` entries of `split`, drawn as under PYTHONHASHSEED=0 whatever this process's hash seed (module docstring)."""
    check_task(task)  # here, so that a missing reasoning-gym or a misspelt task is reported from this process
    return call_with_fixed_hash_seed(_drawn_entries, task, n, seed, split, difficulty)


def _drawn_entries(task: str, n: int, seed: int, split: Split, difficulty: dict[str, Any]) -> list[dict]:
    """`n` entries of `split`: questions of the other split skipped, and repeats too in the test split."""
    limit = DRAWS_PER_ROW * n + 1000
    dataset = task_dataset(task, size=limit, seed=generator_seed(task, seed, split), **difficulty)
    entries, seen = [], set()
    for index in range(limit):
        if len(entries) == n:
            return entries
        entry = dataset[index]
        question = entry["question"]
        if problem_split(question, TEST_PERCENT) != split or (split == "test" and question in seen):
            continue
        seen.add(question)
        entries.append(entry)
    if len(entries) == n:
        return entries
    raise ValueError(
        f"reasoning_gym/{task}: found only {len(entries)} {'distinct ' if split == 'test' else ''}{split} questions "
        f"of the {n} asked for in {limit} draws (settings {difficulty or 'default'}): the task has too few "
        "questions at these settings. Fix: ask for fewer rows, or widen the difficulty settings."
    )


def reasoning_gym_rows(
    task: str,
    n: int,
    seed: int = 0,
    split: Split = "train",
    instruction: str = ANSWER_INSTRUCTION,
    **difficulty: Any,
) -> list[dict]:
    """`n` rows of reasoning-gym's `task` in verl's schema (as `arithmetic_rows`), for `split`.

    task: a reasoning-gym dataset name (e.g. "leg_counting"); an unknown one raises a ValueError listing them.
    seed: which questions; train and test never share one, whatever the seeds (module docstring).
    instruction: appended to each question, after a blank line; it must ask for what the scorer reads.
    difficulty: the task's generator settings (e.g. `min_terms=2, max_terms=3` for chain_sum); an unknown
      one raises a ValueError listing the task's settings.
    """
    if split not in ("train", "test"):
        raise ValueError(f'reasoning_gym_rows: split must be "train" or "test", got {split!r}')
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"reasoning_gym_rows: n must be a non-negative int, got {n!r}")
    rows = []
    for index, entry in enumerate(_entries(task, n, seed, split, difficulty)):
        question, answer = entry["question"].rstrip(), "" if entry["answer"] is None else str(entry["answer"])
        rows.append({
            "data_source": SOURCE_PREFIX + task,
            "prompt": [{"role": "user", "content": f"{question}\n\n{instruction}" if instruction else question}],
            "ability": "reasoning",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": index, "task": task, "question": entry["question"],
                           "answer": answer, "metadata_json": metadata_json(entry["metadata"])},
        })
    return rows
