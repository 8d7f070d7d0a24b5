"""The links between an experiment's stages: `StageOutput` references, found and resolved.

A stage graph may use a value an earlier stage returned (`StageOutput(stage="sft")`: the RL
stage starts from the SFT checkpoint). The runner resolves them between stages, and a named
run's record follows them to know which stages depend on a changed one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import fiddle as fdl
from fiddle import daglish

from rlhf.runtime.remote import StageOutput

__all__ = ["resolve_stage_outputs", "stage_references"]


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
            return results[ref.stage][ref.key]
        return state.map_children(value)

    return daglish.MemoizedTraversal.run(swap, graph)
