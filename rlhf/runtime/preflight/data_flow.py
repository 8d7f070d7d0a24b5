"""Data-flow and stage-order rules: what one part of a graph needs from another.

- an advantage estimator that needs a critic in a trainer without one, a KL loss or KL penalty
  with no reference model, a distillation estimator with no teacher, a group estimator with one
  sample per prompt (the rules of
  `rlhf.algos.requirements`, which the trainer reads too), reported with the graph path to change;
- a stage using the output of a stage that does not run before it;
- (warnings) a `critic_warmup` that leaves the actor untrained: not below `total_steps`, or
  without a critic;
- every `data_source` of an RL stage's training rows and of an evaluator's rows against the
  reward's scorers (the trainer checks the same when it is built, but that is after the models
  load). Rows that come from an earlier stage or a stream are left to the trainer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import datasets
import fiddle as fdl
from fiddle import daglish

from rlhf.algos.requirements import reference_problems, setup_problems, staleness_problems, teacher_problems
from rlhf.data.arrow import data_sources, is_validated
from rlhf.runtime.preflight.graph import args, callable_of, cli_path, get, is_a, nodes, stage_prefix
from rlhf.runtime.remote import Remote, StageOutput
from rlhf.trainers.evaluate import Evaluator
from rlhf.trainers.rl import RLTrainer
from rlhf.workers.policy import PolicyWorker

__all__ = ["data_flow_problems", "reward_source_problems", "stage_order_problems"]


def stage_order_problems(graph: Any, selected: dict[str, Any]) -> list[str]:
    """A stage reading the output of a stage that runs after it, or not at all."""
    problems: list[str] = []
    order = list(dict(get(graph, "stages") or {}))
    for name, stage in selected.items():
        for node, path in nodes(stage, stage_prefix(name)):
            if not is_a(node, StageOutput):
                continue
            ref = fdl.build(node)
            where = cli_path(path)
            if ref.stage not in order or order.index(ref.stage) >= order.index(name):
                problems.append(
                    f"{where}: stage {name!r} uses the output {ref.key!r} of stage {ref.stage!r}, which has not "
                    f"run before it (stages run in order: {', '.join(order)}). Reorder the stages."
                )
            elif ref.stage not in selected:
                problems.append(
                    f"{where}: stage {name!r} uses the output {ref.key!r} of stage {ref.stage!r}, which is not "
                    f"among the stages to run. Run both (--stages {ref.stage},{name}), or give the value "
                    f"itself: --config 'set:{where}=\"...\"'."
                )
    return problems


def data_flow_problems(name: str, stage: Any) -> tuple[list[str], list[str]]:
    """(errors, warnings): the estimator/critic/sample-count/reference rules of `rlhf.algos.requirements`
    (the trainer reads the same rules), reported with the graph path to change."""
    errors: list[str] = []
    warnings: list[str] = []
    for node, path in nodes(stage, stage_prefix(name)):
        where = cli_path(path)
        problems = []
        if is_a(node, RLTrainer):
            arguments = args(node)
            estimator = arguments.get("advantage")
            n = get(arguments.get("sampling"), "n")
            # the estimator itself where it builds (small objects): one that wraps a task estimator has its needs
            estimator = (_built_or_none(estimator) or callable_of(estimator)) if estimator is not None else None
            problems = setup_problems(
                estimator, n=n if isinstance(n, int) else None,
                has_critic=arguments.get("critic") is not None,
                dynamic_sampling=arguments.get("dynamic_sampling") is not None,
            ) if estimator is not None else []
            warnings += critic_warmup_warnings(where, arguments)
            policy = arguments.get("policy")
            worker = get(policy, "worker")
            if estimator is not None and is_a(policy, Remote) and is_a(worker, PolicyWorker):
                problems += teacher_problems(estimator, has_teacher=get(worker, "teacher_model_path") is not None)
            if arguments.get("kl_in_reward") is not None and is_a(policy, Remote) and is_a(worker, PolicyWorker):
                has_ref = get(worker, "ref_model_path") is not None
                problems += reference_problems(kl_loss=False, kl_in_reward=True, has_ref=has_ref)
            objective = get(worker, "objective") if is_a(policy, Remote) else None
            problems += staleness_problems(stale_samples=arguments.get("async_rollout") is not None,
                                           rollout_correction=arguments.get("rollout_correction") is not None,
                                           decoupled=objective is not None and get(objective, "decoupled") is not None)
        if is_a(node, PolicyWorker):
            arguments = args(node)
            objective = arguments.get("objective")
            kl = get(objective, "kl_loss") if objective is not None else None
            problems = [  # paths below the worker, not below the trainer
                dataclasses.replace(p, field=p.field.removeprefix("policy.worker."),
                                    fix=p.fix.removeprefix("policy.worker."))
                for p in reference_problems(kl_loss=kl is not None, kl_in_reward=False,
                                            has_ref=arguments.get("ref_model_path") is not None)
            ]
        for problem in problems:
            fix = f" Fix: --config 'set:{where}.{problem.fix}'." if problem.fix else ""
            errors.append(f"{where}.{problem.field}: {problem.message}{fix}")
    return errors, warnings


def critic_warmup_warnings(where: str, arguments: dict[str, Any]) -> list[str]:
    """An RLTrainer's `critic_warmup` that keeps the actor from ever training, or idles it without a critic."""
    warmup, total = arguments.get("critic_warmup"), arguments.get("total_steps")
    if not isinstance(warmup, int) or not isinstance(total, int) or warmup == 0:
        return []
    if warmup >= total:
        return [f"{where}.critic_warmup={warmup} >= total_steps={total}: the actor is never updated in this stage "
                f"(only steps after the warm-up train it). Lower it, e.g. --config "
                f"set:{where}.critic_warmup={max(0, total - 1)}."]
    if arguments.get("critic") is None:
        return [f"{where}.critic_warmup={warmup} without a critic: the first {warmup} steps generate and score but "
                f"train nothing. Set --config set:{where}.critic_warmup=0, or add a critic."]
    return []


def reward_source_problems(name: str, stage: Any) -> list[str]:
    """A `data_source` in the rows an RLTrainer trains on (or an Evaluator scores) that its reward has no
    scorer for. Reads the rows' loader (cached by its own hook) and builds the reward, both cheap."""
    problems = []
    for node, path in nodes(stage, stage_prefix(name)):
        pairs = {RLTrainer: ("train_data", "reward"), Evaluator: ("dataset", "reward")}
        for cls, (data_arg, reward_arg) in pairs.items():
            if not is_a(node, cls):
                continue
            arguments = args(node)
            sources = _row_sources(arguments.get(data_arg))
            reward = _built_or_none(arguments.get(reward_arg))
            if sources is None or not callable(getattr(reward, "check_sources", None)):
                continue
            try:
                reward.check_sources(sources)
            except ValueError as err:
                where = cli_path((*path, daglish.Attr(data_arg)))
                problems.append(f"{where}: {err}")
    return problems


def _row_sources(dataset: Any) -> set[str] | None:
    """The data_source values of a dataset node's `rows`, or None when they cannot be read now."""
    if not isinstance(dataset, fdl.Buildable) or "rows" not in dataset.__arguments__:
        return None
    rows = _built_or_none(dataset.rows)
    if is_validated(rows):
        return data_sources(rows)
    if isinstance(rows, datasets.Dataset):
        return set(rows.unique("data_source")) - {None} if "data_source" in rows.column_names else None
    if isinstance(rows, (list, tuple)) and all(isinstance(r, dict) for r in rows):
        return {r["data_source"] for r in rows if isinstance(r.get("data_source"), str)}
    return None  # a stream (scanned when the trainer is built), or rows not readable now


def _built_or_none(value: Any) -> Any:
    """`value` built (a loader, a generator, a reward); None where it does not build now (a stage's output,
    a missing file: their own checks report those)."""
    if not isinstance(value, fdl.Buildable):
        return value
    try:
        return fdl.build(value)
    except Exception:  # noqa: BLE001 - reported elsewhere, or resolved later (StageOutput)
        return None
