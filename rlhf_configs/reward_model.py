"""Reward-model graph pieces: the trained reward-model group, one reward-model stage over preference files, and the
graph of `rlhf rm` (its flags: `rlhf.cli.rm`).

Rows are preference pairs (`rlhf.data.preferences`: prompt, chosen, rejected, optional margin). The final
model is `<out>/rm/<time>/rm/final`, a sequence-classification folder with the reward mean and std in its
config.json, which an RL stage scores with (`fiddler:reward_model(path=...)`, `rlhf_configs.tasks.use_reward_model`).
"""

from __future__ import annotations

from typing import Any

import fiddle as fdl
import torch
from transformers import get_cosine_schedule_with_warmup

from rlhf.algos.reward_model_loss import BradleyTerryLoss
from rlhf.data.preferences import PreferenceDataset, load_preference_rows
from rlhf.models.loading import load_tokenizer
from rlhf.runtime.experiment import Experiment
from rlhf.runtime.remote import Remote
from rlhf.trainers.reward_model import RewardModelTrainer
from rlhf.workers.reward_model import RewardModelWorker
from rlhf.workers.training import TrainingSetup
from rlhf_configs.pieces import one_stage_experiment


def reward_model_group(
    num_workers: int = 1, cpus_per_worker: float = 1, gpus_per_worker: float = 0,
    training: fdl.Config[TrainingSetup] | None = None,  # None: a new node with TrainingSetup's defaults
    **worker: Any,
) -> fdl.Config:
    """The trained reward-model group (`RewardModelWorker` with a `loss`), one process per data-parallel rank; the
    worker always gets a `training` node, so `set:stages.rm.rm.worker.training.micro_batch_size=8` works."""
    return fdl.Config(
        Remote,
        name="rm",
        worker=fdl.Config(RewardModelWorker, training=training if training is not None else fdl.Config(TrainingSetup),
                          **worker),
        num_workers=num_workers,
        cpus_per_worker=cpus_per_worker,
        gpus_per_worker=gpus_per_worker,
    )


def rm_stage(
    model, data, val=None, *, steps: int = 500, batch_size: int = 32, micro_batch_size: int = 8,
    max_tokens_per_micro_batch: int | None = None, lr: float = 1e-5, warmup_steps: int = 10,
    max_length: int = 1024, center_rewards_coefficient: float | None = None, test_freq: int = 50,
    save_freq: int = 0, workers: int = 1, gpus_per_worker: float = 0, compute_dtype: str = "float32",
    seed: int = 0,
) -> fdl.Config[RewardModelTrainer]:
    """A reward-model stage: a one-label score head on `model` (a causal LM, e.g. the policy's or an SFT
    checkpoint; the head is new, drawn from `seed`) trained on the pairs of `data` (and held out: `val`), each a
    file or a graph node that builds preference rows, Bradley-Terry loss (with each pair's `margin` where the
    rows give one; `center_rewards_coefficient`: TRL's centring term), AdamW + cosine schedule with warmup,
    `batch_size` pairs per step in micro-batches of `micro_batch_size` rows (a pair's two rows always together)
    or by a token budget, held-out `rm/accuracy`, `rm/margin`, ... on `val`."""
    tokenizer = fdl.Config(load_tokenizer, model)

    def dataset(rows, name):  # a file, or a graph node that makes the rows (e.g. from an earlier stage's samples)
        rows = fdl.Config(load_preference_rows, path=rows) if isinstance(rows, str) else rows
        return fdl.Config(PreferenceDataset, rows=rows, tokenizer=tokenizer, max_length=max_length, name=name)

    return fdl.Config(
        RewardModelTrainer,
        rm=reward_model_group(
            num_workers=workers,
            gpus_per_worker=gpus_per_worker,
            model_path=model,
            loss=fdl.Config(BradleyTerryLoss, center_rewards_coefficient=center_rewards_coefficient),
            optimizer=fdl.Partial(torch.optim.AdamW, lr=lr, weight_decay=0.01),
            lr_scheduler=fdl.Partial(get_cosine_schedule_with_warmup, num_warmup_steps=warmup_steps,
                                     num_training_steps=steps),
            training=fdl.Config(TrainingSetup, micro_batch_size=micro_batch_size, compute_dtype=compute_dtype,
                                max_tokens_per_micro_batch=max_tokens_per_micro_batch, seed=seed),
            max_length=max_length,
        ),
        data=dataset(data, "train"),
        val_data=dataset(val, "val") if val is not None else None,
        batch_size=batch_size,
        total_steps=steps,
        test_freq=test_freq,
        save_freq=save_freq,
        seed=seed,
    )


def rm_experiment(
    model: str, data: str, val: str | None = None, out: str = "outputs", local: bool = False,
    aim_repo: str | None = None, progress: bool = True, **stage,
) -> fdl.Config[Experiment]:
    """`rlhf rm`: one reward-model stage (keyword arguments go to `rm_stage`)."""
    return one_stage_experiment("rm", rm_stage(model, data, val, **stage), out=out, local=local,
                                aim_repo=aim_repo, progress=progress)
