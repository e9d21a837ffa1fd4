"""allocscope export: a capture in another tool's format."""

from __future__ import annotations

import argparse

from ..common.units import format_bytes
from .options import add_capture, add_output, check_output, default_output, load_capture

NAME = "export"
HELP = "write a capture as a PyTorch memory snapshot (memory_viz) or a Perfetto/Chrome trace"
DESCRIPTION = """\
--format memory-viz writes the pickle that pytorch.org/memory_viz and
torch.cuda._memory_viz open: the allocator's segments at the end, each
device's trace (alloc, free, segment events, OOMs) with Python stacks, and
the allocator settings. `allocscope import` reads it back with nothing lost.

--format perfetto writes Chrome trace-event JSON for ui.perfetto.dev or
chrome://tracing: a counter track of live bytes per category (and
allocated, reserved, device used), marks and OOMs as instants, iterations
as slices; counters keep every slice's peak (--points slices).

examples:
  allocscope export step.alsc --format memory-viz        # writes step.pickle
  allocscope export step.alsc --format perfetto           # writes step.perfetto.json
  allocscope export step.alsc --format perfetto --points 50000 -o trace.json
"""

SUFFIX = {"memory-viz": ".pickle", "perfetto": ".perfetto.json"}


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    add_capture(parser)
    parser.add_argument("--format", required=True, choices=sorted(SUFFIX), help="what to write")
    add_output(parser, "file to write (default: the capture's name with .pickle or .perfetto.json)")
    parser.add_argument("--points", type=int, default=10000, metavar="N",
                        help="perfetto: counter samples per track (default 10000)")


def run(args: argparse.Namespace) -> int:
    from ..common.errors import InputError
    from ..interop import export_memory_viz, export_perfetto

    if args.points < 2:
        raise InputError("--points must be at least 2")
    out = args.output or default_output(args.file, SUFFIX[args.format])
    check_output(out, args.force)
    cap = load_capture(args.file)
    size = export_memory_viz(cap, out) if args.format == "memory-viz" else export_perfetto(cap, out, points=args.points)
    print(f"wrote {out} ({format_bytes(size)})")
    return 0
