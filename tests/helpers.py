"""Shared test fixtures' building blocks: the tiny model, built once per session."""

import atexit
import contextlib
import dataclasses
import functools
import os
import shutil
import tempfile
import types
from pathlib import Path

import fiddle as fdl
import torch

from rlhf.models.tiny import byte_level_qwen2_tokenizer, tiny_qwen2

PROJECT = Path(__file__).resolve().parents[1]  # this checkout
_ROOT = os.environ.get("RLHF_TEST_MODELS", os.path.join(tempfile.gettempdir(), "rlhf-test-models"))


@functools.cache
def tiny_model_path(hidden_size: int = 32, num_layers: int = 2, seed: int = 0) -> str:
    """A tiny Qwen2 folder shared by tests (built on first use; identical for a given seed)."""
    return tiny_qwen2(
        os.path.join(_ROOT, f"h{hidden_size}-l{num_layers}-s{seed}"),
        hidden_size=hidden_size, num_layers=num_layers, intermediate_size=4 * hidden_size, seed=seed,
    )


@functools.cache
def short_answer_model(path: str | None = None) -> str:
    """`path` (the tiny model) after 40 SFT steps on short arithmetic answers: its sampled turns end on EOS within a
    few tokens (a random model almost never samples EOS, so its every agent turn would be cut by max_new_tokens).
    Made once per process, in a temporary folder removed when the process exits."""
    import itertools

    from rlhf.data.generators import arithmetic_rows
    from rlhf.data.sft import SFTDataset
    from rlhf.models.loading import load_tokenizer
    from rlhf.workers.objectives import SFTObjective
    from rlhf.workers.policy import PolicyWorker
    from rlhf.workers.training import TrainingSetup

    path = path or tiny_model_path()
    torch.manual_seed(0)
    worker = PolicyWorker(path, objective=SFTObjective(), optimizer=functools.partial(torch.optim.AdamW, lr=1e-2),
                          training=TrainingSetup(micro_batch_size=64))
    data = SFTDataset(arithmetic_rows(256, seed=5), load_tokenizer(path))
    for batch in itertools.islice(data.shuffled(64, seed=0, bucketed=False), 40):
        worker.update(batch)
    folder = tempfile.mkdtemp(prefix="short-answers-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return worker.save(folder)


def training_knobs(kw: dict, into=None) -> dict:
    """`kw` with TrainingSetup's fields (micro_batch_size=4, strategy="fsdp", ...) moved into one
    `training=` argument: a TrainingSetup, or `into(**knobs)` (e.g. a `fdl.Config` of it) for graphs."""
    from rlhf.workers.training import TrainingSetup

    fields = {f.name for f in dataclasses.fields(TrainingSetup)}
    knobs = {k: kw.pop(k) for k in list(kw) if k in fields}
    return {**kw, "training": (into or TrainingSetup)(**knobs)}


def grpo_worker(**kw):
    """A PolicyWorker on the tiny model with a PPO-clip + k3 KL objective; TrainingSetup's fields
    (micro_batch_size: 4 here) may be given as keywords."""
    from rlhf.algos import KLLoss, PPOClipLoss, kl_k3
    from rlhf.workers.objectives import PolicyObjective
    from rlhf.workers.policy import PolicyWorker

    path = tiny_model_path()
    objective = PolicyObjective(policy_loss=PPOClipLoss(), kl_loss=KLLoss(estimator=kl_k3, coef=0.1))
    return PolicyWorker(path, objective=objective,
                        **training_knobs({"micro_batch_size": 4, "ref_model_path": path, **kw}))


def scored_rollout(worker, prompts=4, n=4, seed=0):
    """A generated batch with random advantages and reference log-probs, ready for `update`."""
    from rlhf.data.generators import arithmetic_rows
    from rlhf.data.prompts import PromptDataset
    from rlhf.models.loading import load_tokenizer
    from rlhf.rollout.sampling import SamplingParams

    data = PromptDataset(arithmetic_rows(prompts, seed=seed), load_tokenizer(tiny_model_path()))
    torch.manual_seed(seed)
    batch = worker.generate(data.collate(range(prompts)), SamplingParams(n=n, max_new_tokens=6))
    g = torch.Generator().manual_seed(seed)
    batch["advantages"] = torch.randn(len(batch), 1, generator=g) * batch["response_mask"]
    return batch.union(worker.compute_ref_log_probs(batch))


def group_plan(num_workers, **worker):
    """The Plan of a policy group of `num_workers` on the tiny model (same objective as grpo_worker unless
    `objective=` gives a node); `worker`: more PolicyWorker arguments (`optimizer` replaces the default SGD), TrainingSetup's fields
    among them (they go to the worker's `training` node)."""
    from rlhf.algos import KLLoss, PPOClipLoss, kl_k3
    from rlhf.runtime.plan import compile_graph
    from rlhf.workers.objectives import PolicyObjective
    from rlhf.workers.training import TrainingSetup
    from rlhf_configs.pieces import policy_group

    path = tiny_model_path()
    objective = worker.pop("objective", None) or fdl.Config(
        PolicyObjective, policy_loss=fdl.Config(PPOClipLoss), kl_loss=fdl.Config(KLLoss, estimator=kl_k3, coef=0.1)
    )
    # SGD: the update is lr * gradient, so comparing parameters compares gradients. (Adam's first
    # step is ~lr * sign(g): float noise flips near-zero gradients and hides what is compared.)
    worker = training_knobs({"optimizer": fdl.Partial(torch.optim.SGD, lr=0.1), "micro_batch_size": 3, **worker},
                            into=lambda **knobs: fdl.Config(TrainingSetup, **knobs))
    return compile_graph(
        policy_group(num_workers=num_workers, model_path=path, ref_model_path=path, objective=objective, **worker)
    )


def updated_group(num_workers: int, batch, **worker) -> tuple[list[dict], list[dict]]:
    """One update of a `group_plan(num_workers, **worker)` group on `batch`: each rank's metrics and parameters.
    One worker runs on LocalRuntime; more run through Ray (two gloo processes), as FSDP ranks do."""
    from rlhf.runtime.local import LocalRuntime
    from rlhf.runtime.ray_runtime import RayRuntime

    runtime = LocalRuntime() if num_workers == 1 else RayRuntime(num_cpus=num_workers)
    try:
        group = runtime.start_groups(group_plan(num_workers, **worker))["policy"]
        metrics = group.update(batch)
        return (metrics if isinstance(metrics, list) else [metrics]), group.parameters_digest()
    finally:
        runtime.shutdown()


@functools.cache
def vllm_model_path(seed: int = 0) -> str:
    """The tiny Qwen2 for vLLM tests: vLLM's CPU attention needs head_dim >= 32 (hidden 64, 2 heads, 1 KV head)."""
    return tiny_qwen2(
        os.path.join(_ROOT, f"vllm-h64-l2-s{seed}"), hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
        intermediate_size=256, seed=seed,
    )


def vllm_engine(**options):
    """A VLLMEngine on `vllm_model_path()` sized for tests: fp32 (token-exact with transformers), short context."""
    from rlhf.rollout.vllm_engine import VLLMEngine

    settings = dict(dtype="float32", max_model_len=256, max_num_seqs=64)
    return VLLMEngine(vllm_model_path(), **{**settings, **options})


def chat_batch(tokenizer, texts):
    """Left-padded chat prompts for `texts`, as a rollout engine takes them."""
    from rlhf.batch import Batch
    from rlhf.data.tokenize import chat_prompt_ids, left_pad, position_ids

    rows = [chat_prompt_ids(tokenizer, [{"role": "user", "content": t}]) for t in texts]
    ids, mask = left_pad(rows, tokenizer.pad_token_id)
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": position_ids(mask)}, {"uid": list(texts)})


# Not ChatML: the policy's template differs, so reusing its token ids would be caught.
RM_TEMPLATE = (
    "{% for message in messages %}[{{ message['role'] | upper }}] {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[ASSISTANT] {% endif %}<|endoftext|>"
)


@functools.cache
def tiny_reward_model() -> str:
    """A tiny Qwen2ForSequenceClassification (one label) + byte-level tokenizer with its own template."""
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    path = os.path.join(tempfile.gettempdir(), "rlhf-test-models", "rm-h32-l2-s0")
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    tok = byte_level_qwen2_tokenizer()
    tok.chat_template = RM_TEMPLATE
    tok.pad_token = "<|im_start|>"  # unlike the policy's, and not the template's last token
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=32, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, num_labels=1, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=None,
    )
    torch.manual_seed(0)
    model = Qwen2ForSequenceClassification(config)
    torch.nn.init.normal_(model.score.weight, std=1.0)  # scores of order 1, so rows differ visibly
    tmp = tempfile.mkdtemp(dir=os.path.dirname(path))
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        os.replace(tmp, path)
    except OSError:  # another process wrote it first
        pass
    return path


@contextlib.contextmanager
def small_disk(folder, size: str = "20m"):
    """A real filesystem of `size` (a tmpfs) mounted at `folder`, for full-disk tests; skips the test where
    mounting is not allowed (it needs root or CAP_SYS_ADMIN), saying so."""
    import subprocess

    import pytest

    os.makedirs(folder, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a {size} tmpfs at {folder} ({done.stderr.strip() or done.returncode}): "
                    "the full-disk tests need a real small filesystem (run them as root)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def fill_disk(folder, leave: int = 0) -> int:
    """Fill the filesystem of `folder` with a file `filler` until it is full, then give back `leave` bytes;
    returns the filler's size. Delete the file to free the space."""
    path = os.path.join(folder, "filler")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        block = b"\0" * 2**16
        while True:
            try:
                if os.write(fd, block) == 0:
                    break
            except OSError:
                break
        size = os.lseek(fd, 0, os.SEEK_END)
        os.ftruncate(fd, max(0, size - leave))
    finally:
        os.close(fd)
    return os.path.getsize(path)


def _teacher_stage(tokenizer, rows):
    """40 SFT steps of the tiny model on the additions: a teacher far more sure of its answers than the student."""
    from rlhf.data.sft import SFTDataset
    from rlhf.trainers.sft import SFTTrainer
    from rlhf.workers.objectives import SFTObjective
    from rlhf.workers.training import TrainingSetup
    from rlhf_configs.pieces import policy_group

    return fdl.Config(
        SFTTrainer,
        policy=policy_group(model_path=tiny_model_path(), objective=fdl.Config(SFTObjective),
                            optimizer=fdl.Partial(torch.optim.AdamW, lr=3e-3),
                            training=fdl.Config(TrainingSetup, micro_batch_size=64)),
        data=fdl.Config(SFTDataset, rows=rows, tokenizer=tokenizer),
        batch_size=64, total_steps=40, bucketed=False,
    )


def distillation_graph(out: str, teacher=None, top_k: int = 0, steps: int = 8):
    """On-policy distillation on the tiny model, in-process and untracked: the untrained tiny model (8 prompts x 4
    samples of 6 tokens a step, AdamW 3e-2) distilled from `teacher` (a folder; None: a stage "teacher" makes one
    first by SFT); `top_k` > 0 adds the top-k forward KL."""
    from rlhf.algos import GRPO, PPOClipLoss
    from rlhf.data.generators import arithmetic_rows
    from rlhf.data.prompts import PromptDataset
    from rlhf.models.loading import load_tokenizer
    from rlhf.rewards.arithmetic import exact_match_score
    from rlhf.rewards.manager import RewardManager
    from rlhf.rollout.sampling import SamplingParams
    from rlhf.runtime.experiment import Experiment
    from rlhf.runtime.local import LocalRuntime
    from rlhf.runtime.remote import StageOutput
    from rlhf.trainers.rl import RLTrainer
    from rlhf.workers.objectives import PolicyObjective
    from rlhf.workers.training import TrainingSetup
    from rlhf_configs.algorithms import use_distillation
    from rlhf_configs.pieces import policy_group

    student = tiny_model_path()
    tokenizer = fdl.Config(load_tokenizer, student)
    rows = fdl.Config(arithmetic_rows, n=512, seed=0, split="train")
    stages = {}
    if teacher is None:
        stages["teacher"] = _teacher_stage(tokenizer, rows)
        teacher = fdl.Config(StageOutput, stage="teacher")
    opd = fdl.Config(
        RLTrainer,
        policy=policy_group(model_path=student,
                            objective=fdl.Config(PolicyObjective, policy_loss=fdl.Config(PPOClipLoss)),
                            optimizer=fdl.Partial(torch.optim.AdamW, lr=3e-2),
                            training=fdl.Config(TrainingSetup, micro_batch_size=64)),
        tokenizer=tokenizer,
        train_data=fdl.Config(PromptDataset, rows=rows, tokenizer=tokenizer),
        reward=fdl.Config(RewardManager, scorers={"arithmetic": exact_match_score}),
        advantage=fdl.Config(GRPO),
        sampling=fdl.Config(SamplingParams, n=4, temperature=1.0, max_new_tokens=6),
        prompts_per_step=8, total_steps=steps, records=None,
    )
    use_distillation(opd, teacher, top_k=top_k)
    return fdl.Config(Experiment, name="opd_tiny", stages={**stages, "opd": opd},
                      runtime=fdl.Config(LocalRuntime), tracker=None, output_dir=out, progress=False)


def run_capturing(monkeypatch, graph) -> dict[int, tuple[dict, object]]:
    """Run the experiment `graph`, keeping each RL step's metrics and the batch it trained on."""
    from rlhf.runtime.experiment import run_experiment
    from rlhf.trainers.rl import RLTrainer

    seen = {}
    step = RLTrainer.step

    def spy(self, rollouts, needs, n):
        metrics, batch = step(self, rollouts, needs, n)
        seen[n] = (metrics, batch)
        return metrics, batch

    monkeypatch.setattr(RLTrainer, "step", spy)
    run_experiment(graph)
    return seen


def load_file(relative: str) -> types.ModuleType:
    """An experiment or benchmark file of this checkout (`"experiments/arithmetic_tiny.py"`), executed afresh
    as the command line loads it: a module named after the file, registered in `sys.modules`."""
    from rlhf.cli.experiment import load_experiment  # pulls in the runtime: only tests that load a file pay

    return load_experiment(str(PROJECT / relative))
