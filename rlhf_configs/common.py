"""Fiddlers every experiment accepts on its command line (`--config fiddler:local`, ...)."""

from __future__ import annotations

import dataclasses
import inspect

import fiddle as fdl
from fiddle import selectors

from rlhf.config.gin_overrides import apply_gin
from rlhf.config.overrides import OverrideError
from rlhf.runtime.experiment import Experiment
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.remote import Remote
from rlhf.trainers.async_rollout import OnStale, Transport
from rlhf.trainers.rl import RLTrainer
from rlhf.workers.critic import CriticWorker
from rlhf.workers.fsdp import FSDP
from rlhf.workers.lora import LoRA
from rlhf.workers.policy import PolicyWorker
from rlhf.workers.reward_model import RewardModelWorker
from rlhf.workers.training import TrainingSetup
from rlhf_configs.algorithms import use_distillation
from rlhf_configs.async_rollout import Correction, Placement, use_async_rollout
from rlhf_configs.tasks import use_reward_model


def local(cfg: fdl.Config[Experiment]) -> None:
    """Run every worker group in this process (world size 1): breakpoint() works, start-up is instant."""
    cfg.runtime = fdl.Config(LocalRuntime)


def workers(cfg: fdl.Config[Experiment], n: int = 2) -> None:
    """Data-parallel over `n` workers in every worker group (Ray runtime)."""
    selectors.select(cfg, Remote).set(num_workers=n)


def threads(cfg: fdl.Config[Experiment], n: int = 2) -> None:
    """`n` CPUs for every worker group's workers, which is also their torch thread count (e.g. both cores of a
    2-core machine for a one-worker recipe on LocalRuntime). On a busy machine more threads can be much slower."""
    if n < 1:
        raise OverrideError(f"fiddler:threads needs n >= 1 (CPUs, and torch threads, per worker), got {n}")
    selectors.select(cfg, Remote).set(cpus_per_worker=n)


def no_tracking(cfg: fdl.Config[Experiment]) -> None:
    """Do not record runs in Aim (e.g. on a machine without aim installed)."""
    cfg.tracker = None


def quiet(cfg: fdl.Config[Experiment]) -> None:
    """No progress bars (logs stay readable in CI)."""
    cfg.progress = False


def cpu(cfg: fdl.Config[Experiment]) -> None:
    """Run on CPUs in float32 (rlhf_configs/cpu.gin): no GPUs, float32 weights and matmuls, DDP."""
    apply_gin(cfg, "cpu.gin")


def gin(cfg: fdl.Config[Experiment], path: str | None = None, text: str | None = None) -> None:
    """Apply a gin file's bindings (rlhf_configs/*.gin or your own), e.g. fiddler:gin(path='debug.gin')."""
    apply_gin(cfg, path, text)


def fsdp(cfg: fdl.Config[Experiment], reshard_after_forward: bool = True) -> None:
    """Shard every trained and frozen model with FSDP2 (also on CPUs, over gloo; with `workers(n=2)`
    each of 2 ranks holds half of every model). The plan (`--print_plan`) shows the shard sizes."""
    strategy = "fsdp" if reshard_after_forward else fdl.Config(FSDP, reshard_after_forward=False)
    for role in (PolicyWorker, CriticWorker, RewardModelWorker):
        for worker in selectors.select(cfg, role, check_nonempty=False):
            if not isinstance(worker.training, fdl.Config):  # a worker on its default setup gets a node
                worker.training = fdl.Config(TrainingSetup, **dataclasses.asdict(worker.training))
    selectors.select(cfg, TrainingSetup, check_nonempty=False).set(strategy=strategy)  # absent roles: nothing to do


def lora(cfg: fdl.Config[Experiment], **options) -> None:
    """Train a LoRA adapter instead of all weights in every trained policy and reward model, e.g. fiddler:lora(rank=16, alpha=32)
    (`options` are LoRA's: rank, alpha, dropout, target_modules; unset ones keep LoRA's defaults). Where the
    reference is the policy's own model, the base with the adapter disabled is the reference: no second copy.
    Adapters usually want a learning rate about 10x a full fine-tune's."""
    unknown = sorted(set(options) - set(inspect.signature(LoRA).parameters))
    if unknown:
        raise OverrideError(f"fiddler:lora got unknown option(s) {', '.join(unknown)}; LoRA takes "
                            f"{', '.join(inspect.signature(LoRA).parameters)}")
    for worker in selectors.select(cfg, PolicyWorker, check_nonempty=False):
        if worker.objective is not None:  # inference-only policies (generate, eval) have nothing to adapt
            worker.adapter = fdl.Config(LoRA, **options)
    for worker in selectors.select(cfg, RewardModelWorker, check_nonempty=False):
        if worker.loss is not None:  # a reward model being trained (its new score head trains whole)
            worker.adapter = fdl.Config(LoRA, **options)


def distill(cfg: fdl.Config[Experiment], teacher: str, distill_coef: float = 1.0, task_reward: bool = False,
            top_k: int = 0) -> None:
    """On-policy distillation in every RL stage: a frozen `teacher` folder (the policy's tokenizer) scores each
    sampled token and the advantage is the per-token reverse KL to it (`task_reward`: plus the stage's task
    advantage; `top_k`: plus a top-k forward KL loss). docs/distillation.md."""
    for stage in selectors.select(cfg, RLTrainer):
        use_distillation(stage, teacher, distill_coef=distill_coef, task_reward=task_reward, top_k=top_k)


def reward_model(cfg: fdl.Config[Experiment], path: str, weight: float = 1.0, rule_weight: float = 1.0,
                 tokenizer_path: str | None = None, max_length: int = 2048, normalize: bool = True) -> None:
    """Score every RL stage's samples with a reward model (a sequence-classification folder, e.g. `rlhf rm`'s) as
    well: score = rule_weight x rule + weight x RM; rule_weight=0 trains on the reward model alone and still reports
    the rule as reward/rule/mean. `normalize`: apply the reward mean/std stored with the model (docs/rewards.md)."""
    for stage in selectors.select(cfg, RLTrainer):
        use_reward_model(stage, path, weight=weight, tokenizer_path=tokenizer_path, max_length=max_length,
                         rule_weight=rule_weight, normalize=normalize)


def one_step_off(cfg: fdl.Config[Experiment], placement: Placement = "separate", transport: Transport = "auto",
                 correction: Correction = "bypass") -> None:
    """Asynchronous rollout, one step off policy (verl): while the trainer updates on batch k, a rollout group
    generates batch k+1 with the weights of version k-1; reproducible, and resumes bit-identically. Loss: PPO's
    ratio against the behaviour policy ("bypass") or AReaL's "decoupled" objective (docs/async.md). Every RL stage."""
    for stage in selectors.select(cfg, RLTrainer):
        use_async_rollout(stage, max_staleness=1, on_stale="wait", weights="fixed_lag", placement=placement,
                          transport=transport, correction=correction)


def streaming(cfg: fdl.Config[Experiment], max_staleness: int = 2, on_stale: OnStale = "wait",
              placement: Placement = "separate", transport: Transport = "auto", correction: Correction = "bypass",
              partial_rollouts: bool = False) -> None:
    """Bounded-staleness streaming: a rollout group generates continuously with the newest weights, and a
    sample more than `max_staleness` versions old is waited for or dropped (`on_stale`). Depends on timing,
    so runs differ; loss as in `one_step_off` (docs/async.md). `partial_rollouts`: multi-turn conversations
    outlive their batch and continue on newer weights (docs/async.md#partial-rollouts). Every RL stage."""
    for stage in selectors.select(cfg, RLTrainer):
        use_async_rollout(stage, max_staleness=max_staleness, on_stale=on_stale, weights="newest",
                          placement=placement, transport=transport, correction=correction,
                          partial_rollouts=partial_rollouts)
