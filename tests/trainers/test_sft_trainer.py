"""SFTTrainer: validation loss, padding metric, checkpoints an RL stage can load, exact resume."""

import fiddle as fdl
import pytest
import torch

from rlhf.data.generators import arithmetic_rows
from rlhf.data.sft import SFTDataset
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.plan import compile_graph
from rlhf.trainers.context import StageContext
from rlhf.trainers.sft import SFTTrainer
from rlhf.workers.objectives import SFTObjective
from rlhf_configs.pieces import policy_group
from rlhf.workers.training import TrainingSetup
from helpers import tiny_model_path


def start_policy(lr=1e-2):
    group = policy_group(model_path=tiny_model_path(), objective=fdl.Config(SFTObjective),
                         optimizer=fdl.Partial(torch.optim.AdamW, lr=lr),
                         training=fdl.Config(TrainingSetup, micro_batch_size=3))  # 8 rows: 3 + 3 + 2
    runtime = LocalRuntime()
    return runtime, runtime.start_groups(compile_graph(group))["policy"]


@pytest.fixture(scope="module")
def data():
    chats = [{"messages": [{"role": "user", "content": f"say {k} twice"}, {"role": "assistant", "content": f"{k} {k}"},
                           {"role": "user", "content": "again"}, {"role": "assistant", "content": f"{k}{k}"}]}
             for k in range(4)]
    return SFTDataset(chats + arithmetic_rows(4), load_tokenizer(tiny_model_path()))


def run(trainer, out_dir, resume=False):
    logged = {}
    trainer.run(StageContext(out_dir=out_dir, log=lambda m, s: logged.setdefault(s, {}).update(m), progress=False,
                             resume=resume))
    return logged


def test_validation_loss_is_the_training_loss_on_held_out_data(data, tmp_path):
    runtime, policy = start_policy()
    try:
        trainer = SFTTrainer(policy, data, batch_size=8, total_steps=3, val_data=data, val_batch_size=5,
                             test_freq=1, val_before_train=True)
        logged = run(trainer, tmp_path)
        # step 1 trains on all 8 examples: its loss (before the update) is the val loss of the initial model
        assert logged[0]["val/sft_loss"] == pytest.approx(logged[1]["sft/loss"], rel=1e-5)
        assert logged[3]["val/sft_loss"] < logged[0]["val/sft_loss"]  # it learns
        assert 0 < logged[1]["sft/padding_frac"] < 1 and logged[1]["actor/lr"] == 1e-2
        model = load_causal_lm(str(tmp_path / "final"), "float32")  # an RL stage's starting point
        assert sum(p.numel() for p in model.parameters()) > 0
    finally:
        runtime.shutdown()


def test_resumed_run_matches_uninterrupted_run(data, tmp_path):
    def train(steps, out, save_freq=0, resume=False):
        runtime, policy = start_policy()
        try:
            trainer = SFTTrainer(policy, data, batch_size=4, total_steps=steps, bucketed=True, save_freq=save_freq)
            logged = run(trainer, out, resume)
            return logged, policy.parameters_digest()[0]
        finally:
            runtime.shutdown()

    full, want = train(3, tmp_path / "full")
    train(2, tmp_path / "cut", save_freq=1)
    resumed, got = train(3, tmp_path / "cut", save_freq=1, resume=True)
    assert list(resumed) == [3] and resumed[3]["sft/loss"] == full[3]["sft/loss"]
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert sorted(p.name for p in (tmp_path / "cut" / "checkpoints").iterdir()) == ["step_00000002", "step_00000003"]
