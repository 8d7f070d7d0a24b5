"""A function's default arguments read from its source file, without importing its module.

A command's `--help` shows the defaults of the graph builder it calls (`rlhf sft --help`:
`rlhf_configs.sft.sft_stage`'s). Importing the builder's module to read its signature costs
8-9 s of CPU (torch, transformers, the runtimes) for a help text; reading the signature with
`ast` keeps each default written once, in that signature, and the help instant.
"""

from __future__ import annotations

import ast
import importlib.util
from typing import Any

__all__ = ["source_defaults"]


def source_defaults(module: str, name: str) -> dict[str, Any]:
    """{argument: default} of the function (a class: its `__init__`) `name` at the top of `module`, for every
    default written as a literal (`512`, `None`, `(1, 2)`, `"auto"`); other defaults are left out.

    Raises LookupError when the module has no such function (it was renamed: the caller must follow)."""
    spec = importlib.util.find_spec(module)  # imports the parent packages only
    if spec is None or spec.origin is None:
        raise LookupError(f"no module {module!r} to read the defaults of {name!r} from")
    with open(spec.origin, encoding="utf-8") as file:
        tree = ast.parse(file.read(), spec.origin)
    for node in tree.body:
        if getattr(node, "name", None) != name:
            continue
        if isinstance(node, ast.ClassDef):
            node = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if isinstance(node, ast.FunctionDef):
            return _literal_defaults(node.args)
    raise LookupError(f"{spec.origin} defines no function or class {name!r} at its top level")


def _literal_defaults(args: ast.arguments) -> dict[str, Any]:
    """The literal defaults of a signature: positional ones align with the last positional arguments."""
    positional = [*args.posonlyargs, *args.args]
    pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
    pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
    out = {}
    for arg, default in pairs:
        try:
            out[arg.arg] = ast.literal_eval(default)
        except ValueError:  # a name or a call (`DEFAULT_TARGETS`): not readable without importing
            continue
    return out
