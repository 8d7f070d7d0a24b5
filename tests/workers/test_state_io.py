"""Sharded checkpoints (rlhf.workers.state_io) under 2 FSDP2 ranks in Ray: a killed group resumes
bit-identically, each rank writes its own shard, the gathered weights (`final/`, `rlhf export`)
equal the trained ones and load in transformers; a LoRA adapter trained sharded merges to the trained
weights. Plus Accelerate's former format: loads under DDP, refused under FSDP."""

import fiddle as fdl
import pytest
import torch
from transformers import AutoModelForCausalLM

from rlhf.batch import Batch
from rlhf.cli import main
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.trainers.checkpoint import CheckpointManager
from rlhf.workers.state_io import CheckpointFormatError
from helpers import group_plan, grpo_worker, scored_rollout, tiny_model_path


@pytest.fixture(scope="module")
def ray_runtime(shared_ray):
    shared_ray.start()  # the runtime joins the session's cluster
    runtime = RayRuntime(num_cpus=2)
    yield runtime
    runtime.shutdown()


def prompts() -> Batch:
    return PromptDataset(arithmetic_rows(4, seed=3), load_tokenizer(tiny_model_path())).collate(range(4))


def rl_step(group, step: int) -> Batch:
    """Sample (each rank's torch RNG), score with fixed advantages, update; returns the rollout."""
    batch = group.generate(prompts(), SamplingParams(n=2, max_new_tokens=6))
    g = torch.Generator().manual_seed(step)
    batch["advantages"] = torch.randn(len(batch), 1, generator=g) * batch["response_mask"]
    group.update(batch)
    return batch


def assert_same_weights(actual: dict, expected: dict, what: str) -> None:
    assert actual.keys() == expected.keys(), what
    for k in expected:
        assert torch.equal(actual[k], expected[k]), f"{what}: {k} differs"


def fsdp_plan(**worker):
    # AdamW and a schedule, so the optimizer's moments and the LR schedule must be restored too
    return group_plan(2, strategy="fsdp", optimizer=fdl.Partial(torch.optim.AdamW, lr=1e-2),
                      lr_scheduler=fdl.Partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5), **worker)


@pytest.mark.slow
def test_a_killed_fsdp_group_resumes_bit_identically_and_exports(ray_runtime, tmp_path):
    checkpoints = CheckpointManager(tmp_path / "checkpoints")
    group = ray_runtime.start_groups(fsdp_plan())["policy"]
    untrained = load_causal_lm(tiny_model_path()).state_dict()
    group.save(str(tmp_path / "initial"))  # the gathered state of a freshly sharded model is the model
    assert_same_weights(AutoModelForCausalLM.from_pretrained(tmp_path / "initial").state_dict(), untrained, "initial")
    for step in (1, 2):
        rl_step(group, step)
    checkpoints.save(2, lambda folder: group.save_state(str(folder / "policy")), {})
    expected_rollout = rl_step(group, 3)
    (expected,) = group.parameters_digest()[:1]
    ray_runtime.stop_groups()  # ray.kill: both ranks die without a word

    policy = tmp_path / "checkpoints" / "step_00000002" / "policy"
    shards = sorted(p.name for p in (policy / "dcp").glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]  # each rank wrote its own shard
    assert sorted(p.name for p in (policy / "rng").iterdir()) == ["rank_00000.pt", "rank_00001.pt"]
    assert not list(policy.glob("*.safetensors"))  # nothing gathered for resume

    group = ray_runtime.start_groups(fsdp_plan())["policy"]
    folder, _, skipped = checkpoints.resume(lambda f: group.load_state(str(f / "policy")))
    assert folder.name == "step_00000002" and not skipped
    rollout = rl_step(group, 3)
    assert torch.equal(rollout["responses"], expected_rollout["responses"])  # every rank's RNG restored
    rank0, rank1 = group.parameters_digest()
    assert_same_weights(rank0, expected, "resumed vs uninterrupted")  # weights, AdamW moments, LR schedule
    assert_same_weights(rank1, expected, "rank 1")

    checkpoints.save(3, lambda folder: group.save_state(str(folder / "policy")), {})
    group.save(str(tmp_path / "final"))
    assert main(["export", str(tmp_path), str(tmp_path / "exported"), "--step", "3"]) == 0  # the sharded checkpoint
    for name in ("final", "exported"):
        model = AutoModelForCausalLM.from_pretrained(tmp_path / name)
        assert model.config.architectures == ["Qwen2ForCausalLM"]  # not FSDP's wrapper class
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied
        assert_same_weights(model.state_dict(), expected, name)
    ray_runtime.stop_groups()


def test_lora_trained_under_fsdp_saves_an_adapter_that_merges_to_the_trained_weights(tmp_path):
    """In this process (FSDP over a process group of one): the gather-then-save path is the one
    2 ranks take, without starting another Ray group."""
    peft = pytest.importorskip("peft")
    from rlhf.workers.lora import LoRA, merged

    worker = grpo_worker(strategy="fsdp", adapter=LoRA(rank=4), optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
    worker.update(scored_rollout(worker))
    trained = worker.parameters_digest()
    assert any(float(v.abs().max()) > 0 for k, v in trained.items() if "lora_B" in k)  # the adapter learned
    worker.save(str(tmp_path / "final"))

    local = LoRA(rank=4)(load_causal_lm(tiny_model_path()))
    local.load_state_dict(trained)
    want = merged(local).state_dict()  # W + alpha/r B A of the weights the sharded model holds
    assert_same_weights(AutoModelForCausalLM.from_pretrained(tmp_path / "final").state_dict(), want, "merged")
    from_adapter = peft.PeftModel.from_pretrained(load_causal_lm(tiny_model_path()), str(tmp_path / "final-adapter"))
    assert_same_weights(from_adapter.merge_and_unload().state_dict(), want, "base + saved adapter")
    on_its_own = load_causal_lm(str(tmp_path / "final-adapter")).state_dict()  # the adapter names its base
    assert all(torch.allclose(on_its_own[k], want[k], atol=1e-6) for k in want)


@pytest.mark.slow
def test_lora_on_two_fsdp_ranks_uses_the_base_as_reference_and_its_checkpoint_resumes_and_exports(
        ray_runtime, tmp_path, capfd):
    """LoRA sharded over 2 ranks: no reference model is held (the adapter-disabled actor is the reference,
    and its log-probs are the base model's); a checkpoint holds only the adapter's shards, a new group
    resumes it bit-identically, and `rlhf export` merges it into exactly the trained weights."""
    from rlhf.workers.lora import LoRA, merged
    from rlhf.workers.policy import response_log_probs

    adapter = fdl.Config(LoRA, rank=4)
    checkpoints = CheckpointManager(tmp_path / "checkpoints")
    group = ray_runtime.start_groups(fsdp_plan(adapter=adapter))["policy"]
    assert [held["reference"] for held in group.parameter_bytes()] == [0, 0]
    batch = rl_step(group, 1)
    rl_step(group, 2)  # the adapter has moved: the actor is not the base any more
    ref = group.compute_ref_log_probs(batch)["ref_log_probs"]
    with torch.no_grad():
        base = response_log_probs(load_causal_lm(tiny_model_path()).eval(), batch, batch.meta["temperature"])[0]
    mask = batch["response_mask"].bool()
    assert torch.allclose(ref[mask], base[mask], atol=1e-5)
    checkpoints.save(2, lambda folder: group.save_state(str(folder / "policy")), {})
    (at_step_2,) = group.parameters_digest()[:1]
    expected_rollout = rl_step(group, 3)
    (expected,) = group.parameters_digest()[:1]
    ray_runtime.stop_groups()

    policy = tmp_path / "checkpoints" / "step_00000002" / "policy"
    assert sorted(p.name for p in (policy / "dcp").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert (policy / "hf" / "adapter_config.json").is_file()
    group = ray_runtime.start_groups(fsdp_plan(adapter=adapter, seed=7))["policy"]  # another init: the checkpoint wins
    checkpoints.resume(lambda f: group.load_state(str(f / "policy")))
    rollout = rl_step(group, 3)
    assert torch.equal(rollout["responses"], expected_rollout["responses"])
    rank0, rank1 = group.parameters_digest()
    assert_same_weights(rank0, expected, "resumed LoRA vs uninterrupted")
    assert_same_weights(rank1, expected, "rank 1")
    ray_runtime.stop_groups()
    assert "reference = the actor's base with its adapter disabled" in capfd.readouterr().out  # both ranks' lines

    assert main(["export", str(tmp_path), str(tmp_path / "step2"), "--step", "2"]) == 0
    local = LoRA(rank=4)(load_causal_lm(tiny_model_path()))
    local.load_state_dict(at_step_2)
    want = merged(local).state_dict()  # W + alpha/r B A of the weights the ranks held at step 2
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "step2").state_dict()
    assert exported.keys() == want.keys()
    assert all(torch.allclose(exported[k], want[k], atol=1e-6, rtol=0) for k in want)


def test_accelerate_format_loads_under_ddp_and_is_refused_under_fsdp(tmp_path):
    """What rlhf wrote before sharded checkpoints (Accelerator.save_state under DDP)."""
    worker = grpo_worker(strategy="ddp")
    worker.update(scored_rollout(worker))
    folder = tmp_path / "checkpoints" / "step_00000001"
    CheckpointManager(tmp_path / "checkpoints").save(
        1, lambda f: worker.trainer.accelerator.save_state(str(f / "policy"), safe_serialization=True), {})
    (expected,) = [worker.parameters_digest()]

    ddp = grpo_worker(strategy="ddp")
    ddp.load_state(str(folder / "policy"))
    assert_same_weights(ddp.parameters_digest(), expected, "Accelerate format under DDP")

    fsdp = grpo_worker(strategy="fsdp")
    with pytest.raises(CheckpointFormatError, match="Accelerate's former checkpoint format.*strategy='ddp'"):
        CheckpointManager(tmp_path / "checkpoints").resume(lambda f: fsdp.load_state(str(f / "policy")))
    assert folder.is_dir()  # intact, not moved aside as broken


def test_a_ddp_checkpoint_resumes_under_fsdp_and_back(tmp_path):
    """The same names whatever the wrapper: weights, AdamW moments and the LR schedule survive
    DDP -> FSDP -> DDP (each at world size 1, in this process)."""
    def worker(strategy):
        return grpo_worker(strategy=strategy, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2),
                           lr_scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5))

    ddp = worker("ddp")
    ddp.update(scored_rollout(ddp))
    ddp.save_state(str(tmp_path / "ddp"))
    fsdp = worker("fsdp")
    fsdp.load_state(str(tmp_path / "ddp"))
    assert_same_weights(fsdp.parameters_digest(), ddp.parameters_digest(), "DDP -> FSDP")
    assert fsdp.trainer.optimizer.param_groups[0]["lr"] == ddp.trainer.optimizer.param_groups[0]["lr"] == 5e-3
    fsdp.save_state(str(tmp_path / "fsdp"))
    back = worker("ddp")
    back.load_state(str(tmp_path / "fsdp"))
    assert_same_weights(back.parameters_digest(), ddp.parameters_digest(), "FSDP -> DDP")
    want, got = ddp.trainer.optimizer.state_dict(), back.trainer.optimizer.state_dict()
    assert want["state"].keys() == got["state"].keys() and want["state"]
    for i in want["state"]:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(got["state"][i][name], want["state"][i][name]), f"{name} of parameter {i}"
    assert back.trainer.scheduler.state_dict() == ddp.trainer.scheduler.state_dict()
