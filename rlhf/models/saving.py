"""Model folders that travel: what `save_pretrained` writes, minus what only describes this machine.

transformers (5.x) records how a tokenizer was loaded in its `tokenizer_config.json`
(`local_files_only: true` whenever HF_HUB_OFFLINE is set, `is_local`), and configs can carry the
folder they came from (`_name_or_path`). Copied to another machine, such a folder refuses to reach
the hub or names a path that does not exist there. Every folder the project hands to users
(`final/`, `rlhf export`, adapters, a checkpoint's `hf/`) is written through `save_tokenizer` /
`make_portable`, so none carries them. A full model folder gets a `MANIFEST.json` (every file's size
and sha256, `rlhf.io.manifest`), so a stage that starts from another stage's `final/` can check it first.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlhf.io.manifest import write_manifest

# keys whose values describe the machine or the call that loaded the files, never the model
MACHINE_KEYS = ("local_files_only", "is_local", "_name_or_path", "name_or_path", "_model_name_or_path",
                "_commit_hash")
_JSON_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "special_tokens_map.json")


def make_portable(folder: str | Path) -> None:
    """Drop `MACHINE_KEYS` from the Hugging Face JSON files in `folder` (in place)."""
    for name in _JSON_FILES:
        path = Path(folder) / name
        if not path.is_file():
            continue
        data = json.loads(path.read_text())
        if isinstance(data, dict) and any(key in data for key in MACHINE_KEYS):
            for key in MACHINE_KEYS:
                data.pop(key, None)
            path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def save_tokenizer(tokenizer, folder: str | Path) -> None:
    """`tokenizer.save_pretrained(folder)`, portable (see the module docstring)."""
    tokenizer.save_pretrained(str(folder))
    make_portable(folder)


def save_model_folder(folder: str | Path, model, tokenizer=None, state_dict: dict | None = None) -> None:
    """A Hugging Face model folder (safetensors weights, config, generation config, tokenizer), portable,
    with its `MANIFEST.json`. `state_dict`: the weights to write instead of `model`'s own (e.g. gathered
    from FSDP shards)."""
    model.save_pretrained(str(folder), state_dict=state_dict)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))
    make_portable(folder)
    write_manifest(Path(folder))  # last: it lists every other file
