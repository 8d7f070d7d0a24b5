"""Token-budget micro-batches: trimming, splitting, order restoration, packing, and the update they give."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlhf.batch import Batch
from rlhf.rollout.hf_engine import position_ids_from_mask
from rlhf.workers.micro_batches import (
    pack, packed_logits, restore_order, row_spans, row_units, split_by_tokens, trim_padding, unpack,
)
from helpers import tiny_model_path

PAD = 0


def ragged_batch(prompt_lens, response_lens, group=1, seed=0, vocab=200):
    """A batch in the rollout layout: [left-padded prompt | right-padded response], per-token columns (B, R).

    Rows i*group .. (i+1)*group-1 share prompt i and uid i (a GRPO group).
    """
    g = torch.Generator().manual_seed(seed)
    b = len(response_lens)
    p, r = max(prompt_lens), max(max(response_lens), 1)
    prompts = torch.full((b, p), PAD)
    prompt_mask = torch.zeros(b, p, dtype=torch.long)
    for u, n in enumerate(prompt_lens):
        ids = torch.randint(1, vocab, (n,), generator=g)
        for i in range(u * group, (u + 1) * group):
            prompts[i, p - n :], prompt_mask[i, p - n :] = ids, 1
    responses = torch.full((b, r), PAD)
    response_mask = torch.zeros(b, r, dtype=torch.long)
    for i, n in enumerate(response_lens):
        responses[i, :n], response_mask[i, :n] = torch.randint(1, vocab, (n,), generator=g), 1
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    return Batch(
        {
            "prompts": prompts,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids_from_mask(attention_mask),
            "advantages": torch.randn(b, r, generator=g) * response_mask,
            "old_log_probs": -torch.rand(b, r, generator=g) * response_mask,
        },
        {"uid": [f"u{i // group}" for i in range(b)]},
        {"temperature": 1.0, "max_new_tokens": max(response_lens)},  # what a rollout records
    )


def widen(batch, left, right):
    """`batch` with `left` all-padding prompt columns and `right` all-padding response columns added."""
    p = batch["prompts"].shape[1]
    r = batch["responses"].shape[1]
    tensors = {}
    for k, v in batch.tensors.items():
        if v.shape[1] == p + r:
            v = torch.nn.functional.pad(v, (left, right))
        elif k == "prompts":
            v = torch.nn.functional.pad(v, (left, 0))
        else:
            v = torch.nn.functional.pad(v, (0, right))
        tensors[k] = v
    tensors["position_ids"] = position_ids_from_mask(tensors["attention_mask"])
    return Batch(tensors, dict(batch.non_tensors), dict(batch.meta))


@st.composite
def ragged(draw):
    group = draw(st.integers(1, 4))
    groups = draw(st.integers(1, 6))
    prompt_lens = draw(st.lists(st.integers(1, 12), min_size=groups, max_size=groups))
    response_lens = draw(st.lists(st.integers(0, 15), min_size=groups * group, max_size=groups * group))
    batch = ragged_batch(prompt_lens, response_lens, group=group, seed=draw(st.integers(0, 99)))
    return widen(batch, draw(st.integers(0, 3)), draw(st.integers(0, 3)))


def real_tokens(batch):
    """Each row's real (non-pad) tokens, with their positions: what trimming must keep."""
    mask = batch["attention_mask"].bool()
    return [(batch["input_ids"][i][mask[i]].tolist(), batch["position_ids"][i][mask[i]].tolist()) for i in range(len(batch))]


# ------------------------------------------------------------------ trimming
def test_trim_padding_by_hand():
    # prompts of 2 and 3 tokens, responses of 1 and 2 tokens, widened to P = 3 + 2, R = 2 + 2:
    # 2 leading prompt columns and 2 trailing response columns are padding in every row.
    batch = widen(ragged_batch([2, 3], [1, 2]), 2, 2)
    assert batch["input_ids"].shape == (2, 9) and batch["responses"].shape == (2, 4)
    trimmed = trim_padding(batch)
    assert trimmed["input_ids"].shape == (2, 3 + 2)
    assert trimmed["prompts"].shape == (2, 3) and trimmed["responses"].shape == (2, 2)
    assert trimmed["advantages"].shape == (2, 2)
    assert trimmed["position_ids"].tolist() == [[0, 0, 1, 2, 2], [0, 1, 2, 3, 4]]  # cumsum(mask) - 1: pad repeats the last
    assert real_tokens(trimmed) == real_tokens(batch)
    assert trim_padding(trimmed) is trimmed  # nothing left to trim


@given(ragged())
def test_trimming_keeps_every_real_token_and_column_alignment(batch):
    trimmed = trim_padding(batch)
    assert real_tokens(trimmed) == real_tokens(batch)
    r = trimmed["responses"].shape[1]
    p = trimmed["input_ids"].shape[1] - r
    assert torch.equal(trimmed["input_ids"][:, p:], trimmed["responses"])
    assert torch.equal(trimmed["input_ids"][:, :p], trimmed["prompts"])
    assert torch.equal(trimmed["attention_mask"][:, p:], trimmed["response_mask"])
    for key in ("advantages", "old_log_probs"):  # per-response-token columns keep their values
        assert torch.equal(trimmed[key], batch[key][:, :r])
    assert batch[key][:, r:].abs().sum() == 0
    assert list(trimmed["uid"]) == list(batch["uid"])


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_trimmed_forward_gives_the_same_log_probs(attn):
    from transformers import AutoModelForCausalLM

    from rlhf.workers.policy import response_log_probs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path(), attn_implementation=attn).eval()
    batch = ragged_batch([3, 7, 5], [2, 6, 1, 0, 4, 3], group=2, seed=1)
    batch = widen(batch, 2, 3)
    with torch.no_grad():
        full, _ = response_log_probs(model, batch, 1.0)
        trimmed = trim_padding(batch)
        assert trimmed["input_ids"].shape[1] < batch["input_ids"].shape[1]
        part, _ = response_log_probs(model, trimmed, 1.0)
    mask = trimmed["response_mask"].bool()
    torch.testing.assert_close(part[mask], full[:, : part.shape[1]][mask], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ splitting
def padded_size(part):
    return part["input_ids"].shape[0] * part["input_ids"].shape[1]


@given(ragged(), st.integers(8, 120), st.booleans())
def test_split_by_tokens_properties(batch, max_tokens, keep_groups):
    split = split_by_tokens(batch, max_tokens, keep_groups=keep_groups)
    # every row exactly once
    assert sorted(split.order.tolist()) == list(range(len(batch)))
    assert sum(len(p) for p in split.parts) == len(batch)
    # the budget holds, except for micro-batches of one over-budget row (and they are counted)
    over = [p for p in split.parts if padded_size(p) > max_tokens]
    assert all(len(p) == 1 for p in over) and len(over) == split.over_budget
    # each part is trimmed: no all-padding prompt column on the left, none on the right of the responses
    for part in split.parts:
        r = part["responses"].shape[1]
        am = part["attention_mask"]
        assert am[:, 0].any() or part["input_ids"].shape[1] - r == 1
        assert am[:, -1].any() or r == 1
    # restore_order inverts the split, for per-token results and for non-tensor columns
    width = batch["responses"].shape[1]
    restored = restore_order([p["advantages"] for p in split.parts], split.order, width)
    assert torch.equal(restored, batch["advantages"])
    uids = np.concatenate([p["uid"] for p in split.parts])
    assert list(uids[np.argsort(split.order)]) == list(batch["uid"])
    # the parts hold the original rows' real tokens
    tokens = [t for p in split.parts for t in real_tokens(p)]
    assert [tokens[j] for j in np.argsort(split.order)] == real_tokens(batch)


@given(ragged(), st.integers(8, 120), st.integers(1, 30))
def test_min_micro_batches_is_met_and_keeps_every_row(batch, max_tokens, at_least):
    split = split_by_tokens(batch, max_tokens, min_micro_batches=at_least)
    assert len(split.parts) >= min(at_least, len(batch))
    assert sorted(split.order.tolist()) == list(range(len(batch)))


def test_groups_stay_together_when_the_budget_allows():
    # 4 groups of 4 rows; prompts of 10 tokens; the widest group is 10 + 8 = 18 wide, 72 tokens
    batch = ragged_batch([10, 10, 10, 10], [1, 8, 2, 3, 5, 5, 5, 5, 2, 2, 2, 2, 7, 1, 1, 1], group=4)
    split = split_by_tokens(batch, max_tokens=4 * 18)
    for part in split.parts:
        assert len(set(part["uid"])) == 1 or len(part) % 4 == 0  # whole groups only
    assert split.over_budget == 0
    # a budget below a group's size splits the group into rows, longest first
    small = split_by_tokens(batch, max_tokens=2 * 18)
    assert all(padded_size(p) <= 2 * 18 for p in small.parts)
    assert len(small.parts) > len(split.parts)
    # keep_groups=False places rows by length alone: less padding, groups split
    free = split_by_tokens(batch, max_tokens=4 * 18, keep_groups=False)
    assert sum(map(padded_size, free.parts)) < sum(map(padded_size, split.parts))
    assert any(len(set(p["uid"])) > 1 and len(p) % 4 for p in free.parts)


@given(st.lists(st.integers(1, 12), min_size=2, max_size=12).filter(lambda x: len(x) % 2 == 0),
       st.integers(4, 80), st.integers(1, 8))
def test_whole_units_are_never_split(response_lens, max_tokens, at_least):
    """Preference pairs (units of 2 rows sharing a uid) stay adjacent in one micro-batch, over budget or not,
    and the split for FSDP's equal forward count cuts between units only."""
    batch = ragged_batch([3 + 2 * k for k in range(len(response_lens) // 2)], response_lens, group=2)
    split = split_by_tokens(batch, max_tokens, min_micro_batches=at_least, whole_units=True)
    for part in split.parts:
        uid = list(part["uid"])
        assert len(uid) % 2 == 0 and all(uid[i] == uid[i + 1] for i in range(0, len(uid), 2))
    assert len(split.parts) >= min(at_least, len(batch) // 2)
    assert sorted(split.order.tolist()) == list(range(len(batch)))


def test_a_row_over_budget_goes_alone_and_is_counted():
    batch = ragged_batch([20, 2], [30, 1, 1, 1], group=2)  # row 0 alone is 20 + 30 = 50 wide
    split = split_by_tokens(batch, max_tokens=40)
    assert split.over_budget == 1
    assert [len(p) for p in split.parts][0] == 1 and split.order[0] == 0


def test_row_units_follow_uid_or_prompt():
    batch = ragged_batch([3, 4, 3], [1, 2, 3, 4, 5, 6], group=2)
    assert [u.tolist() for u in row_units(batch)] == [[0, 1], [2, 3], [4, 5]]
    batch.non_tensors.pop("uid")
    assert [u.tolist() for u in row_units(batch)] == [[0, 1], [2, 3], [4, 5]]  # same prompt tokens


def test_row_spans_by_hand():
    batch = ragged_batch([2, 4], [3, 0], group=1)  # P = 4, R = 3
    prompt, response = row_spans(batch)
    assert prompt.tolist() == [2, 4] and response.tolist() == [3, 0]


# ------------------------------------------------------------------ packing
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_packed_forward_equals_the_padded_forward(attn):
    from transformers import AutoModelForCausalLM

    from rlhf.algos import log_probs_from_logits
    from rlhf.workers.policy import response_log_probs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path(), attn_implementation=attn).eval()
    batch = ragged_batch([3, 7, 5], [2, 6, 1, 0, 4, 3], group=2, seed=3)
    with torch.no_grad():
        padded, _ = response_log_probs(model, batch, 1.0)
        packed = pack(batch)
        assert packed.input_ids.shape == (1, int(batch["attention_mask"].sum()))
        logits = packed_logits(model, packed)
        per_token = log_probs_from_logits(logits[None].float(), packed.targets[None])[0]
        log_probs = unpack(per_token, packed)
        # the trap packed_logits avoids: with the cache on, rows attend to each other
        leaky = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=True).logits[0]
    mask = batch["response_mask"].bool()
    assert packed.targets.numel() == int(mask.sum())
    torch.testing.assert_close(log_probs[mask], padded[mask], atol=1e-5, rtol=1e-5)
    assert (log_probs[~mask] == 0).all()
    assert (leaky[packed.logits_index] - logits).abs().max() > 1e-2


# ------------------------------------------------ the update: tokens vs rows
class TokenBudgetBatch(Batch):
    """A Batch whose micro-batch split is `split_by_tokens`: feeds ModelTrainer.update token-budget
    micro-batches without changing it. Level 0 is the update's batch, whose `split` cuts the
    PPO mini-batches by rows as usual; level 1 is a mini-batch, whose `split` is by tokens."""

    max_tokens = 0
    level = 0

    def _like(self, batch: Batch, level: int) -> "TokenBudgetBatch":
        out = TokenBudgetBatch(batch.tensors, batch.non_tensors, batch.meta)
        out.max_tokens, out.level = self.max_tokens, level
        return out

    def to(self, device):
        return self._like(super().to(device), self.level)

    def split(self, size):
        if self.level == 0:
            return [self._like(b, 1) for b in super().split(size)]
        return split_by_tokens(self, self.max_tokens).parts


@pytest.mark.parametrize("aggregate", ["token_mean", "seq_mean_token_mean"])
def test_token_budget_update_equals_the_row_count_update(aggregate):
    from transformers import AutoModelForCausalLM

    from rlhf.algos import KLLoss, PPOClipLoss, aggregation, kl_k3
    from rlhf.workers.objectives import PolicyObjective
    from rlhf.workers.policy import response_log_probs
    from rlhf.workers.training import ModelTrainer, TrainingSetup

    agg = getattr(aggregation, aggregate)
    objective = PolicyObjective(PPOClipLoss(aggregate=agg), kl_loss=KLLoss(estimator=kl_k3, coef=0.1, aggregate=agg))
    prompt_lens = [4, 11, 6, 9, 3, 12]
    response_lens = [1, 7, 2, 9, 3, 3, 8, 1, 0, 5, 2, 6, 4, 4, 9, 1, 2, 2, 7, 3, 5, 1, 6, 2]
    batch = ragged_batch(prompt_lens, response_lens, group=4, seed=5)
    batch["ref_log_probs"] = batch["old_log_probs"] - 0.1 * batch["response_mask"]

    def train(data, micro_batch_size):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
        trainer = ModelTrainer(model, lambda ps: torch.optim.AdamW(ps, lr=1e-3),
                               setup=TrainingSetup(strategy="ddp", micro_batch_size=micro_batch_size, mini_batches=2))
        seen = []

        def micro_loss(micro, num_tokens, num_seqs):
            seen.append(tuple(micro["input_ids"].shape))
            log_probs, entropy = response_log_probs(trainer.model, micro, 1.0, with_entropy=True)
            return objective(log_probs, entropy, micro, num_tokens=num_tokens, num_seqs=num_seqs)

        metrics = trainer.update(data, micro_loss)
        return {k: v.detach().clone() for k, v in trainer.unwrapped().state_dict().items()}, metrics, seen

    rows, row_metrics, row_shapes = train(batch, micro_batch_size=3)
    tokens_batch = TokenBudgetBatch(batch.tensors, batch.non_tensors, batch.meta)
    tokens_batch.max_tokens = 64
    tokens, token_metrics, token_shapes = train(tokens_batch, micro_batch_size=10**6)
    assert all(b * t <= 64 for b, t in token_shapes)  # really cut by tokens (all rows here fit the budget)
    assert sum(b * t for b, t in token_shapes) < sum(b * t for b, t in row_shapes)  # and less padding
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_path()).state_dict()
    for k in rows:
        torch.testing.assert_close(tokens[k], rows[k], atol=2e-6, rtol=1e-5, msg=lambda m: f"{k}: tokens != rows: {m}")
    moved = sum(int((rows[k] != initial[k]).sum()) for k in rows) / sum(v.numel() for v in rows.values())
    assert moved > 0.9  # AdamW moved (almost) every weight, so the comparison compares updates
    assert row_metrics["actor/grad_norm"] == pytest.approx(token_metrics["actor/grad_norm"], rel=1e-5)
    assert math.isfinite(row_metrics["actor/grad_norm"]) and row_metrics["actor/grad_norm"] > 0
