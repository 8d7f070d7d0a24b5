"""LeanDecoder: the decoding loop's fast step reproduces the model's own forward.

Qwen2 (q/k/v biases, tied embeddings), Llama (no biases, untied head, grouped-query
attention, llama3 rotary scaling); left-padded prompts of different lengths, n samples
per prompt; and the architectures it must leave to the model's forward.
"""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rlhf.rollout.decode import sample
from rlhf.rollout.lean_decoder import supports

PAD, EOS = 0, 1


def qwen2():
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)).eval()


def llama():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=50, hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=6,
        num_key_value_heads=2, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    )
    return LlamaForCausalLM(config).eval()


def prompts():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 50, (3, 7), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding of different lengths
    mask[2, :1] = 0
    return ids.masked_fill(mask == 0, PAD), mask


@pytest.mark.parametrize("build", [qwen2, llama], ids=["qwen2", "llama"])
@pytest.mark.parametrize("n", [1, 4])
def test_greedy_tokens_and_log_probs_equal_the_models_forward(build, n):
    model = build()
    assert supports(model)
    ids, mask = prompts()
    kwargs = dict(n=n, max_new_tokens=20, eos_token_ids=[EOS], pad_token_id=PAD, temperature=0.0)
    lean_tokens, lean_lp = sample(model, ids, mask, lean=True, **kwargs)
    hf_tokens, hf_lp = sample(model, ids, mask, lean=False, **kwargs)
    assert lean_tokens.shape[1] == 20
    assert torch.equal(lean_tokens, hf_tokens)
    assert torch.allclose(lean_lp, hf_lp, atol=1e-5)


@pytest.mark.parametrize("build", [qwen2, llama], ids=["qwen2", "llama"])
def test_sampling_with_a_seed_draws_the_same_tokens(build):
    """The step changes cost, not the distribution: the same seed gives the same samples."""
    model = build()
    ids, mask = prompts()
    kwargs = dict(n=3, max_new_tokens=15, eos_token_ids=[EOS], pad_token_id=PAD, temperature=1.0, top_p=0.9)
    torch.manual_seed(5)
    lean = sample(model, ids, mask, lean=True, **kwargs)
    torch.manual_seed(5)
    hf = sample(model, ids, mask, lean=False, **kwargs)
    assert torch.equal(lean[0], hf[0])
    assert torch.allclose(lean[1], hf[1], atol=1e-5)


def test_unsupported_models_use_their_own_forward():
    from peft import LoraConfig, get_peft_model

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=32, n_layer=1, n_head=2)).eval()
    assert not supports(gpt2)
    lora = get_peft_model(qwen2(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert not supports(lora)
    assert not supports(lora.base_model.model)  # LoRA layers replace the plain Linear projections
    sliding = Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True,
                                           sliding_window=4, max_window_layers=0))
    assert not supports(sliding)
    hooked = qwen2()
    hooked.lm_head.register_forward_hook(lambda m, i, o: o + 1.0)  # a hook the lean step would skip
    assert not supports(hooked)
    ids, mask = prompts()  # and decoding still works through the fallback
    tokens, _ = sample(gpt2, ids, mask, n=2, max_new_tokens=5, eos_token_ids=[EOS], pad_token_id=PAD, temperature=0.0)
    assert tokens.shape == (6, 5)
