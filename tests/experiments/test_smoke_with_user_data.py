"""`fiddler:smoke` of every recipe works when the data is the user's files (`load_rows(path=...)`), as
docs/bring_your_own_model.md advises; `limit_rows` finds each kind of rows node's knob."""

from pathlib import Path

import fiddle as fdl
import pytest
from fiddle import selectors

from rlhf.cli.experiment import load_experiment
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.data.sft import SFTDataset, load_sft_rows
from rlhf.data.sources import load_rows
from rlhf.runtime.plan import compile_graph
from rlhf_configs.rows import limit_rows

EXPERIMENTS = sorted((Path(__file__).parents[2] / "experiments").glob("*.py"))
SMOKED = [p for p in EXPERIMENTS if hasattr(load_experiment(str(p)), "smoke")]


def _users_files(graph: fdl.Config, folder: Path) -> list[fdl.Config]:
    """Every dataset node's rows read from a file (prompt rows with load_rows, SFT rows with load_sft_rows),
    replacing the recipe's generators and whatever wrapped them; the new rows nodes."""
    nodes = []
    for cls, reader in ((PromptDataset, load_rows), (SFTDataset, load_sft_rows)):
        for i, dataset in enumerate(selectors.select(graph, cls)):
            dataset.rows = fdl.Config(reader, path=str(folder / f"{cls.__name__}-{i}.parquet"))
            nodes.append(dataset.rows)
    return nodes


@pytest.mark.parametrize("path", SMOKED, ids=[p.stem for p in SMOKED])
def test_smoke_works_when_the_data_comes_from_files(path, tmp_path):
    # before limit_rows: AttributeError: No parameter 'rows' has been set on <Config[load_rows(...)]>
    module = load_experiment(str(path))
    graph = module.base()
    files = _users_files(graph, tmp_path)
    assert files, "the recipe has no dataset to read from files"
    module.smoke(graph)
    assert all(isinstance(node.limit, int) for node in files)  # every file is read in part, as the generators were
    for stage in graph.stages.values():
        compile_graph(stage)


def test_limit_rows_sets_n_limit_or_the_wrapped_rows_and_names_the_fix_otherwise():
    generated = fdl.Config(PromptDataset, rows=fdl.Config(arithmetic_rows, n=100))
    limit_rows(generated, 8)
    assert generated.rows.n == 8
    read = fdl.Config(PromptDataset, rows=fdl.Config(load_rows, path="x.parquet"))
    limit_rows(read, 8)
    assert read.rows.limit == 8
    wrapped = fdl.Config(PromptDataset, rows=fdl.Config(_rewrite, rows=fdl.Config(load_sft_rows, path="x.parquet")))
    limit_rows(wrapped, 8)
    assert wrapped.rows.rows.limit == 8
    listed = fdl.Config(PromptDataset, rows=[{"i": 0}, {"i": 1}, {"i": 2}])
    limit_rows(listed, 2)
    assert listed.rows == [{"i": 0}, {"i": 1}]
    with pytest.raises(ValueError, match=r"limit_rows: cannot make .* no `n` or `limit` argument.*Fix: read them"):
        limit_rows(fdl.Config(PromptDataset, rows=fdl.Config(_opaque, path="x")), 8)


def _rewrite(rows):
    return rows


def _opaque(path):
    return []
