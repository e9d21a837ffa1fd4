"""allocscope info: what a capture holds."""

from __future__ import annotations

import argparse
import json

from .options import add_capture, add_json, load_capture

NAME = "info"
HELP = "show a capture's metadata and event counts"
DESCRIPTION = """\
Show what a capture holds: the process and torch that made it, the devices and
allocator settings, event counts, file size per event, bytes live at the end
and at the peak, and the allocator baselines.

examples:
  allocscope info step.alsc
  allocscope info --json step.alsc | jq .events
"""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    add_capture(parser)
    add_json(parser)


def run(args: argparse.Namespace) -> int:
    import warnings

    from ..capture.reader import TruncatedCaptureWarning
    from ..reports.info import render, summarize

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TruncatedCaptureWarning)  # shown in the output instead
        s = summarize(load_capture(args.file))
    print(json.dumps(s, indent=2, default=str) if args.json else render(s))
    return 0
