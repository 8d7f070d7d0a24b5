"""LeanDecoder: the decoding loop's fast step reproduces the model's own forward.

Qwen2 (q/k/v biases, tied embeddings), Llama (no biases, untied head, grouped-query
attention, llama3 rotary scaling); left-padded prompts of different lengths, n samples
per prompt; and the architectures it must leave to the model's forward.
"""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rlhf.rollout.decode import sample
from rlhf.rollout.lean_decoder import LeanDecoder, supports

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


def test_the_lm_head_in_vocabulary_chunks_gives_the_same_bits(monkeypatch):
    """HEAD_CHUNK only changes how the head's matmul is cut: a vocabulary of 2,500 in chunks of 1024 (the last
    one short), with rows leaving as they finish (the matmul padded to min_rows), gives the one-matmul step's
    samples and log-probs bit for bit (each logit is the same dot product; SmolLM2's head too, measured)."""
    import rlhf.rollout.lean_decoder as lean_decoder

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=2500, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    with torch.no_grad():
        model.lm_head.weight[EOS] *= 30  # rows end at different steps
    ids, mask = prompts()
    kwargs = dict(n=3, max_new_tokens=16, eos_token_ids=[EOS], pad_token_id=PAD, temperature=1.0)
    torch.manual_seed(3)
    chunked = sample(model, ids, mask, **kwargs)
    monkeypatch.setattr(lean_decoder, "HEAD_CHUNK", 10**9)
    torch.manual_seed(3)
    whole = sample(model, ids, mask, **kwargs)
    assert torch.equal(whole[0], chunked[0]) and torch.equal(whole[1], chunked[1])
    assert len({int(row.eq(EOS).nonzero()[0]) if row.eq(EOS).any() else 16 for row in whole[0]}) > 1


def test_each_prompt_is_kept_once_for_its_samples_and_its_slot_is_reused_after_its_last_row():
    """Cascade attention's bookkeeping: U prompts x n samples take U prompt slots (the prefill's keys, once each);
    rows moved by a select keep their prompt; a slot frees with its group's last row and takes the next prompt;
    and every step's logits stay those of the model's forward over prompt + decoded tokens."""
    from rlhf.rollout.decode import _prefill

    model = qwen2()
    ids, mask = prompts()
    decoder = LeanDecoder(model, rows=6, n=2, prompt_columns=7, new_columns=8, dtype=torch.float32,
                          device=torch.device("cpu"))
    _, cache, trimmed = _prefill(model, ids[:2], mask[:2])
    decoder.add(cache, trimmed, 2)
    assert decoder._slots == [0, 0, 1, 1]
    assert torch.equal(decoder.prompt_keys[0][:2, :, : trimmed.shape[1]], cache.layers[0].keys)
    history = {r: [] for r in range(4)}  # each row's decoded tokens, by its first row index

    def check(logits, rows, prompt_rows):
        for i, r in enumerate(rows):
            p = prompt_rows[i]
            full = torch.cat([ids[p][mask[p].bool()], torch.tensor(history[r], dtype=torch.long)])
            ref = model(input_ids=full[None]).logits[0, -1]
            assert torch.allclose(logits[i], ref, atol=1e-5), (r, len(history[r]))

    rows, prompt_rows = [0, 1, 2, 3], [0, 0, 1, 1]
    for step in range(3):
        token = torch.tensor([5 + r + step for r in range(4)])
        for r, t in zip(rows, token.tolist()):
            history[r].append(t)
        with torch.no_grad():
            check(decoder.step(token), rows, prompt_rows)
    decoder.select([3, 1])  # prompt 0 keeps row 1; prompt 1 keeps row 3, moved to the front
    rows, prompt_rows = [3, 1], [1, 0]
    assert decoder._slots == [1, 0]
    decoder.select([0])  # prompt 0's last row leaves: its slot is free again
    rows, prompt_rows = [3], [1]
    _, cache, trimmed = _prefill(model, ids[2:], mask[2:])
    decoder.add(cache, trimmed, 2)
    assert decoder._slots == [1, 0, 0]
    history.update({4: [], 5: []})
    rows, prompt_rows = [3, 4, 5], [1, 2, 2]
    for step in range(3):
        token = torch.tensor([7 + r + step for r in rows])
        for r, t in zip(rows, token.tolist()):
            history[r].append(t)
        with torch.no_grad():
            check(decoder.step(token), rows, prompt_rows)


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


def test_sliding_windows_count_as_full_attention_only_when_longer_than_the_sequence():
    from transformers import MistralConfig, MistralForCausalLM

    def mistral(window):
        torch.manual_seed(0)
        return MistralForCausalLM(MistralConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                num_attention_heads=4, num_key_value_heads=2,
                                                sliding_window=window)).eval()

    assert supports(mistral(None))
    windowed = mistral(27)  # every Mistral layer attends through the window
    assert not supports(windowed)  # length unknown: the window might bind
    assert supports(windowed, length=27) and not supports(windowed, length=28)
    ids, mask = prompts()  # 7 prompt tokens + 20 new = 27: the lean step is exact
    kwargs = dict(n=2, max_new_tokens=20, eos_token_ids=[EOS], pad_token_id=PAD, temperature=0.0)
    lean_tokens, lean_lp = sample(windowed, ids, mask, lean=True, **kwargs)
    hf_tokens, hf_lp = sample(windowed, ids, mask, lean=False, **kwargs)
    assert torch.equal(lean_tokens, hf_tokens) and torch.allclose(lean_lp, hf_lp, atol=1e-5)


@pytest.fixture
def one_rank_group():
    """A single-process gloo group and a 1-device CPU mesh: what `fully_shard` needs to run here."""
    import socket

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if dist.is_initialized():  # a worker test in this process (Accelerate) may have left one behind: reuse it
        assert dist.get_world_size() == 1, "a test left a multi-rank process group in the pytest process"
        yield init_device_mesh("cpu", (1,))
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def sharded(build, mesh, **policy):
    """`build()` sharded as the project's FSDP2 strategy does: each decoder layer, then the root."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = build()
    mp = MixedPrecisionPolicy(**policy)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    return fully_shard(model, mesh=mesh, mp_policy=mp)


@pytest.mark.parametrize("build", [qwen2, llama], ids=["qwen2", "llama"])
def test_a_model_sharded_by_fsdp2_keeps_the_lean_step_and_its_greedy_tokens(one_rank_group, build, monkeypatch):
    """`fully_shard` renames the class (FSDPQwen2ForCausalLM), turns parameters into DTensors and adds
    (un)shard hooks: the lean step still runs, from gathered weights, with the unwrapped model's tokens."""
    import rlhf.rollout.decode as decode

    model = sharded(build, one_rank_group)
    assert type(model).__name__.startswith("FSDP") and supports(model)
    built = []
    monkeypatch.setattr(decode, "LeanDecoder", lambda *a, **kw: built.append(1) or LeanDecoder(*a, **kw))
    ids, mask = prompts()
    kwargs = dict(n=3, max_new_tokens=20, eos_token_ids=[EOS], pad_token_id=PAD, temperature=0.0)
    tokens, lp = sample(model, ids, mask, **kwargs)
    assert built == [1]
    expected_tokens, expected_lp = sample(build(), ids, mask, lean=False, **kwargs)
    assert torch.equal(tokens, expected_tokens) and torch.allclose(lp, expected_lp, atol=1e-5)
    model.lm_head.register_forward_hook(lambda m, i, o: o + 1.0)  # a user's hook still means the fallback
    assert not supports(model)


def test_fsdp2_bf16_compute_decodes_in_bf16_with_log_probs_of_a_forward(one_rank_group, monkeypatch):
    """MixedPrecisionPolicy(param_dtype=bf16) over fp32 shards: the prefill runs in bf16, so the lean step
    gathers the weights and casts them to bf16; its log-probs match a bf16 forward over the sampled text."""
    import rlhf.rollout.decode as decode

    model = sharded(qwen2, one_rank_group, param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    built = []
    monkeypatch.setattr(decode, "LeanDecoder", lambda *a, **kw: built.append(LeanDecoder(*a, **kw)) or built[-1])
    ids, mask = prompts()
    torch.manual_seed(0)
    tokens, lp = sample(model, ids, mask, n=2, max_new_tokens=12, eos_token_ids=[EOS], pad_token_id=PAD,
                        temperature=1.0, min_new_tokens=12)
    full_ids = torch.cat([ids.repeat_interleave(2, 0), tokens], dim=1)
    full_mask = torch.cat([mask.repeat_interleave(2, 0), torch.ones_like(tokens)], dim=1)
    with torch.no_grad():
        logits = model(input_ids=full_ids, attention_mask=full_mask,
                       position_ids=(full_mask.cumsum(1) - 1).clamp(min=0)).logits[:, -13:-1].float()
    from torch.distributed.tensor import DTensor

    shard = model.model.layers[0].mlp.down_proj.weight  # the layers reshard after a forward: fp32 master shards
    assert isinstance(shard, DTensor) and shard.dtype == torch.float32
    ref = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    assert built[0].w_head.dtype == torch.bfloat16 and built[0].keys[0].dtype == torch.bfloat16
    assert torch.isfinite(lp).all()
    assert (lp - ref).abs().max() < 0.01  # bf16 rounding of two kernel orders (measured 1.1e-3)
