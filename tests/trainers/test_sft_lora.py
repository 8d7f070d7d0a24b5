"""LoRA through PEFT (optional): SFT trains only the adapter, which is saved alone and merges exactly."""

import pytest
import torch

pytest.importorskip("peft")

from rlhf.data.generators import arithmetic_rows
from rlhf.data.sft import SFTDataset
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.workers.lora import LoRA, merge_adapter, merged, save_adapter
from rlhf.workers.objectives import SFTObjective
from rlhf.workers.policy import response_log_probs
from helpers import tiny_model_path


def logits(model, batch):
    with torch.no_grad():
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     position_ids=batch["position_ids"]).logits


def test_lora_sft_saves_a_small_adapter_that_merges_to_the_same_model(tmp_path):
    base_path = tiny_model_path()
    batch = SFTDataset(arithmetic_rows(8), load_tokenizer(base_path)).collate(range(8))
    base = load_causal_lm(base_path)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    torch.manual_seed(0)
    model = LoRA(rank=4, alpha=8)(base)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert torch.allclose(logits(model, batch), logits(load_causal_lm(base_path), batch))  # B = 0 at the start

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    mask = batch["response_mask"]
    losses = []
    for _ in range(5):
        log_probs, _ = response_log_probs(model, batch, 1.0)
        loss, _ = SFTObjective()(log_probs, None, batch, num_tokens=float(mask.sum()), num_seqs=8.0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    for k, v in model.get_base_model().state_dict().items():  # frozen base weights never move
        if "lora_" not in k and "base_layer" not in k:
            assert torch.equal(v, before[k]), k

    adapter = save_adapter(model, str(tmp_path / "adapter"))
    files = {p.name for p in (tmp_path / "adapter").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files and "model.safetensors" not in files
    in_memory = merged(model)
    assert not any("lora_" in n for n, _ in in_memory.named_parameters())
    want = logits(model, batch)
    assert torch.allclose(logits(in_memory, batch), want, atol=1e-5)
    folder = merge_adapter(adapter, str(tmp_path / "merged"))
    assert torch.allclose(logits(load_causal_lm(folder), batch), want, atol=1e-5)
    assert load_tokenizer(folder).eos_token == "<|im_end|>"


def test_policy_worker_trains_only_the_adapter_and_saves_merged_and_adapter(tmp_path):
    pytest.importorskip("peft")
    import torch
    from transformers import AutoModelForCausalLM

    from rlhf.data.generators import arithmetic_rows
    from rlhf.data.sft import SFTDataset
    from rlhf.models.loading import load_tokenizer
    from rlhf.workers.lora import LoRA
    from rlhf.workers.objectives import SFTObjective
    from rlhf.workers.policy import PolicyWorker
    from helpers import tiny_model_path

    path = tiny_model_path()
    worker = PolicyWorker(path, objective=SFTObjective(), adapter=LoRA(rank=4),
                          optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
    assert len(worker.trainer.optimizer.param_groups[0]["params"]) < len(list(worker.trainer.unwrapped().parameters()))
    batch = SFTDataset(arithmetic_rows(8), load_tokenizer(path)).collate(range(8))
    losses = [worker.update(batch)["sft/loss"] for _ in range(4)]
    assert losses[-1] < losses[0]
    out = worker.save(str(tmp_path / "final"))
    assert (tmp_path / "final-adapter").is_dir()
    merged = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        on_device = batch.to(worker.trainer.device)  # the worker's model is on its GPU where there is one
        mine = worker.trainer.unwrapped()(input_ids=on_device["input_ids"],
                                          attention_mask=on_device["attention_mask"]).logits.cpu()
        theirs = merged(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert torch.allclose(mine, theirs, atol=1e-4)
