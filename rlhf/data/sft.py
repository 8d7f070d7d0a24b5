"""`SFTDataset`: single- and multi-turn SFT examples in the same layout as RL rollouts.

A batch holds `input_ids` = [left-padded prompt | right-padded response] with `responses`
and `response_mask`, exactly like a rollout, so the policy worker computes response
log-probs the same way for SFT and RL, and the loss covers `response_mask` tokens only.

Two row formats:
- verl prompt rows (`prompt`, `reward_model`, ...): the prompt is the chat-templated
  `prompt` messages, the response is `response(row)` + EOS (every response token is trained).
- chat rows with `messages` (system/user/assistant/tool turns, several of each): the prompt is
  the conversation up to the first assistant turn's header; the response is the rest of the
  conversation up to the last assistant turn, and `response_mask` is 1 exactly on the
  assistant contents and their end-of-turn token, 0 on user/system/tool turns and on the
  template's role headers inside it. A row's optional `tools` (OpenAI function schemas, as TRL's
  SFT takes them) reach the chat template as `tools=`, so a demonstration is rendered exactly as an
  agent's request with those tools is (rlhf serve, the agent-program gateway).

Batches can be length-bucketed (`SFTDataset.shuffled(..., bucketed=True)`) to cut padding;
`padding_fraction` measures it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import datasets
import numpy as np
import torch
from datasets.fingerprint import Hasher
from transformers import PreTrainedTokenizerBase

from rlhf.batch import Batch
from rlhf.data.arrow import (
    as_rows,
    cache_key,
    cached_map,
    load_file,
    mark_source,
    rows_fingerprint,
    source_name,
    tokenizer_key,
)
from rlhf.data.schema import DataError, ground_truth
from rlhf.data.tokenize import chat_prompt_ids_batch, left_pad, position_ids, right_pad, shuffled_batches
from rlhf.ranges import PositiveInt


def answer_from_ground_truth(row: Mapping) -> str:
    """The response is the bare ground truth (arithmetic: "68")."""
    return ground_truth(row)


def answer_from_extra_info(row: Mapping, key: str = "answer") -> str:
    """The response is a worked solution stored in `extra_info[key]` (GSM8K: "... #### 72")."""
    return row["extra_info"][key]


# ------------------------------------------------------------------ multi-turn
def _render(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Mapping], generation_prompt: bool,
            tools: Sequence[Mapping] | None = None) -> str:
    kwargs = {"tools": [dict(t) for t in tools]} if tools else {}
    return tokenizer.apply_chat_template(
        [dict(m) for m in messages], add_generation_prompt=generation_prompt, tokenize=False, **kwargs
    )


def conversation_ids(
    tokenizer: PreTrainedTokenizerBase, messages: Sequence[Mapping], *, tools: Sequence[Mapping] | None = None,
    where: str = "conversation", context: int = 0,
) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, response ids, response mask) of a chat with one or more assistant turns.

    `context`: the first `context` messages are prompt only, assistant turns among them included (a
    preference pair's prompt may hold earlier turns; only the completion after it is scored).

    The template is rendered on growing prefixes of the conversation: the text added by
    `messages[:i+1]` over `messages[:i]` + generation prompt is assistant turn i (its content,
    end-of-turn token and the template's separator after it), and everything else is
    context. Each piece is tokenised on its own, so the span boundaries are exact whatever the
    tokenizer merges. Inside an assistant piece the mask stops after its last special token
    (the end-of-turn marker, e.g. <|im_end|>; ChatML's trailing newline carries no loss). A template whose
    render of a prefix is not a prefix of the full render (e.g. one that drops earlier
    reasoning) is refused with a DataError.
    """
    roles = [m.get("role") if isinstance(m, Mapping) else None for m in messages]
    assistant = [i for i, r in enumerate(roles) if r == "assistant" and i >= context]
    if not assistant or any(not isinstance(m, Mapping) or not isinstance(m.get("content"), str) for m in messages):
        raise DataError(
            f"{where}: `messages` must be a list of {{role, content}} dicts with at least one assistant turn"
            + (f" after the first {context} (the prompt)" if context else "") + f", got roles {roles}"
        )
    if tools is not None and (not isinstance(tools, Sequence) or not all(isinstance(t, Mapping) for t in tools)):
        raise DataError(f"{where}: `tools` must be a list of function schemas "
                        '({"type": "function", "function": {"name": ..., "parameters": {...}}}), '
                        f"got {type(tools).__name__}")
    render = functools.partial(_render, tokenizer, tools=tools)
    # end-of-turn markers: EOS and the template's other special tokens (Qwen base: EOS is
    # <|endoftext|>, turns end with <|im_end|>)
    end_ids = {tokenizer.eos_token_id, *tokenizer.all_special_ids}

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def piece(previous: str, current: str) -> str:
        if not current.startswith(previous):
            raise DataError(
                f"{where}: the chat template does not render conversations incrementally (the render of the "
                "first turns is not a prefix of the render of more turns), so assistant spans cannot be found; "
                "use a template without history rewriting"
            )
        return current[len(previous):]

    prompt_text = render(messages[: assistant[0]], True)
    prompt = ids(prompt_text)
    response: list[int] = []
    mask: list[int] = []
    done = prompt_text  # rendered text covered so far
    for turn in assistant:
        header = render(messages[:turn], True)
        between = ids(piece(done, header))  # user/system turns + the assistant header
        answer = ids(piece(header, render(messages[: turn + 1], False)))
        trained = max((k + 1 for k, t in enumerate(answer) if t in end_ids), default=len(answer))
        response += between + answer
        mask += [0] * len(between) + [1] * trained + [0] * (len(answer) - trained)
        done = render(messages[: turn + 1], False)
    while mask and not mask[-1]:  # nothing to learn after the last end-of-turn token
        response.pop()
        mask.pop()
    return prompt, response, mask


# ----------------------------------------------------------------- bucketing
def length_bucketed_batches(
    lengths: Sequence[int], batch_size: int, seed: int, start_step: int = 0, pool: int = 16
) -> Iterator[list[int]]:
    """Endless batches of row indices with similar lengths, reshuffled each epoch from (seed, epoch).

    Each epoch: a random permutation is cut into pools of `pool` x `batch_size` rows, each pool
    is sorted by length and cut into batches, and the batches of the epoch are shuffled (so
    long and short batches alternate). Randomness stays (which rows share a pool is random)
    while padding drops. Step k's batch depends only on (seed, k): resumable at `start_step`.
    """
    num_rows = len(lengths)
    if batch_size > num_rows:
        raise ValueError(f"batch size {batch_size} exceeds the {num_rows} rows of the dataset")
    lengths = np.asarray(lengths)
    per_epoch = num_rows // batch_size

    @functools.lru_cache(maxsize=2)
    def epoch_batches(epoch: int) -> list[list[int]]:
        rng = np.random.default_rng([seed, epoch])
        order = rng.permutation(num_rows)[: per_epoch * batch_size]  # full batches only, as unbucketed
        batches = []
        for start in range(0, len(order), pool * batch_size):
            chunk = order[start : start + pool * batch_size]
            chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
            batches += [chunk[i : i + batch_size].tolist() for i in range(0, len(chunk), batch_size)]
        return [batches[i] for i in rng.permutation(len(batches))]

    step = start_step
    while True:
        epoch, offset = divmod(step, per_epoch)
        yield epoch_batches(epoch)[offset]
        step += 1


def batch_order(
    lengths: Sequence[int], batch_size: int, seed: int, start_step: int = 0, *, bucketed: bool
) -> Iterator[list[int]]:
    """Endless batches of indices, reshuffled each epoch from `seed` and resumable at `start_step`: length-bucketed
    (`length_bucketed_batches`) or random (`shuffled_batches`). The order of SFTDataset and PreferenceDataset."""
    if bucketed:
        return length_bucketed_batches(lengths, batch_size, seed, start_step)
    return shuffled_batches(len(lengths), batch_size, seed, start_step)


def padding_fraction(batch: Batch) -> float:
    """Padded tokens / all tokens of the batch (its `attention_mask` is 0 on padding)."""
    mask = batch["attention_mask"]
    return 1.0 - float(mask.sum()) / max(mask.numel(), 1)


# ------------------------------------------------------------------- dataset
FITS, TOO_LONG, BAD = 0, 1, 2  # `status` of an example in the tokenising map

SFT_FEATURES = datasets.Features({
    "prompt_ids": datasets.List(datasets.Value("int32")),
    "response_ids": datasets.List(datasets.Value("int32")),
    "response_mask": datasets.List(datasets.Value("int8")),
    "length": datasets.Value("int32"),
    "status": datasets.Value("int8"),
    "error": datasets.Value("string"),
})


def sft_tokens(
    batch: dict[str, list],
    indices: list[int],
    *,
    tokenizer: PreTrainedTokenizerBase,
    response: Callable[[Mapping], str],
    max_length: int,
    name: str,
) -> dict[str, list]:
    """The tokenising map of SFT rows: (prompt ids, response ids, response mask) per row, its length,
    `status` (FITS / TOO_LONG / BAD) and, for a BAD row, the error message."""
    out: dict[str, list] = {key: [] for key in SFT_FEATURES}
    eos = tokenizer.eos_token_id
    rows = [json.loads(text) for text in batch["row"]]
    plain = [k for k, row in enumerate(rows) if "messages" not in row]
    prompts = dict(zip(plain, chat_prompt_ids_batch(tokenizer, [rows[k]["prompt"] for k in plain])))
    for k, (i, row) in enumerate(zip(indices, rows)):
        prompt: list[int] = []
        target: list[int] = []
        mask: list[int] = []
        error, status = None, FITS
        try:
            if "messages" in row:
                prompt, target, mask = conversation_ids(tokenizer, row["messages"], tools=row.get("tools"),
                                                        where=f"{name}, row {i}")
            else:
                try:
                    text = response(row)
                except (KeyError, TypeError) as err:
                    raise DataError(
                        f"{name}: row {i} has no response text ({type(err).__name__}: {err}); "
                        "check the rows or the `response` function of the SFT dataset",
                        source=name, index=i,
                    ) from err
                prompt = prompts[k]
                target = tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
                mask = [1] * len(target)
        except DataError as err:
            error, status = str(err), BAD
        if status == FITS and len(prompt) + len(target) > max_length:
            status = TOO_LONG
        keep = status == FITS
        out["prompt_ids"].append(prompt if keep else [])
        out["response_ids"].append(target if keep else [])
        out["response_mask"].append(mask if keep else [])
        out["length"].append(len(prompt) + len(target))
        out["status"].append(status)
        out["error"].append(error)
    return out


class SFTDataset:
    """SFT examples from verl prompt rows (+ a response function) or from chat `messages` rows.

    rows: a validated dataset from `load_sft_rows`, any `datasets.Dataset`, or a list of row dicts.
    Tokenising runs as one cached batched map (see `rlhf.data.arrow`), keyed by the rows'
    fingerprint, the tokenizer, `response` and `max_length`; examples are read from Arrow per batch.
    """

    def __init__(
        self,
        rows: Any,
        tokenizer: PreTrainedTokenizerBase,
        response: Callable[[Mapping], str] = answer_from_ground_truth,  # prompt row -> target text
        max_length: int = 1024,  # prompt + response tokens; longer examples are dropped
        name: str = "sft",
        cache_dir: str | None = None,  # None: $HF_DATASETS_CACHE/rlhf (see rlhf.data.arrow.cache_root)
        num_proc: int | None = None,  # processes for tokenising; None: one per core from 50k rows
    ):
        self.name = name
        self.tokenizer = tokenizer
        self.source = source_name(rows, name)
        data = as_rows(rows, source=name, kind="sft", cache_dir=cache_dir, num_proc=num_proc)
        if len(data) == 0:
            raise DataError(f"{self.source}: SFT dataset {name!r} has no rows", source=self.source)
        self.fingerprint = rows_fingerprint(data, cache_dir=cache_dir)
        key = cache_key("sft", self.fingerprint, tokenizer_key(tokenizer), Hasher.hash(response), max_length, name)
        tokens = cached_map(
            data, sft_tokens, name="sft", key=key, cache_dir=cache_dir, num_proc=num_proc, features=SFT_FEATURES,
            fn_kwargs={"tokenizer": tokenizer, "response": response, "max_length": max_length, "name": name},
            with_indices=True,
        )
        status = tokens.data.column("status").to_numpy()
        if (status == BAD).any():
            i = int(np.argmax(status == BAD))
            raise DataError(tokens[i]["error"], source=self.source, index=i)
        fits = status == FITS
        self.num_filtered = int((~fits).sum())
        if not fits.any():
            shortest = int(tokens.data.column("length").to_numpy().min())
            raise DataError(
                f"{self.source}: every row of SFT dataset {name!r} is longer than max_length={max_length} tokens "
                f"(the shortest has {shortest}). Fix: raise max_length to at least that.", source=self.source,
            )
        self.data = tokens.select_columns(["prompt_ids", "response_ids", "response_mask", "length"])
        if self.num_filtered:
            self.data = self.data.select(np.flatnonzero(fits))
        self.lengths = self.data.with_format("numpy")["length"]  # prompt + response tokens of each example

    @staticmethod
    def preflight(arguments: dict) -> None:
        """Before any stage runs: build the dataset when its rows are a loaded dataset (a file) and its tokenizer
        builds (`wants_values`), so a file whose every example is too long stops the run there, naming the file
        (when `response` is a plain function: one still a graph node, such as `rlhf sft --response-key`'s, is
        checked when the stage builds).
        The result is cached for the run's own build; rows from a generator are checked when it is built."""
        rows, tokenizer = arguments.get("rows"), arguments.get("tokenizer")
        if not callable(arguments.get("response", answer_from_ground_truth)):
            return  # a response function still a graph node (`fdl.Partial(answer_from_extra_info, key=...)`): at build
        if isinstance(tokenizer, PreTrainedTokenizerBase) and isinstance(rows, datasets.Dataset):
            SFTDataset(**arguments)

    def __len__(self) -> int:
        return len(self.data)

    def collate(self, indices: Sequence[int]) -> Batch:
        pad = self.tokenizer.pad_token_id
        part = self.data[[int(i) for i in indices]]
        prompts, prompt_mask = left_pad(part["prompt_ids"], pad)
        responses, attention = right_pad(part["response_ids"], pad)
        response_mask = torch.zeros_like(responses)
        for row, m in enumerate(part["response_mask"]):
            response_mask[row, : len(m)] = torch.tensor(m, dtype=torch.long)
        mask = torch.cat([prompt_mask, attention], dim=1)
        return Batch(
            {
                "input_ids": torch.cat([prompts, responses], dim=1),
                "attention_mask": mask,
                "position_ids": position_ids(mask),
                "responses": responses,
                "response_mask": response_mask,
            },
            meta={"temperature": 1.0},  # the log-likelihood of the data under the model itself
        )

    def shuffled(
        self, batch_size: int, seed: int, start_step: int = 0, *, bucketed: bool
    ) -> Iterator[Batch]:
        """Endless full batches, reshuffled each epoch from `seed`; resumable at `start_step`.

        bucketed: batches of similar lengths (see `length_bucketed_batches`) to cut padding; no default
          here: the trainer's (`SFTTrainer.bucketed`) is the one.
        """
        for indices in batch_order(self.lengths, batch_size, seed, start_step, bucketed=bucketed):
            yield self.collate(indices)

    def in_order(self, batch_size: int) -> Iterator[Batch]:
        """Every example once, in order (validation); the last batch may be smaller."""
        for start in range(0, len(self), batch_size):
            yield self.collate(range(start, min(start + batch_size, len(self))))


SFTDataset.preflight.wants_values = True  # type: ignore[attr-defined]  (see rlhf.runtime.preflight_hooks)


def load_sft_rows(
    path: str,
    cache_dir: str | None = None,  # None: $HF_DATASETS_CACHE (see rlhf.data.arrow.cache_root)
    num_proc: int | None = None,  # processes for validating; None: one per core from 50k rows
    limit: PositiveInt | None = None,  # keep the first `limit` rows only; None: all
) -> datasets.Dataset:
    """Rows of a parquet / JSON Lines / JSON file for an SFTDataset, as a validated Arrow dataset: verl
    prompt rows (checked against the schema, as `load_rows`) or chat rows with `messages` (checked by SFTDataset)."""
    rows = load_file(path, kind="sft", cache_dir=cache_dir, num_proc=num_proc)[0]
    if limit is not None and limit < len(rows):
        rows = mark_source(rows.select(range(limit)), source_name(rows, str(path)))
    return rows


def _preflight(arguments: Mapping) -> None:
    """Read and check the file before any stage starts (see rlhf.runtime.preflight_hooks); the result is cached."""
    if isinstance(arguments.get("path"), str):
        load_sft_rows(arguments["path"], cache_dir=arguments.get("cache_dir"), num_proc=arguments.get("num_proc"))


def _input_files(arguments: Mapping) -> list[str]:
    """The file whose contents a named run records (rlhf.runtime.run_record): rewriting it is a change."""
    return [arguments["path"]] if isinstance(arguments.get("path"), str) else []


load_sft_rows.preflight = _preflight  # type: ignore[attr-defined]
load_sft_rows.input_files = _input_files  # type: ignore[attr-defined]
