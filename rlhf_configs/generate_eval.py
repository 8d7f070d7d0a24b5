"""The graphs of `rlhf generate`, `rlhf eval` and `rlhf probe`: plain experiments that run_experiment runs."""

from __future__ import annotations

from pathlib import Path

import fiddle as fdl

from rlhf.data.prompts import PromptDataset
from rlhf.data.sources import load_rows
from rlhf.models.loading import load_tokenizer
from rlhf.rewards import RewardManager, scorers_with
from rlhf.rewards.registry import Scorer
from rlhf.rollout.choose import AutoEngine, engine_class
from rlhf.rollout.hf_engine import HFEngine
from rlhf.rollout.sampling import SamplingParams
from rlhf.rollout.vllm_engine import VLLMEngine
from rlhf.runtime.experiment import Experiment
from rlhf.tracking.query import producer_run
from rlhf.trainers.eval_job import EvalJob
from rlhf.trainers.generate import RESPONSES_PER_CALL, GenerationStage
from rlhf.trainers.probe import ProbeJob
from rlhf_configs.pieces import one_stage_experiment, policy_group


def rollout_engine(name: str, dtype: str, max_model_len: int):
    """The policy worker's engine slot for `--engine NAME`; auto: `AutoEngine`, which picks vLLM on a
    worker with a GPU and vLLM, else transformers (chosen on the worker, not on this machine). The
    transformers engine decodes at most RESPONSES_PER_CALL rows at once (its KV cache is sized for them;
    a bigger call refills finished rows' slots with its pending prompts)."""
    # vLLM keeps its own copy: in the requested dtype, with a KV cache for these lengths
    vllm = fdl.Partial(VLLMEngine, dtype=dtype, max_model_len=max_model_len)
    hf = fdl.Partial(HFEngine, max_rows_per_call=RESPONSES_PER_CALL)
    if name == "auto":
        return fdl.Config(AutoEngine, vllm=vllm, hf=hf)
    return vllm if engine_class(name) is VLLMEngine else hf


def fit_engine_context(graph: fdl.Config, keep_longer: bool = False) -> fdl.Config:
    """Set each GenerationStage's vLLM context (`max_model_len`, where its engine node sets one) to the stage's
    prompt + response limit, after the command line changed them (`--max-new-tokens`, `set:`): the builder's
    value came from its default lengths, which may exceed the model's positions (vLLM refuses that) or fall short
    of the new limits. `keep_longer`: a context the user set (`set:...max_model_len=`) stays where it is longer."""
    for stage in graph.stages.values():
        generation = stage if fdl.get_callable(stage) is GenerationStage else getattr(stage, "generation", None)
        if generation is None:
            continue
        engine = generation.policy.worker.engine
        engine = engine.vllm if fdl.get_callable(engine) is AutoEngine else engine
        if fdl.get_callable(engine) is VLLMEngine and "max_model_len" in engine.__arguments__:
            need = generation.dataset.max_prompt_length + generation.sampling.max_new_tokens
            engine.max_model_len = max(engine.max_model_len or 0, need) if keep_longer else need
    return graph


def reward_manager(scorer: Scorer | None = None, scorers: dict[str, Scorer] | None = None) -> fdl.Config:
    """The reward of `rlhf eval`/`generate`: each data_source's built-in scorer (rlhf.rewards.RULES), `scorers`
    (data_source -> scorer) over them; `scorer` scores every data_source `scorers` does not name instead."""
    return fdl.Config(RewardManager, scorers=fdl.Config(scorers_with, overrides=dict(scorers or {}),
                                                         builtin=scorer is None), default=scorer)


def generation_stage(model, data, out, *, n, temperature, top_p, max_new_tokens, batch_size,
                      max_prompt_length, workers, gpus_per_worker, dtype, parent_run, engine="auto", limit=None,
                      reward=None, kind="generation"):
    """A GenerationStage over the first `limit` rows of `data` (`kind` "generation": rows may leave out the
    ground truth; "prompt": they must carry it, for scoring)."""
    tokenizer = fdl.Config(load_tokenizer, model)
    return fdl.Config(
        GenerationStage,
        policy=policy_group(num_workers=workers, gpus_per_worker=gpus_per_worker, model_path=model, dtype=dtype,
                            engine=rollout_engine(engine, dtype, max_prompt_length + max_new_tokens)),
        dataset=fdl.Config(PromptDataset, rows=fdl.Config(load_rows, path=data, kind=kind, limit=limit),
                           tokenizer=tokenizer, max_prompt_length=max_prompt_length, name="generate"),
        sampling=fdl.Config(SamplingParams, n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens),
        output=out,
        prompts_per_call=batch_size,  # the command line's --batch-size
        parent_run=parent_run,
        reward=reward,
        model=model,
        dtype=dtype,  # recorded in each row: a resume with another --dtype is refused
    )


def _parent(aim_repo, path, param="checkpoint"):
    """The Aim run that wrote `path` (a trainer's checkpoint, a generations file), if tracked."""
    if not aim_repo or path is None or not Path(path).exists():
        return None

    return producer_run(aim_repo, path, param)


def generation_experiment(
    model: str, data: str, out: str, n: int = 1, temperature: float = 1.0, top_p: float = 1.0,
    max_new_tokens: int = 512, batch_size: int | None = None, max_prompt_length: int = 1024, workers: int = 1,
    gpus_per_worker: float = 0, dtype: str = "float32", local: bool = False, aim_repo: str | None = None,
    progress: bool = True, engine: str = "auto", limit: int | None = None, scorer: Scorer | None = None,
    scorers: dict[str, Scorer] | None = None,
):
    """`rlhf generate`: one GenerationStage over (the first `limit` rows of) `data` with `model` (linked to the
    run that trained it). Prompts need no ground truth. With `scorer` (every data_source) or `scorers` (some,
    the others keep their built-in scorer) every response is scored too (`scores` in each row)."""
    reward = reward_manager(scorer, scorers) if scorer is not None or scorers else None
    stage = generation_stage(
        model, data, out, n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
        batch_size=batch_size, max_prompt_length=max_prompt_length, workers=workers,
        gpus_per_worker=gpus_per_worker, dtype=dtype, parent_run=_parent(aim_repo, model), engine=engine,
        limit=limit, reward=reward,
    )
    return one_stage_experiment("generate", stage, local=local, aim_repo=aim_repo, progress=progress)


def eval_experiment(
    generations: str | None = None, model: str | None = None, data: str | None = None, out: str | None = None,
    ks: tuple[int, ...] = (1, 2, 4, 8), n: int = 8, temperature: float = 1.0, top_p: float = 1.0,
    max_new_tokens: int = 512, batch_size: int | None = None, max_prompt_length: int = 1024, workers: int = 1,
    gpus_per_worker: float = 0, dtype: str = "float32", n_boot: int = 1000, seed: int = 0,
    local: bool = False, aim_repo: str | None = None, progress: bool = True, engine: str = "auto",
    limit: int | None = None, scorer: Scorer | None = None, scorers: dict[str, Scorer] | None = None,
):
    """`rlhf eval`: an EvalJob over a generations file, or over (the first `limit` rows of) `model` x `data`
    (generated first, into `<out>/generations.jsonl`, resumable). Scored with each data_source's built-in
    scorer, `scorers` (data_source -> scorer) over them, and `scorer` for every data_source `scorers` does
    not name (see `reward_manager`)."""
    if (generations is None) == (model is None or data is None):
        raise ValueError("give either generations=FILE, or model=MODEL and data=FILE")
    generation = None
    if generations is None:
        generation = generation_stage(
            model, data, None if out is None else str(Path(out) / "generations.jsonl"), n=n,
            temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, batch_size=batch_size,
            max_prompt_length=max_prompt_length, workers=workers, gpus_per_worker=gpus_per_worker,
            dtype=dtype, parent_run=None, engine=engine, limit=limit, kind="prompt",
        )
    stage = fdl.Config(
        EvalJob,
        reward=reward_manager(scorer, scorers),
        generations=generations,
        generation=generation,
        ks=tuple(ks),
        out_dir=out,
        n_boot=n_boot,
        seed=seed,
        parent_run=_parent(aim_repo, model) if model else _parent(aim_repo, generations, "generations"),
    )
    return one_stage_experiment("eval", stage, local=local or generation is None, aim_repo=aim_repo, progress=progress)


def probe_experiment(
    model: str, data: str, out: str | None = None, budgets: tuple[int, ...] = (16, 32, 64, 128, 256),
    max_new_tokens: int = 512, batch_size: int | None = None, max_prompt_length: int = 1024, workers: int = 1,
    gpus_per_worker: float = 0, dtype: str = "float32", local: bool = False, aim_repo: str | None = None,
    progress: bool = True, engine: str = "auto", limit: int | None = None, scorer: Scorer | None = None,
    scorers: dict[str, Scorer] | None = None, max_cut: float = 0.05, samples: int = 0, temperature: float = 0.7,
    samples_max_new_tokens: int | None = None,
):
    """`rlhf probe`: a ProbeJob over (the first `limit` rows of) `model` x `data`, greedy, one response per row,
    generated into `<out without .json>.generations.jsonl` (resumable) and scored as `rlhf eval` scores; the
    report goes to `out` (None: the stage folder's probe.json). `samples` > 0: that many more per row at
    `temperature` (into `<out without .json>.samples.jsonl`), for pass@k and GRPO's signal."""
    generations = None if out is None else str(Path(out).with_suffix("")) + ".generations.jsonl"
    generation = generation_stage(
        model, data, generations, n=1, temperature=0.0, top_p=1.0, max_new_tokens=max_new_tokens,
        batch_size=batch_size, max_prompt_length=max_prompt_length, workers=workers,
        gpus_per_worker=gpus_per_worker, dtype=dtype, parent_run=_parent(aim_repo, model), engine=engine,
        limit=limit, kind="prompt",
    )
    stage = fdl.Config(ProbeJob, generation=generation, reward=reward_manager(scorer, scorers),
                       budgets=tuple(budgets), out=out, max_cut=max_cut, samples=samples, temperature=temperature,
                       samples_max_new_tokens=samples_max_new_tokens)
    return one_stage_experiment("probe", stage, local=local, aim_repo=aim_repo, progress=progress)
