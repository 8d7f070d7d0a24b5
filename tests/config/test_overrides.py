"""Command-line overrides: the fiddle grammar, applied in order, with did-you-mean errors."""

import pytest

import toy_experiment
from rlhf.config.overrides import OverrideError, apply_overrides, set_path


def build(*commands):
    return apply_overrides(list(commands), [toy_experiment])


def test_defaults_to_base_and_applies_in_order():
    g, fiddlers = build("fiddler:tiny", "set:stages.grpo.lr=0.25")
    assert g.stages["grpo"].lr == 0.25 and fiddlers == ["tiny"]
    g, _ = build("set:stages.grpo.lr=0.25", "fiddler:tiny(lr=0.75)")
    assert g.stages["grpo"].lr == 0.75


def test_config_with_arguments_and_bracket_paths():
    g, _ = build("config:base(steps=3)", 'set:stages["sft"].name="x"')
    assert g.stages["sft"].total_steps == 3 and g.stages["sft"].name == "x"


@pytest.mark.parametrize(
    "command, message",
    [
        ("fiddler:tinyy", "no fiddler 'tinyy'. Did you mean 'tiny'?"),
        ("set:stages.grpo.total_stepz=3", "has no field 'total_stepz'. Did you mean 'total_steps'?"),
        ("set:stages.gpro.lr=1", "has no key 'gpro'. Did you mean 'grpo'?"),
        ("set:stages.grpo.name=abc", "not a Python literal; quote strings"),
        ("set:stages.grpo.lr", "needs `=`"),
        ("sett:x=1", "unknown override"),
        ("config:bsae", "Did you mean 'base'?"),
        ("fiddler:tiny(0.1)", "keyword arguments only"),
        ("config:base(steps=3, steps=4)", "argument 'steps' given more than once; give each once"),
    ],
)
def test_mistakes_fail_with_the_fix(command, message):
    cmds = [command] if command.startswith("config:") else ["config:base", command]
    with pytest.raises(OverrideError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        build(*cmds)


def test_set_path_on_list_index():
    g = {"items": [1, 2]}
    set_path(g, "items[1]", 5)
    assert g["items"] == [1, 5]


def test_a_config_after_other_commands_is_refused_not_silently_applied():
    """`config:` builds the graph afresh: placed after other commands it used to drop them without a word
    (and the preflight then asked for the cpu.gin the command line had passed)."""
    with pytest.raises(OverrideError) as err:
        build("fiddler:tiny(lr=0.75)", "set:stages.grpo.lr=0.5", "config:base(steps=3)")
    message = str(err.value)
    assert "'config:base(steps=3)' builds the graph from scratch" in message
    assert "the commands before it ('fiddler:tiny(lr=0.75)', 'set:stages.grpo.lr=0.5') would be dropped" in message
    assert message.endswith("--config 'config:base(steps=3)' --config 'fiddler:tiny(lr=0.75)' "
                            "--config set:stages.grpo.lr=0.5")
    g, _ = build("config:base(steps=3)", "fiddler:tiny(lr=0.75)", "set:stages.grpo.lr=0.5")  # the order it gives
    assert g.stages["sft"].total_steps == 3 and g.stages["grpo"].lr == 0.5
