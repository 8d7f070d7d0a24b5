"""The generation limit is set once, in `SamplingParams.max_new_tokens`: the rollout records it in
the batch, and both of its readers (the reward manager's overlong shaping and the Dr.GRPO loss
normaliser `seq_mean_token_sum_norm`) take it from there, so no recipe copies it by hand."""

import pytest
import torch

from rlhf.algos import PPOClipLoss, seq_mean_token_sum_norm
from rlhf.batch import Batch
from rlhf.rewards import RewardManager, exact_match_score
from rlhf.rollout.engine import rollout_batch
from rlhf.rollout.sampling import SamplingParams
from rlhf.trainers.scoring import score_rollout
from rlhf.workers.objectives import PolicyObjective
from rlhf.models.loading import load_tokenizer
from helpers import tiny_model_path

EOS, PAD = 7, 0


def rollout(max_new_tokens: int) -> Batch:
    """Two fixed responses of 6 and 2 tokens (the second ends with EOS), sampled under `max_new_tokens`."""
    prompts = Batch(
        {"input_ids": torch.tensor([[5, 6], [5, 6]]), "attention_mask": torch.ones(2, 2, dtype=torch.long)},
        {"data_source": ["a", "a"], "ground_truth": ["x", "x"], "extra_info": [None, None]},
    )
    responses = torch.tensor([[65, 66, 67, 68, 69, 70], [65, EOS, PAD, PAD, PAD, PAD]])
    return rollout_batch(prompts, responses, torch.zeros(2, 6), SamplingParams(max_new_tokens=max_new_tokens),
                         eos_token_ids=[EOS], pad_token_id=PAD)


def test_changing_only_sampling_max_new_tokens_moves_overlong_shaping_and_the_loss_normaliser():
    tokenizer = load_tokenizer(tiny_model_path())
    reward = RewardManager({"a": exact_match_score}, overlong_buffer_len=4)
    objective = PolicyObjective(policy_loss=PPOClipLoss(aggregate=seq_mean_token_sum_norm))
    penalties, losses = {}, {}
    for limit in (8, 12):
        batch = rollout(limit)
        assert batch.meta["max_new_tokens"] == limit
        scored, _ = score_rollout(batch, tokenizer, reward)
        penalties[limit] = list(scored["reward_extra/overlong_penalty"])
        log_probs = torch.zeros(2, 6)
        batch["advantages"] = torch.ones(2, 6)  # at r = 1 the PPO token loss is -A = -1
        losses[limit], _ = objective(log_probs, None, batch, num_tokens=7.0, num_seqs=2.0)
    # limit 8, buffer 4: the ramp starts after 4 tokens; 6 tokens -> -(6 - 4) / 4 = -0.5, 2 tokens -> 0.
    # limit 12: the ramp starts after 8 tokens, so neither response is penalised.
    assert penalties == {8: [-0.5, 0.0], 12: [0.0, 0.0]}
    # loss = sum of -1 over the 6 + 2 valid tokens / (N_seq = 2) / L_max: -8 / 2 / 8 and -8 / 2 / 12
    assert losses[8].item() == pytest.approx(-0.5)
    assert losses[12].item() == pytest.approx(-1 / 3)


def test_a_batch_without_its_generation_facts_is_an_error_naming_them():
    batch = rollout(8)
    del batch.meta["max_new_tokens"]
    objective = PolicyObjective()
    batch["advantages"] = torch.ones(2, 6)
    with pytest.raises(KeyError, match=r"PolicyObjective needs batch.meta\['max_new_tokens'\].*SamplingParams"):
        objective(torch.zeros(2, 6), None, batch, num_tokens=7.0, num_seqs=2.0)
    with pytest.raises(KeyError, match=r"score_rollout needs batch.meta\['max_new_tokens'\]"):
        score_rollout(batch, load_tokenizer(tiny_model_path()), RewardManager({"a": exact_match_score}))
