"""The DPO trainer: the policy group learns from preference pairs with a DPO-family loss.

reference log-probs (once, cached) -> batch of pairs -> update -> log -> validate (held-out pairs) ->
checkpoint. The loop, checkpoints and exact resume are the SFT trainer's (`SFTTrainer`: the step is
the data position, the policy's state is a sharded checkpoint); what differs is the data (pairs, chosen
and rejected side by side: rlhf.data.preferences), the objective (`DPOObjective`, built with the same
`loss` node as this trainer), and the reference: each pair's reference log-probs are computed once
before the first step, by the policy group's own reference (a frozen model, or the LoRA base with the
adapter disabled; sharded like the actor under FSDP2), and kept in the stage folder
(`reference_logps/`), so a resumed stage reads them instead of computing them again and each step runs
no reference forward; the policy group then lets its frozen reference model go (`release_reference`), so
training holds no second model. A reference-free loss (SimPO) computes none.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from rlhf.algos.preference import PairLogProbs, PairLoss, PreferenceLoss, preference_metrics
from rlhf.batch import Batch
from rlhf.data.preferences import PreferenceDataset
from rlhf.data.sft import padding_fraction
from rlhf.io.atomic import atomic_write_dir
from rlhf.ranges import NonNegativeInt, PositiveFloat, PositiveInt
from rlhf.trainers.context import StageContext
from rlhf.trainers.evaluate import Evaluator
from rlhf.trainers.metrics import mean_over_ranks
from rlhf.trainers.sft import SFTTrainer

REFERENCE_DIR = "reference_logps"
"""The stage folder's cache of reference log-probs: `logps.pt` ({split: (2N,) per row}) and `info.json`."""


def row_log_probs(per_token: torch.Tensor, batch: Batch) -> torch.Tensor:
    """(B,) log-probs summed over each row's response tokens, from per-token (B,T) ones."""
    return (per_token * batch["response_mask"].to(per_token.dtype)).sum(dim=1)


class DPOTrainer(SFTTrainer):
    """Trains the policy group (built with a `DPOObjective(loss)`) for `total_steps` batches of pairs.

    Logged each step with TRL's names: `dpo/loss`, `rewards/chosen`, `rewards/rejected`, `rewards/margins`,
    `rewards/accuracies`, `logps/chosen`, `logps/rejected`; on held-out pairs the same under `val/`
    (`val/dpo_loss`, `val/rewards/margins`, ...). docs/preferences.md says how to read them.
    """

    loss_metric = "dpo/loss"

    def __init__(
        self,
        policy,  # WorkerGroup of PolicyWorker with objective=DPOObjective(loss) (the same loss node)
        data: PreferenceDataset,
        loss: PreferenceLoss,  # the objective's loss, for the held-out metrics (and whether a reference is read)
        batch_size: PositiveInt = 32,  # pairs per optimizer step, over all data-parallel workers
        total_steps: PositiveInt = 500,
        evaluator: Evaluator | None = None,  # generation-based scores on held-out prompts (e.g. a gold rule)
        val_data: PreferenceDataset | None = None,  # held-out pairs for `val/...`; None: none
        val_batch_size: PositiveInt = 32,  # pairs per log-prob call of the validation (and the reference pass)
        test_freq: NonNegativeInt = 0,  # validate every k steps (0: only at the end); always at the end
        val_before_train: bool = False,  # also validate the initial model (logged at step 0)
        bucketed: bool = True,  # batches of pairs of similar lengths (less padding); False: random
        cache_reference: bool = True,  # reference log-probs computed once and kept; False: by the worker each step
        save_freq: NonNegativeInt = 0,  # full checkpoint every k steps and at the end (0: none; `final/` always)
        keep_checkpoints: PositiveInt = 2,  # complete checkpoints kept (oldest deleted)
        max_train_minutes: PositiveFloat | None = None,  # stop after the step that spends it (SFTTrainer)
        seed: NonNegativeInt = 0,
    ):
        super().__init__(policy, data, batch_size=batch_size, total_steps=total_steps, evaluator=evaluator,
                         val_data=val_data, val_batch_size=val_batch_size, test_freq=test_freq,
                         val_before_train=val_before_train, bucketed=bucketed, save_freq=save_freq,
                         keep_checkpoints=keep_checkpoints, max_train_minutes=max_train_minutes, seed=seed)
        self.loss = loss
        self.cache_reference = cache_reference
        self.reference: dict[str, torch.Tensor] = {}  # split -> (2N,) reference log-prob of each row
        world = getattr(policy, "world_size", 1)
        if batch_size % world:
            raise ValueError(f"DPOTrainer: batch_size={batch_size} pairs must divide by the policy group's "
                             f"{world} workers (each rank trains whole pairs); use a multiple of {world}")

    def run(self, ctx: StageContext) -> dict:
        if self.loss.requires_reference and self.cache_reference:
            self.reference = self.reference_log_probs(Path(ctx.out_dir) / REFERENCE_DIR)
            # every step and validation reads the cache: the frozen copy's memory goes to training instead
            self.policy.release_reference()
        return super().run(ctx)

    # ------------------------------------------------------------ reference
    def reference_log_probs(self, folder: Path) -> dict[str, torch.Tensor]:
        """Every row's reference log-prob, per split: read from `folder` when it was written for these data,
        else computed now (one no-grad pass over the pairs) and written there atomically."""
        splits = {"train": self.data, **({"val": self.val_data} if self.val_data is not None else {})}
        info = {split: data.fingerprint for split, data in splits.items()}
        if (folder / "info.json").exists() and json.loads((folder / "info.json").read_text()) == info:
            return torch.load(folder / "logps.pt", weights_only=True)
        logps = {split: self._reference_pass(data) for split, data in splits.items()}

        def write(tmp: Path) -> None:
            torch.save(logps, tmp / "logps.pt")
            (tmp / "info.json").write_text(json.dumps(info))

        atomic_write_dir(str(folder), write)
        return logps

    def _reference_pass(self, data: PreferenceDataset) -> torch.Tensor:
        parts = [row_log_probs(self.policy.compute_ref_log_probs(batch)["ref_log_probs"], batch)
                 for batch in data.in_order(self.val_batch_size)]
        return torch.cat(parts).float()

    def with_reference(self, batch: Batch, split: str) -> Batch:
        """`batch` with `ref_logps` (B,) from the cache (row 2i chosen, 2i+1 rejected of pair `pair_index`)."""
        if split not in self.reference:
            return batch
        rows = 2 * batch["pair_index"] + torch.arange(len(batch)) % 2
        return batch.union(Batch({"ref_logps": self.reference[split][rows]}))

    # ---------------------------------------------------------------- steps
    def step(self, batch: Batch) -> dict[str, float]:
        start = time.perf_counter()
        metrics = mean_over_ranks(self.policy.update(self.with_reference(batch, "train")))
        metrics["timing_s/step"] = time.perf_counter() - start
        metrics["dpo/padding_frac"] = padding_fraction(batch)
        metrics["dpo/num_tokens"] = float(batch["response_mask"].sum())
        metrics["perf/total_num_tokens"] = float(batch["attention_mask"].sum())
        return metrics

    def validate(self) -> dict[str, float]:
        metrics: dict[str, float] = {}
        if self.val_data is not None:
            metrics.update(self.validation_metrics(self.val_data))
        if self.evaluator is not None:
            metrics.update(self.evaluator(self.policy))
        return metrics

    def validation_metrics(self, data: PreferenceDataset) -> dict[str, float]:
        """The loss and TRL's metrics over every held-out pair (no gradient), prefixed `val/`."""
        parts: list[tuple[PairLogProbs, PairLoss]] = []
        for batch in data.in_order(self.val_batch_size):
            batch = self.with_reference(batch, "val")
            logps = row_log_probs(self.policy.compute_log_probs(batch)["old_log_probs"], batch)
            ref = None
            if self.loss.requires_reference:
                ref = batch["ref_logps"] if "ref_logps" in batch else row_log_probs(
                    self.policy.compute_ref_log_probs(batch)["ref_log_probs"], batch)
            pairs = PairLogProbs.from_rows(logps.double(), batch["response_mask"].sum(dim=1).double(),
                                           None if ref is None else ref.double(), batch["margin"].double())
            parts.append((pairs, self.loss(pairs)))
        joined = PairLogProbs(*(torch.cat([getattr(p, f) for p, _ in parts]) if getattr(parts[0][0], f) is not None
                                else None for f in PairLogProbs.__dataclass_fields__))
        out = PairLoss(*(torch.cat([o[k] for _, o in parts]) for k in range(3)))
        return {("val/dpo_loss" if k == "loss" else f"val/{k}"): float(v)
                for k, v in preference_metrics(joined, out).items()}
