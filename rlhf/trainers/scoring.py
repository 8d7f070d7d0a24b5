"""Turn generated responses into rewards: decode, score with the reward manager and/or a reward model,
place on tokens."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from rlhf.batch import Batch
from rlhf.rewards.manager import Reward
from rlhf.rewards.model_reward import mix_model_scores, place_on_last_token


def decode_responses(batch: Batch, tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """The text of each response's valid tokens (special tokens such as EOS dropped)."""
    responses, mask = batch["responses"], batch["response_mask"].bool()
    return tokenizer.batch_decode([r[m].tolist() for r, m in zip(responses, mask)], skip_special_tokens=True)


def score_rollout(
    batch: Batch,
    tokenizer: PreTrainedTokenizerBase,
    reward: Reward | None,  # the rule reward; None: a reward model alone scores
    reward_model=None,  # WorkerGroup of RewardModelWorker; None: rule scores only
    reward_model_weight: float = 1.0,  # score = rule_weight * rule + reward_model_weight * rm_score
    rule_weight: float = 1.0,  # the rule's weight beside a reward model (0: reported, not trained on)
) -> tuple[Batch, dict]:
    """`token_level_scores` (B, T): each response's score on its last valid (trained) token, 0 elsewhere.

    The text scored is the decoded response, or the rollout's own `response_text` where it brings
    one (a multi-turn rollout: its final assistant message, not the turns and tool results before it).
    """
    if reward is None and reward_model is None:
        raise ValueError("score_rollout needs a rule reward, a reward model, or both; it got neither")
    texts = list(batch["response_text"]) if "response_text" in batch else decode_responses(batch, tokenizer)
    mask = batch["response_mask"]
    result = Batch({}, {"response_text": texts})
    metrics: dict[str, float] = {}
    rule = None
    if reward is not None:
        lengths = mask.sum(dim=1).tolist()  # for overlong shaping (DAPO), with the generation limit
        out = reward(texts, batch["data_source"], batch["ground_truth"], batch["extra_info"], response_lengths=lengths,
                     max_new_tokens=batch.require_meta("max_new_tokens", "score_rollout"))
        rule = torch.tensor(out.scores, dtype=torch.float32)
        for name, column in out.extras.items():
            result[f"reward_extra/{name}"] = column
        metrics.update(out.metrics)
    if reward_model is None:
        result["scores"], result["token_level_scores"] = rule, place_on_last_token(rule, mask)
        return result, metrics
    # needs the prompts' `raw_prompt` column (PromptDataset(raw_prompt=True))
    rm_scores = reward_model.score(batch.union(Batch({}, {"response_text": texts})))["rm_scores"]
    mixed, rm_metrics = mix_model_scores(rule, rm_scores, mask, model_weight=reward_model_weight,
                                         rule_weight=rule_weight)
    metrics.update(rm_metrics)
    return Batch({**result.tensors, **mixed.tensors}, {**result.non_tensors, **mixed.non_tensors}), metrics
