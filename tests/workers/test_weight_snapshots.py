"""Weights to a rollout group: snapshots pack and unpack exactly (bf16 included, also through a pickle as
Ray's object store makes), the broadcast transport serves the versions asked for, and a rollout worker
generates with the weights it was given (its samples change with them and carry their version)."""

import pickle
import threading

import pytest
import torch

from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.rollout.engine import named_weights
from rlhf.rollout.hf_engine import HFEngine
from rlhf.rollout.sampling import SamplingParams
from rlhf.workers.rollout import RolloutWorker
from rlhf.workers.weight_sync import BroadcastReceiver, BroadcastSender, snapshot
from helpers import tiny_model_path


def named(seed: int = 0):
    return list(named_weights(load_causal_lm(tiny_model_path(seed=seed))))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_snapshot_unpacks_to_the_weights_it_packed_also_after_a_pickle(dtype):
    weights = named()
    snap = snapshot(weights, version=3, dtype=dtype, device="cpu")
    assert snap.flat.dtype == getattr(torch, dtype) and snap.flat.dim() == 1 and snap.version == 3
    back = pickle.loads(pickle.dumps(snap))  # what Ray's object store does (as a flat uint8 numpy buffer)
    for s in (snap, back):
        assert [n for n, _ in s.named()] == [n for n, _ in weights]
        for (name, got), (_, want) in zip(s.named(), weights):
            assert torch.equal(got, want.to(getattr(torch, dtype))), name
    assert snapshot(iter(weights), 0, dtype, "cpu", keep=False) is None  # a non-main rank only takes part


def test_broadcast_serves_each_rollout_rank_the_version_it_asks_for():
    """Rank 0 of the policy keeps versions 0..2 (then drops 0); two rollout ranks receive 1 then 2 by broadcast."""
    sender = BroadcastSender(receivers=2, device=torch.device("cpu"))
    versions = {v: snapshot([("w", torch.full((3, 2), float(v)))], v, "float32", "cpu") for v in range(3)}
    got: dict[int, list] = {0: [], 1: []}
    errors = []

    def rollout_rank(rank):
        try:
            receiver = BroadcastReceiver(sender.address, rank, 2, torch.device("cpu"))
            for v in (1, 2):
                snap = receiver.receive(v)
                got[rank].append((snap.version, dict(snap.named())["w"].clone()))
            receiver.close()
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    ranks = [threading.Thread(target=rollout_rank, args=(r,)) for r in (0, 1)]
    for t in ranks:
        t.start()
    for v in range(3):
        sender.publish(versions[v], keep_from=1)  # version 0 is dropped once 1 is out
    for t in ranks:
        t.join(timeout=60)
    assert not errors, errors
    assert sorted(sender._snapshots) == [1, 2]
    for rank in (0, 1):
        assert [(v, float(w.mean())) for v, w in got[rank]] == [(1, 1.0), (2, 2.0)]
    sender._thread.join(timeout=10)
    assert not sender._thread.is_alive() and sender.error is None  # the receivers' close stopped it
    sender.close()


def prompts():
    data = PromptDataset(arithmetic_rows(4, seed=0), load_tokenizer(tiny_model_path()))
    return data.collate(range(4))


def test_a_rollout_worker_generates_with_the_weights_it_is_given():
    """A sync must change what the engine generates (the peers' bug: reloading the base model after a sync)."""
    worker = RolloutWorker(tiny_model_path())
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=8)
    before = worker.generate(prompts(), greedy, seed=0)
    assert before["policy_version"].tolist() == [0] * 4

    worker.load_weights(snapshot(named(seed=1), version=7, dtype="float32", device="cpu"))
    after = worker.generate(prompts(), greedy, seed=0)
    other = HFEngine(tiny_model_path(seed=1)).generate(prompts(), greedy)
    assert after["policy_version"].tolist() == [7] * 4
    assert torch.equal(after["responses"], other["responses"])
    torch.testing.assert_close(after["rollout_log_probs"], other["rollout_log_probs"], atol=1e-5, rtol=0)
    # a tiny random model may pick the same greedy tokens with other weights, never with the same log-probs (±1e-5)
    assert float((before["rollout_log_probs"] - after["rollout_log_probs"]).abs().max()) > 1e-3
    sampled = SamplingParams(n=2, temperature=1.0, max_new_tokens=8)
    assert torch.equal(worker.generate(prompts(), sampled, seed=5)["responses"],
                       worker.generate(prompts(), sampled, seed=5)["responses"])  # a seed fixes the samples


def test_a_snapshot_in_another_dtype_is_refused():
    worker = RolloutWorker(tiny_model_path())
    with pytest.raises(ValueError, match="a snapshot in bfloat16 for an engine in float32"):
        worker.load_weights(snapshot(named(), version=1, dtype="bfloat16", device="cpu"))
