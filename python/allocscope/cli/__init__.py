"""The allocscope command line: one module per command, listed here.

Each command module has NAME, HELP, DESCRIPTION (with examples),
prepare_parser(parser) and run(args) -> exit status.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from . import diff, dump, export, fit, html, import_, info, report, run, simulate

COMMANDS = [run, fit, info, dump, report, html, diff, simulate, import_, export]

_USER_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError)


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
    from ..recording import AllocscopeError
    from ..reader import CaptureError
    from ..vgpu import VirtualGpuError

    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_command", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args._command.run(args))
    except (CaptureError, AllocscopeError, VirtualGpuError, *_USER_ERRORS) as e:
        message = str(e) if not isinstance(e, OSError) or not e.filename else f"{e.filename}: {e.strerror}"
        print(f"allocscope {args._name}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"allocscope {args._name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `allocscope dump f | head`
        return 0
