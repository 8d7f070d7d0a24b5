"""`TrainingSetup(compile=True)`: each decoder layer's norms and MLP compiled in place (rlhf.workers.compiling).
The steps and generations equal eager ones up to float rounding, the parameter names do not change, and the
compiled graphs are really used (no silent fall-back to eager)."""

import pytest
import torch

from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_tokenizer
from rlhf.rollout.sampling import SamplingParams
from rlhf.workers.compiling import compile_layer_parts, compiled_parts, takes_one_tensor
from helpers import grpo_worker, scored_rollout, tiny_model_path, updated_group


def _tiny_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_path(), dtype=torch.float32)


def test_the_norms_and_mlp_of_every_layer_are_compiled_and_the_attention_is_not():
    model = _tiny_model()
    names = list(model.state_dict())
    compiled = compile_layer_parts(model)
    assert compiled == compiled_parts(model)
    assert sorted(compiled) == sorted(f"model.layers.{i}.{part}" for i in range(2)
                                      for part in ("mlp", "input_layernorm", "post_attention_layernorm"))
    assert takes_one_tensor(model.model.layers[0].mlp) and not takes_one_tensor(model.model.layers[0].self_attn)
    assert list(model.state_dict()) == names  # in place: checkpoints and weight syncs read the same names


def test_a_model_without_decoder_layers_is_refused_rather_than_left_eager():
    with pytest.raises(ValueError, match="names no decoder layer.*compile=False"):
        compile_layer_parts(torch.nn.Sequential(torch.nn.Linear(4, 4)))


def test_a_compiled_worker_takes_the_steps_and_generates_the_tokens_an_eager_one_does():
    torch._dynamo.reset()
    eager, compiled = grpo_worker(), grpo_worker(compile=True)  # a reference too: it is compiled alike
    assert compiled_parts(compiled.trainer.unwrapped()) and compiled_parts(compiled.ref_model)
    assert not compiled_parts(eager.trainer.unwrapped())
    for seed in (0, 1):
        batch = scored_rollout(eager, prompts=4, n=4, seed=seed)
        a, b = eager.update(batch), compiled.update(batch)
        assert b["actor/pg_loss"] == pytest.approx(a["actor/pg_loss"], rel=1e-4, abs=1e-6)
    pa, pb = eager.parameters_digest(), compiled.parameters_digest()
    for k in pa:
        torch.testing.assert_close(pb[k], pa[k], rtol=1e-4, atol=1e-5)
    # generation (the prefill runs the compiled parts beside an eager attention with its cache) and log-probs
    prompts = PromptDataset(arithmetic_rows(4, seed=5), load_tokenizer(tiny_model_path())).collate(range(4))
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=6)
    ga, gb = eager.generate(prompts, greedy), compiled.generate(prompts, greedy)
    assert torch.equal(ga["responses"], gb["responses"])
    ra, rb = eager.compute_ref_log_probs(ga), compiled.compute_ref_log_probs(ga)
    torch.testing.assert_close(rb["ref_log_probs"], ra["ref_log_probs"], rtol=1e-4, atol=1e-4)
    # the compiled graphs ran: a fall-back to eager (a recompile limit reached) would leave them unused
    stats = torch._dynamo.utils.counters["stats"]
    assert stats["unique_graphs"] >= 2  # at least a norm's and an MLP's graph
    assert not any("limit" in str(reason) for reason in torch._dynamo.utils.counters["unimplemented"])


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_two_compiled_fsdp_ranks_equal_one_eager_rank():
    """Under FSDP2 (two gloo processes through Ray) the compiled parts run between the layers' all-gathers:
    the step equals one eager rank's."""
    batch = scored_rollout(grpo_worker(), prompts=4, n=4)
    _, (expected,) = updated_group(1, batch, strategy="fsdp")
    _, (rank0, rank1) = updated_group(2, batch, strategy="fsdp", compile=True)
    for k in expected:
        torch.testing.assert_close(rank0[k], rank1[k], rtol=0, atol=0)
        torch.testing.assert_close(rank0[k], expected[k], rtol=1e-4, atol=1e-5)
