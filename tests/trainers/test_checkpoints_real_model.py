"""On SmolLM2-135M-Instruct (real BPE vocabulary, tied embeddings, ChatML): a LoRA adapter trained a few
steps exports merged and the merged model generates what the adapter-wrapped one did; a checkpoint
exports to exactly the trained weights. Tiny shapes: 4 rows, a few tokens (each test ~20-40 s)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import chat_batch
from rlhf.cli import main
from rlhf.data.sft import SFTDataset
from rlhf.rollout import HFEngine
from rlhf.rollout.sampling import SamplingParams
from rlhf.workers.objectives import SFTObjective
from rlhf.workers.policy import PolicyWorker
from rlhf.workers.training import TrainingSetup

pytestmark = pytest.mark.real_model

ROWS = [{"messages": [{"role": "user", "content": f"What is {a}+{b}?"}, {"role": "assistant", "content": str(a + b)}]}
        for a, b in ((12, 30), (7, 8), (25, 17), (40, 2))]
PROMPTS = ["What is 12+30?", "Name a colour."]


def sft_batch(worker):
    return SFTDataset(ROWS, worker.tokenizer).collate(range(len(ROWS)))


def greedy(generate, tokenizer, tokens=12):
    out = generate(chat_batch(tokenizer, PROMPTS), SamplingParams(temperature=0.0, max_new_tokens=tokens))
    return [r[m.bool()].tolist() for r, m in zip(out["responses"], out["response_mask"])]


def test_a_lora_adapter_exported_merged_generates_what_the_adapted_model_did(smollm2_path, tmp_path):
    peft = pytest.importorskip("peft")
    from rlhf.workers.lora import LoRA

    worker = PolicyWorker(smollm2_path, objective=SFTObjective(), adapter=LoRA(rank=8, alpha=16),
                          optimizer=lambda p: torch.optim.AdamW(p, lr=3e-3),
                          training=TrainingSetup(micro_batch_size=4))
    batch = sft_batch(worker)
    losses = [worker.update(batch)["sft/loss"] for _ in range(3)]
    assert losses[-1] < losses[0]
    adapted = greedy(worker.generate, worker.tokenizer)  # generated through the PEFT-wrapped actor
    worker.save(str(tmp_path / "final"))  # final/ merged, final-adapter/ the adapter alone
    assert isinstance(worker.trainer.unwrapped(), peft.PeftModel)
    assert main(["export", str(tmp_path / "final-adapter"), str(tmp_path / "merged")]) == 0
    merged = HFEngine(str(tmp_path / "merged"))
    assert greedy(merged.generate, merged.tokenizer) == adapted
    base_q = worker.trainer.unwrapped().get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
    assert not torch.equal(merged.model.model.layers[0].self_attn.q_proj.weight, base_q)  # the adapter is in it
    assert merged.tokenizer.chat_template == worker.tokenizer.chat_template


def test_a_checkpoint_exports_to_exactly_the_trained_weights(smollm2_path, tmp_path):
    # SGD without momentum keeps no optimizer state: the checkpoint is the weights (tied embedding once)
    worker = PolicyWorker(smollm2_path, objective=SFTObjective(), optimizer=lambda p: torch.optim.SGD(p, lr=1e-3),
                          training=TrainingSetup(micro_batch_size=4))
    worker.update(sft_batch(worker))
    worker.save_state(str(tmp_path / "ckpt" / "policy"))
    expected = worker.parameters_digest()
    del worker
    assert main(["export", str(tmp_path / "ckpt"), str(tmp_path / "hf")]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied
    got = model.state_dict()
    assert got.keys() == expected.keys()
    for k, v in got.items():
        assert torch.equal(v, expected[k]), k
    base = AutoModelForCausalLM.from_pretrained(smollm2_path).state_dict()
    changed = sum(not torch.equal(base[k], v) for k, v in got.items())
    assert changed > len(got) // 2  # the trained weights, not the base's
