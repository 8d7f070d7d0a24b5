"""Asynchronous rollout with vLLM (the CPU build) as the rollout group's engine: a rollout worker follows the
snapshots it is given, and a one-step-off run trains on samples whose vLLM log-probs are those of the weights
two versions back. One process (LocalRuntime's layout); run by `bash scripts/test_vllm.sh`."""

import functools

import fiddle as fdl
import pytest
import torch

from helpers import vllm_model_path
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.rollout import HFEngine, SamplingParams
from rlhf.rollout.engine import named_weights
from rlhf.rollout.vllm_engine import VLLMEngine
from rlhf.workers.rollout import RolloutWorker
from rlhf.workers.weight_sync import snapshot
from test_async_rollout import log_probs_under, run_capturing, version_weights

pytestmark = pytest.mark.vllm

ENGINE = functools.partial(VLLMEngine, max_model_len=256, max_num_seqs=64)


def test_a_vllm_rollout_worker_generates_with_the_snapshot_it_is_given():
    worker = RolloutWorker(vllm_model_path(), engine=ENGINE, dtype="float32")
    prompts = PromptDataset(arithmetic_rows(4, seed=0), load_tokenizer(vllm_model_path())).collate(range(4))
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    worker.load_weights(snapshot(named_weights(load_causal_lm(vllm_model_path(seed=1))), 3, "float32", "cpu"))
    out = worker.generate(prompts, greedy, seed=0)
    other = HFEngine(vllm_model_path(seed=1)).generate(prompts, greedy)
    assert out["policy_version"].tolist() == [3] * 4
    assert torch.equal(out["responses"], other["responses"])
    torch.testing.assert_close(out["rollout_log_probs"], other["rollout_log_probs"], atol=1e-5, rtol=0)


def test_one_step_off_with_vllm_trains_on_the_weights_two_versions_back(tmp_path, monkeypatch):
    from rlhf.algos import GRPO, PPOClipLoss
    from rlhf.rewards.arithmetic import digit_match_score
    from rlhf.rewards.manager import RewardManager
    from rlhf.runtime.experiment import Experiment
    from rlhf.runtime.local import LocalRuntime
    from rlhf.trainers.rl import RLTrainer
    from rlhf.workers.objectives import PolicyObjective
    from rlhf.workers.training import TrainingSetup
    from rlhf_configs import common
    from rlhf_configs.pieces import policy_group

    model = vllm_model_path()
    tok = fdl.Config(load_tokenizer, model)
    stage = fdl.Config(
        RLTrainer,
        policy=policy_group(model_path=model, engine=fdl.Partial(VLLMEngine, max_model_len=256, max_num_seqs=64),
                            objective=fdl.Config(PolicyObjective, policy_loss=fdl.Config(PPOClipLoss), entropy_coef=0.5),
                            optimizer=fdl.Partial(torch.optim.AdamW, lr=3e-2),
                            training=fdl.Config(TrainingSetup, micro_batch_size=8)),
        tokenizer=tok,
        train_data=fdl.Config(PromptDataset, rows=fdl.Config(arithmetic_rows, n=16), tokenizer=tok),
        reward=fdl.Config(RewardManager, scorers={"arithmetic": digit_match_score}),
        advantage=fdl.Config(GRPO), sampling=fdl.Config(SamplingParams, n=4, max_new_tokens=6),
        prompts_per_step=4, total_steps=3, save_freq=1, keep_checkpoints=3,
    )
    g = fdl.Config(Experiment, name="async", stages={"rl": stage}, runtime=fdl.Config(LocalRuntime),
                   output_dir=str(tmp_path / "out"), run_name="run", progress=False)
    common.one_step_off(g)  # after the engine is set: the rollout group takes the policy's (vLLM)
    assert g.stages["rl"].async_rollout.rollout.worker.engine.__fn_or_cls__ is VLLMEngine
    seen = run_capturing(monkeypatch, g)
    for k in (2, 3):
        _, batch = seen[k]
        mask = batch["response_mask"].bool()
        behaviour = max(0, k - 2)
        assert batch["policy_version"].tolist() == [behaviour] * len(batch)
        expected = log_probs_under(version_weights(tmp_path / "out", tmp_path, behaviour, base=model), batch)
        torch.testing.assert_close(batch["rollout_log_probs"][mask], expected[mask], atol=1e-4, rtol=0)
