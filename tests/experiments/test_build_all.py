"""Every experiment and every fiddler builds a graph and compiles its Plan (nothing runs)."""

import inspect
from pathlib import Path

import fiddle as fdl
import pytest

import rlhf_configs.common as common
from rlhf.cli.experiment import load_experiment
from rlhf.graph.io import from_json, graph_hash, to_json
from rlhf.runtime.experiment import Experiment
from rlhf.runtime.plan import compile_graph

EXPERIMENTS = sorted((Path(__file__).parents[2] / "experiments").glob("*.py"))


def load(path: Path):
    """The experiment as the CLI loads it: a module named after the file, so callables defined in the file
    (a recipe's own reward) serialise under that name."""
    return load_experiment(str(path))


def fiddlers(module):
    """Functions of the module whose only required parameter is the graph."""
    out = []
    for name, fn in vars(module).items():
        if inspect.isfunction(fn) and fn.__module__ == module.__name__ and name not in ("base",) and not name.startswith("_"):
            params = [p for p in inspect.signature(fn).parameters.values() if p.default is p.empty]
            if len(params) == 1 and params[0].name == "cfg":
                out.append(fn)
    return out


CASES = [(p, None) for p in EXPERIMENTS] + [
    (p, f) for p in EXPERIMENTS
    for f in [f.__name__ for f in fiddlers(load(p))] + ["local", "workers", "no_tracking", "one_step_off", "streaming"]
]


@pytest.mark.parametrize("path, fiddler", CASES, ids=[f"{p.stem}:{f or 'base'}" for p, f in CASES])
def test_experiment_builds_and_compiles(path, fiddler):
    module = load(path)
    graph = module.base()
    if fiddler:
        fn = getattr(module, fiddler, None) or getattr(common, fiddler)
        fn(graph)
    assert fdl.get_callable(graph) is Experiment
    for stage in graph.stages.values():
        plan = compile_graph(stage)
        assert {"policy", "rm"} & set(plan.groups)  # every stage drives a policy (or a reward model being trained)
    assert graph_hash(from_json(to_json(graph))) == graph_hash(graph)
