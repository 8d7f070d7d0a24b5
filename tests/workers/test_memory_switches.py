"""Memory switches: gradient checkpointing recomputes activations and changes nothing else; no gradient
outlives an update."""

import torch

from helpers import grpo_worker, scored_rollout


def _layer_forwards(worker) -> list[int]:
    calls = [0]
    layer = worker.trainer.unwrapped().model.layers[0].self_attn  # inside the checkpointed forward
    layer.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_gradient_checkpointing_recomputes_and_gives_the_same_update():
    sgd = lambda params: torch.optim.SGD(params, lr=0.1)  # noqa: E731
    plain = grpo_worker(optimizer=sgd, shared_prefix=False)
    checkpointed = grpo_worker(optimizer=sgd, gradient_checkpointing=True)
    assert checkpointed.shared_prefix is False  # the shared-prefix forward needs the KV cache it turns off
    batch = scored_rollout(plain)
    calls_plain, calls_ckpt = _layer_forwards(plain), _layer_forwards(checkpointed)
    a, b = plain.update(batch), checkpointed.update(batch)
    assert calls_ckpt[0] == 2 * calls_plain[0]  # every layer runs again in backward
    assert a["actor/pg_loss"] == b["actor/pg_loss"]
    pa, pb = plain.parameters_digest(), checkpointed.parameters_digest()
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], rtol=1e-5, atol=1e-6)


def test_no_gradient_outlives_an_update():
    """Gradients are a full copy of the trained weights: freed when the update returns, not kept through
    the next rollout (SmolLM2: 0.5 GiB of the generate and log-prob phases' peak)."""
    worker = grpo_worker(optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3), mini_batches=2)
    before = worker.parameters_digest()
    worker.update(scored_rollout(worker))
    params = list(worker.trainer.model.parameters())
    assert all(p.grad is None for p in params)
    after = worker.parameters_digest()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it did train
