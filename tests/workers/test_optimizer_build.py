"""The trainer builds torch optimizers on their fused kernel where the recipe leaves the choice open."""

import functools

import fiddle as fdl
import pytest
import torch

from rlhf.workers.training import ModelTrainer, TrainingSetup, build_optimizer


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in [(64, 48), (48,), (7, 3, 5)]]


@pytest.mark.parametrize("factory, fused", [
    (fdl.build(fdl.Partial(torch.optim.AdamW, lr=1e-3)), True),  # what a recipe's graph builds
    (torch.optim.AdamW, True),  # PolicyWorker's default
    (functools.partial(torch.optim.Adam, lr=1e-3), True),
    (functools.partial(torch.optim.SGD, lr=0.1), None),  # FSDP2 (DTensor) has no rule for fused SGD
    (functools.partial(torch.optim.AdamW, lr=1e-3, fused=False), False),  # the recipe's choice stays
    (functools.partial(torch.optim.AdamW, lr=1e-3, foreach=True), None),
    (lambda ps: torch.optim.AdamW(ps, lr=1e-3), None),  # no `fused` argument to fill in
    (functools.partial(torch.optim.RMSprop, lr=1e-3), None),  # no fused kernel at all
])
def test_fused_only_where_the_choice_is_open(factory, fused):
    optimizer = build_optimizer(factory, _params())
    assert optimizer.param_groups[0].get("fused") == fused


@pytest.mark.parametrize("cls, kwargs", [
    (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.01}),
    (torch.optim.Adam, {"lr": 1e-2, "amsgrad": True}),
])
def test_fused_update_equals_the_loop_up_to_rounding(cls, kwargs):
    """Five steps on the same gradients: the fused kernel's weights equal the per-tensor loop's within
    a few float32 ulps of weights of magnitude ~1 (ulp 1.2e-7), while each step moves them by ~1e-2."""
    loop, fused = _params(), _params()
    opt_loop = cls(loop, **kwargs)
    opt_fused = build_optimizer(functools.partial(cls, **kwargs), fused)
    assert opt_fused.param_groups[0]["fused"] and not opt_loop.param_groups[0]["fused"]
    start = [p.detach().clone() for p in loop]
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        for a, b in zip(loop, fused):
            a.grad = torch.randn(a.shape, generator=g)
            b.grad = a.grad.clone()
        opt_loop.step()
        opt_fused.step()
    for a, b, s in zip(loop, fused, start):
        assert (a - s).abs().median() > 1e-3  # the steps moved the weights far beyond the tolerance
        torch.testing.assert_close(b, a, rtol=0, atol=4e-7)


def test_model_trainer_uses_the_fused_kernel():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    trainer = ModelTrainer(model, fdl.build(fdl.Partial(torch.optim.AdamW, lr=1e-3)),
                           setup=TrainingSetup(strategy="ddp"))
    assert trainer.optimizer.param_groups[0]["fused"] is True
