"""DPOObjective through the real PolicyWorker: one update equals the loss written out by hand; pairs are never
split whatever the micro-batching; a cached reference equals the worker's own; FSDP2 (1 and 2 ranks), LoRA."""

import pytest
import torch
import torch.nn.functional as F

from helpers import tiny_model_path
from rlhf.algos.preference import DPOLoss, IPOLoss, SimPOLoss
from rlhf.batch import Batch
from rlhf.data.preferences import PreferenceDataset
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.workers.lora import LoRA
from rlhf.workers.objectives import DPOObjective
from rlhf.workers.policy import PolicyWorker
from rlhf.workers.training import TrainingSetup

SGD = lambda p: torch.optim.SGD(p, lr=0.5)  # noqa: E731 - the update is lr * gradient: parameters compare gradients


def pairs(n=4):
    """Pairs of ragged lengths (prompts and both sides), so micro-batches trim differently."""
    return [{"prompt": [{"role": "user", "content": f"{k} + {k * 7}" + "?" * k}],
             "chosen": [{"role": "assistant", "content": f"it is {k * 8}" + "!" * (k % 3)}],
             "rejected": [{"role": "assistant", "content": f"no idea {'really ' * (k % 2)}"}],
             "margin": 0.1 * k} for k in range(n)]


@pytest.fixture(scope="module")
def batch():
    return PreferenceDataset(pairs(), load_tokenizer(tiny_model_path())).collate(range(4))


def worker(loss=DPOLoss(beta=0.5), **training):
    path = tiny_model_path()
    setup = TrainingSetup(**{"micro_batch_size": 8, "grad_clip": None, **training})
    ref = path if loss.requires_reference else None
    return PolicyWorker(path, objective=DPOObjective(loss), ref_model_path=ref, optimizer=SGD, training=setup)


def by_hand(batch: Batch, loss) -> dict[str, torch.Tensor]:
    """The parameters after one SGD step on the mean per-pair loss, computed with plain transformers."""
    model = load_causal_lm(tiny_model_path())
    ref = load_causal_lm(tiny_model_path()).requires_grad_(False)
    r = batch["responses"].shape[1]

    def row_logps(m):
        logits = m(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   position_ids=batch["position_ids"]).logits[:, -r - 1 : -1]
        per_token = F.log_softmax(logits.float(), dim=-1).gather(-1, batch["responses"][..., None])[..., 0]
        return (per_token * batch["response_mask"]).sum(dim=1)

    from rlhf.algos.preference import PairLogProbs

    tokens = batch["response_mask"].sum(dim=1).float()
    pairs_ = PairLogProbs.from_rows(row_logps(model), tokens, row_logps(ref), batch["margin"])
    loss(pairs_).losses.mean().backward()
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    return {k: v.detach() for k, v in model.state_dict().items()}


def max_diff(a, b):
    return max(float((a[k] - b[k]).abs().max()) for k in b)


@pytest.mark.parametrize("loss", [DPOLoss(beta=0.5), IPOLoss(beta=0.5), SimPOLoss()], ids=["dpo", "ipo", "simpo"])
def test_one_update_equals_the_loss_written_out(batch, loss):
    w = worker(loss)
    metrics = w.update(batch)
    assert max_diff(w.parameters_digest(), by_hand(batch, loss)) < 1e-6
    if loss.requires_reference:  # policy = reference before the step: every implicit reward is 0
        assert metrics["rewards/chosen"] == 0.0 and metrics["rewards/margins"] == 0.0
    for name in ("dpo/loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
                 "logps/chosen", "logps/rejected"):
        assert name in metrics


@pytest.mark.parametrize("training", [
    dict(micro_batch_size=2),  # one pair per micro-batch
    dict(micro_batch_size=3),  # an odd row count: rounded to whole pairs, never a split pair
    dict(max_tokens_per_micro_batch=40),  # token budget below a pair's size: each pair alone, over budget
    dict(max_tokens_per_micro_batch=120),  # pairs packed by length, trimmed
    dict(strategy="fsdp"),  # FSDP2 at world size 1
], ids=["one-pair", "odd-rows", "tiny-budget", "budget", "fsdp"])
def test_micro_batching_never_changes_the_update(batch, training):
    whole = worker()
    whole.update(batch)
    split = worker(**training)
    metrics = split.update(batch)
    assert max_diff(split.parameters_digest(), whole.parameters_digest()) < 1e-6
    assert metrics["actor/micro_batches"] >= 1


def test_metrics_are_exact_means_over_pairs_across_micro_batches(batch):
    one, many = worker(), worker(micro_batch_size=2)
    a, b = one.update(batch), many.update(batch)
    assert b["actor/micro_batches"] == 4.0
    for name in ("dpo/loss", "logps/chosen", "logps/rejected"):
        assert b[name] == pytest.approx(a[name], rel=1e-6), name


def test_a_split_pair_is_refused(batch):
    torn = batch.index([0, 1, 2])  # pair 1 without its rejected row
    with pytest.raises(ValueError, match="split preference pair|odd number of rows"):
        worker().update(torn)


def test_cached_reference_equals_the_workers_own(batch):
    own, cached = worker(), worker()
    own.update(batch)
    ref = cached.compute_ref_log_probs(batch)["ref_log_probs"]
    cached.update(batch.union(Batch({"ref_logps": (ref * batch["response_mask"]).sum(dim=1)})))
    assert max_diff(own.parameters_digest(), cached.parameters_digest()) < 1e-6


def test_lora_reference_is_the_base_with_the_adapter_disabled(batch):
    path = tiny_model_path()
    w = PolicyWorker(path, objective=DPOObjective(DPOLoss(beta=0.5)), ref_model_path=path, adapter=LoRA(rank=4),
                     optimizer=lambda p: torch.optim.AdamW(p, lr=0.05), training=TrainingSetup(micro_batch_size=8))
    assert w.ref_is_base and w.parameter_bytes()["reference"] == 0  # no second model
    first = w.update(batch)
    assert first["rewards/margins"] == 0.0  # B = 0 at the start: the adapted model is the base
    for _ in range(5):
        last = w.update(batch)
    assert last["rewards/margins"] > 0.1 and last["rewards/accuracies"] > 0.5  # the adapter learns the pairs
