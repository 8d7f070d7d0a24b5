"""RewardModelTrainer on the tiny model through LocalRuntime: held-out accuracy rises on separable pairs, the exported
folder loads with its head intact and scores as the trainer did, the reward statistics normalise RL scores, exact
resume, a pair never split across micro-batches."""

import functools
import random
from pathlib import Path

import fiddle as fdl
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSequenceClassification

from helpers import tiny_model_path
from rlhf.algos.reward_model_loss import BradleyTerryLoss
from rlhf.batch import Batch
from rlhf.data.preferences import PreferenceDataset, write_preference_rows
from rlhf.models.loading import load_tokenizer
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.plan import bind_groups, compile_graph
from rlhf.trainers.context import StageContext
from rlhf.trainers.reward_model import RewardModelTrainer
from rlhf.workers.reward_model import MissingRewardHeadError, RewardModelWorker
from rlhf.workers.training import TrainingSetup
from rlhf_configs.reward_model import rm_stage

GOOD, BAD = ("kind", "warm", "glad", "calm"), ("rude", "cold", "grim", "mean")


def separable_rows(n: int, seed: int) -> list[dict]:
    """Pairs whose chosen reply ends with a friendly word and rejected with an unfriendly one of the same
    length, the rest of both replies the same random letters: learnable, and no length cue."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        tail = "".join(rng.choice("xyzw ") for _ in range(rng.randint(2, 12)))
        rows.append({"prompt": [{"role": "user", "content": f"{rng.randint(10, 99)}+{rng.randint(10, 99)}"}],
                     "chosen": [{"role": "assistant", "content": f"{tail} {rng.choice(GOOD)}"}],
                     "rejected": [{"role": "assistant", "content": f"{tail} {rng.choice(BAD)}"}]})
    return rows


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[str, str]:
    folder = tmp_path_factory.mktemp("pairs")
    return (str(write_preference_rows(separable_rows(48, 0), folder / "train.jsonl")),
            str(write_preference_rows(separable_rows(24, 1), folder / "val.jsonl")))


def stage(files, **options) -> fdl.Config[RewardModelTrainer]:
    settings = dict(steps=12, batch_size=8, micro_batch_size=4, lr=2e-2, warmup_steps=0, test_freq=6, max_length=64)
    return rm_stage(tiny_model_path(), files[0], files[1], **{**settings, **options})


def run(graph: fdl.Config[RewardModelTrainer], out: Path, resume: bool = False, after=None):
    """The stage as the runner runs it (LocalRuntime); each step's metrics, and `after(group)` while it lives."""
    plan = compile_graph(graph)
    runtime = LocalRuntime()
    groups = runtime.start_groups(plan)
    logged: dict[int, dict] = {}
    try:
        trainer = fdl.build(bind_groups(plan.driver, groups))
        result = trainer.run(StageContext(out_dir=out, log=lambda m, s: logged.setdefault(s, {}).update(m),
                                          progress=False, resume=resume))
        extra = after(trainer.rm) if after is not None else None
    finally:
        runtime.shutdown()
    return logged, result, extra


def test_heldout_accuracy_rises_and_the_export_scores_as_the_trainer(files, tmp_path):
    graph = stage(files)
    graph.val_before_train = True
    tokenizer = load_tokenizer(tiny_model_path())
    val = PreferenceDataset(separable_rows(24, 1), tokenizer, max_length=64)
    batch = val.collate(range(len(val)))
    logged, result, trained = run(graph, tmp_path, after=lambda rm: rm.compute_scores(batch)["rm_scores"])

    # measured: accuracy 0.458 before training, 1.0 after 6 and 12 steps; loss 0.69 -> 0.07
    assert logged[0]["rm/accuracy"] < 0.6 and logged[12]["rm/accuracy"] == 1.0
    assert logged[12]["val/rm_loss"] < 0.25 * logged[0]["val/rm_loss"]
    assert logged[12]["rm/chosen_mean"] > logged[12]["rm/rejected_mean"]
    assert logged[12]["rm/margin"] == pytest.approx(logged[12]["rm/chosen_mean"] - logged[12]["rm/rejected_mean"],
                                                    abs=1e-5)
    assert {"rm/loss", "rm/train/accuracy", "rm/grad_norm", "rm/lr"} <= set(logged[1])

    folder = result["checkpoint"]
    _, info = AutoModelForSequenceClassification.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"]  # nothing initialised afresh
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    assert model.config.reward_mean == pytest.approx(result["reward_mean"])
    assert model.config.reward_std == pytest.approx(result["reward_std"]) and result["reward_std"] > 0

    # RL's path: the raw chat messages and the response text, re-rendered by the worker's template
    rows = separable_rows(24, 1)
    texts = Batch({"x": torch.zeros(2 * len(rows))},
                  {"raw_prompt": [r["prompt"] for r in rows for _ in range(2)],
                   "response_text": [r[side][0]["content"] for r in rows for side in ("chosen", "rejected")]})
    raw = RewardModelWorker(folder, max_length=64, normalize=False).score(texts)["rm_scores"]
    torch.testing.assert_close(raw, trained, atol=1e-5, rtol=1e-5)
    normalised = RewardModelWorker(folder, max_length=64).score(texts)["rm_scores"]
    torch.testing.assert_close(normalised, (trained - result["reward_mean"]) / result["reward_std"],
                               atol=1e-5, rtol=1e-5)


def test_a_folder_without_its_head_is_refused_not_initialised(files, tmp_path):
    """A causal LM, or a reward model whose head was lost, never scores with random weights."""
    with pytest.raises(MissingRewardHeadError, match="no trained reward head .*score.weight.*rlhf rm"):
        RewardModelWorker(tiny_model_path(), max_length=64)
    _, result, _ = run(stage(files, steps=1, test_freq=0), tmp_path)
    weights = Path(result["checkpoint"]) / "model.safetensors"
    state = load_file(str(weights))
    save_file({k: v for k, v in state.items() if k != "score.weight"}, str(weights), metadata={"format": "pt"})
    with pytest.raises(MissingRewardHeadError, match="score.weight"):
        RewardModelWorker(result["checkpoint"], max_length=64)


def test_a_resumed_run_matches_the_uninterrupted_run(files, tmp_path):
    digest = lambda rm: rm.parameters_digest()[0]  # noqa: E731
    full, _, want = run(stage(files, steps=4, test_freq=0), tmp_path / "full", after=digest)
    cut = stage(files, steps=4, test_freq=0, save_freq=1)
    cut.total_steps = 2  # stopped after step 2 (the LR schedule is the 4-step run's)
    run(cut, tmp_path / "cut")
    resumed, _, got = run(stage(files, steps=4, test_freq=0, save_freq=1), tmp_path / "cut", resume=True,
                          after=digest)
    assert list(resumed) == [3, 4]
    assert all(resumed[s]["rm/loss"] == full[s]["rm/loss"] for s in (3, 4))
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_the_loss_sees_both_rows_of_every_pair_in_one_micro_batch(files):
    """Micro-batches of 3 rows (an odd size) and a token budget that fits one row but not a pair: pairs stay whole
    (each micro-batch holds whole pairs), so the loss is the same as with the whole batch in one forward."""
    tokenizer = load_tokenizer(tiny_model_path())
    data = PreferenceDataset(separable_rows(8, 3), tokenizer, max_length=64)
    batch = data.collate(range(8))
    width = batch["attention_mask"].shape[1]
    seen = []

    def loss(chosen, rejected, margin, *, num_pairs):
        seen.append(len(chosen))
        return (-torch.nn.functional.logsigmoid(chosen - rejected)).sum() / num_pairs, {}

    def update(**setup):
        torch.manual_seed(0)
        worker = RewardModelWorker(tiny_model_path(), max_length=64, loss=loss, training=TrainingSetup(**setup),
                                   optimizer=functools.partial(torch.optim.SGD, lr=0.1))
        worker.update(batch)
        return worker.parameters_digest()

    whole = update(micro_batch_size=16)
    assert seen == [8]
    seen.clear()
    for setup in (dict(micro_batch_size=3), dict(max_tokens_per_micro_batch=width + 1)):
        got = update(**setup)
        assert sum(seen) == 8 and len(seen) > 1, setup
        seen.clear()
        for k in whole:
            torch.testing.assert_close(got[k], whole[k], atol=1e-6, rtol=1e-5)


def test_rlhf_rm_trains_and_prints_where_the_model_is(files, tmp_path, capsys):
    from rlhf.cli import main

    code = main(["rm", tiny_model_path(), "--data", files[0], "--val", files[1], "--steps", "12", "--batch-size", "8",
                 "--micro-batch-size", "4", "--lr", "2e-2", "--warmup-steps", "0", "--max-length", "64",
                 "--out", str(tmp_path), "--local", "--quiet"])
    out = capsys.readouterr().out
    assert code == 0
    folder = out.split("reward model: ")[1].split()[0]
    assert folder.endswith("rm/final") and "rm/accuracy: 1.0000" in out and "stored in its config.json" in out
    RewardModelWorker(folder, max_length=64)  # loads for RL: head and statistics there


def test_rlhf_rm_refuses_a_file_of_prompt_rows(tmp_path):
    from rlhf.cli import main
    from rlhf.data.files import write_rows
    from rlhf.data.generators import arithmetic_rows

    write_rows(arithmetic_rows(4), tmp_path / "prompts.jsonl")
    with pytest.raises(SystemExit, match="prompts.jsonl, row 0 .*field .chosen. is missing"):
        main(["rm", tiny_model_path(), "--data", str(tmp_path / "prompts.jsonl"), "--local", "--quiet"])


def test_a_lora_reward_model_trains_its_adapter_and_whole_head_and_exports_merged(files, tmp_path):
    """`fiddler:lora` on a reward-model stage: the backbone's weights stay, the adapter and the new head train; final/
    is the merged model (RL loads it whole) and final-adapter/ the adapter with the head."""
    pytest.importorskip("peft")
    from rlhf_configs.common import lora

    graph = stage(files, steps=6, test_freq=0)
    experiment = fdl.Config(dict, stages={"rm": graph})  # the fiddler walks any graph
    lora(experiment, rank=4, alpha=8)
    assert graph.rm.worker.adapter is not None
    tokenizer = load_tokenizer(tiny_model_path())
    val = PreferenceDataset(separable_rows(24, 1), tokenizer, max_length=64)
    batch = val.collate(range(len(val)))
    logged, result, trained = run(graph, tmp_path, after=lambda rm: rm.compute_scores(batch)["rm_scores"])
    assert logged[6]["rm/loss"] < logged[1]["rm/loss"]
    folder = Path(result["checkpoint"])
    assert (folder.parent / "final-adapter" / "adapter_config.json").is_file()
    merged = load_file(str(folder / "model.safetensors"))
    base = load_file(str(Path(tiny_model_path()) / "model.safetensors"))
    assert "score.weight" in merged and not any("lora" in k for k in merged)
    changed = [k for k in base if k.startswith("model.layers") and not torch.equal(base[k], merged[k])]
    assert changed and all(k.split(".")[-2] in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                   "down_proj") for k in changed)  # only the adapted layers moved
    rows = separable_rows(24, 1)
    texts = Batch({"x": torch.zeros(2 * len(rows))},
                  {"raw_prompt": [r["prompt"] for r in rows for _ in range(2)],
                   "response_text": [r[side][0]["content"] for r in rows for side in ("chosen", "rejected")]})
    raw = RewardModelWorker(str(folder), max_length=64, normalize=False).score(texts)["rm_scores"]
    torch.testing.assert_close(raw, trained, atol=1e-4, rtol=1e-4)


def test_preflight_refuses_pairs_that_do_not_split_over_the_workers(files, tmp_path):
    from rlhf.runtime.preflight import PreflightError, preflight
    from rlhf_configs.reward_model import rm_experiment

    graph = rm_experiment(tiny_model_path(), files[0], files[1], out=str(tmp_path), steps=2, batch_size=3, workers=2)
    with pytest.raises(PreflightError, match=r"batch_size = 3 preference pairs per step do not split evenly over 2 "
                                             r"data-parallel reward-model workers.*set:stages.rm.batch_size=4"):
        preflight(graph, ["rm"])


def test_a_pairs_shared_prompt_encoded_once_gives_the_full_forwards_scores_and_update(files):
    """shared_prefix (a pair's prompt through the model once, the two replies over its KV cache) scores and trains
    as the full forward of both rows does, up to float rounding; and it is on by default (DDP, no checkpointing)."""
    tokenizer = load_tokenizer(tiny_model_path())
    batch = PreferenceDataset(separable_rows(8, 5), tokenizer, max_length=64).collate(range(8))
    assert batch["responses"].shape[1] < batch["input_ids"].shape[1]

    def worker(shared: bool) -> RewardModelWorker:
        torch.manual_seed(0)
        return RewardModelWorker(tiny_model_path(), max_length=64, loss=BradleyTerryLoss(), shared_prefix=shared,
                                 training=TrainingSetup(micro_batch_size=16),
                                 optimizer=functools.partial(torch.optim.SGD, lr=0.1))

    once, twice = worker(True), worker(False)
    assert once.shared_prefix and RewardModelWorker(tiny_model_path(), max_length=64, loss=BradleyTerryLoss()).shared_prefix
    torch.testing.assert_close(once.compute_scores(batch)["rm_scores"], twice.compute_scores(batch)["rm_scores"],
                               atol=1e-5, rtol=1e-4)
    calls = []
    handle = once.head.register_forward_hook(lambda module, args, out: calls.append(tuple(out.shape[:2])))
    metrics = once.update(batch), twice.update(batch)
    handle.remove()
    width, r = batch["input_ids"].shape[1], batch["responses"].shape[1]
    assert calls == [(8, width - r), (16, r)]  # the prompt pass: one row per pair; the replies over its cache
    assert metrics[0]["rm/loss"] == pytest.approx(metrics[1]["rm/loss"], rel=1e-5)
    after = once.parameters_digest(), twice.parameters_digest()
    for k in after[0]:
        torch.testing.assert_close(after[0][k], after[1][k], atol=1e-6, rtol=1e-5)
