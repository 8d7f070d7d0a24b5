"""On-policy distillation end to end through the real runtime (LocalRuntime), on the tiny model.

The teacher is the tiny model after 40 SFT steps on two-digit additions (the student's tokenizer, a much more
peaked distribution); the student is the same tiny model before them. OPD samples from the student, the teacher
scores every sampled token, and the per-token reverse KL, the advantage, falls: measured 2.76 -> 0.88 nats per
token in 8 steps (lr 3e-2), and 2.76 -> 0.34 with the top-4 forward KL added (top-4 overlap 0.01 -> 0.69).
"""

import pytest
import torch

from helpers import distillation_graph, run_capturing
from rlhf.runtime.experiment import run_experiment

STEPS = 8  # distillation_graph's


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
