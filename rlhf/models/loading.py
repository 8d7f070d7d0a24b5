"""Load causal LMs and tokenizers from a local folder or the Hugging Face hub, failing early and clearly.

`resolve_model_path` is called before training starts (preflight), so a missing model
stops a run within seconds with a message that says what is missing and how to run offline,
instead of failing inside a Ray worker minutes later.

A PEFT adapter folder (rlhf.models.adapters) is a model too: its base model, found from its
`adapter_config.json`, with the adapter merged in. `model_folder` writes that merged model
once into the cache for what needs full weights on disk (vLLM).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from rlhf.io.atomic import atomic_write_dir
from rlhf.io.fingerprint import stat_digest
from rlhf.io.lock import held
from rlhf.models.adapters import adapter_base_name, is_adapter_folder, merge_adapter_into
from rlhf.models.importing import cache_root
from rlhf.models.saving import save_model_folder

transformers.utils.logging.disable_progress_bar()


class ModelNotFoundError(FileNotFoundError):
    """The model folder or hub id cannot be found (or the hub cannot be reached)."""


_OFFLINE_HINT = (
    "To run offline, download the model on a machine with hub access "
    "(`huggingface-cli download {name} --local-dir DIR`) and pass the folder as the model path, "
    "or use the experiment's `tiny` fiddler (`--config fiddler:tiny`), which builds a small model locally."
)


def _looks_like_hub_id(name: str) -> bool:
    # a Path (what `rlhf.models.importing.import_model` returns) is a folder, never a hub id
    return isinstance(name, str) and name.count("/") == 1 and not name.startswith((".", "/", "~")) \
        and not Path(name).exists()


def resolve_model_path(name_or_path: str) -> str:
    """Return a local folder holding the model `name_or_path` (a folder, or a hub id fetched/cached)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if is_adapter_folder(path):
            adapter_base_path(str(path))  # the base must be reachable too
            return str(path)
        if not (path / "config.json").exists():
            raise ModelNotFoundError(
                f"Model folder {path} has no config.json (nor adapter_config.json): it is neither a Hugging Face "
                "model folder nor a PEFT adapter folder. Point the model path at the folder that holds config.json "
                "and the weights, or an adapter's adapter_config.json."
            )
        return str(path)
    if not _looks_like_hub_id(name_or_path):
        raise ModelNotFoundError(
            f"Model path {name_or_path!r} does not exist (looked in {path.resolve()}). "
            "Check the path, or give a Hugging Face hub id such as 'Qwen/Qwen2.5-0.5B-Instruct'."
        )
    from huggingface_hub import snapshot_download

    hint = _OFFLINE_HINT.format(name=name_or_path)
    try:  # the local cache first: works offline, answers at once
        return snapshot_download(name_or_path, local_files_only=True)
    except Exception:
        pass
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        raise ModelNotFoundError(
            f"Model {name_or_path!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set. {hint}"
        )
    try:
        return snapshot_download(
            name_or_path,
            allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"],
            etag_timeout=10,
        )
    except Exception as err:  # no network, unknown repo, gated model...
        raise ModelNotFoundError(
            f"Could not fetch model {name_or_path!r} from the Hugging Face hub ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}). {hint}"
        ) from err


def model_reference(name_or_path: str) -> str:
    """How to name a model in a file that outlives this process (an adapter's base model): a hub id
    as given, a folder as its absolute path."""
    return name_or_path if _looks_like_hub_id(name_or_path) else str(Path(name_or_path).expanduser().resolve())


def same_model(a: str, b: str) -> bool:
    """Whether two model paths (or hub ids) name the same model folder."""
    return Path(resolve_model_path(a)).resolve() == Path(resolve_model_path(b)).resolve()


def adapter_base_path(adapter: str) -> str:
    """The local folder of an adapter folder's base model (which may be an adapter folder itself)."""
    base = adapter_base_name(adapter)
    try:
        return resolve_model_path(base)
    except ModelNotFoundError as err:
        raise ModelNotFoundError(
            f"{adapter} is a PEFT adapter whose base model {base!r} cannot be found: {err} Put the base model "
            f"there, or set base_model_name_or_path in {Path(adapter) / 'adapter_config.json'} to where it is."
        ) from err


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """The model's tokenizer, left-padded (generation needs left padding) with a pad token; for an adapter
    folder, the tokenizer saved with it, else its base model's. A policy's and a reward model's alike: both
    render chat messages, so a tokenizer without a chat template is refused here."""
    path = resolve_model_path(name_or_path)
    if is_adapter_folder(path) and not (Path(path) / "tokenizer_config.json").is_file():
        return load_tokenizer(adapter_base_path(path))
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if tok.chat_template is None:
        raise ValueError(
            f"the tokenizer at {name_or_path} has no chat template, so chat rows (a policy's prompts, a reward "
            "model's (prompt, response) pairs) cannot be rendered as the model was trained on. Fix: use an "
            "instruct or reward model saved with its chat template, or set `tokenizer.chat_template` and save "
            "it with the model."
        )
    return tok


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """A model to build, with its weights (`load`) or as an empty module tree (`skeleton`, called
    under the meta device). FSDP reads the weights on one rank and builds skeletons on the others
    (rlhf.workers.fsdp.build_sharded)."""

    load: Callable[[], torch.nn.Module]
    skeleton: Callable[[], torch.nn.Module]

    def wrapped(self, wrap: Callable[[torch.nn.Module], torch.nn.Module]) -> ModelSource:
        """The same model passed through `wrap` (a LoRA adapter), with or without weights."""
        return ModelSource(lambda: wrap(self.load()), lambda: wrap(self.skeleton()))


def hf_model_source(
    auto_class: type, name_or_path: str, dtype: str = "float32",
    finish: Callable[[torch.nn.Module], torch.nn.Module] = lambda m: m,
    on_missing: Callable[[torch.nn.Module, list[str]], None] | None = None, **config_kwargs,
) -> ModelSource:
    """A Hugging Face model folder (or hub id) as a `ModelSource` of `auto_class`
    (AutoModelForCausalLM, AutoModelForTokenClassification...); `finish` runs on either result.
    `on_missing(model, keys)` sees the weights the folder lacked (which transformers initialised
    afresh) and may raise; None: they are accepted (a value head started on a causal LM).
    An adapter folder is its base model with the adapter merged in (the skeleton is the base's)."""
    path, torch_dtype = resolve_model_path(name_or_path), getattr(torch, dtype)
    if is_adapter_folder(path):
        base = hf_model_source(auto_class, adapter_base_path(path), dtype, on_missing=on_missing, **config_kwargs)
        return ModelSource(lambda: finish(merge_adapter_into(base.load(), path)), lambda: finish(base.skeleton()))

    def load() -> torch.nn.Module:
        if on_missing is None:
            return finish(auto_class.from_pretrained(path, dtype=torch_dtype, **config_kwargs))
        verbosity = transformers.utils.logging.get_verbosity()
        transformers.utils.logging.set_verbosity_error()  # its load report: `on_missing` says what matters
        try:
            model, info = auto_class.from_pretrained(path, dtype=torch_dtype, output_loading_info=True,
                                                     **config_kwargs)
        finally:
            transformers.utils.logging.set_verbosity(verbosity)
        on_missing(model, sorted(info.get("missing_keys") or []))
        return finish(model)

    def skeleton() -> torch.nn.Module:
        return finish(auto_class.from_config(AutoConfig.from_pretrained(path, **config_kwargs), dtype=torch_dtype))

    return ModelSource(load, skeleton)


def _with_cache(model: torch.nn.Module) -> torch.nn.Module:
    model.config.use_cache = True
    return model


def causal_lm_source(name_or_path: str, dtype: str = "float32") -> ModelSource:
    return hf_model_source(AutoModelForCausalLM, name_or_path, dtype, finish=_with_cache)


def load_causal_lm(name_or_path: str, dtype: str = "float32") -> torch.nn.Module:
    """A causal LM in `dtype` ("float32", "bfloat16", "float16") with eager-safe attention on CPU."""
    return causal_lm_source(name_or_path, dtype).load()


def model_folder(name_or_path: str) -> str:
    """A folder with the model's full weights: the model's own, or for an adapter folder its merged model,
    written once into the cache (`<cache>/merged/<digest>`, keyed by the adapter's files and its base) for
    what reads weights from disk itself (vLLM)."""
    path = resolve_model_path(name_or_path)
    if not is_adapter_folder(path):
        return path
    base = adapter_base_path(path)
    digest = stat_digest([path, base], prefix=str(Path(base).resolve()))
    target = cache_root() / "merged" / digest[:16]
    target.parent.mkdir(parents=True, exist_ok=True)
    with held(target.with_name(target.name + ".lock")):
        if not (target / "config.json").is_file():
            model, tokenizer = load_causal_lm(path), load_tokenizer(path)
            atomic_write_dir(str(target), lambda tmp: save_model_folder(tmp, model, tokenizer))
    return str(target)


def _preflight_path(arguments: dict) -> None:
    """Before any stage runs: a model path given as a string must resolve."""
    if isinstance(arguments.get("name_or_path"), str):
        resolve_model_path(arguments["name_or_path"])


load_tokenizer.preflight = _preflight_path  # type: ignore[attr-defined]
load_causal_lm.preflight = _preflight_path  # type: ignore[attr-defined]
