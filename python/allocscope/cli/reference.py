"""The command line's reference page (docs/cli.md), written from the
commands' own parsers so that it cannot drift from them:

    python -m allocscope.cli.reference > docs/cli.md

tests/unit/test_docs.py checks that the committed page is what this writes."""

from __future__ import annotations

import argparse
import sys

from . import COMMANDS

__all__ = ["markdown"]

_INTRO = """\
# The command line

Every command has `--help` with the same text. Bad input (a damaged capture,
a wrong argument, an unknown GPU, an output in the way) is one line on
stderr and exit status 2; piped into `head`, a command stops quietly.
This page is written from the commands' own parsers
(`python -m allocscope.cli.reference > docs/cli.md`; a test keeps it so).

| command | what it does |
|---|---|
"""


def _option_row(action: argparse.Action) -> tuple[str, str]:
    if action.option_strings:
        names = ", ".join(f"`{o}`" for o in action.option_strings)
        if action.nargs != 0:
            metavar = action.metavar or (action.dest.upper() if not action.choices else
                                         "{" + ",".join(map(str, action.choices)) + "}")
            names += f" `{metavar}`"
    else:
        names = f"`{action.metavar or action.dest}`"
    text = action.help or ""
    if "%" in text:  # argparse's own expansion (%(default)s, %%)
        text = text % {**vars(action), "prog": ""}
    return names, text.replace("|", "\\|")


def _command(command) -> list[str]:  # noqa: ANN001 (a command module: NAME, HELP, DESCRIPTION, prepare_parser)
    parser = argparse.ArgumentParser(prog=f"allocscope {command.NAME}", add_help=False)
    command.prepare_parser(parser)
    lines = [f"## allocscope {command.NAME}", "", command.HELP[0].upper() + command.HELP[1:] + ".", "", "```text",
             command.DESCRIPTION.rstrip("\n"), "```", "", "| option | what |", "|---|---|"]
    for action in parser._actions:  # (argparse keeps them only there)
        if action.help == argparse.SUPPRESS:
            continue
        name, text = _option_row(action)
        lines.append(f"| {name} | {text} |")
    return lines + [""]


def markdown() -> str:
    """docs/cli.md."""
    lines = [_INTRO.rstrip("\n")]
    lines += [f"| [`{c.NAME}`](#allocscope-{c.NAME}) | {c.HELP} |" for c in COMMANDS]
    lines.append("")
    for command in COMMANDS:
        lines += _command(command)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(markdown())
