"""Gin files as graph overrides: selectors, scopes, macros, references, includes, history, errors,
the shipped rlhf_configs/*.gin files, and a round-trip property over random binding sets."""

from __future__ import annotations

import copy
import inspect
import re
from pathlib import Path

import fiddle as fdl
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import gin_toy_components as toys
import gin_toy_experiment
from rlhf.config.gin_overrides import SHIPPED, GinError, apply_gin
from rlhf.config.overrides import OverrideError, apply_overrides
from rlhf.graph.io import flatten
from helpers import load_file

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_FILES = sorted(p.name for p in SHIPPED.glob("*.gin"))


def gin(text: str, graph=None, path: str = "t.gin"):
    return apply_gin(graph if graph is not None else toys.toy_graph(), path=path, text=text)


def raises(message: str):
    return pytest.raises(GinError, match=re.escape(message))


def gin_entries(node, param: str) -> list[str]:
    return [str(e.location) for e in node.__argument_history__[param] if ".gin:" in str(e.location)]


# ------------------------------------------------------------------ selectors
def test_binding_sets_every_matching_node():
    g = gin("Sampling.max_new_tokens = 4\nOptimizer.lr = 0.5")
    sft, grpo = g.stages["sft"], g.stages["grpo"]
    for sampling in (sft.sampling, grpo.sampling, sft.evaluator.sampling):
        assert sampling.max_new_tokens == 4
    assert sft.policy.worker.optimizer.lr == grpo.policy.worker.optimizer.lr == 0.5
    assert isinstance(sft.policy.worker.optimizer, fdl.Partial)  # a Partial is selected like a Config


def test_a_shared_node_is_set_once():
    g = gin("Sampling.temperature = 0.5")
    shared = g.stages["sft"].evaluator.sampling
    assert shared is g.stages["grpo"].evaluator.sampling
    assert gin_entries(shared, "temperature") == ["t.gin:1"]


@pytest.mark.parametrize("selector", ["AdamW", "optim.AdamW", "adamw.AdamW", "torch.optim.AdamW"])
def test_selector_by_name_or_module_suffix(selector):
    g = fdl.Config(toys.Worker, optimizer=fdl.Partial(torch.optim.AdamW, lr=1e-3))
    gin(f"{selector}.lr = 0.25", g)
    assert g.optimizer.lr == 0.25


def test_selector_module_parts_must_fit():
    g = fdl.Config(toys.Worker, optimizer=fdl.Partial(torch.optim.AdamW))
    with raises("no node in the graph calls 'sgd.AdamW'"):
        gin("sgd.AdamW.lr = 0.25", g)


def test_import_path_selector_matches_that_object_and_may_match_nothing():
    g = gin("gin_toy_components.Optimizer.lr = 0.3\ngin_toy_components.Unused.x = 1")
    assert g.stages["sft"].policy.worker.optimizer.lr == 0.3
    with raises("Unused (gin_toy_components.Unused) has no parameter 'y'"):
        gin("gin_toy_components.Unused.y = 1")  # parameters are still checked


def test_binding_block_syntax():
    g = gin("Sampling:\n    n = 3\n    max_new_tokens = 5\n")
    assert g.stages["grpo"].sampling.n == 3 and g.stages["grpo"].sampling.max_new_tokens == 5


def test_any_keyword_accepted_where_the_callable_takes_kwargs():
    g = gin("metrics.anything = 1", fdl.Config(toys.Trainer, hooks=[fdl.Config(toys.metrics)]))
    assert g.hooks[0].anything == 1


# --------------------------------------------------------------------- scopes
def test_scope_by_dict_key():
    g = gin("grpo/Optimizer.lr = 0.5")
    assert g.stages["grpo"].policy.worker.optimizer.lr == 0.5
    assert g.stages["sft"].policy.worker.optimizer.lr == 0.1


def test_scope_by_a_name_argument():
    g = gin("actor/Worker.micro_batch_size = 2")  # `actor` is the grpo Group's name, no attribute
    assert g.stages["grpo"].policy.worker.micro_batch_size == 2
    assert g.stages["sft"].policy.worker.micro_batch_size == 8


def test_scope_by_the_nodes_own_attribute():
    g = gin("evaluator/Sampling.n = 2")
    assert g.stages["sft"].evaluator.sampling.n == 2
    assert g.stages["sft"].sampling.n == 1 and g.stages["grpo"].sampling.n == 8
    g = gin("sampling/Sampling.max_new_tokens = 3")  # evaluator.sampling is a `sampling` too
    assert g.stages["grpo"].evaluator.sampling.max_new_tokens == g.stages["grpo"].sampling.max_new_tokens == 3


def test_nested_scopes_in_order_and_shared_nodes_on_any_path():
    g = gin("grpo/evaluator/Sampling.n = 4")
    assert g.stages["sft"].evaluator.sampling.n == 4  # the same node, reached through grpo too
    g = gin("grpo/policy/Optimizer.lr = 0.7")
    assert g.stages["grpo"].policy.worker.optimizer.lr == 0.7
    assert g.stages["sft"].policy.worker.optimizer.lr == 0.1
    with raises("no Optimizer node is under scope 'policy/grpo'"):
        gin("policy/grpo/Optimizer.lr = 0.7")


# ------------------------------------------------------------- macros, values
def test_macros_anywhere_in_the_file_and_in_containers():
    g = gin("Optimizer.lr = %LR\nTrainer.hooks = [%LR, {'k': %PAIR}]\nLR = 0.5\nPAIR = (%LR, 'x')\n")
    assert g.stages["sft"].policy.worker.optimizer.lr == 0.5
    assert g.stages["grpo"].hooks == [0.5, {"k": (0.5, "x")}]


def test_literals():
    g = gin("Trainer.hooks = [-1, 2.5e-3, 'a b', None, True, (), (1,), {'x': [1]}]")
    assert g.stages["sft"].hooks == [-1, 2.5e-3, "a b", None, True, (), (1,), {"x": [1]}]


def test_undefined_macro():
    with raises("t.gin:1: macro %LRR is not defined (define it as `LRR = ...`). Did you mean 'LR'?"):
        gin("Optimizer.lr = %LRR\nLR = 1")


def test_config_vs_partial_references():
    g = gin("Trainer.advantage = @gin_toy_components.Normalized()\nWorker.optimizer = @Optimizer")
    sft, grpo = g.stages["sft"], g.stages["grpo"]
    assert isinstance(sft.advantage, fdl.Config) and fdl.get_callable(sft.advantage) is toys.Normalized
    assert sft.advantage is not grpo.advantage  # every target gets its own node
    assert isinstance(sft.policy.worker.optimizer, fdl.Partial)
    assert fdl.get_callable(sft.policy.worker.optimizer) is toys.Optimizer  # resolved in the graph
    assert fdl.build(sft.policy.worker.optimizer)(params=[1]).params == [1]


def test_references_in_lists_and_through_imports():
    g = gin("import gin_toy_components as t\nTrainer.hooks = [@t.Baseline(), @Sampling()]\nt.Baseline.eps = 0.1")
    hooks = g.stages["sft"].hooks
    assert [fdl.get_callable(h) for h in hooks] == [toys.Baseline, toys.Sampling]
    assert hooks[0].eps == 0.1


def test_bindings_reach_nodes_created_later_in_the_file():
    # as in gin, a binding of X applies to an X that a later line creates with @X()
    g = gin("Normalized.by_std = False\nTrainer.advantage = @gin_toy_components.Normalized()\n")
    assert g.stages["grpo"].advantage.by_std is False
    assert gin_entries(g.stages["grpo"].advantage, "by_std") == ["t.gin:1"]
    g = gin("Normalized.eps = 1.0\nTrainer.advantage = @gin_toy_components.Normalized()\nNormalized.eps = 2.0\n")
    assert g.stages["grpo"].advantage.eps == 2.0  # the last binding of an argument wins


def test_unknown_reference():
    with raises("t.gin:1: @Normalised is neither a callable in the graph nor an importable dotted path"):
        gin("Trainer.advantage = @Normalised()")


# ------------------------------------------------------------- files, history
def test_include_relative_to_the_including_file_and_history(tmp_path):
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "opt.gin").write_text("# optimizer\nLR = 0.2\nOptimizer.lr = %LR\n")
    (tmp_path / "main.gin").write_text("include 'parts/opt.gin'\nSampling.n = 5\n")
    g = apply_gin(toys.toy_graph(), str(tmp_path / "main.gin"))
    optimizer = g.stages["grpo"].policy.worker.optimizer
    assert optimizer.lr == 0.2 and g.stages["grpo"].sampling.n == 5
    assert gin_entries(optimizer, "lr") == [f"{tmp_path}/parts/opt.gin:3"]
    assert gin_entries(g.stages["grpo"].sampling, "n") == [f"{tmp_path}/main.gin:2"]


def test_include_errors(tmp_path):
    (tmp_path / "a.gin").write_text("include 'b.gin'\n")
    (tmp_path / "b.gin").write_text("\ninclude 'a.gin'\n")
    with raises("b.gin:2: include 'a.gin' includes itself"):
        apply_gin(toys.toy_graph(), str(tmp_path / "a.gin"))
    with raises("t.gin:1: include 'missing.gin': no such file"):
        gin("include 'missing.gin'")


def test_path_lookup_and_arguments():
    with raises("gin file 'debugg.gin' not found"):
        apply_gin(toys.toy_graph(), "debugg.gin")
    with raises("needs a gin file path or gin text"):
        apply_gin(toys.toy_graph())
    g = apply_gin(toys.toy_graph(), text="Sampling.n = 2")
    assert str(g.stages["sft"].sampling.__argument_history__["n"][-1].location) == "<gin text>:1"


def test_as_a_fiddler_on_the_command_line(tmp_path):
    (tmp_path / "x.gin").write_text("grpo/Trainer.total_steps = 7\n")
    command = f'fiddler:gin(path="{tmp_path}/x.gin")'
    g, fiddlers = apply_overrides([command], [gin_toy_experiment])
    assert g.stages["grpo"].total_steps == 7 and g.stages["sft"].total_steps == 10
    assert fiddlers == [command.removeprefix("fiddler:")]  # recorded in the run's lineage


# --------------------------------------------------------------------- errors
def test_unknown_selector_names_file_line_and_the_graphs_callables():
    with pytest.raises(OverrideError) as err:  # the CLI's error type: one message, no traceback
        gin("\nSampling.n = 2\nSamplng.n = 2\n", path="my.gin")
    message = str(err.value)
    assert message.startswith("my.gin:3: Samplng.n: no node in the graph calls 'Samplng'. Did you mean 'Sampling'?")
    assert "Callables in the graph: Evaluator, Group, Optimizer, Root, Sampling, Trainer, Worker." in message


def test_unknown_parameter_names_file_line_callable_and_valid_parameters():
    with raises(
        "my.gin:1: Optimizer.lrr: Optimizer (gin_toy_components.Optimizer) has no parameter 'lrr'. "
        "Did you mean 'lr'? Valid parameters: lr, params, weight_decay."
    ):
        gin("Optimizer.lrr = 1", path="my.gin")


def test_scope_that_selects_nothing_lists_where_the_nodes_are():
    with raises("t.gin:1: eval/Optimizer.lr: no Optimizer node is under scope 'eval'. The Optimizer nodes are at "
                ".stages['grpo'].policy.worker.optimizer, .stages['sft'].policy.worker.optimizer"):
        gin("eval/Optimizer.lr = 1")


def test_syntax_error_names_file_and_line():
    with raises("t.gin:2: Unable to parse value."):
        gin("Sampling.n = 1\nSampling.n = = 2\n")


def test_an_error_leaves_the_graph_unchanged():
    g = toys.toy_graph()
    before = copy.deepcopy(g)
    with raises("no parameter 'nn'"):
        gin("Sampling.n = 2\nTrainer.advantage = @gin_toy_components.Baseline()\nSampling.nn = 3", g)
    assert g == before
    assert gin_entries(g.stages["sft"].sampling, "n") == []


# --------------------------------------------------------- the shipped files
def load_experiment(name: str):
    return load_file(f"experiments/{name}.py")


@pytest.fixture(scope="module")
def experiments():
    return {name: load_experiment(name) for name in ("qwen_gsm8k", "arithmetic_tiny")}


def test_gin_files_are_shipped():
    assert {"debug.gin", "cpu.gin", "long_context.gin", "low_memory.gin"} <= set(SHIPPED_FILES)


@pytest.mark.parametrize("experiment", ["qwen_gsm8k", "arithmetic_tiny"])
@pytest.mark.parametrize("name", SHIPPED_FILES)
def test_every_shipped_file_applies_to_the_recipes(experiments, experiment, name):
    g = experiments[experiment].base()
    before = copy.deepcopy(g)
    apply_gin(g, name)  # found among the shipped files
    assert g != before


@pytest.mark.parametrize("experiment, stages", [("qwen_gsm8k", ["grpo"]), ("arithmetic_tiny", ["sft", "grpo", "eval"])])
def test_low_memory_changes_exactly_its_three_bindings(experiments, experiment, stages):
    """Every TrainingSetup, PolicyWorker and Evaluator of the recipe gets the file's value, and nothing else
    changes (the algorithm, batch sizes and mini-batches included)."""
    g = experiments[experiment].base()
    before = flatten(g)
    after = flatten(apply_gin(g, "low_memory.gin"))
    changed = {k: after.get(k) for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert changed == {
        **{f"stages.{s}.policy.worker.training.micro_batch_size": 1 for s in stages},
        **{f"stages.{s}.policy.worker.dtype": "bfloat16" for s in stages},
        **{f"stages.{s}.evaluator.prompts_per_call": 32 for s in stages},
    }


def test_debug_and_cpu_on_qwen_gsm8k(experiments):
    g = experiments["qwen_gsm8k"].base()
    apply_gin(g, str(SHIPPED / "debug.gin"))
    apply_gin(g, "cpu.gin")
    grpo = g.stages["grpo"]
    assert (grpo.total_steps, grpo.prompts_per_step, grpo.sampling.max_new_tokens) == (2, 4, 8)
    assert grpo.evaluator.sampling.max_new_tokens == 8
    assert grpo.policy.gpus_per_worker == 0
    assert (grpo.policy.worker.dtype, grpo.policy.worker.training.strategy) == ("float32", "ddp")
    assert grpo.policy.worker.training.compute_dtype == "float32"  # the recipe's bf16 matmuls too
    assert gin_entries(grpo, "total_steps") == [f"{SHIPPED / 'debug.gin'}:5"]


def test_cpu_is_one_switch(experiments):
    """`fiddler:cpu` is cpu.gin: a GPU recipe (bf16 compute, one GPU per worker) runs on CPUs in float32."""
    import rlhf_configs.common as common

    g = experiments["qwen_gsm8k"].base()
    training = g.stages["grpo"].policy.worker.training
    assert (training.compute_dtype, g.stages["grpo"].policy.gpus_per_worker) == ("bfloat16", 1)
    common.cpu(g)
    assert g == apply_gin(experiments["qwen_gsm8k"].base(), "cpu.gin")
    grpo = g.stages["grpo"]
    assert (grpo.policy.gpus_per_worker, grpo.policy.worker.dtype) == (0, "float32")
    assert (grpo.policy.worker.training.compute_dtype, grpo.policy.worker.training.strategy) == ("float32", "ddp")


def test_debug_on_arithmetic_tiny_sets_sft_and_eval_rows(experiments):
    g = apply_gin(experiments["arithmetic_tiny"].base(), "debug.gin")
    assert g.stages["sft"].total_steps == 3 and g.stages["sft"].batch_size == 8
    for stage in g.stages.values():
        assert stage.evaluator.dataset.rows.n == 16
    assert g.stages["grpo"].train_data.rows.n == 7000  # the training rows are not under `evaluator`


def test_long_context_macros(experiments):
    g = apply_gin(experiments["qwen_gsm8k"].base(), "long_context.gin")
    grpo = g.stages["grpo"]
    assert grpo.train_data.max_prompt_length == grpo.evaluator.dataset.max_prompt_length == 2048
    assert grpo.sampling.max_new_tokens == 8192


# ------------------------------------------------------------------ property
# Every parameter a random binding may set (`name` is left alone: it decides scopes).
PARAMS = {
    "Optimizer": ["lr", "weight_decay"],
    "Sampling": ["n", "temperature", "max_new_tokens"],
    "Worker": ["micro_batch_size", "dtype"],
    "Group": ["num_workers"],
    "Evaluator": ["batch_size"],
    "Trainer": ["total_steps", "hooks"],
}


def toy_nodes(g) -> dict[str, tuple[object, str, set[str]]]:
    """Each node of the toy graph: (node, selector, the scope names on its paths), written out by hand."""
    out = {}
    greedy_scopes = {"stages", "sft", "grpo", "evaluator", "sampling"}
    out["greedy"] = (g.stages["sft"].evaluator.sampling, "Sampling", greedy_scopes)
    for stage, group in (("sft", "policy"), ("grpo", "actor")):
        t = g.stages[stage]
        base = {"stages", stage}
        out[f"{stage}"] = (t, "Trainer", base)
        out[f"{stage}.group"] = (t.policy, "Group", base | {"policy", group})
        out[f"{stage}.worker"] = (t.policy.worker, "Worker", base | {"policy", group, "worker"})
        out[f"{stage}.opt"] = (t.policy.worker.optimizer, "Optimizer", base | {"policy", group, "worker", "optimizer"})
        out[f"{stage}.sampling"] = (t.sampling, "Sampling", base | {"sampling"})
        out[f"{stage}.evaluator"] = (t.evaluator, "Evaluator", base | {"evaluator"})
    return out


literals = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3)
    | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=3), inner, max_size=2),
    max_leaves=5,
)
SCOPES = [None, "sft", "grpo", "evaluator", "actor", "policy", "sampling", "worker"]


def scoped_binding(selector: str):
    """Mostly a scope some `selector` node is under (the binding applies), sometimes any scope."""
    under = sorted({s for _, sel, scopes in toy_nodes(toys.toy_graph()).values() if sel == selector for s in scopes})
    scope = st.sampled_from([None, *under] * 5 + SCOPES)  # repeated: weighted towards scopes that apply
    return st.tuples(scope, st.just(selector), st.sampled_from(PARAMS[selector]), literals)


bindings = st.lists(st.sampled_from(sorted(PARAMS)).flatmap(scoped_binding), min_size=1, max_size=6)


@given(bindings)
def test_round_trip_random_bindings(binding_set):
    g = toys.toy_graph()
    nodes = toy_nodes(g)
    expected = {key: dict(node.__arguments__) for key, (node, _, _) in nodes.items()}
    before = copy.deepcopy(g)
    lines, misses = [], False
    for scope, selector, param, value in binding_set:
        lines.append(f"{scope + '/' if scope else ''}{selector}.{param} = {value!r}")
        targets = [k for k, (_, sel, scopes) in nodes.items() if sel == selector and (scope is None or scope in scopes)]
        misses |= not targets
        for key in targets:
            expected[key][param] = value
    text = "\n".join(lines) + "\n"
    if misses:  # some scope selects none of that selector's nodes: an error, and nothing changes
        with pytest.raises(GinError):
            apply_gin(g, text=text)
        assert g == before
        return
    apply_gin(g, text=text)
    for key, (node, _, _) in nodes.items():
        assert node.__arguments__ == expected[key], key
    assert g.seed == 0 and set(g.stages) == {"sft", "grpo"}


# ------------------------------------------------------------------ the docs
DOC = ROOT / "docs" / "configuring.md"


def test_the_docs_gin_example_applies_to_qwen_gsm8k(experiments):
    example = re.search(r"```gin\n(.*?)```", DOC.read_text(), re.S).group(1)
    g = apply_gin(experiments["qwen_gsm8k"].base(), path=str(DOC), text=example)
    grpo = g.stages["grpo"]
    assert grpo.total_steps == 50 and grpo.sampling.max_new_tokens == 2048
    assert fdl.get_callable(grpo.advantage).__name__ == "RLOO"
    assert isinstance(grpo.policy.worker.objective.kl_loss.estimator, fdl.Partial)
    assert (grpo.policy.worker.training.micro_batch_size, grpo.policy.worker.training.mini_batches) == (4, 2)
    assert grpo.policy.worker.training.strategy == "ddp"  # from the included cpu.gin


def test_every_place_the_verl_table_names_exists(experiments):
    import rlhf.algos
    from rlhf.config.gin_overrides import _callables, _index

    known = {}
    for name in ("qwen_gsm8k", "arithmetic_tiny"):
        g = experiments[name].base()
        known.update({getattr(fn, "__name__", ""): fn for fn in _callables(g, _index(g))})
    known.update({n: getattr(rlhf.algos, n) for n in dir(rlhf.algos) if n[:1].isupper()})
    table = DOC.read_text().split("## From verl")[1]
    checked = 0
    for row in table.splitlines():
        if not row.startswith("| `"):
            continue
        for cell in row.split("|")[2:]:
            for code in re.findall(r"`([^`]*)`", cell):
                if code.startswith("stages."):  # a set: path in qwen_gsm8k
                    node = experiments["qwen_gsm8k"].base()
                    for part in code.split("."):
                        node = node[part] if isinstance(node, dict) else getattr(node, part)
                    checked += 1
                for cls, param in re.findall(r"\b([A-Za-z_]\w*)\.([A-Za-z_]\w*)\b", code):
                    if cls in known:
                        assert param in inspect.signature(known[cls]).parameters, f"{cls}.{param} in docs"
                        checked += 1
    assert checked > 40
