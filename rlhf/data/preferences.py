"""Preference pairs: the row schema, files, and `PreferenceDataset` (chosen and rejected side by side).

A preference row sits beside verl's prompt row::

    {"prompt":   [{"role": "user", "content": "What is 23+45?"}],     # chat messages (the context)
     "chosen":   [{"role": "assistant", "content": "68"}],            # the preferred completion
     "rejected": [{"role": "assistant", "content": "58"}],            # the other one
     "margin": 1.5,                    # optional: how much better chosen is (reward-model / DPO margin)
     "data_source": "arithmetic",      # optional
     "extra_info": {"index": 0}}       # optional dict

`chosen` and `rejected` are the assistant turns after the prompt (one message, or several: an agent's
turns with tool results between them), or whole conversations that start with the prompt. Files in
TRL's layouts read unchanged: conversational (`prompt`/`chosen`/`rejected` as messages), conversational
with an implicit prompt (no `prompt`: `chosen` and `rejected` are whole conversations and their shared
first messages are the prompt, as TRL's `extract_prompt`), and TRL's standard layout (plain strings: the
prompt becomes one user message, each completion one assistant message, rendered with the chat template).

Rows come from a `.parquet`, `.jsonl` or `.json` file or a `datasets` folder (`save_to_disk`, or a folder
of data files) and are checked row by row: errors name the file, the row (and line) and the field.

A `PreferenceDataset` batch holds 2 rows per pair, chosen at row 2i and rejected at 2i+1, each in the
SFT/rollout layout (`input_ids` = [left-padded prompt | right-padded response], `responses`,
`response_mask` on the completion's assistant tokens only, `attention_mask`, `position_ids`) plus
`margin` (B,) (the pair's margin on both of its rows; 0 where the row gives none), `pair_index` (B,) (the
pair's position in the dataset) and the non-tensor `uid` (the same on both rows of a pair, so micro-batches
and data-parallel shards keep a pair together: rlhf.workers.micro_batches.row_units). Both sides are
tokenised by the SFT machinery (`rlhf.data.sft.conversation_ids`), so a pair's prompt tokens are the
same on both rows and the same as an SFT example's.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from rlhf.batch import Batch
from rlhf.data.arrow import cache_key, cached_map, rows_fingerprint, tokenizer_key
from rlhf.data.files import (
    SUFFIXES,
    ReadReport,
    _check_readable,
    _parse,
    _write_json,
    _write_parquet,
    canonical_json,
    without_none,
)
from rlhf.data.schema import ROLES, DataError, _validate_prompt, is_preference_row, preference_file_hint, to_python
from rlhf.data.sft import BAD, FITS, TOO_LONG, batch_order, conversation_ids
from rlhf.data.tokenize import left_pad, position_ids, right_pad
from rlhf.ranges import PositiveInt

PREFERENCE_FIELDS = ("prompt", "chosen", "rejected", "margin", "data_source", "extra_info")
"""The fields of a preference row (others are kept as they are)."""

_EXAMPLE = ('{"prompt": [{"role": "user", "content": "2+2?"}], "chosen": [{"role": "assistant", "content": "4"}], '
            '"rejected": [{"role": "assistant", "content": "5"}]}')


# ------------------------------------------------------------------ one row
def normalize_preference_row(row: Any, *, source: str, index: int, line: int | None = None) -> dict:
    """`row` checked and in the one form every layout becomes: `prompt` (messages), `chosen` and `rejected`
    (the completion's messages after the prompt), `extra_info` (a dict), `margin`/`data_source` when given,
    other fields kept. A `DataError` names file, row (line) and field, and says how to fix it."""
    where = f"{source}, row {index}" + (f" (line {line})" if line is not None else "")

    def fail(field: str, problem: str, fix: str) -> DataError:
        return DataError(f"{where}: field {field!r} {problem}. Fix: {fix}.", source=source, index=index, field=field)

    row = to_python(row)
    if not isinstance(row, Mapping):
        raise fail("<row>", f"is a {type(row).__name__}, not a dict", f"every row must be an object like {_EXAMPLE}")
    row = without_none(row)
    for side in ("chosen", "rejected"):
        if side not in row:
            if "messages" in row:
                raise fail(side, "is missing: this is an SFT chat row (`messages`), not a preference pair",
                           "train on it with `rlhf sft`, or give each row `prompt`, `chosen` and `rejected`")
            if "completion" in row and "label" in row:
                raise fail(side, "is missing: this is an unpaired (KTO) row (`completion`, `label`)",
                           "pair a desirable and an undesirable completion of the same prompt into chosen/rejected")
            raise fail(side, "is missing", f"give every row prompt, chosen and rejected, e.g. {_EXAMPLE}")
    out = dict(row)
    prompt = row.get("prompt")
    chosen, rejected = (_as_messages(row[side], "assistant") for side in ("chosen", "rejected"))
    if prompt is None:  # TRL's implicit prompt: the shared first messages of two whole conversations
        if isinstance(row["chosen"], str) or isinstance(row["rejected"], str):
            raise fail("prompt", "is missing and chosen/rejected are plain strings (no messages to share)",
                       "give the prompt: a `prompt` field with the question")
        prompt, chosen, rejected = _split_shared_prefix(chosen, rejected)
        if not prompt:
            raise fail("prompt", "is missing and chosen and rejected share no first messages",
                       "give `prompt`, or make chosen and rejected whole conversations that start with the prompt")
    else:
        prompt = _as_messages(prompt, "user")
        for side, messages in (("chosen", chosen), ("rejected", rejected)):  # whole conversations: drop the prompt
            if isinstance(messages, list) and len(messages) > len(prompt) and messages[: len(prompt)] == prompt:
                if side == "chosen":
                    chosen = messages[len(prompt):]
                else:
                    rejected = messages[len(prompt):]
    out["prompt"] = prompt
    _validate_prompt(out, fail)
    for side, messages in (("chosen", chosen), ("rejected", rejected)):
        out[side] = _checked_completion(messages, side, fail)
    if "margin" in row:
        margin = row["margin"]
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin):
            raise fail("margin", f"must be a finite number, got {margin!r}",
                       "give how much better chosen is than rejected (e.g. a score difference), or leave it out")
        out["margin"] = float(margin)
    if "data_source" in row and (not isinstance(row["data_source"], str) or not row["data_source"].strip()):
        raise fail("data_source", f"must be a non-empty string, got {row['data_source']!r}",
                   "name the dataset, or leave it out")
    extra_info = row.get("extra_info", {})
    if not isinstance(extra_info, Mapping):
        raise fail("extra_info", f"must be a dict, got {type(extra_info).__name__}", "use a dict, or leave it out")
    out["extra_info"] = dict(extra_info)
    return out


def _as_messages(value: Any, role: str) -> Any:
    """TRL's standard layout: a plain string is one message of `role`; anything else is returned as it is."""
    return [{"role": role, "content": value}] if isinstance(value, str) else value


def _split_shared_prefix(chosen: Any, rejected: Any) -> tuple[list, Any, Any]:
    """(shared first messages, chosen after them, rejected after them), as TRL's `extract_prompt`."""
    if not isinstance(chosen, list) or not isinstance(rejected, list):
        return [], chosen, rejected
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    return chosen[:shared], chosen[shared:], rejected[shared:]


def _checked_completion(messages: Any, side: str, fail) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise fail(side, f"must be a non-empty list of chat messages (or a string), got {_short(messages)}",
                   f'use e.g. [{{"role": "assistant", "content": "..."}}]')
    for i, message in enumerate(messages):
        field = f"{side}[{i}]"
        if not isinstance(message, Mapping) or not isinstance(message.get("content"), str) \
                or message.get("role") not in ROLES:
            raise fail(field, f"must be a message {{role, content}} with a chat role and string content, got "
                       f"{_short(message)}", f"use one of the roles {', '.join(ROLES)} and a string content")
    if messages[0]["role"] != "assistant":
        raise fail(f"{side}[0].role", f"is {messages[0]['role']!r}: the completion must start with the assistant's "
                   "turn", "put the context (system/user turns) in `prompt`, and in chosen/rejected only what comes "
                   "after it")
    return [dict(m) for m in messages]


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -------------------------------------------------------------------- files
def _raw_rows(path: Path, split: str, report: ReadReport) -> Iterator[tuple[int, int | None, Any]]:
    """(index, line or None, raw row) of a file or a `datasets` folder."""
    if path.is_dir():
        try:
            if any((path / name).exists() for name in ("dataset_info.json", "state.json", "dataset_dict.json")):
                loaded = datasets.load_from_disk(str(path))
                if isinstance(loaded, datasets.DatasetDict):
                    if split not in loaded:
                        raise DataError(f"{path}: no split {split!r} in this dataset (it has {', '.join(loaded)}). "
                                        "Fix: pass the split to read.", source=str(path))
                    loaded = loaded[split]
            else:
                loaded = datasets.load_dataset(str(path), split=split)
        except DataError:
            raise
        except Exception as err:  # noqa: BLE001 - datasets raises many types
            raise DataError(f"{path}: cannot be read as a `datasets` folder ({type(err).__name__}: {err}). Fix: "
                            "give a folder written by Dataset.save_to_disk, a folder of data files, or one "
                            ".parquet / .jsonl / .json file.", source=str(path)) from err
        yield from ((i, None, row) for i, row in enumerate(loaded))
        return
    _check_readable(path)
    yield from _parse(path, report, "raise")


def load_preference_rows(
    path: str,
    limit: PositiveInt | None = None,  # keep the first `limit` rows only; None: all
    split: str = "train",  # the split of a `datasets` folder (files have one)
) -> list[dict]:
    """The normalised rows (`normalize_preference_row`) of a `.parquet`, `.jsonl` or `.json` file or a
    `datasets` folder, every row checked: the first bad one stops the read naming file, row and field."""
    file = Path(path).expanduser()
    if not file.exists():
        _check_readable(file)  # the project's missing-file message
    if file.is_file() and file.stat().st_size == 0:
        raise DataError(f"{path}: the file is empty (0 bytes). Fix: write the rows again, or point at another file.",
                        source=str(path))
    rows: list[dict] = []
    for index, line, raw in _raw_rows(file, split, ReadReport(path=str(path))):
        if limit is not None and index >= limit:
            break
        rows.append(normalize_preference_row(raw, source=str(path), index=index, line=line))
    if not rows:
        raise DataError(f"{path}: no preference rows. Fix: write the rows again, or point at another file.",
                        source=str(path))
    return rows


def _preflight(arguments: Mapping[str, Any]) -> None:
    """Read and check the file before any stage starts (see rlhf.runtime.preflight_hooks)."""
    if isinstance(arguments.get("path"), str):
        load_preference_rows(arguments["path"], limit=arguments.get("limit"),
                             **({"split": arguments["split"]} if "split" in arguments else {}))


def _input_files(arguments: Mapping[str, Any]) -> list[str]:
    """The file whose contents a named run records (rlhf.runtime.run_record): rewriting it is a change."""
    return [arguments["path"]] if isinstance(arguments.get("path"), str) else []


load_preference_rows.preflight = _preflight  # type: ignore[attr-defined]
load_preference_rows.input_files = _input_files  # type: ignore[attr-defined]


def write_preference_rows(rows: Sequence[Mapping], path: str | Path) -> Path:
    """Check every row, then write them to `.parquet`, `.jsonl` or `.json` atomically (nothing on a bad row)."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise DataError(f"{path}: unsupported file type {path.suffix or '(no suffix)'!r}. Fix: use one of "
                        f"{', '.join(SUFFIXES)}.", source=str(path))
    rows = [normalize_preference_row(row, source=f"rows for {path}", index=i) for i, row in enumerate(rows)]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        (_write_parquet if path.suffix == ".parquet" else _write_json)(rows, tmp, path)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


# ------------------------------------------------------------------ tokens
TOKENS_VERSION = "1"
"""Part of the tokenising cache key: bump it when `preference_tokens` changes its output for the same rows."""

PAIR_FEATURES = datasets.Features({
    "prompt_ids": datasets.List(datasets.Value("int32")),
    "chosen_ids": datasets.List(datasets.Value("int32")),
    "chosen_mask": datasets.List(datasets.Value("int8")),
    "rejected_ids": datasets.List(datasets.Value("int32")),
    "rejected_mask": datasets.List(datasets.Value("int8")),
    "margin": datasets.Value("float32"),
    "length": datasets.Value("int32"),  # the longer side's prompt + completion tokens
    "status": datasets.Value("int8"),
    "error": datasets.Value("string"),
})


def preference_tokens(
    batch: dict[str, list], indices: list[int], *, tokenizer: PreTrainedTokenizerBase, max_length: int, name: str
) -> dict[str, list]:
    """The tokenising map of preference rows: each side through `conversation_ids` (the prompt as context),
    `status` FITS / TOO_LONG (either side over `max_length`) / BAD (with its error)."""
    out: dict[str, list] = {key: [] for key in PAIR_FEATURES}
    for i, text in zip(indices, batch["row"]):
        row = json.loads(text)
        context = len(row["prompt"])
        sides, error, status = {}, None, FITS
        try:
            for side in ("chosen", "rejected"):
                sides[side] = conversation_ids(tokenizer, row["prompt"] + row[side], where=f"{name}, row {i}, {side}",
                                               context=context)
        except DataError as err:
            error, status = str(err), BAD
        length = max((len(p) + len(r) for p, r, _ in sides.values()), default=0)
        if status == FITS and length > max_length:
            status = TOO_LONG
        keep = status == FITS
        out["prompt_ids"].append(sides["chosen"][0] if keep else [])
        for side in ("chosen", "rejected"):
            out[f"{side}_ids"].append(sides[side][1] if keep else [])
            out[f"{side}_mask"].append(sides[side][2] if keep else [])
        out["margin"].append(float(row.get("margin", 0.0)))
        out["length"].append(length)
        out["status"].append(status)
        out["error"].append(error)
    return out


class PreferenceDataset:
    """Preference pairs tokenised with the chat template, served as Batches of adjacent (chosen, rejected) rows.

    rows: normalised rows (`load_preference_rows`) or any rows `normalize_preference_row` accepts.
    Tokenising runs as one cached map (`rlhf.data.arrow.cached_map`), keyed by the rows' fingerprint, the
    tokenizer and `max_length`. A pair whose chosen or rejected side is longer than `max_length` tokens is
    dropped, counted in `num_filtered` and in a warning (TRL truncates instead: a truncated completion is
    another completion than the one labelled).
    """

    def __init__(
        self,
        rows: Sequence[Mapping],
        tokenizer: PreTrainedTokenizerBase,
        max_length: PositiveInt = 1024,  # prompt + completion tokens of each side; longer pairs are dropped
        name: str = "preferences",
        cache_dir: str | None = None,  # None: $HF_DATASETS_CACHE/rlhf (see rlhf.data.arrow.cache_root)
    ):
        self.name = name
        self.tokenizer = tokenizer
        rows = [normalize_preference_row(row, source=name, index=i) for i, row in enumerate(rows)]
        if not rows:
            raise DataError(f"preference dataset {name!r} has no rows", source=name)
        self.has_margin = any("margin" in row for row in rows)
        texts = [canonical_json(row, i, normalized=True) for i, row in enumerate(rows)]
        data = datasets.Dataset.from_dict({"row": texts, "data_source": [row.get("data_source") for row in rows]},
                                          features=datasets.Features({"row": datasets.Value("string"),
                                                                      "data_source": datasets.Value("string")}))
        self.fingerprint = rows_fingerprint(data, cache_dir=cache_dir)
        key = cache_key("preferences", TOKENS_VERSION, self.fingerprint, tokenizer_key(tokenizer), max_length, name)
        tokens = cached_map(data, preference_tokens, name="preferences", key=key, cache_dir=cache_dir, num_proc=None,
                            features=PAIR_FEATURES, with_indices=True,
                            fn_kwargs={"tokenizer": tokenizer, "max_length": max_length, "name": name})
        status = tokens.data.column("status").to_numpy()
        if (status == BAD).any():
            i = int(np.argmax(status == BAD))
            raise DataError(tokens[i]["error"], source=name, index=i)
        fits = status == FITS
        self.num_filtered = int((~fits).sum())
        if not fits.any():
            shortest = int(tokens.data.column("length").to_numpy().min())
            raise DataError(f"{name}: every pair is longer than max_length={max_length} tokens (the shortest pair's "
                            f"longer side has {shortest}). Fix: raise max_length to at least that.", source=name)
        if self.num_filtered:
            warnings.warn(f"{name}: dropped {self.num_filtered} of {len(fits)} preference pairs with a side longer "
                          f"than max_length={max_length} tokens; raise max_length to keep them", stacklevel=2)
            tokens = tokens.select(np.flatnonzero(fits))
        self.data = tokens.remove_columns(["status", "error"])
        self.lengths = self.data.with_format("numpy")["length"]  # the longer side of each pair, in tokens

    @staticmethod
    def preflight(arguments: dict) -> None:
        """Before any stage runs: build the dataset when its rows are loaded and its tokenizer builds
        (`wants_values`), so a file whose every pair is too long stops the run there."""
        rows, tokenizer = arguments.get("rows"), arguments.get("tokenizer")
        if isinstance(tokenizer, PreTrainedTokenizerBase) and isinstance(rows, list):
            PreferenceDataset(**arguments)

    def __len__(self) -> int:
        """The number of pairs (a batch of k pairs has 2k rows)."""
        return len(self.data)

    def collate(self, indices: Sequence[int]) -> Batch:
        """The pairs at `indices` as 2 x len(indices) rows: chosen at 2i, rejected at 2i+1."""
        pad = self.tokenizer.pad_token_id
        part = self.data[[int(i) for i in indices]]
        prompts = [p for p in part["prompt_ids"] for _ in range(2)]
        responses = [r for pair in zip(part["chosen_ids"], part["rejected_ids"]) for r in pair]
        masks = [m for pair in zip(part["chosen_mask"], part["rejected_mask"]) for m in pair]
        prompt_ids, prompt_mask = left_pad(prompts, pad)
        response_ids, attention = right_pad(responses, pad)
        response_mask = torch.zeros_like(response_ids)
        for row, m in enumerate(masks):
            response_mask[row, : len(m)] = torch.tensor(m, dtype=torch.long)
        mask = torch.cat([prompt_mask, attention], dim=1)
        return Batch(
            {
                "input_ids": torch.cat([prompt_ids, response_ids], dim=1),
                "attention_mask": mask,
                "position_ids": position_ids(mask),
                "responses": response_ids,
                "response_mask": response_mask,
                "margin": torch.tensor(part["margin"], dtype=torch.float32).repeat_interleave(2),
                "pair_index": torch.tensor([int(i) for i in indices], dtype=torch.long).repeat_interleave(2),
            },
            # a pair's two rows share a uid: micro-batches and data-parallel shards keep them together
            {"uid": [int(i) for i in indices for _ in range(2)]},
            meta={"temperature": 1.0},  # the data's likelihood under the model itself
        )

    def shuffled(self, batch_size: int, seed: int, start_step: int = 0, *, bucketed: bool = False) -> Iterator[Batch]:
        """Endless batches of `batch_size` pairs, reshuffled each epoch from `seed`; step k's batch depends only
        on (seed, k), so a run resumed at `start_step` sees what an uninterrupted one would.

        bucketed: pairs of similar lengths share a batch (`rlhf.data.sft.length_bucketed_batches`)."""
        for indices in batch_order(self.lengths, batch_size, seed, start_step, bucketed=bucketed):
            yield self.collate(indices)

    def in_order(self, batch_size: int) -> Iterator[Batch]:
        """Every pair once, in order (validation); the last batch may be smaller."""
        for start in range(0, len(self), batch_size):
            yield self.collate(range(start, min(start + batch_size, len(self))))


PreferenceDataset.preflight.wants_values = True  # type: ignore[attr-defined]  (see rlhf.runtime.preflight_hooks)


def pairs_from_samples(
    row: Mapping, responses: Sequence[str], scores: Sequence[float], *, with_margin: bool = False,
    length_matched: bool = False, chosen_longer: bool | None = None,
) -> dict | None:
    """The (best, worst) preference row of one prompt's scored samples; None when every score ties.

    `row` is the prompt row (verl schema; its data_source and reward_model are kept); the scores go to
    `extra_info` (`chosen_score`, `rejected_score`), and with `with_margin` their difference is the pair's
    `margin`. The first sample wins a tie for best or worst (reproducible); with `length_matched`, among the
    tied best and tied worst the two closest in length (in characters; then the first) are paired, so length
    explains less of the label and a reward model has less of a length shortcut to learn (on SmolLM2's answers
    to `topic_prompt_rows` labelled by `direct_answer_score`: "the longer wins" fell from 60.5% to 58.2% of the
    pairs). `chosen_longer` True/False: among the ties, prefer a pair whose chosen answer is longer/shorter than
    its rejected one (then the closest in length), where the ties allow one (`preference_pairs` uses it to
    balance a whole data set)."""
    if not responses:
        return None
    best = max(range(len(scores)), key=lambda k: (scores[k], -k))
    worst = min(range(len(scores)), key=lambda k: (scores[k], k))
    if scores[best] == scores[worst]:
        return None
    if length_matched or chosen_longer is not None:
        tops = [k for k in range(len(scores)) if scores[k] == scores[best]]
        bottoms = [k for k in range(len(scores)) if scores[k] == scores[worst]]
        candidates = [(b, w) for b in tops for w in bottoms]
        if chosen_longer is not None:
            candidates = [(b, w) for b, w in candidates
                          if _longer_side(responses[b], responses[w]) == chosen_longer] or candidates
        if length_matched:
            best, worst = min(candidates, key=lambda p: (abs(len(responses[p[0]]) - len(responses[p[1]])), p))
        else:
            best, worst = candidates[0]
    pair = {
        "prompt": [dict(m) for m in row["prompt"]],
        "chosen": [{"role": "assistant", "content": responses[best]}],
        "rejected": [{"role": "assistant", "content": responses[worst]}],
        "extra_info": {**(row.get("extra_info") or {}), "chosen_score": float(scores[best]),
                       "rejected_score": float(scores[worst])},
    }
    for key in ("data_source", "reward_model"):  # the reference answer stays for gold checks and RL on the prompts
        if row.get(key):
            pair[key] = row[key]
    if with_margin:
        pair["margin"] = float(scores[best]) - float(scores[worst])
    return pair


def _longer_side(chosen: str, rejected: str) -> bool | None:
    """True where the chosen answer is the longer (in characters), False the shorter, None the same length."""
    return None if len(chosen) == len(rejected) else len(chosen) > len(rejected)


def preference_pairs(
    rows: Sequence[Mapping], scores: Sequence[Sequence[float]], *, with_margin: bool = False,
    length_matched: bool = False, length_balanced: bool = False,
) -> list[dict | None]:
    """`pairs_from_samples` of every row (its `responses`) with its scores; None for a prompt whose samples tie.

    `length_balanced`: each prompt's pair is taken, among its tied best and tied worst answers, on the side of
    "the chosen is the longer" that the pairs so far have fewer of (the closest in length on that side), so over
    the data set length says as little as the ties allow about which answer won. Without it, a reward model
    can score well by preferring the longer answer whenever the scorer's winners tend to run longer (the
    commonest reward hack); balancing keeps every pair's label (the scorer's) and only chooses among equals."""
    pairs, longer, shorter = [], 0, 0
    for row, row_scores in zip(rows, scores, strict=True):
        want = (longer <= shorter) if length_balanced else None
        pair = pairs_from_samples(row, row["responses"], row_scores, with_margin=with_margin,
                                  length_matched=length_matched or length_balanced, chosen_longer=want)
        if pair is not None:
            (side,) = length_sides([pair])
            longer += side is True
            shorter += side is False
        pairs.append(pair)
    return pairs


def length_sides(pairs: Sequence[Mapping]) -> list[bool | None]:
    """Per pair: True where the chosen answer is the longer (in characters), False the shorter, None a tie."""
    return [_longer_side(_text(p["chosen"]), _text(p["rejected"])) for p in pairs]


def longer_chosen_share(pairs: Sequence[Mapping]) -> float | None:
    """How often "the longer answer is better" labels a pair right (a length tie counts half); None without
    pairs. Near 0.5: length alone cannot label the pairs; a reward model must learn something else."""
    if not pairs:
        return None
    return sum(1.0 if s else 0.5 if s is None else 0.0 for s in length_sides(pairs)) / len(pairs)


def _text(side: Sequence[Mapping] | str) -> str:
    """A preference side's text: its messages' contents joined (or the text itself)."""
    return side if isinstance(side, str) else "".join(str(m["content"]) for m in side)
