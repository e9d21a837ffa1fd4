"""allocscope import: a PyTorch memory snapshot as a capture."""

from __future__ import annotations

import argparse

from .options import add_json, add_output, check_output, default_output

NAME = "import"
HELP = "convert a PyTorch memory snapshot (_dump_snapshot pickle) into a capture file"
DESCRIPTION = """\
Read a snapshot written by torch.cuda.memory._dump_snapshot() (after
torch.cuda.memory._record_memory_history()) and write it as an allocscope
capture, so that report, html, simulate and diff work on snapshots you
already have. The pickle is read as plain data only: a file that asks to
build any object or call any function is refused before anything runs.
The allocator's trace becomes the events, the snapshot's segments the end
state; the state before the trace is rebuilt by undoing the trace (see
docs/format.md). Snapshots made by `allocscope export --format memory-viz`
import back exactly.

examples:
  allocscope import snapshot.pickle                 # writes snapshot.alsc
  allocscope import snapshot.pickle -o run.alsc && allocscope html run.alsc
"""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("snapshot", help="snapshot pickle (torch.cuda.memory._dump_snapshot)")
    add_output(parser, "capture to write (default: the snapshot's name with .alsc)")
    add_json(parser, "print what was written as JSON")


def run(args: argparse.Namespace) -> int:
    import json

    from ..interop import import_snapshot

    out = args.output or default_output(args.snapshot, ".alsc")
    check_output(out, args.force)
    result = import_snapshot(args.snapshot, out)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"wrote {out}: {result['events']} events, {result['stacks']} stack nodes")
    return 0
