"""`rlhf models import SOURCE OUT`: a GGUF file, a model folder or a known model name -> a plain model folder."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rlhf.models.importing import KNOWN_MODELS, ModelImportError, cache_root, import_model

USAGE = "usage: rlhf models import SOURCE OUT"


def models_main(argv: Sequence[str]) -> int:
    """`rlhf models ACTION ...` (ACTION: import)."""
    p = argparse.ArgumentParser(prog="rlhf models", description="Import models into plain Hugging Face folders.")
    sub = p.add_subparsers(dest="action", required=True)
    known = "; ".join(f"{name}: {m.description}" for name, m in sorted(KNOWN_MODELS.items()))
    imp = sub.add_parser(
        "import",
        help="a .gguf file, a model folder or a known model name -> fp32 safetensors folder with tokenizer",
        description="Write SOURCE as a plain fp32 safetensors model folder (tokenizer, chat template, "
        f"generation config) at OUT. Known names: {known}. Re-running is served from the cache "
        f"({cache_root()}; set RLHF_CACHE to move it).",
    )
    imp.add_argument("source", help="a .gguf file, a Hugging Face model folder, or a known name "
                     f"({', '.join(sorted(KNOWN_MODELS))})")
    imp.add_argument("out", help="the folder to write")
    imp.add_argument("--cache-dir", default=None, help=f"where downloads and conversions are cached (default {cache_root()})")
    args = p.parse_args(list(argv))
    try:
        out = import_model(args.source, args.out, cache_dir=args.cache_dir)
    except ModelImportError as err:
        sys.exit(f"error: {err}")
    print(out)
    return 0
