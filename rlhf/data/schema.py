"""The prompt-row schema (verl's), checked row by row with errors a user can act on.

A row is a dict::

    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "user", "content": "..."}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": "train", "index": 3, ...}}

Data prepared for verl trains here unchanged, so the checks accept what verl's own
preprocessing scripts write: `ability` and `extra_info` may be absent, and a
`ground_truth` may be a dict (TinyZero's countdown data stores `{"target", "numbers"}`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

ROLES = ("system", "developer", "user", "assistant", "tool")
"""Chat roles a prompt message may have (those chat templates understand)."""

_EXAMPLE_PROMPT = '[{"role": "user", "content": "What is 23+45?"}]'


class DataError(ValueError):
    """A data file or row is not usable; the message says where, what and how to fix it.

    `source`, `index` and `field` repeat the location for programs that want it.
    """

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        index: int | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.source = source
        self.index = index
        self.field = field


def to_python(value: Any) -> Any:
    """Turn numpy arrays and scalars (as pandas/parquet return them) into lists, dicts, ints."""
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:  # leaves, no ABC checks
        return value
    if isinstance(value, np.ndarray):
        return [to_python(v) for v in value.tolist()] if value.dtype == object else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if kind is dict or isinstance(value, Mapping):
        return {k: to_python(v) for k, v in value.items()}
    if kind is list or kind is tuple or isinstance(value, (list, tuple)):
        return [to_python(v) for v in value]
    return value


def _type_name(value: Any) -> str:
    return type(value).__name__


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def validate_row(
    row: Mapping, *, source: str, index: int, line: int | None = None, require_ground_truth: bool = True
) -> None:
    """Raise `DataError` unless `row` follows the prompt-row schema.

    `source` names the file (or generator) and `index` the 0-based row number, so the
    message points at the bad row; `line` (1-based, for jsonl) is added when known.
    `require_ground_truth=False` accepts rows without `reward_model` (or its `ground_truth`):
    prompts to generate for, which nothing compares against a reference.
    """
    where = f"{source}, row {index}" + (f" (line {line})" if line is not None else "")

    def fail(field: str, problem: str, fix: str) -> DataError:
        return DataError(
            f"{where}: field {field!r} {problem}. Fix: {fix}.",
            source=source,
            index=index,
            field=field,
        )

    if not isinstance(row, Mapping):
        raise fail(
            "<row>",
            f"is a {_type_name(row)}, not a dict",
            "every row must be an object with data_source, prompt, reward_model",
        )

    if is_preference_row(row) and ("data_source" not in row or "prompt" not in row):
        raise DataError(f"{where}: {preference_file_hint('prompt data (RL, generation) is verl prompt rows')}; to "
                        "use its prompts for RL or generation, give each row data_source (and reward_model for "
                        "scoring).",
                        source=source, index=index, field="chosen")
    if "data_source" not in row:
        raise fail("data_source", "is missing", 'add the dataset name, e.g. "data_source": "openai/gsm8k"')
    data_source = row["data_source"]
    if not isinstance(data_source, str) or not data_source.strip():
        raise fail(
            "data_source",
            f"must be a non-empty string, got {_short(data_source)}",
            "set it to the name the reward scorers are keyed by, e.g. \"openai/gsm8k\"",
        )

    _validate_prompt(row, fail)

    if "ability" in row and row["ability"] is not None and not isinstance(row["ability"], str):
        raise fail("ability", f"must be a string, got {_type_name(row['ability'])}", 'use e.g. "math"')

    _validate_reward_model(row, fail, require_ground_truth)

    extra_info = row.get("extra_info")
    if extra_info is not None and not isinstance(extra_info, Mapping):
        raise fail(
            "extra_info",
            f"must be a dict, got {_type_name(extra_info)}",
            'use a dict such as {"split": "train", "index": 0}, or leave it out',
        )


def _validate_reward_model(row: Mapping, fail: Callable[[str, str, str], DataError], required: bool) -> None:
    """`reward_model` with its `ground_truth`; when not `required`, both may be absent (None counts as absent)."""
    reward_model = row.get("reward_model")
    if not required and (reward_model is None or (
            isinstance(reward_model, Mapping) and reward_model.get("ground_truth") is None)):
        return
    if reward_model is None:
        raise fail(
            "reward_model",
            "is missing",
            'add {"style": "rule", "ground_truth": "<answer>"} with the reference answer',
        )
    if not isinstance(reward_model, Mapping):
        raise fail(
            "reward_model",
            f"must be a dict, got {_type_name(reward_model)}",
            'use {"style": "rule", "ground_truth": "<answer>"}',
        )
    if reward_model.get("ground_truth") is None:
        raise fail(
            "reward_model.ground_truth",
            "is missing",
            "store the reference answer the scorer compares against, as a string",
        )
    truth = reward_model["ground_truth"]
    if not isinstance(truth, (str, Mapping)):
        raise fail(
            "reward_model.ground_truth",
            f"must be a string (or a dict for structured tasks), got {_type_name(truth)} {_short(truth)}",
            f"store it as a string, e.g. {json.dumps(str(truth))}",
        )
    style = reward_model.get("style")
    if style is not None and not isinstance(style, str):
        raise fail("reward_model.style", f"must be a string, got {_type_name(style)}", 'use "rule"')


def _validate_prompt(row: Mapping, fail: Callable[[str, str, str], DataError]) -> None:
    if "prompt" not in row:
        raise fail("prompt", "is missing", f"add the chat messages, e.g. {_EXAMPLE_PROMPT}")
    prompt = row["prompt"]
    if isinstance(prompt, str):
        raise fail(
            "prompt",
            "is a plain string, not a list of chat messages",
            f'wrap it: [{{"role": "user", "content": {_short(prompt, 30)}}}]',
        )
    if isinstance(prompt, np.ndarray):
        raise fail(
            "prompt",
            "is a numpy array (as pandas returns parquet lists)",
            "convert the row with rlhf.data.to_python, or read the file with rlhf.data.read_rows",
        )
    if not isinstance(prompt, (list, tuple)):
        raise fail(
            "prompt", f"must be a list of chat messages, got {_type_name(prompt)}", f"use e.g. {_EXAMPLE_PROMPT}"
        )
    if not prompt:
        raise fail("prompt", "is an empty list", f"give at least one message, e.g. {_EXAMPLE_PROMPT}")
    for i, message in enumerate(prompt):
        field = f"prompt[{i}]"
        if not isinstance(message, Mapping):
            raise fail(
                field, f"must be a dict with role and content, got {_type_name(message)}", f"use e.g. {_EXAMPLE_PROMPT}"
            )
        for key in ("role", "content"):
            if key not in message:
                raise fail(
                    f"{field}.{key}", "is missing", f"every message needs role and content, e.g. {_EXAMPLE_PROMPT}"
                )
        if message["role"] not in ROLES:
            raise fail(
                f"{field}.role",
                f"is {_short(message['role'])}, not a chat role",
                f"use one of {', '.join(ROLES)}",
            )
        if not isinstance(message["content"], str):
            raise fail(
                f"{field}.content",
                f"must be a string, got {_type_name(message['content'])} {_short(message['content'])}",
                "store the message text as a string",
            )
    if not any(message["content"].strip() for message in prompt):
        raise fail("prompt", "has only empty messages", "put the question in the user message's content")


def is_preference_row(row: Any) -> bool:
    """Whether `row` is a preference pair (has both `chosen` and `rejected`)."""
    return isinstance(row, Mapping) and "chosen" in row and "rejected" in row


def preference_file_hint(needs: str) -> str:
    """Why a preference row does not fit here (`needs`: what this reader wants instead) and where pairs go."""
    return (f"this is a preference row (prompt, chosen, rejected), and {needs}. Fix: learn from the pairs with the "
            "DPO stage (`rlhf dpo MODEL --data FILE`, rlhf_configs.dpo.dpo_stage) or train a reward model on them "
            "(the reward-model stage); for SFT on the preferred answers, write rows with `messages` = prompt + "
            "chosen (docs/preferences.md)")


def has_ground_truth(row: Mapping) -> bool:
    """Whether the row has a `reward_model.ground_truth` (rows read for generation only may not)."""
    reward_model = row.get("reward_model") if isinstance(row, Mapping) else None
    return isinstance(reward_model, Mapping) and reward_model.get("ground_truth") is not None


def ground_truth(row: Mapping) -> str:
    """The row's reference answer as a string (a dict ground truth becomes canonical JSON)."""
    reward_model = row.get("reward_model") if isinstance(row, Mapping) else None
    truth = reward_model.get("ground_truth") if isinstance(reward_model, Mapping) else None
    if truth is None:
        raise DataError(
            "row has no reward_model.ground_truth. Fix: validate rows with validate_row "
            "(read_rows does) before asking for their answers.",
            field="reward_model.ground_truth",
        )
    if isinstance(truth, Mapping):
        return json.dumps(to_python(truth), sort_keys=True)
    return str(truth)
