"""On-policy distillation end to end through the real runtime (LocalRuntime), on the tiny model.

The teacher is the tiny model after 40 SFT steps on two-digit additions (the student's tokenizer, a much more
peaked distribution); the student is the same tiny model before them. OPD samples from the student, the teacher
scores every sampled token, and the per-token reverse KL, the advantage, falls: measured 2.76 -> 0.88 nats per
token in 8 steps (lr 3e-2), and 2.76 -> 0.34 with the top-4 forward KL added (top-4 overlap 0.01 -> 0.69).
"""

import fiddle as fdl
import pytest
import torch

from helpers import run_capturing, tiny_model_path
from rlhf.algos import GRPO, PPOClipLoss
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.data.sft import SFTDataset
from rlhf.models.loading import load_tokenizer
from rlhf.rewards.arithmetic import exact_match_score
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.experiment import Experiment, run_experiment
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.remote import StageOutput
from rlhf.trainers.rl import RLTrainer
from rlhf.trainers.sft import SFTTrainer
from rlhf.workers.objectives import PolicyObjective, SFTObjective
from rlhf.workers.training import TrainingSetup
from rlhf_configs.algorithms import use_distillation
from rlhf_configs.pieces import policy_group

STEPS = 8


def teacher_stage(tokenizer, rows) -> fdl.Config[SFTTrainer]:
    """40 SFT steps of the tiny model on the additions: a teacher far more sure of its answers than the student."""
    return fdl.Config(
        SFTTrainer,
        policy=policy_group(model_path=tiny_model_path(), objective=fdl.Config(SFTObjective),
                            optimizer=fdl.Partial(torch.optim.AdamW, lr=3e-3),
                            training=fdl.Config(TrainingSetup, micro_batch_size=64)),
        data=fdl.Config(SFTDataset, rows=rows, tokenizer=tokenizer),
        batch_size=64, total_steps=40, bucketed=False,
    )


def distillation_graph(out: str, teacher=None, top_k: int = 0, steps: int = STEPS) -> fdl.Config[Experiment]:
    """The untrained tiny model distilled from `teacher` (a folder; None: a stage "teacher" makes one first)."""
    student = tiny_model_path()
    tokenizer = fdl.Config(load_tokenizer, student)
    rows = fdl.Config(arithmetic_rows, n=512, seed=0, split="train")
    stages = {}
    if teacher is None:
        stages["teacher"] = teacher_stage(tokenizer, rows)
        teacher = fdl.Config(StageOutput, stage="teacher")
    opd = fdl.Config(
        RLTrainer,
        policy=policy_group(model_path=student, objective=fdl.Config(PolicyObjective, policy_loss=fdl.Config(PPOClipLoss)),
                            optimizer=fdl.Partial(torch.optim.AdamW, lr=3e-2),
                            training=fdl.Config(TrainingSetup, micro_batch_size=64)),
        tokenizer=tokenizer,
        train_data=fdl.Config(PromptDataset, rows=rows, tokenizer=tokenizer),
        reward=fdl.Config(RewardManager, scorers={"arithmetic": exact_match_score}),
        advantage=fdl.Config(GRPO),
        sampling=fdl.Config(SamplingParams, n=4, temperature=1.0, max_new_tokens=6),
        prompts_per_step=8, total_steps=steps, records=None,
    )
    use_distillation(opd, teacher, top_k=top_k)
    return fdl.Config(Experiment, name="opd_tiny", stages={**stages, "opd": opd},
                      runtime=fdl.Config(LocalRuntime), tracker=None, output_dir=out, progress=False)


@pytest.fixture(scope="module")
def sft_teacher(tmp_path_factory) -> str:
    """The teacher's folder, made once for this module by the teacher stage."""
    graph = distillation_graph(str(tmp_path_factory.mktemp("teacher")))
    graph.stages = {"teacher": graph.stages["teacher"]}
    return run_experiment(graph)["teacher"]["checkpoint"]


def curves(seen, *names):
    return [[seen[s][0][name] for s in sorted(seen)] for name in names]


def test_opd_lowers_the_students_reverse_kl_to_a_fixed_teacher(tmp_path, monkeypatch, sft_teacher):
    seen = run_capturing(monkeypatch, distillation_graph(str(tmp_path), teacher=sft_teacher))
    kl, teacher = curves(seen, "distill/reverse_kl", "distill/teacher_log_prob")
    assert len(kl) == STEPS
    assert kl[0] > 1.0, f"the SFT teacher should disagree with the untrained student at first: {kl}"
    assert kl[-1] < 0.5 * kl[0], f"the reverse KL to the teacher did not fall: {kl}"
    assert teacher[-1] > teacher[0] + 1.0, f"the teacher did not come to like the student's samples more: {teacher}"
    metrics, batch = seen[1]
    assert "teacher_log_probs" in batch and "old_log_probs" in batch
    # the advantage is the per-token reverse KL, negated, on the sampled tokens (no group baseline)
    expected = (batch["teacher_log_probs"] - batch["old_log_probs"]) * batch["response_mask"]
    torch.testing.assert_close(batch["advantages"], expected)
    assert metrics["timing_s/teacher"] > 0 and "distill/top_k_overlap" not in metrics


def test_top_k_forward_kl_trains_too_and_reports_the_overlap(tmp_path, monkeypatch, sft_teacher):
    seen = run_capturing(monkeypatch, distillation_graph(str(tmp_path), teacher=sft_teacher, top_k=4))
    kl, overlap, forward = curves(seen, "distill/reverse_kl", "distill/top_k_overlap", "distill/top_k_forward_kl")
    assert kl[-1] < 0.5 * kl[0], f"the reverse KL to the teacher did not fall: {kl}"
    assert overlap[-1] > overlap[0] + 0.3, f"the student's top-4 did not come to hold the teacher's: {overlap}"
    assert forward[-1] < forward[0], forward
    batch = seen[1][1]
    assert batch["teacher_top_k_ids"].shape == (*batch["responses"].shape, 4)
    assert batch["teacher_top_k_log_probs"].shape == (*batch["responses"].shape, 4)
