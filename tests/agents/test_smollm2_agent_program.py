"""SmolLM2-135M-Instruct (the real model) driven by an OpenAI-client agent program (rlhf.agent_programs):
its trajectories are token-exact against SmolLM2's template, and the calculator recipe's smoke runs through
the runtime with the trainer agreeing with the engine on every sampled token."""

import pytest
import torch

import rlhf_configs.common as common
from program_agents import CONVERSATIONS, two_turns
from rlhf.agent_programs import AgentProgramRollout
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_tokenizer
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.experiment import run_experiment
from rlhf.workers.policy import PolicyWorker
from helpers import load_file


@pytest.mark.real_model
def test_smollm2_agent_trajectories_are_one_render_except_inside_sampled_text(smollm2_path):
    """Sampled two-turn conversations (a tool result and a user follow-up between the turns). SmolLM2's template
    is append-only (`rlhf models check-template`), so each trajectory decodes to exactly one render of the
    conversation the agent holds. Its ids may still differ from that render tokenised anew, but only inside
    text the model sampled, where the sampled split is not the tokenizer's own (e.g. one '\\n\\n' token for two
    '\\n'): the ids trained are the ids sampled, which is why they are kept. The trainer's log-probs equal the
    recorded ones on every sampled token."""
    tok = load_tokenizer(smollm2_path)
    rows = [{"data_source": "chat", "prompt": [{"role": "user", "content": q}], "reward_model": {"ground_truth": "0"},
             "extra_info": {}} for q in ("What is 12+30?", "Name a colour.", "Write a haiku about rain.")]
    prompts = PromptDataset(rows, tok, raw_prompt=True).collate(range(len(rows)))
    worker = PolicyWorker(smollm2_path)
    torch.manual_seed(0)
    CONVERSATIONS.clear()
    batch, metrics = AgentProgramRollout(two_turns, tok).rollout(
        worker.engine.generate, prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=24))
    assert metrics["agent/errors/total"] == 0 and metrics["num_turns/min"] == 2
    held = {}
    for uid, messages in CONVERSATIONS:
        held.setdefault(uid, []).append(messages)
    differing = 0
    for i, uid in enumerate(batch["uid"]):
        real = batch["attention_mask"][i].bool()
        ids = batch["input_ids"][i][real].tolist()
        sampled = torch.cat([torch.zeros(batch["prompts"].shape[1], dtype=torch.long), batch["response_mask"][i]])[real]
        text = tok.decode(ids)
        cut = not text.endswith("<|im_end|>")
        renders = [tok.apply_chat_template(m, tokenize=False) for m in held[uid]]
        assert text + ("<|im_end|>\n" if cut else "\n") in renders  # one render of a conversation the agent holds
        again = tok(text, add_special_tokens=False)["input_ids"]
        if again != ids:  # where the re-tokenised render parts from the trained ids, the model was sampling
            differing += 1
            start = next(k for k, (a, b) in enumerate(zip(ids, again)) if a != b)
            assert sampled[start] == 1 or (start > 0 and sampled[start - 1] == 1), (i, start)
    print(f"{differing} of {len(batch)} trajectories differ from a re-tokenised render, inside sampled text")
    old = worker.compute_log_probs(batch)["old_log_probs"]
    mask = batch["response_mask"].bool()
    assert (old - batch["rollout_log_probs"]).abs()[mask].max() < 1e-3


@pytest.mark.real_model
def test_smollm2_agent_recipe_smoke(smollm2_path, tmp_path):
    recipe = load_file("experiments/smollm2_agent.py")
    graph = recipe.base()
    recipe.smoke(graph)
    for fiddler in (common.local, common.no_tracking, common.quiet):
        fiddler(graph)
    graph.output_dir = str(tmp_path / "out")
    metrics = run_experiment(graph)["grpo"]["metrics"]
    for name in ("agent/attempts", "agent/errors/total", "agent/timeouts", "num_turns/mean", "tool_calls/mean",
                 "response_length/turn_1/mean", "val-aux/agent/attempts", "actor/pg_loss"):
        assert name in metrics, name
    assert metrics["agent/attempts"] == 4 and metrics["agent/timeouts"] == 0
    assert metrics["rollout_corr/log_prob_abs_diff_max"] < 1e-3  # the trainer agrees with the engine on every turn
