"""A named run's identity: what each stage was started with, and every invocation since.

A run with a `run_name` lives in `<output_dir>/<name>/<run_name>/` and is resumed by running
the same command again. `experiment.json` there records, per stage that has started, the stage
graph's hash and flattened leaves, and a list of invocations (time, command line, overrides,
fiddlers, changes accepted). Before a rerun does any work, `RunRecord.problems` compares the
new graph with it, stage by stage:

- a different model (a leaf below a `*model_path` argument, also when the model node is shared
  and `flatten` lists it under another path, e.g. the tokenizer's) or algorithm (a component
  of another kind: a changed `__fn__`, a component added or removed) is an error naming both;
  a checkpoint of one cannot continue as the other. The way on is a new run name.
- the data are part of the identity: a node whose callable carries an `input_files(arguments)`
  hook (the data loaders: `load_rows`, `load_hf_rows`, `load_sft_rows`) names the files it
  reads, and each file's size and sha256 (`rlhf.io.fingerprint`) is recorded beside the
  graph. A file rewritten under the same name is a change like any other.
- any other change (more steps, another learning rate) is an error unless the invocation says
  `allow_changes` (`--allow_changes`); then it is recorded, and a finished stage runs again
  from its newest checkpoint (so `total_steps` 8 -> 12 really trains 4 more steps).
- a stage whose input comes from a stage that is continued with changes (an RL stage started
  from the SFT checkpoint) cannot be continued: its results came from the old input.

A stage's `result.json` (written by the runner when the stage finishes) carries the stage's
identity hash (graph and data): a stage counts as finished only when that hash is the one it
has now, so a continuation with changes that was interrupted (or failed) runs again instead of
reporting the old result. Paths the result holds inside the stage folder are stored relative to
it, so a moved run folder still points at its own weights.

A run without a `run_name` gets a new timestamped folder each time and is never compared.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import fiddle as fdl
from fiddle import daglish

from rlhf.graph.diff import Change, diff_flat
from rlhf.graph.io import flatten, graph_hash, shared_node_paths
from rlhf.io.fingerprint import content_fingerprint, file_stat
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


_DATA_PREFIX = "contents of "  # the leaves of `data`: "contents of data/train.jsonl"


def _is_identity(change: Change, aliases: Mapping[str, Sequence[str]]) -> bool:
    """A change of model (below any `*model_path` argument, under any of the paths of a shared node)
    or of algorithm (a `__fn__`)."""
    if change.path.startswith(_DATA_PREFIX):
        return False
    parts = change.path.split(".")
    if parts[-1] == "__fn__":
        return True
    for end in range(1, len(parts) + 1):
        prefix = ".".join(parts[:end])
        for path in aliases.get(prefix, [prefix]):
            if any(p.endswith("model_path") for p in path.split(".")):
                return True
    return False


def input_files(stage_graph: Any) -> list[str]:
    """The files the graph's loaders read (their `input_files(arguments)` hooks), in graph order, once each."""
    files: list[str] = []
    seen: set[int] = set()
    for value, _ in daglish.iterate(stage_graph):
        if isinstance(value, fdl.Buildable) and id(value) not in seen:
            seen.add(id(value))
            hook = getattr(fdl.get_callable(value), "input_files", None)
            if callable(hook):
                for file in hook(fdl.ordered_arguments(value, include_defaults=True)):
                    if isinstance(file, (str, os.PathLike)) and str(file) not in files:
                        files.append(str(file))
    return files


def stage_identity(stage_graph: Any, recorded: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a stage is: its graph (hash, flattened leaves, where shared nodes are used) and its data files'
    contents. `recorded`: the stage's entry in the record, whose fingerprints are reused for files whose
    size and modification time are unchanged (a large data file is not read at every rerun)."""
    flat = json.loads(json.dumps(flatten(stage_graph), default=repr))  # as it reads back from the file
    stats = dict((recorded or {}).get("data_stat", {}))
    data, data_stat = {}, {}
    for file in input_files(stage_graph):
        key = f"{_DATA_PREFIX}{file}"
        data[key] = content_fingerprint(file, known=stats.get(key))
        data_stat[key] = [file_stat(file), data[key]]
    return {"graph_hash": graph_hash(stage_graph), "graph": flat, "data": data, "data_stat": data_stat,
            "aliases": shared_node_paths(stage_graph)}


def identity_hash(identity: Mapping[str, Any]) -> str:
    """One hash of a stage's graph and data (what its `result.json` must have been produced by)."""
    text = json.dumps({"graph_hash": identity["graph_hash"], "data": identity.get("data", {})}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


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
        """The stages (of `stages`) that have started before, compared with `graph`'s (and its data)."""
        recorded = self.load()["stages"]
        out = []
        for name in stages:
            if name in recorded:
                old = recorded[name]
                new = stage_identity(graph.stages[name], old)
                changes = [] if old.get("graph_hash") == new["graph_hash"] else diff_flat(old.get("graph", {}),
                                                                                          new["graph"])
                if "data" in old:  # a record written before data were recorded compares the graph only
                    changes += diff_flat(old["data"], new["data"])
                aliases = {**old.get("aliases", {}), **new["aliases"]}
                out.append(StageDiff(name, [c for c in changes if _is_identity(c, aliases)],
                                     [c for c in changes if not _is_identity(c, aliases)]))
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
        identity = stage_identity(graph.stages[name], entry)
        entry.update(identity, identity_hash=identity_hash(identity))
        entry["invocations"] = [*entry.get("invocations", []), dict(invocation)]
        data["stages"][name] = entry
        self._write(data)
        return entry["invocations"]

    def changed_stages(self, graph: Any, stages: Sequence[str]) -> set[str]:
        return {d.stage for d in self.diffs(graph, stages) if d.changed}

    def finished_result(self, graph: Any, name: str) -> dict[str, Any] | None:
        """The result of stage `name` if it finished with the graph and data it has now, else None."""
        stage_dir = self.folder / name
        try:
            stored = json.loads((stage_dir / RESULT).read_text())
        except FileNotFoundError:
            return None
        except ValueError:
            return None  # a torn or edited file: the stage runs again (from its newest checkpoint)
        if "result" not in stored:  # written before results carried their stage's identity
            return stored if name not in self.changed_stages(graph, [name]) else None
        recorded = self.load()["stages"].get(name)
        if stored.get("identity_hash") != identity_hash(stage_identity(graph.stages[name], recorded)):
            return None  # produced by another graph or other data (e.g. a continuation that was interrupted)
        result = dict(stored["result"])
        for key in stored.get("relative_paths", []):
            result[key] = str(stage_dir / result[key])
        return result

    def write_result(self, name: str, result: Mapping[str, Any]) -> None:
        """Store a finished stage's result with the identity (graph and data) it started with (`start_stage`);
        paths inside the stage folder are stored relative to it."""
        stage_dir = self.folder / name
        stored, relative = dict(result), []
        for key, value in result.items():
            if isinstance(value, (str, os.PathLike)) and _inside(Path(value), stage_dir):
                stored[key] = os.path.relpath(Path(value).resolve(), stage_dir.resolve())
                relative.append(key)
        data = {"identity_hash": self.load()["stages"][name]["identity_hash"], "relative_paths": relative,
                "result": stored}
        stage_dir.mkdir(parents=True, exist_ok=True)
        tmp = stage_dir / f".{RESULT}.tmp"
        tmp.write_text(json.dumps(data, default=str, indent=1))
        os.replace(tmp, stage_dir / RESULT)

    def _write(self, data: Mapping[str, Any]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(data, indent=1, default=repr))
        os.replace(tmp, self.path)


def _inside(path: Path, folder: Path) -> bool:
    try:
        return path.resolve().is_relative_to(folder.resolve()) and path.resolve() != folder.resolve()
    except (OSError, ValueError):
        return False


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
