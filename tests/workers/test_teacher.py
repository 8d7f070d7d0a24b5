"""The policy worker's teacher (on-policy distillation): log-probs at the sampling temperature, the top-k columns,
the refusal of a teacher with another tokenizer before any model loads, the plan line and the memory term."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import fiddle as fdl
import pytest
import torch

from helpers import distillation_graph, group_plan, tiny_model_path
from rlhf.algos import GRPO, OnPolicyDistillation, PPOClipLoss, TopKForwardKL
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_tokenizer
from rlhf.models.vocabulary import VocabularyMismatch, check_same_vocabulary
from rlhf.rollout.sampling import SamplingParams
from rlhf.workers.memory import ModelShape, Placement, Workload
from rlhf.workers.memory_probe import PeakMemory, live_bytes
from rlhf.workers.objectives import PolicyObjective
from rlhf.workers.policy import PolicyWorker
from rlhf.workers.response_log_probs import response_outputs
from rlhf.workers.training import TrainingSetup

from test_memory_plan import SMOLLM2, policy_arguments


def rollout(worker, temperature=0.7, prompts=3, n=2):
    data = PromptDataset(arithmetic_rows(prompts, seed=0), load_tokenizer(tiny_model_path()))
    torch.manual_seed(0)
    return worker.generate(data.collate(range(prompts)), SamplingParams(n=n, temperature=temperature, max_new_tokens=5))


def test_teacher_log_probs_are_at_the_sampling_temperature():
    """The teacher = a second tiny model (other seed, same tokenizer): its log-probs of the sampled tokens are
    log_softmax(logits / T), as the student's old log-probs are, never those of T = 1."""
    teacher_path = tiny_model_path(seed=1)
    objective = PolicyObjective(policy_loss=PPOClipLoss(), distill_loss=TopKForwardKL(k=3))
    worker = PolicyWorker(tiny_model_path(), objective=objective, teacher_model_path=teacher_path,
                          training=TrainingSetup(micro_batch_size=4))
    batch = rollout(worker, temperature=0.7)
    assert batch.meta["temperature"] == 0.7
    scored = worker.compute_teacher_log_probs(batch)
    teacher = PolicyWorker(teacher_path).trainer.unwrapped()  # the same weights, loaded on their own
    with torch.no_grad():
        logits = response_outputs(teacher, batch, shared_prefix=False, prefix_model=None).double()
    expected = torch.log_softmax(logits / 0.7, -1)
    sampled = expected.gather(-1, batch["responses"][..., None]).squeeze(-1).float()
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(scored["teacher_log_probs"][mask], sampled[mask], atol=1e-5, rtol=1e-5)
    at_one = torch.log_softmax(logits, -1).gather(-1, batch["responses"][..., None]).squeeze(-1).float()
    assert not torch.allclose(scored["teacher_log_probs"][mask], at_one[mask], atol=1e-3)
    top = expected.topk(3, dim=-1)
    torch.testing.assert_close(scored["teacher_top_k_log_probs"][mask], top.values.float()[mask], atol=1e-5, rtol=1e-5)
    assert torch.equal(scored["teacher_top_k_ids"][mask], top.indices[mask])
    # the update computes the teacher's top-k for its own rows when the batch lacks them, and trains on them
    batch["advantages"] = torch.zeros_like(batch["response_mask"], dtype=torch.float32)
    metrics = worker.update(batch)
    assert metrics["distill/top_k_forward_kl"] > 0 and 0 <= metrics["distill/top_k_overlap"] <= 1
    assert set(worker.parameter_bytes()) == {"actor", "teacher"}


def test_a_teacher_equal_to_the_student_gives_its_log_probs():
    path = tiny_model_path()
    worker = PolicyWorker(path, teacher_model_path=path, ref_model_path=path)
    batch = rollout(worker, temperature=1.3)
    mask = batch["response_mask"].bool()
    old = worker.compute_log_probs(batch)["old_log_probs"]
    teacher = worker.compute_teacher_log_probs(batch)["teacher_log_probs"]
    torch.testing.assert_close(teacher[mask], old[mask])
    assert "teacher_top_k_ids" not in worker.compute_teacher_log_probs(batch)  # no top-k loss: sampled tokens only


def swapped_tokenizer_folder(tmp_path: Path) -> str:
    """A model folder whose tokenizer gives ids of 'a' and 'b' to each other, and no weights at all: a check that
    reached the weights would fail on them instead of naming the tokens."""
    source = Path(tiny_model_path())
    folder = tmp_path / "other-tokenizer"
    folder.mkdir()
    for name in source.iterdir():
        if name.suffix in (".json", ".jinja", ".txt") and name.name != "model.safetensors.index.json":
            shutil.copy(name, folder / name.name)
    spec = json.loads((folder / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    if (folder / "vocab.json").exists():
        plain = json.loads((folder / "vocab.json").read_text())
        plain["a"], plain["b"] = plain["b"], plain["a"]
        (folder / "vocab.json").write_text(json.dumps(plain))
    assert not list(folder.glob("*.safetensors"))
    return str(folder)


def test_a_teacher_with_another_tokenizer_is_refused_naming_the_tokens(tmp_path):
    teacher = swapped_tokenizer_folder(tmp_path)
    a, b = load_tokenizer(tiny_model_path()).convert_tokens_to_ids(["a", "b"])
    with pytest.raises(VocabularyMismatch, match=rf"id {min(a, b)}: student '[ab]', teacher '[ab]'"):
        check_same_vocabulary(tiny_model_path(), teacher)
    check_same_vocabulary(tiny_model_path(), tiny_model_path(seed=1))  # another model, the same tokenizer
    # the worker's preflight hook, before anything loads, and the constructor, before any model loads
    with pytest.raises(VocabularyMismatch, match="first differences"):
        PolicyWorker.preflight({"model_path": tiny_model_path(), "teacher_model_path": teacher})
    with pytest.raises(VocabularyMismatch, match="cross-tokenizer distillation is not supported"):
        PolicyWorker(tiny_model_path(), teacher_model_path=teacher)


def test_the_experiment_preflight_refuses_before_any_stage(tmp_path):
    from rlhf.runtime.experiment import run_experiment
    from rlhf.runtime.preflight import PreflightError

    teacher = swapped_tokenizer_folder(tmp_path)
    graph = distillation_graph(str(tmp_path / "out"), teacher=teacher)
    with pytest.raises(PreflightError, match=r"teacher's tokenizer .* first differences: id \d+: student"):
        run_experiment(graph)
    assert not (tmp_path / "out").exists()
    # an OPD estimator with no teacher on the worker is named too, with the path to set
    graph = distillation_graph(str(tmp_path / "out"), teacher=tiny_model_path(seed=1))
    graph.stages["opd"].policy.worker.teacher_model_path = None
    with pytest.raises(PreflightError, match=r"stages\.opd\.policy\.worker\.teacher_model_path: OnPolicyDistillation"):
        run_experiment(graph)
    # and a mix with GRPO keeps GRPO's need for two samples per prompt
    graph = distillation_graph(str(tmp_path / "out"), teacher=tiny_model_path(seed=1))
    graph.stages["opd"].advantage = fdl.Config(OnPolicyDistillation, task=fdl.Config(GRPO))
    graph.stages["opd"].sampling.n = 1
    with pytest.raises(PreflightError, match="OnPolicyDistillation compares the samples of each prompt"):
        run_experiment(graph)


def test_the_plan_line_names_the_teacher_and_its_shard():
    import re

    big = tiny_model_path(hidden_size=64)
    for strategy, world, divisor in (("fsdp", 2, 2), ("ddp", 2, 1)):
        text = group_plan(world, strategy=strategy, teacher_model_path=big).describe()
        line = next(x for x in text.splitlines() if "strategy" in x)
        sizes = dict((name, (float(a), float(b))) for name, a, b in
                     re.findall(r"(actor|reference|teacher) ([\d.]+) MB per rank of ([\d.]+) MB", line))
        assert set(sizes) == {"actor", "reference", "teacher"}, line
        per_rank, total = sizes["teacher"]
        assert total > sizes["actor"][1] and abs(per_rank * divisor - total) < 2e-3, line


def test_the_memory_plan_counts_the_teacher():
    """Held like the reference (its own shape, the compute dtype, sharded by FSDP) in every phase; its no-grad
    forward in the log-prob phase when it is the larger model; a top-k loss unfuses the update's head."""
    work = Workload(prompt_tokens=48, response_tokens=16, n=4, rows=8)
    teacher = ModelShape(vocab=49152, hidden=960, intermediate=2560, layers=32, heads=15, kv_heads=5, head_dim=64,
                         tied_embeddings=True)  # SmolLM2-360M's shape
    plain = PolicyWorker.predict_memory(policy_arguments(SMOLLM2), work, Placement())
    with_teacher = PolicyWorker.predict_memory({**policy_arguments(SMOLLM2), "teacher_model_path": teacher},
                                               work, Placement())
    for phase in with_teacher.phases:
        terms = {t.name: t.bytes for t in phase.terms}
        assert terms["teacher weights (float32)"] == 4 * teacher.parameters("lm")
    log_probs = {t.name for t in with_teacher.phase("log-probs (no grad)").terms}
    assert any(name.startswith("teacher forward") for name in log_probs), log_probs
    assert with_teacher.peak > plain.peak + 4 * teacher.parameters("lm") * 0.99
    sharded = PolicyWorker.predict_memory(
        {**policy_arguments(SMOLLM2, strategy="fsdp"), "teacher_model_path": teacher}, work,
        Placement(world_size=2, fsdp=True))
    terms = {t.name: t.bytes for t in sharded.phase("update").terms}
    assert terms["teacher weights (float32)"] == 4 * teacher.parameters("lm") / 2
    # long responses, so the update peaks at its activations: the fused head's kept logits, or with a top-k loss
    # the model's own head's logits and their gradients
    long = Workload(prompt_tokens=48, response_tokens=256, n=4, rows=32)
    for objective, fused in ((PolicyObjective(), True), (PolicyObjective(distill_loss=TopKForwardKL(k=8)), False)):
        update = {t.name for t in PolicyWorker.predict_memory(
            {**policy_arguments(SMOLLM2), "teacher_model_path": teacher, "objective": objective}, long,
            Placement()).phase("update").terms}
        assert any(name.startswith("kept logits") for name in update) == fused, update
        assert ("logit gradients" in update) == (not fused), update


def test_the_teacher_forward_prediction_within_15_percent_of_the_measured_peak():
    baseline = live_bytes()
    teacher = tiny_model_path(hidden_size=64)
    worker = PolicyWorker(tiny_model_path(), objective=PolicyObjective(), teacher_model_path=teacher,
                          training=TrainingSetup(strategy="ddp", micro_batch_size=4))
    batch = rollout(worker, prompts=4, n=4)
    batch["advantages"] = torch.zeros_like(batch["response_mask"], dtype=torch.float32)
    worker.update(batch)  # the steady state: AdamW's moments exist
    with PeakMemory() as forward:
        worker.compute_teacher_log_probs(batch)
    arguments = {**policy_arguments(tiny_model_path(), micro_batch_size=4, strategy="ddp"),
                 "objective": worker.objective, "ref_model_path": None, "teacher_model_path": teacher}
    p, r = batch["prompts"].shape[1], batch["responses"].shape[1]
    predicted = PolicyWorker.predict_memory(arguments, Workload(p, r, n=4, rows=len(batch)), Placement())
    assert predicted.phase("log-probs (no grad)").bytes == pytest.approx(forward.peak - baseline, rel=0.15)
