"""Rollout records: each step's prompts, responses, rewards and advantages as JSON Lines.

`rlhf rollouts show RUN --step N` reads them back (best and worst response per group), so a
user can see what the policy actually generated at any step of a run; without `--step` it prints
one summary line per step (`format_step_summary`: a long run records thousands of groups). A multi-turn response
(rlhf.agents) is also recorded as `segments`: its runs of tokens the policy sampled and was trained
on (`trained` true) and of tokens it was only shown (tool results, template tokens), decoded with the
special tokens; `show` prints them one per line, `rlhf rollouts view` dims the untrained ones.
Where the score has parts, each row carries them under `reward_extra`: a scorer's extra values
(`{"lenient": 1.0, "partial": 0.0}`) and, with a reward model, the rule's and the model's own scores
(`"rule/score"`, `"model/score"`; score = rule_weight x rule + weight x model), so a reader sees per
sample how much of the score came from the reward model.

A step's rows are appended in one write; a write that fails (a full disk) is cut back to where
the file ended, so the file never keeps half a step. A kill in the middle of the write can still
leave a torn last line: a resume (`truncate_records`) drops it with a warning, and reading
skips it with a warning, instead of stopping at a `JSONDecodeError`. A bad line elsewhere (a hand
edit, a damaged copy) stops a resume, which rewrites the file, naming the line; reading
(`rlhf rollouts show` / `view`) leaves it out with a warning naming it and shows the rest.
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from rlhf.agents.batch import response_spans
from rlhf.batch import Batch

RECORDS_FILE = "rollouts.jsonl"

log = logging.getLogger(__name__)


class RolloutRecorder:
    """Appends a sample of every step's groups to `<stage dir>/rollouts.jsonl`.

    On by default in RL stages: a capped sample of each step's prompt groups (all their responses),
    chosen by a seeded draw, so what the policy generated can always be looked at afterwards at a
    bounded cost (16 groups x n responses per step: ~10 MB for 250 steps of 8 short responses).
    """

    def __init__(
        self,
        sample_rate: float = 1.0,  # fraction of prompt groups recorded
        max_groups_per_step: int | None = 16,  # at most this many groups per step (None: no cap)
        seed: int = 0,
    ):
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
        if max_groups_per_step is not None and max_groups_per_step < 1:
            raise ValueError(f"max_groups_per_step must be >= 1 or None (no cap), got {max_groups_per_step}")
        self.sample_rate = sample_rate
        self.max_groups_per_step = max_groups_per_step
        self.seed = seed

    def write(self, folder: Path, step: int, batch: Batch, texts: Sequence[str],
              prompts: Sequence[str] | Callable[[list[int]], Sequence[str]], tokenizer=None) -> int:
        """Record the groups selected for `step`; returns the number of rows written. `prompts`: every row's prompt
        text, or a function of the recorded rows' indices that decodes only those (the step's driver time: decoding
        every prompt cost more than the rest of the records). With `tokenizer`, rows whose response holds tokens
        outside the loss mask (multi-turn) get their `segments`."""
        uids = [str(u) for u in batch["uid"]]
        groups = sorted(set(uids))
        rng = np.random.default_rng([self.seed, step])
        keep = [g for g in groups if rng.random() < self.sample_rate]
        if self.max_groups_per_step is not None and len(keep) > self.max_groups_per_step:
            keep = [keep[i] for i in sorted(rng.choice(len(keep), self.max_groups_per_step, replace=False))]
        keep = set(keep)
        rows = [i for i, uid in enumerate(uids) if uid in keep]
        if not rows:
            return 0
        # whole columns at once: a Python loop over a step's rows of tensors cost ~10 ms a step on the driver
        mask = batch["response_mask"].bool()
        scores = batch["token_level_scores"].sum(dim=1).tolist()
        first = mask.int().argmax(dim=1, keepdim=True)  # an advantage is constant over a response: its first token's
        advantages = torch.where(mask.any(dim=1), batch["advantages"].gather(1, first).squeeze(1), 0.0).tolist()
        lengths = mask.sum(dim=1).tolist()
        untrained = None
        if tokenizer is not None and "attention_mask" in batch:
            real = batch["attention_mask"][:, -mask.shape[1]:].bool()
            untrained = (real & ~mask).any(dim=1).tolist()  # tokens the loss did not see: tell them apart
        versions = batch["policy_version"].tolist() if "policy_version" in batch else None
        parts = {key.removeprefix("reward_extra/"): batch[key] for key in batch.non_tensors
                 if key.startswith("reward_extra/")}
        prompt_texts = dict(zip(rows, prompts(rows) if callable(prompts) else [prompts[i] for i in rows]))
        folder.mkdir(parents=True, exist_ok=True)
        lines = []
        for i in rows:
            row = {
                "step": step,
                "uid": uids[i],
                "prompt": prompt_texts[i],
                "response": texts[i],
                "score": scores[i],
                "advantage": float(advantages[i]),
                "response_length": int(lengths[i]),
                "ground_truth": str(batch["ground_truth"][i]),
                "data_source": str(batch["data_source"][i]),
            }
            agent = (batch["extra_info"][i] or {}).get("agent") if "extra_info" in batch else None
            if agent is not None:
                row["agent"] = agent
            if untrained is not None and untrained[i]:
                real_i = real[i]
                row["segments"] = [{"text": text, "trained": bool(trained)} for text, trained in response_spans(
                    tokenizer, batch["responses"][i][real_i].tolist(), mask[i][real_i].int().tolist())]
            if versions is not None:  # the weights that generated it (behind the step's with async rollout)
                row["policy_version"] = int(versions[i])
            extras = {name: _json_value(column[i]) for name, column in parts.items() if column[i] is not None}
            if extras:
                row["reward_extra"] = extras
            lines.append(json.dumps(row, ensure_ascii=False))
        append_whole(folder / RECORDS_FILE, "".join(line + "\n" for line in lines).encode("utf-8"))
        return len(lines)


def _json_value(value):
    """A scorer's extra value as JSON holds it: numpy and torch scalars as Python numbers, anything else
    that JSON has no type for as its text."""
    if isinstance(value, (np.generic, torch.Tensor)):
        value = value.item()
    return value if isinstance(value, (bool, int, float, str)) else str(value)


def append_whole(path: Path, data: bytes) -> None:
    """Append `data` in one write; if it fails part-way (a full disk), cut the file back to its old end."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        end = os.lseek(fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:  # write() may return short on a full disk before it raises
                view = view[os.write(fd, view):]
        except OSError:
            os.ftruncate(fd, end)
            raise
    finally:
        os.close(fd)


def _parsed_lines(path: Path, skip_bad: bool = False) -> list[tuple[str, dict]]:
    """(line, row) for each line; a torn last line (a kill mid-append) is dropped with a warning, a bad line
    elsewhere is an error naming the file and line, or with `skip_bad` (reading, not rewriting) left out
    with a warning naming it."""
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    out = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            out.append((line, json.loads(line)))
        except ValueError as err:
            if number == len(lines):
                log.warning("%s: line %d is cut short (a write that was interrupted, e.g. a kill or a full disk); "
                            "it is left out", path, number)
                continue
            message = f"{path}: line {number} is not a JSON record ({err})"
            if skip_bad:
                log.warning("%s; it is left out", message)
                continue
            raise ValueError(f"{message}; remove or fix that line") from None
    return out


def read_records(folder: Path, step: int | None = None) -> list[dict]:
    path = Path(folder) / RECORDS_FILE
    if not path.exists():
        raise FileNotFoundError(f"no rollout records at {path}; RL stages record them unless RLTrainer(records=None)")
    return [r for _, r in _parsed_lines(path, skip_bad=True) if step is None or r["step"] == step]


def truncate_records(folder: Path, last_step: int) -> None:
    """Drop records after `last_step` (a resumed run writes those steps again), and a torn last line."""
    path = Path(folder) / RECORDS_FILE
    if not path.exists():
        return
    keep = [line for line, row in _parsed_lines(path) if row["step"] <= last_step]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(line + "\n" for line in keep), encoding="utf-8")
    tmp.replace(path)


def format_records(rows: list[dict], max_chars: int = 200) -> str:
    """Per group: the prompt, then its best and worst responses with scores."""
    by_group: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        by_group[(r["step"], r["uid"])].append(r)
    lines = []
    for (step, uid), group in sorted(by_group.items()):
        group.sort(key=lambda r: r["score"], reverse=True)
        lines.append(f"step {step}  {uid}  ({len(group)} samples, truth {group[0]['ground_truth']!r})")
        lines.append(f"  prompt: {group[0]['prompt'][:max_chars]!r}")
        for label, r in (("best", group[0]), ("worst", group[-1])):
            if "segments" not in r:
                lines.append(f"  {label:5} score {r['score']:+.3f}{_parts(r)} adv {r['advantage']:+.3f}: "
                             f"{r['response'][:max_chars]!r}")
                continue
            agent = r.get("agent") or {}
            lines.append(f"  {label:5} score {r['score']:+.3f} adv {r['advantage']:+.3f}, "
                         f"{agent.get('num_turns', '?')} turns, {agent.get('finish_reason', '?')}:")
            for segment in r["segments"]:
                lines.append(f"      {'trained' if segment['trained'] else 'context':7} | {segment['text'][:max_chars]!r}")
    return "\n".join(lines)


def _parts(row: dict) -> str:
    """` (rule +1.000, model -0.312)` when the row's score was mixed from a rule and a reward model, else ''."""
    extras = row.get("reward_extra") or {}
    named = [(name, extras[f"{name}/score"]) for name in ("rule", "model") if f"{name}/score" in extras]
    return " (" + ", ".join(f"{name} {value:+.3f}" for name, value in named) + ")" if named else ""


def format_step_summary(rows: list[dict], max_chars: int = 60) -> str:
    """One line per step: its recorded rows, mean score, mean response length (tokens) and its first response."""
    by_step: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        by_step[r["step"]].append(r)
    lines = [f"{'step':>6} {'rows':>5} {'mean score':>10} {'mean length':>11}  first response"]
    for step, group in sorted(by_step.items()):
        score = sum(r["score"] for r in group) / len(group)
        length = sum(r["response_length"] for r in group) / len(group)
        lines.append(f"{step:>6} {len(group):>5} {score:>+10.3f} {length:>11.1f}  {group[0]['response'][:max_chars]!r}")
    return "\n".join(lines)
