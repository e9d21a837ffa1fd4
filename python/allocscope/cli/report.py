"""allocscope report: the peak explained, from the textbook estimate to the
measured bytes."""

from __future__ import annotations

import argparse
import json

from .options import add_capture, add_full_stacks, add_json, add_top, check_top, load_capture

NAME = "report"
HELP = "explain the peak (or a mark): categories, modules, sites, theory vs practice"
DESCRIPTION = """\
Explain where the memory went at the peak of allocated memory (or, with --at,
at the first mark with that label; with --steps, at the peak of those
optimizer steps of a watched model): bytes live by category (parameter,
gradient, optimizer state, activation, temporary, ...), by module and by
source line, and the waterfall from the textbook estimate (parameters +
gradients + optimizer state + activations) to what was measured, line by line:
each category's difference, allocator rounding, cached free memory, and memory
outside PyTorch's allocator. Categories need a watched model
(`rec.watch(model, optimizer)`); see docs/attribution.md. Sizes are in binary
units (KiB = 1024 B). --json prints the same as JSON (schema: docs/report.md).
On a long capture --steps and --at read only what they need: from the last
checkpoint before them, to the step after theirs. The peak, iterations and
timeline then cover the events read, which the report names.

examples:
  allocscope report step.alsc
  allocscope report step.alsc --at after-forward
  allocscope report long.alsc --steps 100-120
  allocscope report --json step.alsc | jq '.gap'
  allocscope report ddp.alsc                   (every rank of a run: ddp.rank0.alsc, ...)
  allocscope report serve.alsc                 (every process of a run: serve.alsc, serve.pid4242.alsc, ...)

Given several captures of one run (the ranks of a job, or the processes of
a command: an engine process beside its parent, spawned workers), it first
compares them: per rank (or process) the peaks, device used, NCCL's memory
and the contexts other processes made on its card; the worst one and where
it differs from the median one; then the report of the worst.
"""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    add_capture(parser, run=True)
    add_json(parser)
    parser.add_argument("--at", metavar="LABEL", help="report at the first mark with this label instead of the peak")
    parser.add_argument("--steps", metavar="A-B", type=_steps,
                        help="report on optimizer steps A to B (or one step A) of a watched model: their peak, "
                             "their iterations, their timeline")
    add_top(parser, 10, "rows in each table")
    add_full_stacks(parser)


def _steps(text: str) -> tuple[int, int]:
    first, sep, last = text.partition("-")
    try:
        a, b = int(first), int(last) if sep else int(first)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a step or a range of steps (e.g. 100 or 100-120)") from None
    if a < 0 or b < a:
        raise argparse.ArgumentTypeError(f"{text!r}: steps run from a first to a last, both >= 0")
    return a, b


def run(args: argparse.Namespace) -> int:
    from ..capture.runs import load_run, run_files
    from ..common.errors import InputError
    from ..reports.ranks import build_ranks, render_ranks
    from ..reports.report import build_report, render

    check_top(args)
    if args.at is not None and args.steps is not None:
        raise InputError("--at and --steps cannot be used together")
    files = run_files(args.file)
    if len(files) > 1:
        if args.at is not None or args.steps is not None:
            raise InputError("--at and --steps report on one capture: give one rank's or process's file "
                             "(FILE.rankN.alsc, FILE.pidN.alsc)")
        ranks = build_ranks(load_run(files), top=args.top)
        print(json.dumps(ranks, indent=1) if args.json else render_ranks(ranks, args.top))
        return 0
    # --steps and --at read only as far as the steps or the mark need, from
    # the last checkpoint before them where the file has one (reader.load).
    if args.at is not None:
        cap = load_capture(files[0], at_mark=args.at)
    else:
        first, last = args.steps if args.steps is not None else (None, None)
        cap = load_capture(files[0], through_step=last, from_step=first)
    report = build_report(cap, at=args.at, steps=args.steps, top=args.top)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(render(report, args.top, stacks="full" if args.full_stacks else "folded"))
    return 0
