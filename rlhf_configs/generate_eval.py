"""The graphs of `rlhf generate` and `rlhf eval`: plain experiments that run_experiment runs."""

from __future__ import annotations

from pathlib import Path

import fiddle as fdl

from rlhf.data.prompts import PromptDataset
from rlhf.data.sources import load_rows
from rlhf.models.loading import load_tokenizer
from rlhf.rewards import RewardManager, default_scorers
from rlhf.rollout.choose import AutoEngine, engine_class
from rlhf.rollout.sampling import SamplingParams
from rlhf.rollout.vllm_engine import VLLMEngine
from rlhf.runtime.experiment import Experiment
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.tracking.aim_tracker import AimTracker
from rlhf.tracking.query import producer_run
from rlhf.trainers.eval_job import EvalJob
from rlhf.trainers.generate import GenerationStage
from rlhf_configs.pieces import policy_group

def rollout_engine(name: str, dtype: str, max_model_len: int):
    """The policy worker's engine slot for `--engine NAME`; auto: `AutoEngine`, which picks vLLM on a
    worker with a GPU and vLLM, else transformers (chosen on the worker, not on this machine)."""
    # vLLM keeps its own copy: in the requested dtype, with a KV cache for these lengths
    vllm = fdl.Partial(VLLMEngine, dtype=dtype, max_model_len=max_model_len)
    if name == "auto":
        return fdl.Config(AutoEngine, vllm=vllm)
    return vllm if engine_class(name) is VLLMEngine else engine_class(name)


def generation_stage(model, data, out, *, n, temperature, top_p, max_new_tokens, batch_size,
                      max_prompt_length, workers, gpus_per_worker, dtype, parent_run, engine="auto"):


    tokenizer = fdl.Config(load_tokenizer, model)
    return fdl.Config(
        GenerationStage,
        policy=policy_group(num_workers=workers, gpus_per_worker=gpus_per_worker, model_path=model, dtype=dtype,
                            engine=rollout_engine(engine, dtype, max_prompt_length + max_new_tokens)),
        dataset=fdl.Config(PromptDataset, rows=fdl.Config(load_rows, path=data), tokenizer=tokenizer,
                           max_prompt_length=max_prompt_length, name="generate"),
        sampling=fdl.Config(SamplingParams, n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens),
        output=out,
        prompts_per_call=batch_size,  # the command line's --batch-size
        parent_run=parent_run,
    )


def _root(name, stage, *, local, aim_repo, progress=True):


    return fdl.Config(
        Experiment,
        name=name,
        stages={name: stage},
        runtime=fdl.Config(LocalRuntime if local else RayRuntime),
        tracker=fdl.Config(AimTracker, repo=aim_repo, experiment=name) if aim_repo else None,
        progress=progress,
    )


def _parent(aim_repo, path, param="checkpoint"):
    """The Aim run that wrote `path` (a trainer's checkpoint, a generations file), if tracked."""
    if not aim_repo or path is None or not Path(path).exists():
        return None

    return producer_run(aim_repo, path, param)


def generation_experiment(
    model: str, data: str, out: str, n: int = 1, temperature: float = 1.0, top_p: float = 1.0,
    max_new_tokens: int = 512, batch_size: int = 64, max_prompt_length: int = 1024, workers: int = 1,
    gpus_per_worker: float = 0, dtype: str = "float32", local: bool = False, aim_repo: str | None = None,
    progress: bool = True, engine: str = "auto",
):
    """`rlhf generate`: one GenerationStage over `data` with `model` (linked to the run that trained it)."""
    stage = generation_stage(
        model, data, out, n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
        batch_size=batch_size, max_prompt_length=max_prompt_length, workers=workers,
        gpus_per_worker=gpus_per_worker, dtype=dtype, parent_run=_parent(aim_repo, model), engine=engine,
    )
    return _root("generate", stage, local=local, aim_repo=aim_repo, progress=progress)


def eval_experiment(
    generations: str | None = None, model: str | None = None, data: str | None = None, out: str | None = None,
    ks: tuple[int, ...] = (1, 2, 4, 8), n: int = 8, temperature: float = 1.0, top_p: float = 1.0,
    max_new_tokens: int = 512, batch_size: int = 64, max_prompt_length: int = 1024, workers: int = 1,
    gpus_per_worker: float = 0, dtype: str = "float32", n_boot: int = 1000, seed: int = 0,
    local: bool = False, aim_repo: str | None = None, progress: bool = True, engine: str = "auto",
):
    """`rlhf eval`: an EvalJob over a generations file, or over `model` x `data` (generated first,
    into `<out>/generations.jsonl`, resumable). Scored with `default_scorers()`."""


    if (generations is None) == (model is None or data is None):
        raise ValueError("give either generations=FILE, or model=MODEL and data=FILE")
    generation = None
    if generations is None:
        generation = generation_stage(
            model, data, None if out is None else str(Path(out) / "generations.jsonl"), n=n,
            temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, batch_size=batch_size,
            max_prompt_length=max_prompt_length, workers=workers, gpus_per_worker=gpus_per_worker,
            dtype=dtype, parent_run=None, engine=engine,
        )
    stage = fdl.Config(
        EvalJob,
        reward=fdl.Config(RewardManager, scorers=fdl.Config(default_scorers)),
        generations=generations,
        generation=generation,
        ks=tuple(ks),
        out_dir=out,
        n_boot=n_boot,
        seed=seed,
        parent_run=_parent(aim_repo, model) if model else _parent(aim_repo, generations, "generations"),
    )
    return _root("eval", stage, local=local or generation is None, aim_repo=aim_repo, progress=progress)
