"""Sample n responses per held-out prompt and score them: pass@k and maj@k of a model on arithmetic.

The graph behind `rlhf eval MODEL --data FILE`, written out as an experiment: one stage, an
`EvalJob` that first runs a `GenerationStage` (resumable JSON Lines in the stage's folder),
then reports mean@n, pass@k, maj@k and best@k with bootstrap intervals (table, JSON, plot, Aim).
Without a model it evaluates a freshly initialised tiny model (accuracy near 0: a smoke run);
give it the checkpoint of an `arithmetic_tiny` run to see what SFT and GRPO learned.

    python experiments/generate_and_eval.py --config fiddler:local
    python experiments/generate_and_eval.py \
        --config 'config:base(model="outputs/arithmetic_tiny/<stamp>/grpo/final")'
"""

from __future__ import annotations

import sys

import fiddle as fdl

from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_tokenizer
from rlhf.rewards.arithmetic import exact_match_score
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.experiment import Experiment
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.tracking.aim_tracker import AimTracker
from rlhf.trainers.eval_job import EvalJob
from rlhf.trainers.generate import GenerationStage
from rlhf_configs.pieces import policy_group, tiny_model
from rlhf_configs.rows import limit_rows

NAME = "generate_and_eval"


def base(model: str | None = None, n: int = 8) -> fdl.Config[Experiment]:
    model_path = model or tiny_model(f"outputs/{NAME}/init-h64-l2", hidden_size=64, num_layers=2)
    generation = fdl.Config(
        GenerationStage,
        policy=policy_group(model_path=model_path),
        dataset=fdl.Config(
            PromptDataset,
            rows=fdl.Config(arithmetic_rows, n=200, seed=0, split="test"),
            tokenizer=fdl.Config(load_tokenizer, model_path),
            name="heldout",
        ),
        sampling=fdl.Config(SamplingParams, n=n, temperature=1.0, max_new_tokens=8),
        prompts_per_call=50,
    )
    evaluation = fdl.Config(
        EvalJob,
        reward=fdl.Config(RewardManager, scorers={"arithmetic": exact_match_score}),
        generation=generation,
        ks=(1, 2, 4, 8),
    )
    return fdl.Config(
        Experiment,
        name=NAME,
        stages={"eval": evaluation},
        runtime=fdl.Config(RayRuntime),
        tracker=fdl.Config(AimTracker, repo=".aim", experiment=NAME),
    )


def smoke(cfg: fdl.Config[Experiment]) -> None:
    """Eight prompts, four samples each (tests and quick checks)."""
    limit_rows(cfg.stages["eval"].generation.dataset, 8)
    cfg.stages["eval"].generation.sampling.n = 4
    cfg.stages["eval"].ks = (1, 2, 4)


if __name__ == "__main__":
    from rlhf.cli.experiment import run_cli

    run_cli(sys.modules[__name__])
