"""allocscope report: the peak explained, from the textbook estimate to the
measured bytes."""

from __future__ import annotations

import argparse
import json

NAME = "report"
HELP = "explain the peak (or a mark): categories, modules, sites, theory vs practice"
DESCRIPTION = """\
Explain where the memory went at the peak of allocated memory (or, with --at,
at the first mark with that label): bytes live by category (parameter,
gradient, optimizer state, activation, temporary, ...), by module and by
source line, and the waterfall from the textbook estimate (parameters +
gradients + optimizer state + activations) to what was measured, line by line:
each category's difference, allocator rounding, cached free memory, and memory
outside PyTorch's allocator. Categories need a watched model
(`rec.watch(model, optimizer)`); see docs/attribution.md. Sizes are in binary
units (KiB = 1024 B). --json prints the same as JSON (schema: docs/report.md).

examples:
  allocscope report step.alsc
  allocscope report step.alsc --at after-forward
  allocscope report --json step.alsc | jq '.gap'
"""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="capture file")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--at", metavar="LABEL", help="report at the first mark with this label instead of the peak")
    parser.add_argument("--top", type=int, default=10, metavar="N", help="rows in each table (default 10)")


def run(args: argparse.Namespace) -> int:
    from .. import load
    from ..reports.report import MarkNotFound, build_report, render

    if args.top < 1:
        raise ValueError("--top must be at least 1")
    cap = load(args.file)
    try:
        report = build_report(cap, at=args.at, top=args.top)
    except MarkNotFound as e:
        raise ValueError(str(e)) from None
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(render(report, args.top))
    return 0
