"""The DPO stage on the tiny model through the real runtime: `rlhf dpo` learns a separable preference (the held-out
margin rises from 0), the reference is computed once and cached, a resumed run equals an uninterrupted one (also
after SIGKILL), and 2 FSDP ranks on Ray equal 1."""

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import fiddle as fdl
import pytest
import torch
from safetensors.torch import load_file

from helpers import tiny_model_path
from rlhf.algos.preference import DPOLoss
from rlhf.cli import main
from rlhf.data.preferences import PreferenceDataset, write_preference_rows
from rlhf.models.loading import load_tokenizer
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.plan import compile_graph
from rlhf.trainers.context import StageContext
from rlhf.trainers.dpo import REFERENCE_DIR, DPOTrainer
from rlhf.workers.objectives import DPOObjective
from rlhf.workers.training import TrainingSetup
from rlhf_configs.pieces import policy_group

JOB = Path(__file__).with_name("dpo_job.py")


def separable(n: int, seed: int) -> list[dict]:
    """Pairs whose chosen answer always starts with "yes" and rejected with "no": one rule tells them apart."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append({"prompt": [{"role": "user", "content": f"{a}+{b}?"}],
                     "chosen": [{"role": "assistant", "content": f"yes {a + b}"}],
                     "rejected": [{"role": "assistant", "content": f"no {a + b}"}]})
    return rows


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pairs")
    return (str(write_preference_rows(separable(48, 0), folder / "train.jsonl")),
            str(write_preference_rows(separable(16, 1), folder / "val.parquet")))


def test_rlhf_dpo_learns_a_separable_preference_and_caches_the_reference(files, tmp_path, capsys):
    train, val = files
    assert main(["dpo", tiny_model_path(), "--data", train, "--val", val, "--steps", "16", "--batch-size", "8",
                 "--micro-batch-size", "4", "--lr", "1e-3", "--warmup-steps", "0", "--test-freq", "8",
                 "--out", str(tmp_path), "--local", "--quiet"]) == 0
    printed = dict(line.partition(": ")[::2] for line in capsys.readouterr().out.strip().splitlines())
    # before any step the policy is its reference: every held-out margin is 0; after, the held-out pairs are
    # told apart by a clear margin (they share only the yes/no rule with the training pairs)
    assert float(printed["val/rewards/margins"]) > 0.3 and float(printed["val/rewards/accuracies"]) == 1.0
    assert float(printed["rewards/margins"]) > 0.3 and float(printed["val/dpo_loss"]) < 0.6
    for name in ("rewards/chosen", "rewards/rejected", "logps/chosen", "logps/rejected", "dpo/loss"):
        assert name in printed
    (stage,) = Path(tmp_path, "dpo").glob("*/dpo")
    assert (Path(printed["checkpoint"]) / "model.safetensors").exists()
    cache = torch.load(stage / REFERENCE_DIR / "logps.pt", weights_only=True)
    assert cache["train"].shape == (96,) and cache["val"].shape == (32,)  # 2 rows per pair
    info = json.loads((stage / REFERENCE_DIR / "info.json").read_text())
    assert set(info) == {"train", "val"}


def test_sft_refuses_the_same_file_and_points_at_dpo(files, tmp_path):
    with pytest.raises(SystemExit, match="preference row.*rlhf dpo"):
        main(["sft", tiny_model_path(), "--data", files[0], "--local", "--quiet", "--out", str(tmp_path)])


def start_policy(loss):
    path = tiny_model_path()
    group = policy_group(model_path=path, ref_model_path=path, objective=fdl.Config(DPOObjective, loss=loss),
                         optimizer=fdl.Partial(torch.optim.AdamW, lr=3e-3),
                         training=fdl.Config(TrainingSetup, micro_batch_size=4))
    runtime = LocalRuntime()
    return runtime, runtime.start_groups(compile_graph(group))["policy"]


def train(data, val, steps, out, save_freq=0, resume=False, cache=True):
    runtime, policy = start_policy(fdl.Config(DPOLoss, beta=0.2))
    logged = {}
    try:
        trainer = DPOTrainer(policy, data, DPOLoss(beta=0.2), batch_size=4, total_steps=steps, val_data=val,
                             test_freq=2, save_freq=save_freq, cache_reference=cache)
        trainer.run(StageContext(out_dir=out, log=lambda m, s: logged.setdefault(s, {}).update(m), progress=False,
                                 resume=resume))
        return logged, policy.parameters_digest()[0], policy.parameter_bytes()[0]
    finally:
        runtime.shutdown()


def test_resumed_run_matches_uninterrupted_run_and_reads_the_cached_reference(tmp_path):
    tokenizer = load_tokenizer(tiny_model_path())
    data, val = PreferenceDataset(separable(10, 2), tokenizer), PreferenceDataset(separable(4, 3), tokenizer)
    full, want, held = train(data, val, 4, tmp_path / "full")
    assert "reference" not in held  # the cache serves every step: the frozen copy was let go before them
    train(data, val, 2, tmp_path / "cut", save_freq=1)
    stamp = (tmp_path / "cut" / REFERENCE_DIR / "logps.pt").stat().st_mtime_ns
    resumed, got, _ = train(data, val, 4, tmp_path / "cut", save_freq=1, resume=True)
    assert (tmp_path / "cut" / REFERENCE_DIR / "logps.pt").stat().st_mtime_ns == stamp  # read, not recomputed
    untimed = lambda m: {k: v for k, v in m.items() if not k.startswith("timing_s/")}  # noqa: E731
    assert list(resumed) == [3, 4] and untimed(resumed[4]) == untimed(full[4])
    for k in want:
        assert torch.equal(got[k], want[k]), k
    # without the cache the worker computes the same reference each step: the same training, to float noise
    uncached, _, held = train(data, val, 4, tmp_path / "uncached", cache=False)
    assert uncached[4]["val/rewards/margins"] == pytest.approx(full[4]["val/rewards/margins"], rel=1e-4)
    assert held["reference"] > 0  # kept: each step's forward needs it
    assert not (tmp_path / "uncached" / REFERENCE_DIR).exists()


def test_release_reference_frees_the_frozen_copy_and_a_later_call_says_why_it_fails():
    runtime, policy = start_policy(fdl.Config(DPOLoss))
    try:
        batch = PreferenceDataset(separable(2, 5), load_tokenizer(tiny_model_path())).collate(range(2))
        held = policy.parameter_bytes()[0]["reference"]
        assert held > 0 and policy.release_reference() == [held]
        assert "reference" not in policy.parameter_bytes()[0] and policy.release_reference() == [0]
        with pytest.raises(RuntimeError, match=r"after release_reference\(\) let this worker's reference model go"):
            policy.compute_ref_log_probs(batch)
    finally:
        runtime.shutdown()


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_is_bit_identical(tmp_path, files):
    def start(out, kill_at=None):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]),
                                                            str(Path(__file__).parents[1])])}
        env.pop("KILL_AT", None)
        if kill_at is not None:
            env["KILL_AT"] = str(kill_at)
        return subprocess.Popen([sys.executable, str(JOB), tiny_model_path(), files[0], files[1], str(out)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def wait(proc):
        _, err = proc.communicate(timeout=600)
        return proc.returncode, err

    kill_at = random.Random().randint(1, 4)
    reference, killed = start(tmp_path / "ref"), start(tmp_path / "run", kill_at)  # side by side: one thread each
    (code, err), (killed_code, _) = wait(reference), wait(killed)
    assert code == 0, err[-3000:]
    assert killed_code == -signal.SIGKILL, f"the job was to be killed in step {kill_at + 1}"
    code, err = wait(start(tmp_path / "run"))
    assert code == 0, err[-3000:]
    stage = Path("dpo") / "job" / "dpo"
    want, got = (load_file(str(base / stage / "final" / "model.safetensors")) for base in (tmp_path / "ref",
                                                                                          tmp_path / "run"))
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want), f"killed at {kill_at + 1}"
    results = [{k: v for k, v in json.loads((base / stage / "result.json").read_text())["result"]["metrics"].items()
                if not k.startswith("timing_s/")} for base in (tmp_path / "ref", tmp_path / "run")]
    assert results[0] == results[1]


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_two_fsdp_ranks_on_ray_equal_one_rank(files):
    from rlhf.runtime.ray_runtime import RayRuntime

    tokenizer = load_tokenizer(tiny_model_path())
    batch = PreferenceDataset(separable(8, 4), tokenizer).collate(range(8))
    path = tiny_model_path()

    def plan(n):
        return compile_graph(policy_group(
            num_workers=n, model_path=path, ref_model_path=path,
            objective=fdl.Config(DPOObjective, loss=fdl.Config(DPOLoss, beta=0.5)),
            optimizer=fdl.Partial(torch.optim.SGD, lr=0.5),
            training=fdl.Config(TrainingSetup, strategy="fsdp", micro_batch_size=3, max_tokens_per_micro_batch=60)))

    local = LocalRuntime()
    try:
        one = local.start_groups(plan(1))["policy"]
        expected_metrics = one.update(batch)[0]
        (expected,) = one.parameters_digest()
    finally:
        local.shutdown()
    ray_runtime = RayRuntime(num_cpus=2)
    try:
        two = ray_runtime.start_groups(plan(2))["policy"]
        metrics = two.update(batch)
        rank0, rank1 = two.parameters_digest()
    finally:
        ray_runtime.shutdown()
    assert max(float((rank0[k] - expected[k]).abs().max()) for k in expected) < 1e-5, "2 FSDP ranks != 1 rank"
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0)
    mean = sum(m["dpo/loss"] for m in metrics) / 2
    assert mean == pytest.approx(expected_metrics["dpo/loss"], rel=1e-5)


def test_preflight_counts_pairs_and_their_rows(files):
    from rlhf.runtime.preflight import batch_arithmetic, check_experiment
    from rlhf_configs.dpo import dpo_experiment

    graph = dpo_experiment(tiny_model_path(), files[0], files[1], batch_size=6, micro_batch_size=3, workers=3)
    (dpo,) = batch_arithmetic(graph)
    assert (dpo.prompts, dpo.n, dpo.samples, dpo.rows_per_worker, dpo.micro_batches) == (6, 2, 12, 4, 1)
    graph.stages["dpo"].batch_size = 4  # 8 rows divide by 2 workers, but 4 pairs do not split over 3
    (message,) = check_experiment(graph, cpus=16, gpus=0).errors
    assert "batch_size = 4 preference pairs per step do not split evenly over 3" in message
    assert "set:stages.dpo.batch_size=6" in message
