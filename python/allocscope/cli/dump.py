"""allocscope dump: the events of a capture, one per line (for debugging)."""

from __future__ import annotations

import argparse
import json

from .options import add_capture, add_json, load_capture

NAME = "dump"
HELP = "print a capture's events as text or JSON lines"
DESCRIPTION = """\
Print the events of a capture in sequence order, as text or as JSON lines.

examples:
  allocscope dump step.alsc | head
  allocscope dump --kind alloc --kind oom --stacks step.alsc
  allocscope dump --json step.alsc > events.jsonl
"""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    from ..capture.format import EventKind

    add_capture(parser)
    add_json(parser, "one JSON object per line")
    parser.add_argument("--kind", action="append", metavar="KIND",
                        choices=[k.name.lower() for k in EventKind],
                        help="only events of this kind (repeatable): " + ", ".join(k.name.lower() for k in EventKind))
    parser.add_argument("--limit", type=int, metavar="N", help="stop after N events")
    parser.add_argument("--stacks", action="store_true", help="include each event's Python stack")


def run(args: argparse.Namespace) -> int:
    from ..reports.events import event_rows, render_event

    if not args.json:
        print("# seq, time since first event, kind (* = seen only by the allocator's trace hook), device, fields")
    for row in event_rows(load_capture(args.file), kinds=args.kind or (), limit=args.limit, stacks=args.stacks):
        print(json.dumps(row) if args.json else render_event(row))
    return 0
