"""DPO graph pieces: one DPO-family stage over preference files, and the graph of `rlhf dpo` (flags: `rlhf.cli.dpo`).

Rows are preference pairs (rlhf.data.preferences: prompt, chosen, rejected; TRL's layouts read as they
are). The loss is a node of rlhf.algos.preference (DPO, robust DPO, IPO, SimPO, RPO), shared by the
policy's `DPOObjective` and the trainer's held-out metrics. The reference is the starting model: a
frozen copy, or with a LoRA adapter (`fiddler:lora`, `--lora-rank`) the base with the adapter disabled;
SimPO has none. The final checkpoint is `<out>/dpo/<time>/dpo/final`.
"""

from __future__ import annotations

import fiddle as fdl
import torch
from transformers import get_cosine_schedule_with_warmup

from rlhf.algos.preference import DPOLoss, IPOLoss, PreferenceLoss, RobustDPOLoss, RPOLoss, SimPOLoss
from rlhf.data.preferences import PreferenceDataset, load_preference_rows
from rlhf.models.loading import load_tokenizer
from rlhf.runtime.experiment import Experiment
from rlhf.trainers.dpo import DPOTrainer
from rlhf.workers.objectives import DPOObjective
from rlhf.workers.training import TrainingSetup
from rlhf_configs.pieces import one_stage_experiment, policy_group

LOSSES: dict[str, type[PreferenceLoss]] = {
    "sigmoid": DPOLoss, "robust": RobustDPOLoss, "ipo": IPOLoss, "simpo": SimPOLoss, "rpo": RPOLoss,
}
"""Command-line names of the losses (TRL's `loss_type` names; "simpo" is TRL's CPO loss_type)."""


def preference_loss(name: str = "sigmoid", **options) -> fdl.Config:
    """The loss node for a command-line name (`LOSSES`) with its options (beta, label_smoothing, gamma, alpha...)."""
    if name not in LOSSES:
        raise ValueError(f"unknown DPO loss {name!r}; choose one of {', '.join(LOSSES)}")
    return fdl.Config(LOSSES[name], **options)


def dpo_stage(
    model, data, val=None, *, loss: fdl.Config | None = None, steps: int = 200, batch_size: int = 16,
    micro_batch_size: int = 8, lr: float = 1e-6, warmup_steps: int = 10, max_length: int = 1024,
    test_freq: int = 50, save_freq: int = 0, workers: int = 1, gpus_per_worker: float = 0,
    compute_dtype: str = "float32", evaluator: fdl.Config | None = None,
) -> fdl.Config[DPOTrainer]:
    """A DPO-family stage: `loss` (None: DPOLoss(beta=0.1)), AdamW + cosine schedule with warmup (lr 1e-6 is
    TRL's default for DPO), `batch_size` pairs per step in micro-batches of `micro_batch_size` pairs (a pair is
    never split), pairs longer than `max_length` tokens on either side dropped, held-out metrics on `val`.
    `data` and `val` are files or graph nodes that build preference rows; `evaluator` (an `Evaluator`) scores the
    trained policy's own answers on held-out prompts (e.g. by a gold rule) at each validation."""
    tokenizer = fdl.Config(load_tokenizer, model)
    loss = loss if loss is not None else fdl.Config(DPOLoss)

    def dataset(rows, name):  # a file, or a graph node that makes the rows (e.g. from an earlier stage's samples)
        rows = fdl.Config(load_preference_rows, path=rows) if isinstance(rows, str) else rows
        return fdl.Config(PreferenceDataset, rows=rows, tokenizer=tokenizer, max_length=max_length, name=name)

    reference_free = not getattr(fdl.get_callable(loss), "requires_reference", True)
    return fdl.Config(
        DPOTrainer,
        policy=policy_group(
            num_workers=workers,
            gpus_per_worker=gpus_per_worker,
            model_path=model,
            objective=fdl.Config(DPOObjective, loss=loss),
            ref_model_path=None if reference_free else model,  # with LoRA: the base, adapter disabled
            optimizer=fdl.Partial(torch.optim.AdamW, lr=lr, weight_decay=0.0),
            lr_scheduler=fdl.Partial(get_cosine_schedule_with_warmup, num_warmup_steps=warmup_steps,
                                     num_training_steps=steps),
            training=fdl.Config(TrainingSetup, micro_batch_size=2 * micro_batch_size,  # rows: 2 per pair
                                compute_dtype=compute_dtype),  # weights and AdamW state stay float32
        ),
        data=dataset(data, "train"),
        loss=loss,  # the same node as the objective's
        val_data=dataset(val, "val") if val is not None else None,
        evaluator=evaluator,
        batch_size=batch_size,
        total_steps=steps,
        test_freq=test_freq,
        save_freq=save_freq,
    )


def dpo_experiment(
    model: str, data: str, val: str | None = None, out: str = "outputs", local: bool = False,
    aim_repo: str | None = None, progress: bool = True, **stage,
) -> fdl.Config[Experiment]:
    """`rlhf dpo`: one DPO stage (keyword arguments go to `dpo_stage`)."""
    return one_stage_experiment("dpo", dpo_stage(model, data, val, **stage), out=out, local=local,
                                aim_repo=aim_repo, progress=progress)
