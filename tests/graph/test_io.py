"""graph_io: fiddle JSON round trip, a hash equal across processes, flat params for Aim."""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import fiddle as fdl
import graph_toys as toys
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rlhf.graph.io import flatten, from_json, graph_hash, nest, to_json

FRACTIONS = st.floats(0.0, 1.0, allow_nan=False)
# Every argument the toy graph may set explicitly, with the values a test may give it.
ARG_VALUES = {
    "opt": {"lr": st.floats(1e-6, 1.0), "betas": st.tuples(FRACTIONS, FRACTIONS), "weight_decay": FRACTIONS},
    "policy": {
        "hidden": st.integers(1, 4096),
        "layers": st.integers(1, 64),
        "name": st.text(max_size=8),
        "stop": st.lists(st.text(max_size=3), max_size=3),
    },
    "loss": {"clip": FRACTIONS, "kl_coef": FRACTIONS, "agg": st.sampled_from(["token-mean", "seq-mean"])},
    "root": {
        "seed": st.integers(0, 2**31),
        "mode": st.sampled_from(list(toys.Mode)),
        "stages": st.lists(st.sampled_from(["sft", "rl", "eval"]), max_size=3).map(tuple),
    },
    # A `fdl.Config(dict, ...)`: fiddle orders a signature's arguments itself, but keeps `**kwargs`
    # in the order they were set, so this node is where argument order really varies.
    "sampling": {"temperature": FRACTIONS, "top_p": FRACTIONS, "n": st.integers(1, 16)},
}
# The signatures' defaults for the same arguments (graph_toys), written out.
DEFAULTS = {
    "opt": {"lr": 1e-3, "betas": (0.9, 0.999), "weight_decay": 0.0},
    "policy": {"hidden": 64, "layers": 2, "name": "policy", "stop": []},
    "loss": {"clip": 0.2, "kl_coef": 0.0, "agg": "token-mean"},
    "root": {"seed": 0, "mode": toys.Mode.TRAIN, "stages": ()},
    "sampling": {},  # dict has no defaults: an unset key is absent
}
_UNSET = object()
LEAVES = [(node, arg) for node, values in ARG_VALUES.items() for arg in values]


@st.composite
def specs(draw):
    """A toy graph as data: which arguments are set (a random subset) and to what."""
    return {
        "args": {node: draw(st.fixed_dictionaries({}, optional=values)) for node, values in ARG_VALUES.items()},
        "loss_fn": draw(st.sampled_from(["grpo_loss", "dapo_loss"])),
        "share_ref": draw(st.booleans()),
        "tags": draw(st.booleans()),
    }


def build(spec, order: int | None = None) -> fdl.Config:
    """The graph of `spec`; with `order`, every node's arguments (and tags) are set in a shuffled order."""
    rng = random.Random(order)

    def node(kind, fn, args):
        items = list(args.items())
        if order is not None:
            rng.shuffle(items)
        return kind(fn, **dict(items))

    args = spec["args"]
    opt = node(fdl.Config, toys.Optimizer, args["opt"])
    if spec["tags"]:
        tags = [toys.Tunable, toys.Logged]
        if order is not None:
            rng.shuffle(tags)
        for tag in tags:
            fdl.add_tag(opt, "lr", tag)
    policy = node(fdl.Config, toys.Policy, {**args["policy"], "optimizer": opt})
    ref = policy if spec["share_ref"] else copy.deepcopy(policy)
    loss = node(fdl.Partial, getattr(toys, spec["loss_fn"]), args["loss"])
    root = node(fdl.Config, toys.experiment, {**args["root"], "policy": policy, "ref": ref, "loss": loss})
    return node(fdl.Config, dict, {"experiment": root, "sampling": node(fdl.Config, dict, args["sampling"])})


# --- to_json / from_json ---------------------------------------------------------------------


@given(specs())
def test_json_round_trip_keeps_graph_sharing_and_hash(spec):
    graph = build(spec)
    back = from_json(to_json(graph))
    assert back == graph
    assert (back.experiment.ref is back.experiment.policy) == spec["share_ref"]
    assert graph_hash(back) == graph_hash(graph)


# --- graph_hash ------------------------------------------------------------------------------


@given(specs(), st.integers(0, 2**32 - 1))
def test_hash_ignores_argument_and_tag_order(spec, order):
    assert graph_hash(build(spec, order)) == graph_hash(build(spec))


def test_raw_fiddle_json_depends_on_argument_order_so_it_is_not_what_is_hashed():
    forward = fdl.Config(dict, lr=0.1, weight_decay=0.2)
    backward = fdl.Config(dict, weight_decay=0.2, lr=0.1)
    assert to_json(forward) != to_json(backward)
    assert graph_hash(forward) == graph_hash(backward)


@given(specs())
def test_explicit_default_hashes_like_unset(spec):
    explicit = copy.deepcopy(spec)
    for node, defaults in DEFAULTS.items():
        explicit["args"][node] = {**defaults, **spec["args"][node]}
    assert graph_hash(build(explicit)) == graph_hash(build(spec))


@given(specs(), st.data())
def test_hash_changes_with_any_leaf_value(spec, data):
    node, arg = data.draw(st.sampled_from(LEAVES))
    new = data.draw(ARG_VALUES[node][arg])
    old = spec["args"][node].get(arg, DEFAULTS[node].get(arg, _UNSET))
    assume(repr(new) != repr(old))  # repr tells 1 from 1.0 and 0.0 from -0.0, as the hash does
    changed = copy.deepcopy(spec)
    changed["args"][node][arg] = new
    assert graph_hash(build(changed)) != graph_hash(build(spec))


@given(specs())
def test_hash_changes_with_the_callable_the_kind_and_the_sharing(spec):
    base = graph_hash(build(spec))
    other_fn = {**spec, "loss_fn": "dapo_loss" if spec["loss_fn"] == "grpo_loss" else "grpo_loss"}
    assert graph_hash(build(other_fn)) != base
    assert graph_hash(build({**spec, "share_ref": not spec["share_ref"]})) != base
    as_config = build(spec)
    loss = as_config.experiment.loss
    as_config.experiment.loss = fdl.Config(fdl.get_callable(loss), **loss.__arguments__)
    assert graph_hash(as_config) != base


def test_hash_tells_types_apart():
    hashes = {graph_hash(fdl.Config(dict, x=value)) for value in (1, 1.0, True, "1", (1,), [1], None)}
    assert len(hashes) == 7


def test_sets_are_rejected_with_their_path():
    with pytest.raises(TypeError, match=r"set at <root>\.policy\.stop.*sorted tuple"):
        graph_hash(fdl.Config(toys.experiment, policy=fdl.Config(toys.Policy, stop={"a", "b"})))


def test_lambdas_are_rejected():
    with pytest.raises(TypeError, match="lambda or local function"):
        graph_hash(fdl.Config(toys.experiment, loss=lambda x: x))


_HASH_IN_CHILD = (
    "import json, sys\n"
    "from rlhf.graph.io import from_json, graph_hash\n"
    "print(json.dumps([graph_hash(from_json(s)) for s in json.load(sys.stdin)]))\n"
)


@settings(max_examples=1)
@given(st.lists(specs(), min_size=12, max_size=12))
def test_hash_is_the_same_in_processes_with_other_hash_seeds(spec_list):
    graphs = [build(spec, order=i) for i, spec in enumerate(spec_list)]
    here = Path(__file__).resolve().parent
    path = os.pathsep.join([str(here.parents[1]), str(here), os.environ.get("PYTHONPATH", "")])
    for seed in ("1", "4242"):
        child = subprocess.run(
            [sys.executable, "-c", _HASH_IN_CHILD],
            input=json.dumps([to_json(g) for g in graphs]),
            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": path},
            capture_output=True,
            text=True,
            check=True,
        )
        assert json.loads(child.stdout) == [graph_hash(g) for g in graphs]


# --- callables defined in scripts and experiment files --------------------------------------------

_SCRIPT = """
import fractions, functools
import fiddle as fdl
from rlhf.graph.io import to_json

def halve(x: float) -> float:
    return x / 2

print(to_json(fdl.Config(functools.partial, halve, fdl.Config(fractions.Fraction, 9))))
"""


def test_a_graph_built_by_a_script_loads_in_another_process(tmp_path, monkeypatch):
    script = tmp_path / "halving_script.py"
    script.write_text(_SCRIPT)
    text = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True,
                          cwd=tmp_path).stdout
    # functools and fractions are found by name anywhere: only the script's own file is recorded
    assert json.loads(text)["rlhf_sources"] == {"__main__": str(script.resolve())}
    monkeypatch.delitem(sys.modules, "halving_script", raising=False)
    graph = from_json(text)  # here __main__ is pytest: the script is loaded under its file's name
    assert fdl.build(graph)() == 4.5 and sys.modules["halving_script"].__file__ == str(script.resolve())
    assert from_json(to_json(graph)) == graph  # and it stays loadable: now recorded under that name


def test_graphs_of_installed_code_record_no_files():
    graph = fdl.Config(toys.Policy, hidden=8)  # tests/graph: a package-less module, but on sys.path here
    assert "rlhf_sources" not in json.loads(to_json(fdl.Config(dict, opt=fdl.Partial(random.Random, 3))))
    assert json.loads(to_json(graph))["rlhf_sources"] == {"graph_toys": str(Path(toys.__file__).resolve())}


def test_a_callable_that_cannot_be_found_names_what_is_missing():
    from rlhf.graph.io import GraphSourceError

    data = json.loads(to_json(fdl.Config(toys.Policy)))
    del data["rlhf_sources"]  # a graph stored before files were recorded, whose module is gone
    text = json.dumps(data).replace('"graph_toys"', '"no_such_module_anywhere"')
    with pytest.raises(GraphSourceError, match="no_such_module_anywhere"):
        from_json(text)


# --- flatten / nest --------------------------------------------------------------------------


def test_flatten_lists_every_leaf_with_defaults_and_shared_nodes_once():
    policy = fdl.Config(toys.Policy, hidden=8, optimizer=fdl.Config(toys.Optimizer, lr=0.1))
    graph = fdl.Config(
        toys.experiment, ref=policy, policy=policy, loss=fdl.Partial(toys.grpo_loss, clip=0.1), stages=("sft", "rl")
    )
    m = toys.__name__
    assert flatten(graph) == {
        "__fn__": f"{m}.experiment",
        "loss.__fn__": f"{m}.grpo_loss",
        "loss.log_probs": None,
        "loss.clip": 0.1,
        "loss.kl_coef": 0.0,
        "loss.agg": "token-mean",
        "mode": f"{m}.Mode.TRAIN",
        # `ref` is the same node as `policy`: both paths are one long, so the sorted name wins.
        "policy.__fn__": f"{m}.Policy",
        "policy.hidden": 8,
        "policy.layers": 2,
        "policy.name": "policy",
        "policy.optimizer.__fn__": f"{m}.Optimizer",
        "policy.optimizer.lr": 0.1,
        "policy.optimizer.betas": [0.9, 0.999],
        "policy.optimizer.weight_decay": 0.0,
        "policy.stop": [],  # default_factory=list, materialized
        "seed": 0,
        "stages": ["sft", "rl"],
    }


def test_flatten_numbers_list_items_and_names_dict_keys():
    graph = fdl.Config(dict, items=[fdl.Partial(toys.dapo_loss, clip=0.3), "x"], named={"a": 1, "b": {}}, fn=len)
    assert flatten(graph) == {
        "__fn__": "builtins.dict",
        "items.0.__fn__": f"{toys.__name__}.dapo_loss",
        "items.0.log_probs": None,
        "items.0.clip": 0.3,
        "items.0.kl_coef": 0.0,
        "items.0.agg": "token-mean",
        "items.1": "x",
        "named.a": 1,
        "named.b": {},
        "fn": "builtins.len",
    }


def test_flatten_takes_the_shortest_path_to_a_shared_node():
    opt = fdl.Config(toys.Optimizer)
    graph = fdl.Config(dict, a=fdl.Config(toys.Policy, optimizer=opt), z=opt)
    flat = flatten(graph)
    assert flat["z.__fn__"] == f"{toys.__name__}.Optimizer"
    assert not any(key.startswith("a.optimizer") for key in flat)


@given(specs(), st.integers(0, 2**32 - 1))
def test_flatten_is_order_independent_and_aim_storable(spec, order):
    flat = flatten(build(spec, order))
    assert flat == flatten(build(spec))
    primitives = (bool, int, float, str, type(None))
    for value in flat.values():
        assert isinstance(value, primitives) or value == {} or all(isinstance(v, primitives) for v in value)


def test_nest_turns_dotted_keys_into_dicts():
    flat = {"__fn__": "f", "a.b": 1, "a.c.__fn__": "g", "a.c.d": [1, 2], "e.0": "x"}
    assert nest(flat) == {"__fn__": "f", "a": {"b": 1, "c": {"__fn__": "g", "d": [1, 2]}}, "e": {"0": "x"}}


def test_nest_refuses_a_key_that_is_both_leaf_and_prefix():
    with pytest.raises(ValueError, match="leaf"):
        nest({"a.b": 1, "a": 2})
    with pytest.raises(ValueError, match="below the leaf"):
        nest({"a": 2, "a.b": 1})
