"""allocscope html: the report as one self-contained HTML file."""

from __future__ import annotations

import argparse

from ..common.units import format_bytes
from .options import add_capture, add_output, check_output, default_output, load_capture

NAME = "html"
HELP = "write the report as one self-contained HTML file (timeline, flamegraph, segments, tables)"
DESCRIPTION = """\
Write an interactive report that opens offline in any browser: memory over
time stacked by category or module (drag to zoom), the peak explained (the
waterfall from the textbook estimate to the measured bytes, and live memory
as an icicle by Python stack or by module), the CUDA caching allocator's
segments at the peak of reserved memory or at an out-of-memory error, and
sortable tables of allocation sites, leaks and iterations. Everything is
inlined; the page makes no network request. Large captures are reduced in
Python (10 million events make a file of a few hundred kilobytes).

examples:
  allocscope html step.alsc                   # writes step.html
  allocscope html step.alsc -o report.html
  allocscope html step.alsc --at after-forward -o fwd.html
"""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    add_capture(parser, run=True)
    add_output(parser, "HTML file to write (default: the capture's name with .html)")
    parser.add_argument("--at", metavar="LABEL", help="explain the first mark with this label instead of the peak")
    parser.add_argument("--no-progress", action="store_true", help="never draw a progress bar")


def run(args: argparse.Namespace) -> int:
    from ..capture.runs import load_run, run_files, run_name
    from ..common.errors import InputError
    from ..reports.html import write_html
    from ..reports.ranks import build_ranks

    files = run_files(args.file)
    out = args.output or default_output(run_name(files) if len(files) > 1 else files[0], ".html")
    check_output(out, args.force)
    ranks = None
    if len(files) > 1:
        if args.at is not None:
            raise InputError("--at explains one capture: give one rank's or process's file "
                             "(FILE.rankN.alsc, FILE.pidN.alsc)")
        caps = load_run(files)
        ranks = build_ranks(caps, top=10)
        cap = caps[[c.path for c in caps].index(ranks["worst_capture"])]
    else:
        cap = load_capture(files[0], progress=False if args.no_progress else None)
    size = write_html(cap, out, at=args.at, progress=False if args.no_progress else None, ranks=ranks)
    print(f"wrote {out} ({format_bytes(size)})")
    return 0
