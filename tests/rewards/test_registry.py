"""The one table of rule rewards: every data_source's scorer and maj@k answer extractor."""

import pickle

import pytest

from rlhf.graph.io import graph_hash
from rlhf.rewards import EXTRACTORS, RULES, SCORERS, default_extractors, default_scorers, gsm8k_answer, gsm8k_score
from rlhf.rewards.math import MATH_SOURCES
from rlhf.trainers.eval_job import EvalJob
import fiddle as fdl


def test_scorers_and_extractors_come_from_one_table():
    assert set(SCORERS) == set(RULES) and set(EXTRACTORS) <= set(RULES)
    assert set(MATH_SOURCES) <= set(EXTRACTORS)  # a scorer that has an answer gets maj@k
    assert "countdown" in SCORERS and "countdown" not in EXTRACTORS  # equations: nothing to vote on
    for source, rules in RULES.items():
        assert SCORERS[source] is rules.score and EXTRACTORS.get(source) is rules.answer


def test_the_shared_tables_refuse_changes_and_the_copies_do_not():
    with pytest.raises(TypeError, match="read-only.*dict\\(...\\)"):
        EXTRACTORS["mine"] = str
    with pytest.raises(TypeError, match="read-only"):
        SCORERS.update(mine=len)
    mine = default_scorers()
    mine["mine"] = len
    assert "mine" not in SCORERS and "mine" not in default_scorers() and default_extractors() == dict(EXTRACTORS)
    assert pickle.loads(pickle.dumps(EXTRACTORS)) == EXTRACTORS  # sent to Ray workers


def test_the_default_extractors_hash_as_part_of_a_graph():
    a, b = fdl.Config(EvalJob, reward=None, generations="x.jsonl"), fdl.Config(EvalJob, reward=None, generations="x.jsonl")
    assert graph_hash(a) == graph_hash(b)


def test_gsm8k_methods_are_one_table_and_a_typo_names_the_allowed_ones():
    assert gsm8k_answer("it is 12", "flexible") == 12 and gsm8k_score("it is 12", "12", method="flexible") == 1.0
    for call in (lambda: gsm8k_answer("#### 12", "flexibel"), lambda: gsm8k_score("#### 12", "12", method="strct")):
        with pytest.raises(ValueError, match=r"method must be one of \['flexible', 'strict'\]"):
            call()
