"""The knob flags of `rlhf sft|generate|eval|probe` are aliases of `set:` overrides on the shipped graph: the flag and
the override build equal graphs, `--help` names each flag's path, and any other `set:` word works beside them."""

import pytest
from helpers import tiny_model_path

from rlhf.cli import main
from rlhf.cli.generate_eval import eval_graph, generate_graph, probe_graph
from rlhf.cli.sft import SFT_FLAGS, sft_graph


def sft(*argv):
    return sft_graph([tiny_model_path(), "--data", "train.jsonl", "--val", "val.jsonl", *argv])


def test_sft_flags_build_the_graph_their_set_overrides_build():
    flags = sft("--lr", "1e-3", "--steps", "7", "--max-length", "9", "--no-bucketing", "--lora-rank", "4",
                "--compute-dtype", "bfloat16")
    sets = sft("set:stages.sft.policy.worker.optimizer.lr=0.001", "set:stages.sft.total_steps=7",
               "set:stages.sft.policy.worker.lr_scheduler.num_training_steps=7",
               "set:stages.sft.data.max_length=9", "set:stages.sft.val_data.max_length=9",  # --val: both datasets
               "set:stages.sft.bucketed=False", "fiddler:lora(rank=4)",
               "set:stages.sft.policy.worker.training.compute_dtype='bfloat16'")
    assert flags == sets
    assert flags != sft()
    assert flags.stages["sft"].policy.worker.optimizer.lr == 1e-3


@pytest.mark.parametrize("flag", [f for f in SFT_FLAGS if f.const is None], ids=lambda f: f.flag)
def test_each_sft_flag_at_its_shown_default_leaves_the_shipped_graph(flag):
    """Its paths exist and the default --help shows is the graph's own value there."""
    value = {float: "{:g}"}.get(flag.type, "{}").format(flag.default)
    assert sft("--accuracy", flag.flag, value) == sft("--accuracy")


def test_a_set_word_reaches_a_field_no_flag_names_and_applies_after_the_flags():
    graph = sft("--steps", "5", "set:stages.sft.seed=3", "set:stages.sft.total_steps=6")
    assert graph.stages["sft"].seed == 3 and graph.stages["sft"].total_steps == 6
    assert graph.stages["sft"].policy.worker.lr_scheduler.num_training_steps == 5


def test_a_flag_whose_node_is_absent_names_what_makes_it(capsys):
    with pytest.raises(SystemExit):
        sft_graph([tiny_model_path(), "--data", "train.jsonl", "--max-new-tokens", "8"])
    assert "--max-new-tokens needs --accuracy" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sft("set:stages.sft.total_stepz=3")
    assert "Did you mean 'total_steps'?" in capsys.readouterr().err


def test_generate_flags_are_their_set_overrides_and_the_vllm_context_follows_the_lengths():
    def generate(*argv):
        return generate_graph([tiny_model_path(), "--data", "p.jsonl", "--out", "g.jsonl", *argv])[0]

    flags = generate("--n", "4", "--temperature", "0.5", "--max-new-tokens", "2000", "--dtype", "bfloat16",
                     "--limit", "3")
    g = "stages.generate"
    sets = generate(f"set:{g}.sampling.n=4", f"set:{g}.sampling.temperature=0.5",
                    f"set:{g}.sampling.max_new_tokens=2000",
                    f"set:{g}.policy.worker.dtype='bfloat16'", f"set:{g}.dtype='bfloat16'",
                    f"set:{g}.policy.worker.engine.vllm.dtype='bfloat16'",  # --engine auto: vLLM's own dtype too
                    f"set:{g}.dataset.rows.limit=3")
    assert flags == sets
    assert flags.stages["generate"].policy.worker.engine.vllm.max_model_len == 1024 + 2000  # prompt + new tokens
    # shorter limits shrink it too (the builder's default 1024 + 512 may exceed a small model's positions: vLLM
    # refuses a context longer than the model's), unless the user set a longer one
    short = generate("--max-prompt-length", "128", "--max-new-tokens", "6").stages["generate"]
    assert short.policy.worker.engine.vllm.max_model_len == 134
    kept = generate("--max-new-tokens", "6", f"set:{g}.policy.worker.engine.vllm.max_model_len=4096")
    assert kept.stages["generate"].policy.worker.engine.vllm.max_model_len == 4096


def test_eval_and_probe_flags_are_their_set_overrides(capsys):
    model = tiny_model_path()
    assert (eval_graph([model, "--data", "p.jsonl", "--ks", "1,3", "--n", "3"])[0]
            == eval_graph([model, "--data", "p.jsonl", "set:stages.eval.ks=(1, 3)",
                           "set:stages.eval.generation.sampling.n=3"])[0])
    assert (probe_graph([model, "--data", "p.jsonl", "--budgets", "2,4", "--max-new-tokens", "8"])[0]
            == probe_graph([model, "--data", "p.jsonl", "set:stages.probe.budgets=(2, 4)",
                            "set:stages.probe.generation.sampling.max_new_tokens=8"])[0])
    sampled = probe_graph([model, "--data", "p.jsonl", "--samples", "8", "--temperature", "0.9",
                           "--samples-max-new-tokens", "16"])[0]
    assert sampled == probe_graph([model, "--data", "p.jsonl", "set:stages.probe.samples=8",
                                   "set:stages.probe.temperature=0.9", "set:stages.probe.samples_max_new_tokens=16"])[0]
    assert (sampled.stages["probe"].samples, sampled.stages["probe"].temperature) == (8, 0.9)
    with pytest.raises(SystemExit):  # scoring a file generates nothing: there is no sampling to set
        eval_graph(["--generations", "g.jsonl", "--n", "3"])
    assert "--n needs MODEL --data FILE" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["sft", "generate", "eval", "probe"])
def test_help_shows_each_knob_flags_set_path_and_marks_the_run_options(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    assert "run options (not graph knobs)" in text and "graph knobs" in text
    if command == "sft":
        for flag in SFT_FLAGS:
            assert all(f"set:{path}=" in text for path in flag.paths), flag.flag
    assert {"sft": "= set:stages.sft.policy.worker.optimizer.lr=LR", "generate": "= set:stages.generate.sampling.n=N",
            "eval": "= set:stages.eval.ks=KS", "probe": "= set:stages.probe.budgets=BUDGETS"}[command] in text


def test_dpo_and_rm_flags_build_the_graphs_their_builders_build():
    """`rlhf dpo` and `rlhf rm` flags are set: aliases too; given, each lands where the builder's argument does."""
    from rlhf.cli.dpo import DPO_FLAGS, dpo_graph
    from rlhf.cli.rm import RM_FLAGS, rm_graph
    from rlhf_configs.dpo import dpo_experiment, preference_loss
    from rlhf_configs.reward_model import rm_experiment

    model, common = tiny_model_path(), ["--data", "d.jsonl", "--val", "v.jsonl", "--local", "--quiet"]
    knobs = ["--steps", "12", "--batch-size", "8", "--lr", "2e-05", "--max-length", "96", "--warmup-steps", "2"]
    built = dict(local=True, progress=False, steps=12, batch_size=8, lr=2e-5, max_length=96, warmup_steps=2)
    dpo = dpo_graph([model, *common, *knobs, "--micro-batch-size", "8", "--beta", "0.2"])
    assert dpo == dpo_experiment(model, "d.jsonl", "v.jsonl", micro_batch_size=4,  # the builder counts pairs
                                 loss=preference_loss("sigmoid", beta=0.2), **built)
    rm = rm_graph([model, *common, *knobs, "--micro-batch-size", "4", "--seed", "3",
                   "--center-rewards-coefficient", "0.01"])
    assert rm == rm_experiment(model, "d.jsonl", "v.jsonl", micro_batch_size=4, seed=3,
                               center_rewards_coefficient=0.01, **built)
    assert rm.stages["rm"].rm.worker.max_length == rm.stages["rm"].val_data.max_length == 96
    # each flag at the default --help shows leaves the shipped graph as it is
    for flags, build in ((DPO_FLAGS, dpo_graph), (RM_FLAGS, rm_graph)):
        for flag in (f for f in flags if f.default is not None and f.const is None):
            value = {float: "{:g}"}.get(flag.type, "{}").format(flag.default)
            assert build([model, *common, flag.flag, value]) == build([model, *common]), flag.flag


def test_dpo_help_names_each_knobs_set_path(capsys):
    with pytest.raises(SystemExit):
        main(["dpo", "--help"])
    out = capsys.readouterr().out
    assert "= set:stages.dpo.policy.worker.optimizer.lr=LR" in out
    assert "--beta" in out
