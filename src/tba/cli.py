"""The `tba` command."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
from pathlib import Path
from types import ModuleType

from tba.commandline import CONFIG_ENV, add_config_arguments, settings_from_args
from tba.settings import Section

# (group, command) -> module with FLAGS, SETTINGS, HELP and run(settings).
COMMANDS: dict[tuple[str, ...], str] = {
    ("buffer", "serve"): "tba.buffer.main",
    ("trainer", "run"): "tba.trainer.main",
    ("searcher", "run"): "tba.searcher.main",
    ("local",): "tba.local.main",
    ("eval",): "tba.eval.main",
}


def build_parser() -> tuple[argparse.ArgumentParser, dict[tuple[str, ...], ModuleType]]:
    parser = argparse.ArgumentParser(prog="tba", description="Trajectory Balance with Asynchrony")
    parser.add_argument("--log-level", default=os.environ.get("TBA_LOG_LEVEL", "INFO"))
    groups = parser.add_subparsers(dest="group", required=True, metavar="COMMAND")
    modules: dict[tuple[str, ...], ModuleType] = {}
    group_parsers: dict[str, argparse._SubParsersAction[argparse.ArgumentParser]] = {}
    for key, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        modules[key] = module
        if len(key) == 1:
            sub = groups.add_parser(key[0], help=module.HELP, description=module.HELP)
        else:
            if key[0] not in group_parsers:
                group = groups.add_parser(key[0], help=f"{key[0]} commands")
                group_parsers[key[0]] = group.add_subparsers(
                    dest="command", required=True, metavar="SUBCOMMAND"
                )
            sub = group_parsers[key[0]].add_parser(
                key[1], help=module.HELP, description=module.HELP
            )
        add_config_arguments(sub, module.FLAGS)
        sub.set_defaults(command_key=key)
    return parser, modules


def run_sections(
    modules: dict[tuple[str, ...], ModuleType] | None = None,
) -> dict[str, type[Section]]:
    """The sections a run file may hold: the union of every command's sections. A section
    name means one model in every command that reads it."""
    if modules is None:
        modules = {key: importlib.import_module(name) for key, name in COMMANDS.items()}
    union: dict[str, type[Section]] = {}
    for key, module in modules.items():
        for name, model in module.SETTINGS.sections().items():
            if union.setdefault(name, model) is not model:
                raise TypeError(f"section [{name}] of `tba {' '.join(key)}` is another model")
    return union


def main(argv: list[str] | None = None) -> None:
    parser, modules = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    module = modules[args.command_key]
    config = args.config
    if config is None and os.environ.get(CONFIG_ENV):
        config = Path(os.environ[CONFIG_ENV])
    settings = settings_from_args(
        module.SETTINGS, args, module.FLAGS, run_sections(modules), config
    )
    module.run(settings)


if __name__ == "__main__":
    main()
