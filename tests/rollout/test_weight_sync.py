"""The weight-sync guard: after every sync the engine must hold what it was sent, or WeightSyncError.

Two faults are injected into the transformers engine with its own copy of the weights (a real
sync, as vLLM's): a sync that drops the tensors, and TRL's sleep-mode bug (the weights are loaded,
then waking the KV cache restores the pre-sleep copy). Both must stop the run at the first
rollout after an update; the real engine, in float32 and in bfloat16, must pass.
"""

import functools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import tiny_model_path
from rlhf.algos import PPOClipLoss
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.rollout import HFEngine, SamplingParams
from rlhf.rollout.engine import (
    DIGEST_SAMPLE, SyncCheck, WeightDigest, WeightSyncError, digest_sample, named_weights, sample_digest,
)
from rlhf.workers.objectives import PolicyObjective
from rlhf.workers.policy import PolicyWorker
from rlhf.workers.training import TrainingSetup

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6)


class DroppingEngine(HFEngine):
    """Fault: the sync consumes the stream and loads nothing."""

    sharing = None  # always its own copy

    def update_weights(self, weights):
        for _ in weights:
            pass


class WakeRestoresOldWeights(HFEngine):
    """Fault (TRL's sleep mode): sleep keeps a backup, the sync loads into the live weights, and
    waking the KV cache copies the backup back over them."""

    sharing = None

    def sleep(self):
        self.backup = {k: v.clone() for k, v in self.model.state_dict().items()}

    def wake_up(self, tags=None):
        if getattr(self, "backup", None) is not None and (tags is None or "kv_cache" in tags):
            self.model.load_state_dict(self.backup)
            self.backup = None


def worker_with(engine):
    sgd = functools.partial(torch.optim.SGD, lr=1.0)  # large steps: the weights clearly move
    return PolicyWorker(tiny_model_path(), objective=PolicyObjective(policy_loss=PPOClipLoss()), optimizer=sgd,
                        engine=engine, training=TrainingSetup(micro_batch_size=16, grad_clip=None))


def one_update(worker):
    prompts = PromptDataset(arithmetic_rows(4, seed=0), worker.tokenizer).collate(range(4))
    torch.manual_seed(0)
    batch = worker.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=6))
    batch["advantages"] = torch.randn(len(batch), 1, generator=torch.Generator().manual_seed(0)) * batch["response_mask"]
    worker.update(batch)
    return prompts


@pytest.mark.parametrize("fault", [DroppingEngine, WakeRestoresOldWeights])
def test_a_sync_that_leaves_the_old_weights_is_an_error(fault):
    worker = worker_with(functools.partial(fault, dtype="float32"))
    prompts = one_update(worker)
    with pytest.raises(WeightSyncError, match=rf"\({fault.__name__}\) did not take the actor's weights"):
        worker.generate(prompts, GREEDY)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_real_sync_passes_the_check_and_the_engine_follows_the_actor(dtype):
    worker = worker_with(functools.partial(HFEngine, dtype=dtype))
    assert not worker.engine.shares_weights and worker.engine.model.dtype == getattr(torch, dtype)
    prompts = one_update(worker)
    check = SyncCheck()
    worker.engine.update_weights(check.tap(named_weights(worker.trainer.unwrapped())))
    assert check.verify(worker.engine) == len(list(worker.trainer.unwrapped().parameters()))  # all compared
    out = worker.generate(prompts, GREEDY)  # the worker's own sync, checked inside
    if dtype == "float32":  # the engine's copy answers as the actor itself
        actor = HFEngine.sharing(worker.trainer.unwrapped(), worker.tokenizer).generate(prompts, GREEDY)
        assert torch.equal(out["responses"], actor["responses"])


def test_the_check_compares_in_the_engines_dtype_and_names_what_differs():
    engine = HFEngine(tiny_model_path(), dtype="bfloat16")
    actor = HFEngine(tiny_model_path()).model  # float32 weights, as a trainer holds them
    check = SyncCheck()
    engine.update_weights(check.tap(named_weights(actor)))
    assert check.verify(engine) > 0  # float32 sent, bfloat16 held: equal after the same rounding
    with torch.no_grad():
        engine.model.model.norm.weight[3] += 0.5
    with pytest.raises(WeightSyncError, match=r"1 of the \d+ tensors checked .*\(model\.norm\.weight\)"):
        check.verify(engine)


def test_tensors_held_in_another_shape_are_not_compared():
    engine = HFEngine(tiny_model_path())
    check = SyncCheck()
    list(check.tap([("model.norm.weight", torch.zeros(7))]))  # e.g. a vocabulary padded by the engine
    assert check.verify(engine) == 0


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 3 * DIGEST_SAMPLE), seed=st.integers(0, 2**16), dtype=st.sampled_from(["float32", "bfloat16"]))
def test_the_digest_sees_a_changed_element_and_a_moved_one(n, seed, dtype):
    rng = np.random.default_rng(seed)
    t = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).to(getattr(torch, dtype))
    base = WeightDigest.of(t)
    assert base == WeightDigest.of(t.clone()) and base.shape == (n,) and base.dtype == dtype
    stride = max(1, -(-n // DIGEST_SAMPLE))
    i = int(rng.integers(0, n)) // stride * stride  # an element the sample reads
    changed = t.clone()
    changed[i] = changed[i] * 2 + 1
    assert WeightDigest.of(changed) != base
    if n >= 2 * stride:
        j = (i + stride) % (n // stride * stride)  # another sampled element
        swapped = t.clone()
        swapped[i], swapped[j] = t[j], t[i]
        assert torch.equal(swapped, t) or WeightDigest.of(swapped) != base


def test_the_digest_is_independent_of_summation_order():
    t = torch.randn(1000, 37)
    assert sample_digest(digest_sample(t)) == sample_digest(digest_sample(t.t().contiguous().t()))
    assert sample_digest(digest_sample(t)) == sample_digest(digest_sample(t).flip(0).flip(0))
