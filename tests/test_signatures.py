"""`rlhf.signatures.with_defaults`: a component's arguments as its constructor sees them, defaults read
from the signature (so a hook or a planner never writes a default a second time)."""

import functools

import pytest

from rlhf.signatures import with_defaults


class Engine:
    def __init__(self, model_path: str, dtype: str = "float32", rows: int | None = None):
        pass


def test_given_arguments_over_the_signatures_defaults():
    assert with_defaults(Engine, {"dtype": "bfloat16"}) == {"dtype": "bfloat16", "rows": None}  # path: not given
    assert with_defaults(Engine, {"model_path": "m"}) == {"model_path": "m", "dtype": "float32", "rows": None}


def test_a_partials_keywords_are_its_defaults():
    assert with_defaults(functools.partial(Engine, rows=8), {})["rows"] == 8


def test_an_argument_the_callable_does_not_take_is_named():
    with pytest.raises(TypeError, match="takes no argument 'dtyp'; it takes model_path, dtype, rows"):
        with_defaults(Engine, {"dtyp": "bfloat16"})


def test_a_callable_taking_any_keyword_takes_them_all():
    def build(path: str, seed: int = 0, **options):
        pass

    assert with_defaults(build, {"enforce_eager": True}) == {"seed": 0, "enforce_eager": True}
