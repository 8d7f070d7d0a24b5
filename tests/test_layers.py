"""The import graph follows the layers of docs/architecture.md: no circles, arrows only downward.

Every module of `rlhf/` and `rlhf_configs/` is read with `ast` (nothing is imported). A module
belongs to the layer of its package (the table below, the same as the picture in
docs/architecture.md). An import may go to its own package or to a package of a LOWER layer;
packages of one layer do not import each other. Function-level imports count too: hiding an
upward import in a function does not make it downward. A function-level import of a project
module is allowed only where `FUNCTION_LEVEL` says why (it avoids a heavy import on a path
that does not need it).

`python tests/test_layers.py` prints the numbers: modules, edges, circles, upward imports and
function-level imports.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Top to bottom. A package may import its own modules and any package of a lower layer.
LAYERS: list[tuple[str, ...]] = [
    ("rlhf",),  # the package root only: `rlhf.sweep`, imported on first use
    ("rlhf.cli",),  # the command line
    ("rlhf_configs", "rlhf.sweeps"),  # reusable graph pieces; running N variants of a graph
    ("rlhf.config", "rlhf.runtime"),  # editing a graph; running one (preflight, plan, runtimes)
    ("rlhf.agent_programs",),  # black-box agent programs in the RL loop, on the recording gateway
    ("rlhf.trainers", "rlhf.serve"),  # driver loops; the OpenAI-compatible server
    ("rlhf.workers", "rlhf.agents"),  # policy, critic, reward-model workers; multi-turn rollouts (agent loop)
    ("rlhf.rollout", "rlhf.data"),  # rollout engines; datasets
    ("rlhf.rewards", "rlhf.models", "rlhf.tracking"),  # scorers; model loading; Aim
    ("rlhf.algos", "rlhf.graph", "rlhf.io"),  # pure math; graphs as data; atomic files
    ("rlhf.batch", "rlhf.ranges", "rlhf.typefit", "rlhf.choices", "rlhf.signatures", "rlhf.argtypes"),  # the data
    # container; range markers; values against annotations; checked choices; arguments completed with a
    # signature's defaults; command-line numbers
]

# Function-level imports of project modules, and why each one is not at the top of its module.
FUNCTION_LEVEL: dict[str, str] = {
    "rlhf": "`rlhf.sweep` is imported on first use, so `import rlhf.x` in a Ray worker stays light",
    "rlhf.cli.experiment_commands": "`rlhf run|plan|show --help` answers without fiddle, the runtimes or torch",
    "rlhf.cli.data": "`rlhf data --help` answers without pyarrow or the data generators",
    "rlhf.cli.prepare_preferences": "`rlhf data prepare preferences --help` answers without the graphs, torch and "
    "the runtimes",
    "rlhf.cli.dpo": "`rlhf dpo --help` answers without the graph, torch and the runtimes",
    "rlhf.cli.sft": "`rlhf sft --help` answers without the graph, torch and the runtimes (8 s of CPU)",
    "rlhf.cli.rm": "`rlhf rm --help` answers without the graph, torch and the runtimes",
    "rlhf.cli.generate_eval": "`rlhf generate|eval|probe --help` answer without the graphs, torch and the runtimes",
    "rlhf.cli.graph_flags": "the knob flags' `--help` answers without fiddle (the overrides) and the graphs",
    "rlhf.cli.rollouts": "`rlhf rollouts --help` answers without torch, and `show` without textual (`view`'s)",
    "rlhf.runtime.ray_runtime": "a Ray actor sets its torch.distributed environment before importing torch",
    "rlhf.tracking.ui": "aim (~3 s) only when a sweep link is made, not to start `aim up` or encode URLs",
    "rlhf.rewards.manager": "torch (~3 s) only for overlong shaping, not in reward-pool worker processes",
    "rlhf.rollout.vllm_engine": "vLLM is optional: its worker extension is imported with vLLM",
}


@functools.cache
def modules() -> dict[str, Path]:
    out = {}
    for top in ("rlhf", "rlhf_configs"):
        for path in sorted((ROOT / top).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


@functools.cache
def project_imports() -> list[tuple[str, str, int, bool]]:
    """`imports` of every module, read once per test session."""
    return imports(modules())


def statements(mods: dict[str, Path]) -> list[tuple[str, list[str], int, bool]]:
    """(module, the names it imports, line, at function level) for every import statement."""
    found = []

    def visit(node: ast.AST, module: str, package: str, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, module, package, True)
                continue
            # imports under `if TYPE_CHECKING:` count like any other: a type-only circle is still a circle
            if isinstance(child, ast.Import):
                found.append((module, [a.name for a in child.names], child.lineno, in_function))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parent = package.rsplit(".", child.level - 1)[0] if child.level > 1 else package
                    base = f"{parent}.{base}".strip(".")
                found.append((module, [f"{base}.{a.name}" for a in child.names], child.lineno, in_function))
            visit(child, module, package, in_function)

    for module, path in mods.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        visit(ast.parse(path.read_text(), str(path)), module, package, False)
    return found


def imports(mods: dict[str, Path]) -> list[tuple[str, str, int, bool]]:
    """(importer, imported project module, line, at function level) for every import of a project module."""

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    found = []
    for module, names, line, in_function in statements(mods):
        for target in {resolve(name) for name in names} - {None, module}:
            found.append((module, target, line, in_function))
    return found


def package_of(module: str) -> str:
    """The layer table's package holding `module` (the longest match; the root only for `rlhf` itself)."""
    names = [p for layer in LAYERS for p in layer if module == p or (p != "rlhf" and module.startswith(p + "."))]
    if not names:
        raise AssertionError(f"{module} is in no package of LAYERS (tests/test_layers.py): add its package to a layer "
                             f"and to the picture in docs/architecture.md")
    return max(names, key=len)


def layer_of(module: str) -> int:
    package = package_of(module)
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def circles(edges: list[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    graph: dict[str, list[str]] = defaultdict(list)
    for a, b in edges:
        graph[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for start in list(graph):
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def upward(found: list[tuple[str, str, int, bool]]) -> list[str]:
    """Imports of a higher layer's package, or of another package of the same layer."""
    out = []
    for a, b, line, in_function in found:
        pa, pb = package_of(a), package_of(b)
        if pa != pb and layer_of(b) <= layer_of(a):
            where = "in a function" if in_function else "at module level"
            out.append(f"{a}:{line} imports {b} {where}: {pa} may import only layers below it ({', '.join(LAYERS[layer_of(a)])})")
    return out


def test_no_import_circles():
    found = project_imports()
    assert circles([(a, b) for a, b, _, in_function in found if not in_function]) == []
    assert circles([(a, b) for a, b, _, _ in found]) == []  # none hidden in functions either


def test_every_import_goes_down_the_layers():
    assert upward(project_imports()) == []


def test_function_level_imports_of_project_modules_say_why():
    found = project_imports()
    unexplained = sorted({f"{a}:{line} imports {b}" for a, b, line, in_function in found
                          if in_function and a not in FUNCTION_LEVEL})
    assert unexplained == [], "import these at the top of the module, or say in FUNCTION_LEVEL why not"


def test_the_layer_table_matches_the_architecture_page():
    page = (ROOT / "docs" / "architecture.md").read_text()
    for layer in LAYERS[1:]:
        for package in layer:
            assert f"{package.replace('.', '/')}" in page, f"docs/architecture.md does not name {package}"


if __name__ == "__main__":
    mods = modules()
    found = imports(mods)
    module_level = [(a, b) for a, b, _, f in found if not f]
    in_functions = [names for _, names, _, f in statements(mods) if f]
    total = len(in_functions)
    project = sum(any(n.split(".")[0] in ("rlhf", "rlhf_configs") for n in names) for names in in_functions)
    print(f"modules: {len(mods)}, imports of project modules: {len(found)} ({len(module_level)} at module level)")
    print(f"circles at module level: {len(circles(module_level))}, with function-level imports: "
          f"{len(circles([(a, b) for a, b, _, _ in found]))}")
    print(f"upward imports: {len(upward(found))}")
    print(f"function-level import statements: {total}, of project modules: {project}")
    for line in upward(found):
        print("  " + line)
    sys.exit(0)


MAX_FUNCTION_LINES = 80
"""A function longer than a screen is doing more than one job: split it (signature and docstring included)."""


def test_no_library_function_is_longer_than_a_screen():
    long = []
    for path in sorted((ROOT / "rlhf").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"
