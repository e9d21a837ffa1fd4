"""allocscope fit: will a command fit on these GPUs? One recorded run per
virtual card, and a verdict with the peaks for each."""

from __future__ import annotations

import argparse
import json
import os

from .options import (add_full_stacks, add_json, add_limit_arguments, add_top, add_values_arguments,
                      add_world_arguments, check_top, limits_from, world_from)

NAME = "fit"
HELP = "run a command on virtual GPUs of several models: does it fit on each, and with how much room"
DESCRIPTION = """\
Run a command once per --gpu on a virtual GPU of that model (torch's real CUDA
caching allocator on a stand-in card: memory behaves as on the card, kernels
compute nothing but the cheap ops that steer shapes; docs/vgpu.md), recording
it, and say for each card whether it fits: the peaks of allocated and reserved
memory, the headroom (the card's memory less the reserved peak and what the
CUDA context and libraries use), what filled memory at the peak (categories and modules: the script's models
and optimizers are watched for it; source lines always) and, where it ran
out, the post-mortem. A command that fails for another reason is reported as
such, not as out of memory. The captures are kept in --output-dir (one per
card), for `allocscope report`, `html` and `simulate`. While it runs, fit
shows one line per run; each run's own output goes to a log beside its
capture (CARD.log), and the end of it shows where a run failed for a reason
other than memory (--verbose shows all of it as it runs).

With --search NAME=LOW..HIGH, finds on each card the largest value of an
integer parameter (batch size, sequence length, layers, ...) at which the
command fits, taking a value that fits to fit below it too: each run is made
where the memory measured so far (the headroom of a run that fit, the
shortfall of one that ran out) puts the boundary, or at the middle of what is
left, never more than bisection's ceil(log2(HIGH - LOW + 2)) runs plus one,
and often 3 or 4. A card
searched after a larger one of the same chip (A100-40GB after A100-80GB)
starts from replays of that card's runs with its own memory
(`allocscope simulate --limit`), and runs only what they leave open. The
value reaches the command through {NAME} in its arguments and the
environment variable NAME. It reports the largest
value with its peak and headroom, and the next value with its peak and
shortfall. A run that fails for another reason stops the search. Without
--search, a {NAME} in the command takes the value of the environment
variable NAME where it is set: the same command line runs at one value, and where it runs
out of memory the post-mortem gives the search that finds the largest value
(and an estimate of it from that run alone).

Exit status: 0 when the command fits on every card (with --search: some
value fits on every card), 1 otherwise. --json prints the document instead
(schema: docs/report.md, "fit"), with the command's own output sent to
standard error.

examples:
  allocscope fit --gpu A100-40GB --gpu L4-24GB -- python train.py --steps 2
  allocscope fit --gpu T4-16GB --json -- train.py --batch-size 64
  allocscope fit --gpu H100-80GB --gpu-memory 20GiB -- python train.py   (20 GiB left on a shared H100)
  allocscope fit --gpu H100-80GB --gpu H100-80GB:20GiB --gpu H100-80GB-MIG-1g.10gb -- python train.py
  allocscope fit --gpu A100-40GB --search BATCH=1..1024 -- python train.py --batch-size {BATCH}
  BATCH=512 allocscope fit --gpu A100-40GB -- python train.py --batch-size {BATCH}
  allocscope fit --gpu H100-80GB --routing balanced --routing worst -- python moe_train.py   (MoE routings)
  allocscope fit --gpu H100-80GB --world-size 1024 --rank 0 --rank 1023 -- python train.py
  allocscope run --gpu list                         (the models)
"""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", metavar="GPU", action="append", required=True,
                        help="a virtual GPU model to try (repeat for several; `allocscope run --gpu list`), "
                             "with its own memory as GPU:SIZE (H100-80GB:20GiB)")
    parser.add_argument("--gpu-memory", metavar="SIZE",
                        help="every card's memory instead of its model's (e.g. 20GiB: what is left on a shared "
                             "card), but a card's own GPU:SIZE; default: $ALLOCSCOPE_VGPU_MEMORY where set")
    parser.add_argument("-o", "--output-dir", metavar="DIR", default="allocscope-fit",
                        help="where the captures go, one per card (default: allocscope-fit)")
    parser.add_argument("-f", "--force", action="store_true", help="overwrite captures already in DIR")
    parser.add_argument("--stacks", choices=("python", "none"), default="python",
                        help="record each allocation's Python stack (default) or not")
    add_json(parser)
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show each run's own output as it runs (by default it goes to a log beside the run's "
                             "capture, and only a run that fails for a reason other than memory shows its end)")
    add_top(parser, 5, "rows in each breakdown")
    add_full_stacks(parser)
    parser.add_argument("--search", metavar="NAME=LOW..HIGH", type=_search_range,
                        help="find the largest value of NAME in LOW..HIGH that fits ({NAME} in the command, "
                             "and the environment variable NAME)")
    add_values_arguments(parser, several_routings=True)
    add_limit_arguments(parser)
    add_world_arguments(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                        help="the command to run, after --")


def _search_range(text: str) -> tuple[str, int, int]:
    from ..common.errors import InputError
    from ..harness.search import parse_search

    try:
        return parse_search(text)
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    from ..harness.fit import fit
    from ..reports.fit import render_fit, render_search
    from ..vgpu import ENV_MEMORY

    check_top(args)

    memory = args.gpu_memory if args.gpu_memory is not None else os.environ.get(ENV_MEMORY) or None
    doc = fit(args.command, args.gpu, output_dir=args.output_dir, force=args.force, stacks=args.stacks, top=args.top,
              search=args.search, stdout_to_stderr=args.json, world=world_from(args), gpu_memory=memory,
              compute=args.compute, routings=args.routing, limits=limits_from(args), verbose=args.verbose)
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        stacks = "full" if args.full_stacks else "folded"
        print(render_search(doc) if args.search else render_fit(doc, args.top, stacks=stacks))
    return 0 if doc["fits_everywhere"] else 1
