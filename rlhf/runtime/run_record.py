"""A named run's identity: what each stage was started with, and every invocation since.

A run with a `run_name` lives in `<output_dir>/<name>/<run_name>/` and is resumed by running
the same command again. `experiment.json` there records, per stage that has started, the stage
graph's hash and flattened leaves, and a list of invocations (time, command line, overrides,
fiddlers, changes accepted). Before a rerun does any work, `RunRecord.problems` compares the
new graph with it, stage by stage:

- a different model (a `*model_path` leaf) or algorithm (a component of another kind: a
  changed `__fn__`, a component added or removed) is an error naming both; a checkpoint of
  one cannot continue as the other. The way on is a new run name.
- any other change (more steps, another learning rate) is an error unless the invocation says
  `allow_changes` (`--allow_changes`); then it is recorded, and a finished stage runs again
  from its newest checkpoint (so `total_steps` 8 -> 12 really trains 4 more steps).
- a stage whose input comes from a stage that is continued with changes (an RL stage started
  from the SFT checkpoint) cannot be continued: its results came from the old input.

A run without a `run_name` gets a new timestamped folder each time and is never compared.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlhf.graph.diff import Change, diff_flat
from rlhf.graph.io import flatten, graph_hash
from rlhf.runtime.stages import stage_references

RECORD = "experiment.json"
RESULT = "result.json"  # a finished stage's result (the runner writes it)


def run_folder(graph: Any) -> Path | None:
    """`<output_dir>/<name>/<run_name>` of an Experiment graph; None without a run name."""
    if getattr(graph, "run_name", None) is None:
        return None
    return Path(graph.output_dir) / graph.name / graph.run_name


@dataclasses.dataclass
class StageDiff:
    """How a stage's graph differs from the one it was started with."""

    stage: str
    identity: list[Change]  # model or algorithm changes: never continuable
    other: list[Change]  # continuable with allow_changes

    @property
    def changed(self) -> bool:
        return bool(self.identity or self.other)


def _is_identity(change: Change) -> bool:
    parts = change.path.split(".")
    return parts[-1] == "__fn__" or any(p.endswith("model_path") for p in parts)


def _fingerprint(stage_graph: Any) -> dict[str, Any]:
    flat = json.loads(json.dumps(flatten(stage_graph), default=repr))  # as it reads back from the file
    return {"graph_hash": graph_hash(stage_graph), "graph": flat}


def format_change(change: Change) -> str:
    return f"{change.path}: {change.old!r} -> {change.new!r}"


class RunRecord:
    """`experiment.json` of one named run folder."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.path = self.folder / RECORD

    def load(self) -> dict[str, Any]:
        if not self.path.exists():
            return {"stages": {}, "invocations": []}
        try:
            return json.loads(self.path.read_text())
        except ValueError as err:
            raise ValueError(f"{self.path} is not valid JSON ({err}); it records what this run was started "
                             f"with. Restore it, or start a new run name.") from err

    def diffs(self, graph: Any, stages: Sequence[str]) -> list[StageDiff]:
        """The stages (of `stages`) that have started before, compared with `graph`'s."""
        recorded = self.load()["stages"]
        out = []
        for name in stages:
            if name in recorded:
                old = recorded[name]
                if old.get("graph_hash") == graph_hash(graph.stages[name]):
                    out.append(StageDiff(name, [], []))
                    continue
                changes = diff_flat(old.get("graph", {}), _fingerprint(graph.stages[name])["graph"])
                out.append(StageDiff(name, [c for c in changes if _is_identity(c)],
                                     [c for c in changes if not _is_identity(c)]))
        return out

    def problems(self, graph: Any, stages: Sequence[str], allow_changes: bool = False) -> list[str]:
        """Why this invocation cannot continue the run (empty when it can)."""
        problems = []
        where = str(self.folder)
        new_name = f"--config \"set:run_name='{Path(where).name}-2'\""
        diffs = self.diffs(graph, stages)
        for d in diffs:
            if d.identity:
                lines = "\n    ".join(format_change(c) for c in d.identity)
                problems.append(
                    f"stage {d.stage!r} of the run in {where} was started with a different model or algorithm "
                    f"than this graph has (its checkpoints cannot continue as the other):\n    {lines}\n  "
                    f"Start a new run: {new_name}."
                )
            elif d.other and not allow_changes:
                lines = "\n    ".join(format_change(c) for c in d.other)
                problems.append(
                    f"stage {d.stage!r} of the run in {where} was started with a different configuration:\n    "
                    f"{lines}\n  To continue it with these changes (recorded in the run; a finished stage "
                    f"continues from its newest checkpoint), pass --allow_changes. To start afresh: {new_name}."
                )
        continued = {d.stage for d in diffs if d.other and not d.identity}
        started = set(self.load()["stages"])
        order = list(graph.stages)
        for name in order:
            if name not in started or name in continued:
                continue
            upstream = _upstream(graph, name)
            for changed in sorted(upstream & continued):
                problems.append(
                    f"stage {name!r} of the run in {where} started from the output of stage {changed!r}, which "
                    f"this invocation changes; its results would not follow from the new {changed!r}. Start a "
                    f"new run: {new_name}."
                )
        return problems

    def record(
        self,
        graph: Any,
        stages: Sequence[str],
        *,
        overrides: Sequence[str] = (),
        fiddlers: Sequence[str] = (),
        allow_changes: bool = False,
    ) -> dict[str, Any]:
        """Append this invocation; returns it. Stages are recorded as they start (`start_stage`)."""
        data = self.load()
        changes = {d.stage: [format_change(c) for c in d.other] for d in self.diffs(graph, stages) if d.other}
        invocation = {
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "argv": list(sys.argv),
            "overrides": list(overrides),
            "fiddlers": list(fiddlers),
            "stages": list(stages),
            "graph_hash": graph_hash(graph),
            "allow_changes": allow_changes,
            "changes": changes,
        }
        data["invocations"].append(invocation)
        data["graph_hash"] = invocation["graph_hash"]
        self._write(data)
        return invocation

    def start_stage(self, graph: Any, name: str, invocation: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Record the graph stage `name` runs with now; returns the invocations that ran it (this one last)."""
        data = self.load()
        entry = data["stages"].get(name, {"invocations": []})
        entry.update(_fingerprint(graph.stages[name]))
        entry["invocations"] = [*entry.get("invocations", []), dict(invocation)]
        data["stages"][name] = entry
        self._write(data)
        return entry["invocations"]

    def changed_stages(self, graph: Any, stages: Sequence[str]) -> set[str]:
        return {d.stage for d in self.diffs(graph, stages) if d.changed}

    def _write(self, data: Mapping[str, Any]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(data, indent=1, default=repr))
        os.replace(tmp, self.path)


def _upstream(graph: Any, stage: str) -> set[str]:
    """The stages whose outputs `stage` uses, directly or through other stages."""
    seen: set[str] = set()
    todo = [stage]
    while todo:
        for ref in stage_references(graph.stages[todo.pop()]):
            if ref.stage not in seen and ref.stage in graph.stages:
                seen.add(ref.stage)
                todo.append(ref.stage)
    return seen
