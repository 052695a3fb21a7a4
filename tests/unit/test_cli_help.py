import importlib
import re

import pytest

from tba.cli import COMMANDS, build_parser
from tba.settings import load_settings

# `--set section.field=value` as help texts and command docstrings write it (argparse may wrap
# the line between the flag and its value).
SET_EXAMPLE = re.compile(r"--set\s+([a-z_]+(?:\.[a-z_]+)+)=(\S+)")


def _subparser(key: tuple[str, ...]):
    parser, _ = build_parser()
    for name in key:
        actions = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
        parser = actions[0].choices[name]
    return parser


@pytest.mark.parametrize("key", list(COMMANDS), ids=" ".join)
def test_every_set_example_in_help_parses_against_the_command_settings(key) -> None:
    module = importlib.import_module(COMMANDS[key])
    text = _subparser(key).format_help() + (module.__doc__ or "")
    examples = SET_EXAMPLE.findall(text)
    assert examples, f"tba {' '.join(key)} --help shows no --set example"
    for path, value in examples:
        load_settings(module.SETTINGS, overrides={path: value})


@pytest.mark.parametrize("key", list(COMMANDS), ids=" ".join)
def test_help_shows_no_internal_names(key) -> None:
    assert "FLAG_" not in _subparser(key).format_help()
