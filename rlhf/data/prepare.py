"""`rlhf data prepare <task> --out DIR`: write DIR/train.parquet and DIR/test.parquet in verl's schema.

Tasks:
- `arithmetic`, `countdown`, `gsm8k_synthetic`: offline, seeded generators (`rlhf.data.generators`).
- `reasoning_gym/<task>`: any of reasoning-gym's ~100 offline generators (`rlhf.data.reasoning_gym`; the `tasks`
  extra), with its settings from `--set key=value`.
- `gsm8k`: openai/gsm8k ("main"), converted exactly as verl's examples/data_preprocess/gsm8k.py.
- `math`: DigitalLearningGmbH/MATH-lighteval, as verl's examples/data_preprocess/math_dataset.py.
- `preferences`: preference pairs labelled by sampling a model and ranking its answers with a scorer
  (`rlhf data prepare preferences --help`; `rlhf.cli.prepare_preferences`, as it runs a model).

The hub tasks load with the `datasets` library, or, with `--local PATH`, from files of the
hub dataset downloaded elsewhere (its parquet/jsonl files, found by split name under PATH),
which needs no `datasets` and no network.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from rlhf.data.files import fingerprint_rows, write_rows
from rlhf.data.generators import GSM8K_INSTRUCTION, arithmetic_rows, countdown_rows, gsm8k_like_rows
from rlhf.data.reasoning_gym import reasoning_gym_rows
from rlhf.data.schema import DataError, to_python
from rlhf.rewards.math import last_boxed

GENERATED: dict[str, Callable[..., list[dict]]] = {
    "arithmetic": arithmetic_rows,
    "countdown": countdown_rows,
    "gsm8k_synthetic": gsm8k_like_rows,
}
"""Command-line names of the offline generator tasks."""

MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
"""verl's MATH instruction, appended to every problem (verl examples/data_preprocess/math_dataset.py)."""

REASONING_GYM = "reasoning_gym/"
"""Command-line prefix of reasoning-gym's tasks: `reasoning_gym/leg_counting`."""

SPLITS = ("train", "test")
GENERATED_TRAIN_ROWS, GENERATED_TEST_ROWS = 1000, 100
"""Rows a generated task writes when --n / --n-test are not given."""

_GSM8K_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")  # verl's extract_solution


def gsm8k_row_from_hf(example: Mapping, split: str, index: int) -> dict:
    """One openai/gsm8k example ({"question", "answer"}) as verl's GSM8K preprocessing writes it.

    Ground truth: the number after the first "#### " in the answer, commas removed
    ("1,234" -> "1234"), with verl's regex.
    """
    question, answer = example["question"], example["answer"]
    found = _GSM8K_ANSWER.search(answer)
    if found is None:
        raise DataError(
            f"openai/gsm8k {split} row {index}: the answer has no final '#### <number>' "
            f"(ends {answer[-60:]!r}). Fix: check that the file holds openai/gsm8k's 'main' config.",
            source="openai/gsm8k", index=index, field="answer",
        )
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"{question} {GSM8K_INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": found.group(1).replace(",", "")},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def math_row_from_hf(example: Mapping, split: str, index: int) -> dict | None:
    """One MATH-lighteval example ({"problem", "solution"}) as verl's MATH preprocessing writes it;
    None when the solution has no \\boxed{} answer (verl would stop there)."""
    truth = last_boxed(example["solution"])
    if truth is None:
        return None
    return {
        "data_source": "DigitalLearningGmbH/MATH-lighteval",
        "prompt": [{"role": "user", "content": f"{example['problem']} {MATH_INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": split, "index": index},
    }


HUB: dict[str, tuple[str, str | None, Callable[[Mapping, str, int], dict | None]]] = {
    "gsm8k": ("openai/gsm8k", "main", gsm8k_row_from_hf),
    "math": ("DigitalLearningGmbH/MATH-lighteval", None, math_row_from_hf),
}
"""Command-line names of the hub tasks: (dataset, config, row conversion)."""


class HubUnavailable(RuntimeError):
    """The dataset could not be loaded from the hub (no `datasets`, offline, not found)."""


def load_hub_splits(name: str, config: str | None) -> dict[str, Iterable[Mapping]]:
    """{"train": examples, "test": examples} of a hub dataset via `datasets`; `HubUnavailable` if not."""
    try:
        import datasets
    except ImportError as err:
        raise HubUnavailable("the `datasets` library is not installed (pip install datasets)") from err
    try:
        loaded = datasets.load_dataset(name, config) if config else datasets.load_dataset(name)
        return {split: loaded[split] for split in SPLITS}
    except Exception as err:  # offline, not found, gated: datasets raises many types
        raise HubUnavailable(f"{type(err).__name__}: {err}") from err


def read_local_split(path: Path, split: str) -> list[dict]:
    """The examples of `split` under `path`: files named `<split>*.parquet|.jsonl|.json`, in name order."""
    if path.is_file():
        files = [path] if path.name.startswith(split) else []
    else:
        files = sorted(
            p for p in path.rglob(f"{split}*") if p.is_file() and p.suffix in (".parquet", ".jsonl", ".json")
        )
    if not files:
        raise DataError(
            f"{path}: no {split} file found. Fix: give a directory holding {split}*.parquet (as on the hub, "
            f"e.g. main/{split}-00000-of-00001.parquet), {split}.jsonl or {split}.json.",
            source=str(path),
        )
    examples: list[dict] = []
    for file in files:
        if file.suffix == ".parquet":
            import pyarrow.parquet as pq

            examples.extend(to_python(pq.read_table(file).to_pylist()))
        elif file.suffix == ".jsonl":
            with file.open(encoding="utf-8") as f:
                examples.extend(json.loads(line) for line in f if line.strip())
        else:
            examples.extend(json.loads(file.read_text(encoding="utf-8")))
    return examples


def hub_rows(
    convert: Callable[[Mapping, str, int], dict | None], examples: Iterable[Mapping], split: str, n: int | None
) -> tuple[list[dict], int]:
    """(rows, examples dropped) converted from the first `n` examples (all when None)."""
    rows, dropped = [], 0
    for index, example in enumerate(examples):
        if n is not None and index >= n:
            break
        row = convert(example, split, index)
        if row is None:
            dropped += 1
        else:
            rows.append(row)
    return rows, dropped


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlhf data prepare",
        description="Write DIR/train.parquet and DIR/test.parquet in verl's prompt schema.",
    )
    parser.add_argument("task", help=f"what data to prepare: {', '.join([*GENERATED, *HUB])}, or {REASONING_GYM}<task> "
                                     f"(any reasoning-gym task, e.g. {REASONING_GYM}leg_counting); `preferences` "
                                     "(pairs from a model's ranked samples) has its own flags: "
                                     "`rlhf data prepare preferences --help`")
    parser.add_argument("--out", required=True, type=Path, help="output directory (created if missing)")
    parser.add_argument("--n", "--size", type=int, default=None,
                        help=f"train rows (generated tasks: default {GENERATED_TRAIN_ROWS}; hub tasks: the first N, "
                             "default all)")
    parser.add_argument("--n-test", type=int, default=None,
                        help=f"test rows (generated tasks: default {GENERATED_TEST_ROWS}; hub tasks: default all)")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (generated tasks only)")
    parser.add_argument("--local", type=Path, default=None,
                        help="hub tasks: read the dataset's files from this path instead of the hub")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                        help=f"{REASONING_GYM}<task> only: a generator setting (e.g. --set min_terms=2; the value is "
                             "read as JSON, else as text); an unknown key lists the task's settings")
    parser.add_argument("--instruction", default=None,
                        help=f"{REASONING_GYM}<task> only: the text after each question (default: ask for a last line "
                             "\"Answer: <answer>\", what the task's reward reads)")
    return parser


def unknown_task(task: str) -> str | None:
    """Why `task` is no task of `rlhf data prepare` (naming the tasks), or None when it is one."""
    if task in GENERATED or task in HUB or task.startswith(REASONING_GYM):
        return None  # a reasoning-gym name is checked when its rows are made (the list needs reasoning-gym)
    return (f"unknown task {task!r}. Tasks: {', '.join([*GENERATED, *HUB])}, and {REASONING_GYM}<task> for any "
            f"reasoning-gym task (e.g. {REASONING_GYM}leg_counting); `preferences` labels pairs with a model")


def generator(task: str, settings: list[str], instruction: str | None = None) -> Callable[..., list[dict]] | None:
    """The row generator (`n, seed=, split=`) of a generated task, None for a hub task; a ValueError for
    settings or an instruction given to a task that takes none."""
    if task.startswith(REASONING_GYM):
        asked = {"instruction": instruction} if instruction is not None else {}
        return functools.partial(reasoning_gym_rows, task[len(REASONING_GYM):], **asked, **parse_settings(settings))
    if settings or instruction is not None:
        raise ValueError(f"--set and --instruction are for {REASONING_GYM}<task> only; {task!r} takes neither")
    return GENERATED[task] if task in GENERATED else None


def parse_settings(settings: list[str]) -> dict[str, Any]:
    """{key: value} of `--set key=value` flags; each value read as JSON (2, true, [1, 3]), else kept as text."""
    parsed: dict[str, Any] = {}
    for setting in settings:
        key, sep, text = setting.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {setting!r}: expected KEY=VALUE, e.g. --set min_terms=2")
        try:
            parsed[key.strip()] = json.loads(text)
        except json.JSONDecodeError:
            parsed[key.strip()] = text
    return parsed



def main(argv: list[str] | None = None) -> int:
    """Prepare one task's train and test files; 0 on success, 1 (with a message on stderr) if not."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:  # --help, or a usage error argparse already printed
        return int(exit_.code or 0)
    if unknown_task(args.task):
        print(f"rlhf data prepare: {unknown_task(args.task)}", file=sys.stderr)
        return 2
    counts = {"train": args.n, "test": args.n_test}
    for split, n in counts.items():
        if n is not None and n < 0:
            print(f"rlhf data prepare: --n{'-test' if split == 'test' else ''} must be >= 0, got {n}", file=sys.stderr)
            return 1
    try:
        generate = generator(args.task, args.settings, args.instruction)
        if generate is not None:
            if args.local is not None:
                print(f"rlhf data prepare {args.task}: --local is for hub tasks ({', '.join(HUB)}); "
                      "generated tasks need no input.", file=sys.stderr)
                return 1
            defaults = {"train": GENERATED_TRAIN_ROWS, "test": GENERATED_TEST_ROWS}
            splits = {
                split: generate(defaults[split] if n is None else n, seed=args.seed, split=split)
                for split, n in counts.items()
            }
            dropped = {split: 0 for split in SPLITS}
        else:
            name, config, convert = HUB[args.task]
            if args.local is not None:
                examples = {split: read_local_split(args.local, split) for split in SPLITS}
            else:
                examples = load_hub_splits(name, config)
            converted = {split: hub_rows(convert, examples[split], split, counts[split]) for split in SPLITS}
            splits = {split: rows for split, (rows, _) in converted.items()}
            dropped = {split: n for split, (_, n) in converted.items()}
    except HubUnavailable as err:
        print(
            f"rlhf data prepare {args.task}: cannot load {HUB[args.task][0]} from the Hugging Face hub: {err}.\n"
            "Offline alternatives:\n"
            + (f"  rlhf data prepare gsm8k_synthetic --out {args.out}   (generated GSM8K-format problems)\n"
               if args.task == "gsm8k" else "")
            + f"  rlhf data prepare {args.task} --out {args.out} --local PATH   (the dataset's train*/test* "
            ".parquet or .jsonl files, downloaded on a machine with hub access)",
            file=sys.stderr,
        )
        return 1
    except (DataError, ValueError, ImportError) as err:  # ImportError: reasoning-gym is not installed
        print(f"rlhf data prepare {args.task}: {err}", file=sys.stderr)
        return 1
    for split in SPLITS:
        path = write_rows(splits[split], args.out / f"{split}.parquet")
        note = f", dropped {dropped[split]} without an answer" if dropped[split] else ""
        print(f"wrote {len(splits[split])} rows to {path} (fingerprint {fingerprint_rows(splits[split])[:12]}{note})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
