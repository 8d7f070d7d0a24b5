"""SmolLM2-135M-Instruct (the real model) in multi-turn rollouts: token-in/token-out with its own ChatML
template (default system prompt and all), and the Python-tool recipe's smoke form through the runtime."""

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
from helpers import load_file


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
def test_smollm2_turns_in_chunks_equal_turns_in_one_call(smollm2_path):
    """Greedy, each turn in chunks of 5 tokens (a weight update could land between them) gives SmolLM2's
    tokens and log-probs of one call per turn: a paused turn goes on from its ids with its 49k-BPE template."""
    tok = load_tokenizer(smollm2_path)
    rows = [{"data_source": "chat", "prompt": [{"role": "user", "content": q}], "reward_model": {"ground_truth": "0"},
             "extra_info": {}} for q in ("What is 12+30?", "Name a colour.")]
    prompts = PromptDataset(rows, tok, raw_prompt=True).collate([0, 1])
    engine = HFEngine(smollm2_path)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16)
    whole, chunked = (AgentRollout(environment=ContinueEnvironment, tokenizer=tok, max_turns=2, max_response_tokens=48,
                                   turn_chunk_tokens=chunk).rollout(engine.generate, prompts, greedy)[0]
                      for chunk in (None, 5))
    assert whole["response_mask"].sum() > 20  # turns longer than a chunk
    for key in ("responses", "response_mask", "attention_mask"):
        assert torch.equal(whole[key], chunked[key]), key
    assert (whole["rollout_log_probs"] - chunked["rollout_log_probs"]).abs().max() < 1e-3


@pytest.mark.real_model
def test_smollm2_python_tool_recipe_smoke(smollm2_path, tmp_path):
    recipe = load_file("experiments/smollm2_python_tool.py")
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


@pytest.mark.real_model
def test_smollm2_gateway_trajectories_train_with_the_recorded_log_probs(smollm2_path):
    """An unmodified OpenAI-client agent through `rlhf serve --sessions` on SmolLM2 (49k BPE): the session's
    two-turn trajectory is one render of the agent's conversation, and the trainer's log-probs over it equal
    the recorded ones on every sampled token (nothing was re-tokenised at the turn boundary)."""
    import httpx
    from openai import OpenAI

    from rlhf.agents import Trajectory, trajectory_batch
    from rlhf.batch import Batch
    from rlhf.serve import BackgroundServer, build_app
    from rlhf.serve.gateway import SessionStore

    worker = PolicyWorker(smollm2_path)
    engine, tok = worker.engine, load_tokenizer(smollm2_path)
    sessions = SessionStore(tok, engine.eos_token_ids)
    messages = [{"role": "user", "content": "What is 12+30?"}]
    with BackgroundServer(build_app(engine, "smollm2", sessions=sessions)) as server:
        client = OpenAI(base_url=f"{server.url}/sessions/e1/v1", api_key="unused", max_retries=0, timeout=120)
        for turn in range(2):
            reply = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=24,
                                                   temperature=1.0, seed=turn)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                         {"role": "user", "content": "Are you sure?"}]
        (record,) = httpx.get(f"{server.url}/sessions/e1").json()["trajectories"]
    t = Trajectory.from_dict(record)
    assert len(t.turns) == 2
    first_end = t.turns[0][1]
    if t.response_ids[first_end - 1] in engine.eos_token_ids:  # turn 1 ended on <|im_end|> (it does at these seeds)
        # what followed it is the template's own newline and the follow-up, as one render of the conversation
        rendered = tok.apply_chat_template(messages[:3], add_generation_prompt=True, tokenize=False)
        assert tok.decode(t.all_ids).startswith(rendered)
    batch = trajectory_batch([t], Batch({}, {"uid": ["e1"], "extra_info": [{}]}), tok.pad_token_id,
                             temperature=1.0, max_new_tokens=256)
    mask = batch["response_mask"].bool()
    old = worker.compute_log_probs(batch)["old_log_probs"]
    assert mask.sum() > 0 and (old - batch["rollout_log_probs"]).abs()[mask].max() < 1e-3
