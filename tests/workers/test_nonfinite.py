"""A NaN loss never reaches the weights: the step is skipped and counted."""

import torch

from rlhf.batch import Batch
from rlhf.workers.training import ModelTrainer, TrainingSetup


def test_nonfinite_gradient_skips_the_step():
    model = torch.nn.Linear(3, 1)
    trainer = ModelTrainer(model, lambda p: torch.optim.SGD(p, lr=0.1),
                           setup=TrainingSetup(micro_batch_size=2), prefix="actor")
    before = {k: v.clone() for k, v in trainer.unwrapped().state_dict().items()}
    batch = Batch({"x": torch.randn(4, 3), "response_mask": torch.ones(4, 2)})

    def nan_loss(micro, num_tokens, num_seqs):
        return trainer.model(micro["x"]).sum() * float("nan"), {"actor/pg_loss": float("nan")}

    metrics = trainer.update(batch, nan_loss)
    assert metrics["actor/nonfinite_steps"] == 1.0
    for k, v in trainer.unwrapped().state_dict().items():
        assert torch.equal(v, before[k])

    def good_loss(micro, num_tokens, num_seqs):
        return trainer.model(micro["x"]).pow(2).sum() / num_seqs, {}

    assert trainer.update(batch, good_loss)["actor/nonfinite_steps"] == 0.0
    assert not torch.equal(trainer.unwrapped().weight, before["weight"])


def test_micro_batches_sum_to_the_full_batch_gradient():
    torch.manual_seed(0)
    x = torch.randn(6, 3)
    grads = []
    for micro in (6, 2):
        model = torch.nn.Linear(3, 1)
        torch.nn.init.constant_(model.weight, 0.5)
        torch.nn.init.zeros_(model.bias)
        trainer = ModelTrainer(model, lambda p: torch.optim.SGD(p, lr=1.0),
                               setup=TrainingSetup(micro_batch_size=micro, grad_clip=None))
        batch = Batch({"x": x, "response_mask": torch.ones(6, 1)})
        trainer.update(batch, lambda m, nt, ns: (trainer.model(m["x"]).pow(2).sum() / ns, {}))
        grads.append(trainer.unwrapped().weight.detach().clone())
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
