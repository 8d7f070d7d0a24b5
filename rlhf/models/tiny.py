"""Tiny Qwen2-architecture models with a byte-level Qwen2 tokenizer, built locally.

Every feature must run offline on a CPU, so tests, the walking-skeleton experiment and the
`tiny` fiddlers build their model here instead of downloading one. The tokenizer is a real
`Qwen2Tokenizer` over the 256 byte symbols (no merges) plus Qwen's special tokens, so it
round-trips any text exactly; a char-level tokenizer saved in a qwen2 folder is silently
rebuilt by transformers on reload into a different vocabulary.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

from rlhf.io.atomic import apply_umask

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
BYTE_VOCAB_SIZE = 256 + 3  # the byte tokenizer's size: 256 byte symbols + the 3 specials
SETTINGS_FILE = "rlhf_tiny.json"  # the settings a folder was built with (compared on every later use)

# ChatML, as Qwen2.5-Instruct uses (without its default system prompt, to keep prompts short).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_level_qwen2_tokenizer() -> Qwen2Tokenizer:
    """A Qwen2 tokenizer over raw bytes: 256 byte symbols + pad, <|im_start|>, <|im_end|> (eos)."""
    vocab = {symbol: i for i, symbol in enumerate(bytes_to_unicode().values())}
    for special in (PAD, IM_START, IM_END):
        vocab[special] = len(vocab)
    tok = Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        unk_token=None,
        eos_token=IM_END,
        pad_token=PAD,
        padding_side="left",  # only persists when passed to the constructor
    )
    tok.add_special_tokens({"additional_special_tokens": [IM_START, IM_END]})
    tok.chat_template = CHATML_TEMPLATE
    return tok


def tiny_qwen2(
    path: str,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    max_position_embeddings: int = 512,
    seed: int = 0,
    vocab_size: int | None = None,  # None: the byte tokenizer's size; larger (e.g. Qwen's 151,936) for cost studies
) -> str:
    """Write a randomly initialised tiny Qwen2 model + tokenizer to `path` (once) and return it.

    Idempotent and safe to call from several processes at once: the folder is written to a
    temporary sibling and renamed into place, and the same seed always gives the same weights.
    The folder records its settings (`rlhf_tiny.json`); an existing folder built with other
    settings is refused (ValueError), never reused: the graph would describe one model and
    another would train.
    """
    settings = _settings(hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size,
                         max_position_embeddings, seed, vocab_size)
    target = Path(path)
    if (target / "config.json").exists():
        _check_existing(target, settings)
        return str(target)
    tok = byte_level_qwen2_tokenizer()
    config = Qwen2Config(
        vocab_size=vocab_size or len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    gen = torch.random.fork_rng()
    with gen:
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / SETTINGS_FILE).write_text(json.dumps(settings, indent=1, sort_keys=True))
        apply_umask(tmp)  # mkdtemp makes the folder 0700 and safetensors its weights 0600
        try:
            os.rename(tmp, target)
        except OSError:  # another process won the race: its folder is identical (or refused below)
            if not (target / "config.json").exists():
                raise
            _check_existing(target, settings)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def _settings(hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int, intermediate_size: int,
              max_position_embeddings: int, seed: int, vocab_size: int | None) -> dict[str, int]:
    return {"hidden_size": hidden_size, "num_layers": num_layers, "num_heads": num_heads,
            "num_kv_heads": num_kv_heads, "intermediate_size": intermediate_size,
            "max_position_embeddings": max_position_embeddings, "seed": seed,
            "vocab_size": vocab_size or BYTE_VOCAB_SIZE}


# config.json's names of the settings (a folder written before `rlhf_tiny.json` existed: its seed is unknown)
_CONFIG_NAMES = {"hidden_size": "hidden_size", "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
                 "num_kv_heads": "num_key_value_heads", "intermediate_size": "intermediate_size",
                 "max_position_embeddings": "max_position_embeddings", "vocab_size": "vocab_size"}


def _check_existing(folder: Path, settings: dict[str, int]) -> None:
    """Raise ValueError naming each setting that differs from what `folder` was built with."""
    try:
        built = json.loads((folder / SETTINGS_FILE).read_text())
    except FileNotFoundError:
        config = json.loads((folder / "config.json").read_text())
        built = {ours: config.get(theirs) for ours, theirs in _CONFIG_NAMES.items()}
    differ = [f"{k}={built[k]!r} (asked: {v!r})" for k, v in settings.items() if k in built and built[k] != v]
    if differ:
        raise ValueError(
            f"{folder} holds a tiny model built with {', '.join(differ)}: reusing it would train that model "
            f"while the graph describes another. Give this model its own path (e.g. one that names its settings, "
            f"like {folder.name}-h{settings['hidden_size']}-l{settings['num_layers']}-s{settings['seed']}), or "
            f"delete the folder to rebuild it."
        )


def _preflight(arguments: dict[str, Any]) -> None:
    """Before any stage starts: an existing folder at `path` must have been built with these settings."""
    path = arguments.get("path")
    if isinstance(path, str) and (Path(path) / "config.json").exists():
        names = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
                 "max_position_embeddings", "seed", "vocab_size")
        _check_existing(Path(path), _settings(*(arguments[n] for n in names)))


tiny_qwen2.preflight = _preflight  # type: ignore[attr-defined]
