"""`rlhf export SOURCE OUT [--step N] [--base PATH] [--dtype DTYPE]`: a run's weights -> a model folder."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from torch.distributed.checkpoint.api import CheckpointException

from rlhf.trainers.export import DTYPES, export

DESCRIPTION = """Write a plain Hugging Face model folder (safetensors, config, generation config, tokenizer
with its chat template) from SOURCE, which is one of:
  a stage folder       <output_dir>/<experiment>/<run>/<stage>: its final/ when the stage finished,
                       else its newest checkpoint (--step N: checkpoint N)
  a checkpoint         <stage>/checkpoints/step_XXXXXXXX (full or LoRA: a LoRA checkpoint's adapter
                       is merged into the base model its adapter_config.json names, or --base)
  a model folder       e.g. a stage's final/ or best/ (rewritten in --dtype)
  an adapter folder    a PEFT adapter (a LoRA stage's final-adapter/, TRL's output), merged into its base"""


def export_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="rlhf export", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="stage folder, checkpoint folder, model folder or adapter folder")
    p.add_argument("out", help="the model folder to write (replaced atomically if it exists)")
    p.add_argument("--step", type=int, default=None, help="export checkpoint step N of the stage folder SOURCE")
    p.add_argument("--base", default=None,
                   help="base model folder (or hub id) of a LoRA checkpoint or adapter, instead of the one it names")
    p.add_argument("--dtype", default="float32", choices=DTYPES, help="dtype of the written weights (default float32)")
    args = p.parse_args(list(argv))
    try:
        result = export(args.source, args.out, step=args.step, base=args.base, dtype=args.dtype)
    except (OSError, ValueError, KeyError, ImportError, CheckpointException) as err:
        sys.exit(f"error: {err}")
    print(f"exported {result.what} from {result.source}")
    print(result.out)
    return 0
