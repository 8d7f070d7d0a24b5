"""Which engine a policy worker gets, in which dtype, and where "auto" is decided.

- a `dtype` set on the engine's node is the engine's own, never replaced by the compute dtype;
- "auto" (`AutoEngine`) is resolved by the worker that builds the engine, so the graph and its
  hash do not depend on the machine that built the graph.
"""

import functools

import fiddle as fdl
import torch

from helpers import tiny_model_path
from rlhf.graph.io import graph_hash
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.rollout import HFEngine
from rlhf.rollout.choose import AutoEngine, engine_class
from rlhf.rollout.engine import for_policy
from rlhf.rollout.vllm_engine import VLLMEngine, vllm_available
from rlhf.workers.policy import PolicyWorker
from rlhf.workers.training import TrainingSetup
from rlhf_configs.generate_eval import generation_experiment, rollout_engine


def engine_for(factory, compute_dtype="float32"):
    path = tiny_model_path()
    actor = load_causal_lm(path)
    return actor, for_policy(factory, path, actor, load_tokenizer(path), dtype=compute_dtype, device=torch.device("cpu"))


def test_the_transformers_engine_shares_the_actor_unless_its_node_sets_a_dtype():
    actor, shared = engine_for(HFEngine, compute_dtype="bfloat16")
    assert shared.shares_weights and shared.model is actor
    actor, own = engine_for(functools.partial(HFEngine, dtype="bfloat16", max_rows_per_call=8))
    assert not own.shares_weights and own.model is not actor
    assert own.model.dtype == torch.bfloat16 and own.max_rows_per_call == 8  # the node's settings, all kept


def test_a_dtype_on_the_engine_node_is_not_replaced_by_the_compute_dtype():
    worker = PolicyWorker(tiny_model_path(), engine=functools.partial(HFEngine, dtype="float32"),
                          training=TrainingSetup(compute_dtype="bfloat16"))
    assert worker.engine.model.dtype == torch.float32
    own_default = PolicyWorker(tiny_model_path(), engine=functools.partial(HFEngine, device="cpu"),
                               training=TrainingSetup(compute_dtype="bfloat16"))
    assert own_default.engine.model.dtype == torch.bfloat16  # no dtype on the node: the compute dtype


def test_auto_is_resolved_where_the_engine_is_built():
    auto = AutoEngine(vllm=functools.partial(VLLMEngine, max_model_len=256))
    assert auto.resolve(gpu=False) is HFEngine  # a CPU machine: transformers, whatever is installed
    on_gpu = auto.resolve(gpu=True)
    assert on_gpu is auto.vllm if vllm_available() else on_gpu is HFEngine
    actor, engine = engine_for(AutoEngine())  # this machine (no GPU): the sharing transformers engine
    assert isinstance(engine, HFEngine) and engine.model is actor


def test_an_auto_engine_graph_is_the_same_on_every_machine(monkeypatch, tmp_path):
    """`rlhf generate --engine auto` puts AutoEngine in the graph: nothing about the machine that built it."""
    def graph():
        return generation_experiment(tiny_model_path(), "data.jsonl", str(tmp_path / "out.jsonl"), engine="auto")

    here = graph()
    import rlhf.rollout.choose as choose

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a head node with a GPU and vLLM
    monkeypatch.setattr(choose, "vllm_available", lambda: True)
    there = graph()
    engine = here.stages["generate"].policy.worker.engine
    assert fdl.get_callable(engine) is AutoEngine
    assert graph_hash(here) == graph_hash(there)
    hf = rollout_engine("hf", "float32", 64)  # generate/eval cap the rows the transformers engine decodes at once
    assert fdl.get_callable(hf) is engine_class("hf") is HFEngine and hf.max_rows_per_call == 64
    assert fdl.get_callable(engine.hf) is HFEngine and engine.hf.max_rows_per_call == 64
