"""allocscope diff: what changed between two captures."""

from __future__ import annotations

import argparse
import json
import os

from .options import add_output, add_top, check_output, check_top, load_capture

NAME = "diff"
HELP = "compare two captures: peaks, and bytes by category, module and source line"
DESCRIPTION = """\
Compare two captures of the same program (two batch sizes, before and after a
code change, two allocator settings): the peaks of allocated, requested and
reserved memory and the textbook estimate, then the bytes live at each
capture's peak by category, by module and by source line (matched by name),
largest change first, and the waterfall items from estimate to measured.

examples:
  allocscope diff bs8.alsc bs16.alsc
  allocscope diff before.alsc after.alsc --json | jq '.categories'
  allocscope diff a.alsc b.alsc --html -o diff.html
  allocscope diff fsdp-bs8.alsc fsdp-bs16.alsc     (two runs of several ranks: their worst ranks)
"""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", help="the first capture (A: the baseline), or a run's captures (its name, a glob)")
    parser.add_argument("b", help="the second capture (B), or a run's")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON (schema allocscope.diff/1)")
    out.add_argument("--html", action="store_true", help="write an HTML page (to -o, default A-vs-B.html)")
    add_output(parser, "with --html: the file to write")
    add_top(parser, 15, "rows per table in text and HTML")


def run(args: argparse.Namespace) -> int:
    from ..common.errors import InputError
    from ..reports.diff import diff, render
    from ..reports.html import render_diff

    check_top(args)
    if args.output and not args.html:
        raise InputError("-o goes with --html")
    d = diff(_one(args.a, "A"), _one(args.b, "B"))
    if args.json:
        print(json.dumps(d, indent=1))
    elif args.html:
        name = lambda p: os.path.splitext(os.path.basename(p))[0]  # noqa: E731
        out = args.output or f"{name(args.a)}-vs-{name(args.b)}.html"
        check_output(out, args.force)
        with open(out, "w", encoding="utf-8") as f:
            f.write(render_diff(d, args.top))
        print(f"wrote {out}")
    else:
        print(render(d, args.top))
    return 0


def _one(name: str, side: str):  # -> Capture
    """The capture `name` stands for; of a run of several ranks, its worst
    rank's (reports/ranks.py), said on stderr."""
    import sys

    from ..capture.runs import load_run, run_files
    from ..reports.ranks import build_ranks, named_by

    files = run_files(name)
    if len(files) == 1:
        return load_capture(files[0])
    caps = load_run(files)
    doc = build_ranks(caps, top=1)
    worst = doc["worst_capture"]
    noun = "ranks" if named_by(doc) == "rank" else "processes"
    print(f"allocscope diff: {side} is a run of {len(caps)} {noun}: comparing its worst, {doc['worst_process']} "
          f"({worst})", file=sys.stderr)
    return next(c for c in caps if c.path == worst)
