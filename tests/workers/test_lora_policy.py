"""LoRA in the policy worker: the reference is the base with the adapter disabled (no second model),
the adapter and a critic's value head start the same for the same seed, a checkpoint holds only what
a resume needs (the adapter's weights, a tied weight once) and resumes exactly."""

import fiddle as fdl
import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from helpers import group_plan, grpo_worker, scored_rollout, tiny_model_path
from rlhf.models.loading import load_causal_lm
from rlhf.workers.policy import SHARED_REFERENCE, response_log_probs

peft = pytest.importorskip("peft")

from rlhf.workers.lora import LoRA, merged  # noqa: E402


def checkpoint_keys(folder) -> set[str]:
    """The model-state keys a DCP checkpoint holds."""
    metadata = FileSystemReader(str(folder / "dcp")).read_metadata()
    return {k.removeprefix("model.") for k in metadata.state_dict_metadata if k.startswith("model.")}


def adam(params):
    return torch.optim.AdamW(params, lr=1e-2)


def test_the_reference_of_a_lora_policy_is_its_base_with_the_adapter_disabled(capsys):
    worker = grpo_worker(adapter=LoRA(rank=4), optimizer=adam)
    assert worker.ref_is_base and worker.ref_model is None  # no second copy of the model
    held = worker.parameter_bytes()
    assert held["reference"] == 0 and held["actor"] > 0
    assert SHARED_REFERENCE in capsys.readouterr().out  # the per-rank log line says so

    batch = scored_rollout(worker)
    worker.update(batch)
    worker.update(batch)  # B moved off zero: the adapted actor differs from the base now
    ref = worker.compute_ref_log_probs(batch)["ref_log_probs"]
    base = load_causal_lm(tiny_model_path()).eval()
    with torch.no_grad():
        want = response_log_probs(base, batch, batch.meta["temperature"])[0]
    mask = batch["response_mask"].bool()
    assert torch.allclose(ref[mask], want[mask], atol=1e-5)
    actor = worker.compute_log_probs(batch)["old_log_probs"]
    assert (actor[mask] - want[mask]).abs().max() > 1e-3  # the adapter is back on for the actor


def test_a_lora_policy_with_another_reference_loads_it():
    other = tiny_model_path(seed=1)
    worker = grpo_worker(adapter=LoRA(rank=4), ref_model_path=other)
    assert not worker.ref_is_base and worker.ref_model is not None


def test_the_plan_shows_the_shared_reference():
    plain = group_plan(2, strategy="fsdp").describe()
    adapted = group_plan(2, strategy="fsdp", adapter=fdl.Config(LoRA, rank=4)).describe()
    assert "reference 0." in plain and SHARED_REFERENCE not in plain
    line = next(x for x in adapted.splitlines() if "strategy" in x)
    assert SHARED_REFERENCE in line and "reference 0." not in line, line


def lora_a(worker) -> dict[str, torch.Tensor]:
    return {k: v for k, v in worker.parameters_digest().items() if "lora_A" in k}


def test_the_adapter_starts_the_same_for_the_same_seed():
    first = lora_a(grpo_worker(adapter=LoRA(rank=4)))
    torch.rand(1000)  # whatever ran before in the process must not matter
    again = lora_a(grpo_worker(adapter=LoRA(rank=4)))
    other = lora_a(grpo_worker(adapter=LoRA(rank=4), seed=1))
    assert first and all(torch.equal(first[k], again[k]) for k in first)
    assert any(not torch.equal(first[k], other[k]) for k in first)


def test_the_value_head_starts_the_same_for_the_same_seed():
    from rlhf.workers.critic import CriticWorker
    from rlhf.workers.training import TrainingSetup

    def head(seed):
        critic = CriticWorker(tiny_model_path(), training=TrainingSetup(seed=seed))
        return critic.trainer.unwrapped().score.weight.detach().clone()

    first = head(0)
    torch.rand(1000)
    assert torch.equal(first, head(0)) and not torch.equal(first, head(1))


def test_a_lora_checkpoint_holds_the_adapter_alone_and_resumes_exactly(tmp_path):
    worker = grpo_worker(adapter=LoRA(rank=4), optimizer=adam)
    batch = scored_rollout(worker)
    worker.update(batch)
    worker.save_state(str(tmp_path / "policy"))
    keys = checkpoint_keys(tmp_path / "policy")
    assert keys and all("lora_" in k for k in keys)  # the frozen base comes from the model path
    hf = {p.name for p in (tmp_path / "policy" / "hf").iterdir()}
    assert {"adapter_config.json", "config.json", "tokenizer_config.json"} <= hf
    worker.update(batch)
    expected = worker.parameters_digest()

    resumed = grpo_worker(adapter=LoRA(rank=4), optimizer=adam, seed=5)  # another init: the checkpoint wins
    resumed.load_state(str(tmp_path / "policy"))
    resumed.update(batch)
    got = resumed.parameters_digest()
    assert all(torch.equal(got[k], expected[k]) for k in expected)  # adapter and AdamW moments restored


def test_a_full_checkpoint_writes_a_tied_weight_once(tmp_path):
    worker = grpo_worker(optimizer=adam)
    worker.update(scored_rollout(worker))
    worker.save_state(str(tmp_path / "policy"))
    keys = checkpoint_keys(tmp_path / "policy")
    assert "model.embed_tokens.weight" in keys and "lm_head.weight" not in keys
    expected = worker.parameters_digest()
    resumed = grpo_worker(optimizer=adam)
    resumed.load_state(str(tmp_path / "policy"))
    got = resumed.parameters_digest()
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    model = resumed.trainer.unwrapped()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied


def test_the_merged_final_model_equals_the_adapted_actor(tmp_path):
    worker = grpo_worker(adapter=LoRA(rank=4), optimizer=adam)
    worker.update(scored_rollout(worker))
    worker.save(str(tmp_path / "final"))
    want = merged(worker.trainer.unwrapped()).state_dict()
    got = load_causal_lm(str(tmp_path / "final")).state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    adapter = load_causal_lm(str(tmp_path / "final-adapter")).state_dict()  # an adapter folder loads merged too
    assert all(torch.allclose(adapter[k], want[k], atol=1e-6) for k in want)
