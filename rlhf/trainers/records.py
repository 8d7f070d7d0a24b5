"""Rollout records: each step's prompts, responses, rewards and advantages as JSON Lines.

`rlhf rollouts show RUN --step N` reads them back (best and worst response per group), so a
user can see what the policy actually generated at any step of a run. A multi-turn response
(rlhf.agents) is also recorded as `spans`: its runs of tokens the policy sampled and was trained on
("trained") and of tokens it was only shown (tool results, template tokens: "context"), decoded with
the special tokens, which `show` prints one per line.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from rlhf.agents.batch import response_spans
from rlhf.batch import Batch

RECORDS_FILE = "rollouts.jsonl"


class RolloutRecorder:
    """Appends a sample of every step's groups to `<stage dir>/rollouts.jsonl`."""

    def __init__(self, sample_rate: float = 1.0, seed: int = 0):  # fraction of prompt groups recorded
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
        self.sample_rate = sample_rate
        self.seed = seed

    def write(self, folder: Path, step: int, batch: Batch, texts: list[str], prompts: list[str], tokenizer=None) -> int:
        """Record the groups selected for `step`; returns the number of rows written. With `tokenizer`,
        rows whose response holds tokens outside the loss mask (multi-turn) get their `spans`."""
        uids = [str(u) for u in batch["uid"]]
        groups = sorted(set(uids))
        rng = np.random.default_rng([self.seed, step])
        keep = {g for g in groups if rng.random() < self.sample_rate}
        mask = batch["response_mask"].bool()
        scores = batch["token_level_scores"].sum(dim=1).tolist()
        advantages = [float(a[m][0]) if m.any() else 0.0 for a, m in zip(batch["advantages"], mask)]
        folder.mkdir(parents=True, exist_ok=True)
        rows = 0
        with open(folder / RECORDS_FILE, "a", encoding="utf-8") as f:
            for i, uid in enumerate(uids):
                if uid not in keep:
                    continue
                row = {
                    "step": step,
                    "uid": uid,
                    "prompt": prompts[i],
                    "response": texts[i],
                    "score": scores[i],
                    "advantage": advantages[i],
                    "response_length": int(mask[i].sum()),
                    "ground_truth": str(batch["ground_truth"][i]),
                    "data_source": str(batch["data_source"][i]),
                }
                agent = (batch["extra_info"][i] or {}).get("agent") if "extra_info" in batch else None
                if agent is not None:
                    row["agent"] = agent
                if tokenizer is not None and "attention_mask" in batch:
                    real = batch["attention_mask"][i, -mask.shape[1]:].bool()
                    if bool((real & ~mask[i]).any()):
                        row["spans"] = response_spans(tokenizer, batch["responses"][i][real].tolist(),
                                                      mask[i][real].int().tolist())
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                rows += 1
        return rows


def read_records(folder: Path, step: int | None = None) -> list[dict]:
    path = Path(folder) / RECORDS_FILE
    if not path.exists():
        raise FileNotFoundError(f"no rollout records at {path}; enable them with RLTrainer(records=RolloutRecorder())")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r for r in rows if step is None or r["step"] == step]


def truncate_records(folder: Path, last_step: int) -> None:
    """Drop records after `last_step` (a resumed run writes those steps again)."""
    path = Path(folder) / RECORDS_FILE
    if not path.exists():
        return
    keep = [line for line in path.read_text(encoding="utf-8").splitlines() if line and json.loads(line)["step"] <= last_step]
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
            if "spans" not in r:
                lines.append(f"  {label:5} score {r['score']:+.3f} adv {r['advantage']:+.3f}: "
                             f"{r['response'][:max_chars]!r}")
                continue
            agent = r.get("agent") or {}
            lines.append(f"  {label:5} score {r['score']:+.3f} adv {r['advantage']:+.3f}, "
                         f"{agent.get('num_turns', '?')} turns, {agent.get('finish_reason', '?')}:")
            for text, trained in r["spans"]:
                lines.append(f"      {'trained' if trained else 'context':7} | {text[:max_chars]!r}")
    return "\n".join(lines)
