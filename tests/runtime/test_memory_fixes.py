"""The memory preflight's suggested fixes read vLLM's share as the engine does (`device_share`): on a CPU
its default is 0.05 of the RAM, so a "lower" share of 0.4 is never suggested there."""

import functools
from pathlib import Path

import torch

from rlhf.rollout.vllm_engine import VLLMEngine
from rlhf.runtime.preflight.memory import RolePlan, _fix_candidates
from rlhf.workers.memory import ModelShape, Placement, Workload
from rlhf.workers.policy import PolicyWorker
from rlhf.workers.training import TrainingSetup

torch.set_num_threads(1)
QWEN05B = ModelShape.from_config(Path(__file__).parents[2] / "rlhf_configs" / "model_configs" / "qwen2.5-0.5b.json")


def share_fixes(device: str) -> list[str]:
    arguments = dict(model_path=QWEN05B, ref_model_path=QWEN05B, objective=True, engine=functools.partial(VLLMEngine),
                     training=TrainingSetup(strategy="ddp"))
    work, placement = Workload(64, 64, n=4, rows=16), Placement(device, device_bytes=64e9)
    role = RolePlan("policy", PolicyWorker.predict_memory(arguments, work, placement), PolicyWorker.predict_memory,
                    arguments, work, placement, "stages.grpo.policy.worker")
    return [label for label, *_ in _fix_candidates(role) if "gpu_memory_utilization" in label]


def test_lower_vllm_shares_are_below_the_engines_own_default():
    assert [f.rsplit("=", 1)[1] for f in share_fixes("cuda")] == ["0.4", "0.3", "0.2"]  # below 0.5 of a GPU
    assert share_fixes("cpu") == []  # 0.05 of the RAM: nothing lower in the list
