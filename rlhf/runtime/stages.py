"""The links between an experiment's stages: `StageOutput` references, found and resolved.

A stage graph may use a value an earlier stage returned (`StageOutput(stage="sft")`: the RL
stage starts from the SFT checkpoint). The runner resolves them between stages, and a named
run's record follows them to know which stages depend on a changed one. A folder handed on this way
(a stage's `final/` model) is checked against its `MANIFEST.json` first: the next stage must not
train from weights damaged since they were written.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fiddle as fdl
from fiddle import daglish

from rlhf.io.manifest import MANIFEST, damage
from rlhf.runtime.remote import StageOutput

__all__ = ["StageOutputError", "resolve_stage_outputs", "stage_references"]

log = logging.getLogger(__name__)


class StageOutputError(RuntimeError):
    """A folder an earlier stage wrote is damaged; the message names the file and how to write it anew."""


def stage_references(graph: Any) -> list[StageOutput]:
    """The `StageOutput` nodes of a graph, in traversal order."""
    refs: list[StageOutput] = []

    def visit(value: Any, state: daglish.State) -> Any:
        if isinstance(value, fdl.Buildable) and fdl.get_callable(value) is StageOutput:
            refs.append(fdl.build(value))
            return value
        return state.map_children(value)

    daglish.MemoizedTraversal.run(visit, graph)
    return refs


def resolve_stage_outputs(graph: Any, results: Mapping[str, Mapping[str, Any]], stage: str) -> Any:
    """`graph` with every `StageOutput` replaced by the value an earlier stage returned."""

    def swap(value: Any, state: daglish.State) -> Any:
        if isinstance(value, fdl.Buildable) and fdl.get_callable(value) is StageOutput:
            ref = fdl.build(value)
            if ref.stage not in results:
                raise ValueError(
                    f"stage {stage!r} uses the output {ref.key!r} of stage {ref.stage!r}, which has not run "
                    f"before it (stages run in order: {list(results)} so far). Reorder the stages."
                )
            if ref.key not in results[ref.stage]:
                raise ValueError(
                    f"stage {stage!r} uses output {ref.key!r} of stage {ref.stage!r}, which returned only "
                    f"{sorted(results[ref.stage])}"
                )
            value = results[ref.stage][ref.key]
            _check_folder(value, stage, ref.stage)
            return value
        return state.map_children(value)

    return daglish.MemoizedTraversal.run(swap, graph)


def _check_folder(value: Any, stage: str, source: str) -> None:
    """Raise `StageOutputError` if `value` is a folder whose files no longer match its manifest."""
    if not isinstance(value, (str, Path)) or not Path(value).is_dir():
        return
    folder = Path(value)
    if not (folder / MANIFEST).is_file():
        if (folder / "config.json").is_file():
            log.warning("stage %r starts from %s, which has no %s (written by an older version of rlhf): "
                        "its files cannot be checked", stage, folder, MANIFEST)
        return
    found = damage(folder)
    if found is None:
        return
    path, reason = found
    if folder.name == "final":
        fix = (f"To write it anew from stage {source!r}'s newest checkpoint, delete {folder} and "
               f"{folder.parent / 'result.json'}, then run the same command again (or restore the folder from a copy)")
    else:
        fix = f"Restore {folder} from a copy, or run stage {source!r} again under a new run name"
    raise StageOutputError(f"stage {stage!r} would start from {folder}, written by stage {source!r}, which is "
                           f"damaged: {path}: {reason}. {fix}.")
