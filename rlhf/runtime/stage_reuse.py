"""Reuse a finished upstream stage instead of running it again.

A sweep over a GRPO-only setting gives every member the same SFT stage: the same stage graph on
the same data, so the same checkpoint. A stage another stage starts from (its output is a
`StageOutput` of a later stage) is indexed when it finishes, under `<reuse_dir>/.finished_stages/`
(`Experiment.reuse_dir`, None: the output folder; a sweep points every member at its base output
folder), by its identity: the stage graph's hash and its data files' contents
(`rlhf.runtime.run_record.stage_identity`, what a named run already compares), together with the
identities of the stages it starts from in turn. A later run (another member, or the same command
again) whose upstream stage has that identity takes the indexed result (checkpoint, metrics, Aim
run) instead of running it, says so, and its next stage's run names the reused run as its parent.
The last stage of a graph always runs. `Experiment.reuse_upstream`: None (the default) reuses in the members of
a sweep only; True also across single runs in one output folder; False never.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlhf.runtime.run_record import identity_hash, stage_identity
from rlhf.runtime.stages import stage_references

__all__ = ["FinishedStages", "upstream_stages"]

INDEX = ".finished_stages"


def upstream_stages(graph: Any) -> set[str]:
    """The stages of the graph whose output another of its stages starts from."""
    return {ref.stage for stage in graph.stages.values() for ref in stage_references(stage)} & set(graph.stages)


class FinishedStages:
    """The index of finished upstream stages in one folder: identity -> where the stage ran and its result."""

    def __init__(self, folder: Path | str):
        self.folder = Path(folder) / INDEX
        self._keys: dict[str, str] = {}

    def key(self, graph: Any, name: str) -> str:
        """The stage's identity: its graph and data, and the identities of the stages it starts from."""
        if name not in self._keys:
            upstream = sorted({ref.stage for ref in stage_references(graph.stages[name])} & set(graph.stages))
            text = json.dumps({"stage": identity_hash(stage_identity(graph.stages[name])),
                               "from": {u: self.key(graph, u) for u in upstream}}, sort_keys=True)
            self._keys[name] = hashlib.sha256(text.encode()).hexdigest()
        return self._keys[name]

    def find(self, graph: Any, name: str) -> dict[str, Any] | None:
        """The result of a finished stage with this stage's identity whose folder still exists, else None."""
        path = self.folder / f"{self.key(graph, name)}.json"
        try:
            entry = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return None
        if not Path(entry["stage_dir"]).is_dir():
            return None  # deleted since: run it again
        return {**entry["result"], "reused_from": entry["stage_dir"]}

    def add(self, graph: Any, name: str, stage_dir: Path, result: Mapping[str, Any]) -> None:
        """Index a stage that just finished; paths in its result are stored absolute (another run reads them)."""
        stored = {k: str(Path(v).absolute()) if isinstance(v, str) and os.path.exists(v) else v
                  for k, v in result.items()}
        entry = {"stage": name, "stage_dir": str(Path(stage_dir).absolute()), "result": stored}
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{self.key(graph, name)}.json"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entry, default=str, indent=1))
        os.replace(tmp, path)
