"""allocscope fit: will a command fit on these GPUs? One recorded run per
virtual card, and a verdict with the peaks for each."""

from __future__ import annotations

import argparse
import json
import os
import sys

from ._child import command_of, outputs, wait_for

NAME = "fit"
HELP = "run a command on virtual GPUs of several models: does it fit on each, and with how much room"
DESCRIPTION = """\
Run a command once per --gpu on a virtual GPU of that model (torch's real CUDA
caching allocator on a stand-in card: memory behaves as on the card, kernels
compute nothing; docs/vgpu.md), recording it, and say for each card whether
it fits: the peaks of allocated and reserved memory, the headroom (the card's
memory less the reserved peak and what the CUDA context and libraries use),
what filled memory at the peak (categories and modules where the script
watches its model, source lines always) and, where it ran out, the
post-mortem. A command that fails for another reason is reported as such,
not as out of memory. The captures are kept in --output-dir (one per card),
for `allocscope report`, `html` and `simulate`.

Exit status: 0 when the command fits on every card, 1 otherwise.
--json prints the document instead (schema: docs/report.md, "fit").

examples:
  allocscope fit --gpu A100-40GB --gpu L4-24GB -- python train.py --steps 2
  allocscope fit --gpu T4-16GB --json -- train.py --batch-size 64
  allocscope run --gpu list                         (the models)
"""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", metavar="GPU", action="append", required=True,
                        help="a virtual GPU model to try (repeat for several; `allocscope run --gpu list`)")
    parser.add_argument("-o", "--output-dir", metavar="DIR", default="allocscope-fit",
                        help="where the captures go, one per card (default: allocscope-fit)")
    parser.add_argument("-f", "--force", action="store_true", help="overwrite captures already in DIR")
    parser.add_argument("--stacks", choices=("python", "none"), default="python",
                        help="record each allocation's Python stack (default) or not")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--top", type=int, default=5, metavar="N", help="rows in each breakdown (default 5)")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                        help="the command to run, after --")


def _capture_path(directory: str, gpu: str) -> str:
    return os.path.join(directory, f"{gpu}.alsc")


def run(args: argparse.Namespace) -> int:
    from .. import _autostart, load, vgpu
    from ..reports.fit import card_result, fit_document, render_fit

    if args.top < 1:
        raise ValueError("--top must be at least 1")
    cmd = command_of(args, "allocscope fit --gpu A100-40GB -- python train.py")
    gpus = list(dict.fromkeys(args.gpu))
    for gpu in gpus:  # every card and output checked before the first run
        vgpu.environment(gpu)
    directory = os.path.abspath(args.output_dir)
    os.makedirs(directory, exist_ok=True)
    existing = [p for gpu in gpus for p in outputs(_capture_path(directory, gpu))]
    if existing and not args.force:
        raise ValueError(f"{os.path.relpath(existing[0])} exists; use --force to overwrite it")
    for path in existing:
        os.remove(path)
    cards = []
    for gpu in gpus:
        path = _capture_path(directory, gpu)
        print(f"allocscope fit: running on a virtual {gpu}", file=sys.stderr)
        env = _autostart.child_environment(vgpu.environment(gpu), path, {"device": "cuda", "stacks": args.stacks})
        status = wait_for(cmd, env)
        written = outputs(path)
        cap = load(written[0], salvage=True) if written else None
        cards.append(card_result(gpu, status, cap, capture_path=os.path.relpath(written[0]) if written else None,
                                 top=args.top))
    doc = fit_document(cmd, cards)
    print(json.dumps(doc, indent=1) if args.json else render_fit(doc, args.top))
    return 0 if doc["fits_everywhere"] else 1
