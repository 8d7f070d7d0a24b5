"""`rlhf models import SOURCE OUT`: a GGUF file, a model folder or a known model name -> a plain model folder.
`rlhf models check-template MODEL`: is the model's chat template append-only for a multi-turn tool conversation?"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from rlhf.agents.template_check import check_template
from rlhf.models.importing import KNOWN_MODELS, ModelImportError, cache_root, import_model
from rlhf.models.loading import ModelNotFoundError, load_tokenizer

USAGE = "usage: rlhf models import SOURCE OUT | rlhf models check-template MODEL"


def models_main(argv: Sequence[str]) -> int:
    """`rlhf models ACTION ...` (ACTION: import, check-template)."""
    p = argparse.ArgumentParser(prog="rlhf models", description="Import models into plain Hugging Face folders; "
                                "check a chat template for multi-turn rollouts.")
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
    check = sub.add_parser(
        "check-template",
        help="is MODEL's chat template append-only for a multi-turn tool conversation, and where not",
        description="Build a multi-turn tool conversation as the agent loop does (sampled tokens appended, each "
        "observation rendered as what the chat template adds for it) and compare it with one render of the whole "
        "conversation. Exits 1 where they differ, naming the message and the text that changes.",
    )
    check.add_argument("model", help="a model folder (or any folder with a tokenizer and chat template)")
    check.add_argument("--conversation", default=None,
                       help="a JSON file holding a list of {role, content} messages to check instead of the sample")
    args = p.parse_args(list(argv))
    if args.action == "check-template":
        return _check_template(args.model, args.conversation)
    try:
        out = import_model(args.source, args.out, cache_dir=args.cache_dir)
    except ModelImportError as err:
        sys.exit(f"error: {err}")
    print(out)
    return 0


def _check_template(model: str, conversation: str | None) -> int:
    try:
        tokenizer = load_tokenizer(model)
        messages = json.loads(open(conversation, encoding="utf-8").read()) if conversation else None
    except (ModelNotFoundError, OSError, ValueError) as err:
        sys.exit(f"error: {err}")
    report = check_template(tokenizer, messages)
    print(f"{model}: {report.format()}")
    return 0 if report.ok else 1
