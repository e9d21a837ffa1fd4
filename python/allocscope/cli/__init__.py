"""The allocscope command line: one module per command, listed here.

Each command module has NAME, HELP, DESCRIPTION (with examples),
prepare_parser(parser) and run(args) -> exit status.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Sequence

from . import diff, dump, export, fit, html, import_, info, report, run, simulate

COMMANDS = [run, fit, info, dump, report, html, diff, simulate, import_, export]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="allocscope",
        description="Record every PyTorch allocation with its Python stack, and explain where the memory went.",
        epilog="Run 'allocscope COMMAND --help' for a command's options and examples.",
    )
    from .._version import __version__

    parser.add_argument("--version", action="version", version=f"allocscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        p = sub.add_parser(command.NAME, help=command.HELP, description=command.DESCRIPTION,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        command.prepare_parser(p)
        p.set_defaults(_command=command, _name=command.NAME)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one command. Bad input (InputError, or an OSError on a path the
    user named) is one line on stderr and status 2; any other exception is
    a bug and keeps its traceback. A reader that closes our standard output
    early (`allocscope dump f | head`) ends the command quietly, with the
    status a Unix tool killed by SIGPIPE leaves (141)."""
    from ..common.errors import InputError

    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_command", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        status = int(args._command.run(args))
        sys.stdout.flush()  # a closed pipe shows here, not at exit where Python would print it
        return status
    except BrokenPipeError:
        try:  # nothing more can be written there, nor flushed at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # not a file (an in-process caller's capture)
            pass
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt:
        print(f"allocscope {args._name}: interrupted", file=sys.stderr)
        return 130
    except InputError as e:
        return _user_error(args._name, str(e))
    except OSError as e:
        if not _names_a_user_path(e, args):
            raise
        return _user_error(args._name, f"{e.filename}: {e.strerror}")


def _user_error(command: str, message: str) -> int:
    print(f"allocscope {command}: error: {message}", file=sys.stderr)
    return 2


def _names_a_user_path(e: OSError, args: argparse.Namespace) -> bool:
    """Whether the error is about a path given on the command line (a file
    to read or write, an output folder, or something in it)."""
    if e.filename is None or not isinstance(e.filename, (str, bytes)):
        return False
    where = os.path.abspath(os.fsdecode(e.filename))
    given = [v for value in vars(args).values() for v in (value if isinstance(value, list) else [value])
             if isinstance(v, str) and v and v != "--"]
    return any(where == p or where.startswith(p.rstrip(os.sep) + os.sep) for p in map(os.path.abspath, given))
