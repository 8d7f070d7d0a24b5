"""One training step on the real model (SmolLM2-135M-Instruct) moves it the way its objective says.

A GRPO step through the policy worker raises the log-probability of the responses whose advantage
is positive and lowers it for the negative ones; an SFT step lowers the loss of the batch it trained
on. Small on purpose (2 prompts x 4 samples x 8 tokens; 8 SFT examples): each runs in well under
40 s on one idle core (scripts/test_real_model.sh runs them).
"""

import functools

import pytest
import torch

from rlhf.algos import GRPO, PPOClipLoss
from rlhf.algos.advantages import AdvantageInputs
from rlhf.algos.groups import group_ids_from_uids
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.data.sft import SFTDataset
from rlhf.rollout.sampling import SamplingParams
from rlhf.workers.objectives import PolicyObjective, SFTObjective
from rlhf.workers.policy import PolicyWorker

pytestmark = pytest.mark.real_model
ADAM = functools.partial(torch.optim.AdamW, lr=1e-5, weight_decay=0.0)


def _sequence_log_probs(worker: PolicyWorker, batch) -> torch.Tensor:
    """(B,) sum of the response tokens' log-probs under the worker's current weights."""
    log_probs = worker.compute_log_probs(batch)["old_log_probs"]
    return (log_probs * batch["response_mask"]).sum(dim=1)


def test_grpo_step_raises_positive_and_lowers_negative_advantage_responses(smollm2_path):
    worker = PolicyWorker(smollm2_path, objective=PolicyObjective(policy_loss=PPOClipLoss()), optimizer=ADAM)
    prompts = PromptDataset(arithmetic_rows(2, seed=3), worker.tokenizer).collate(range(2))
    torch.manual_seed(0)
    batch = worker.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=8))
    # scores 1, 1, 0, 0 in each group of 4: GRPO gives the first two of every group A > 0, the others A < 0
    scores = torch.tensor([1.0, 1.0, 0.0, 0.0] * 2)
    mask = batch["response_mask"]
    last = mask.sum(dim=1).long() - 1
    rewards = torch.zeros(mask.shape).scatter(1, last[:, None], scores[:, None])
    advantages, _ = GRPO()(AdvantageInputs(token_level_rewards=rewards, response_mask=mask,
                                           group_ids=group_ids_from_uids(batch["uid"])))
    batch["advantages"] = advantages
    positive = advantages[:, 0] > 0
    assert positive.tolist() == [True, True, False, False] * 2

    before = _sequence_log_probs(worker, batch)
    metrics = worker.update(batch)
    after = _sequence_log_probs(worker, batch)
    change = after - before
    assert torch.isfinite(torch.tensor(metrics["actor/pg_loss"]))
    assert (change[positive] > 0).all(), change
    assert (change[~positive] < 0).all(), change
    # clearly beyond float noise: the step moved every response by a visible amount
    assert change.abs().min() > 1e-3, change


def test_sft_step_lowers_the_loss(smollm2_path):
    worker = PolicyWorker(smollm2_path, objective=SFTObjective(), optimizer=ADAM)
    batch = SFTDataset(arithmetic_rows(8, seed=5), worker.tokenizer).collate(range(8))
    before = worker.update(batch)["sft/loss"]  # the loss the step trained on (before its optimizer step)
    after = worker.update(batch)["sft/loss"]  # the same batch after one step
    assert after < 0.95 * before, (before, after)
