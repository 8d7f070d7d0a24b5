"""SmolLM2-135M-Instruct (the real model) in multi-turn rollouts: token-in/token-out with its own ChatML
template (default system prompt and all), and the Python-tool recipe's smoke form through the runtime."""

import importlib.util
from pathlib import Path

import pytest
import torch

import rlhf_configs.common as common
from rlhf.agents import AgentRollout
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_tokenizer
from rlhf.rollout.hf_engine import HFEngine
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.experiment import run_experiment
from rlhf.workers.policy import PolicyWorker
from test_agent_rollout import ContinueEnvironment

ROOT = Path(__file__).parents[2]


@pytest.mark.real_model
def test_smollm2_multi_turn_log_probs_match_the_trainer(smollm2_path):
    """Two conversations of two turns (a user follow-up between them) sampled by the transformers engine:
    the trainer's log-probs over each whole conversation equal the engine's on every sampled token."""
    tok = load_tokenizer(smollm2_path)
    rows = [{"data_source": "chat", "prompt": [{"role": "user", "content": q}], "reward_model": {"ground_truth": "0"},
             "extra_info": {}} for q in ("What is 12+30?", "Name a colour.")]
    prompts = PromptDataset(rows, tok, raw_prompt=True).collate([0, 1])
    agent = AgentRollout(environment=ContinueEnvironment, tokenizer=tok, max_turns=2, max_response_tokens=48)
    torch.manual_seed(0)
    worker = PolicyWorker(smollm2_path)
    batch, metrics = agent.rollout(worker.engine.generate, prompts, SamplingParams(temperature=1.0, max_new_tokens=16))
    mask = batch["response_mask"].bool()
    old = worker.compute_log_probs(batch)["old_log_probs"]
    assert (old - batch["rollout_log_probs"]).abs()[mask].max() < 1e-3
    text = tok.decode(batch["input_ids"][0][batch["attention_mask"][0].bool()])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")  # the template's default
    if metrics["num_turns/max"] == 2:  # the first turn ended on <|im_end|>: the follow-up came after its newline
        assert "<|im_end|>\n<|im_start|>user\nAnd 1+1?<|im_end|>\n<|im_start|>assistant\n" in text


@pytest.mark.real_model
def test_smollm2_python_tool_recipe_smoke(smollm2_path, tmp_path):
    spec = importlib.util.spec_from_file_location("smollm2_python_tool", ROOT / "experiments" / "smollm2_python_tool.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    graph = recipe.base()
    recipe.smoke(graph)
    for fiddler in (common.local, common.no_tracking, common.quiet):
        fiddler(graph)
    graph.output_dir = str(tmp_path / "out")
    metrics = run_experiment(graph)["grpo"]["metrics"]
    for name in ("num_turns/mean", "tool_calls/mean", "tool_errors/total", "response_length/turn_1/mean",
                 "val-aux/num_turns/mean", "actor/pg_loss"):
        assert name in metrics, name
    assert metrics["rollout_corr/log_prob_abs_diff_max"] < 1e-3  # the trainer agrees with the engine on every turn
