"""The options several commands share, declared and checked in one place:
the capture (or a run's captures) a command reads, --json, --top, the file
a command writes (-o, -f), and the options of the commands that run a
program (run, fit): the virtual GPU's values, limits, the ranks of a job."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..common.errors import InputError

__all__ = ["add_capture", "add_json", "add_limit_arguments", "add_output", "add_top", "add_values_arguments",
           "add_world_arguments", "check_output", "check_top", "default_output", "limits_from", "load_capture",
           "values_from", "world_from"]

_RUN_HELP = ("capture file, or a run's captures: the name it was given (ddp.alsc for ddp.rank0.alsc, "
             "ddp.rank1.alsc, ...) or a glob ('ddp.rank*.alsc')")


# ---- what a command reads and prints


def add_capture(parser: argparse.ArgumentParser, *, run: bool = False, help: str = "capture file") -> None:
    """The positional `file`; run: it may name a run's captures (capture/runs.py)."""
    parser.add_argument("file", help=_RUN_HELP if run else help)


def load_capture(path: str, **options: Any) -> Any:  # -> Capture
    """The capture at path (reader.load's options: at_mark, through_step, ...)."""
    from ..capture.reader import load

    return load(path, **options)


def add_json(parser: argparse.ArgumentParser, help: str = "print JSON instead of text") -> None:
    parser.add_argument("--json", action="store_true", help=help)


def add_top(parser: argparse.ArgumentParser, default: int, help: str) -> None:
    parser.add_argument("--top", type=int, default=default, metavar="N", help=f"{help} (default {default})")


def add_full_stacks(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--full-stacks", action="store_true",
                        help="show every frame of an out-of-memory request's Python stack (by default: your own "
                             "frames, innermost first, each run of a package's frames as one line such as "
                             "[+5 torch frames])")


def check_top(args: argparse.Namespace) -> None:
    if args.top < 1:
        raise InputError("--top must be at least 1")


# ---- what a command writes


def add_output(parser: argparse.ArgumentParser, help: str, *, what: str = "the output file") -> None:
    """-o PATH and -f (overwrite it)."""
    parser.add_argument("-o", "--output", metavar="PATH", help=help)
    parser.add_argument("-f", "--force", action="store_true", help=f"overwrite {what}")


def default_output(path: str, suffix: str) -> str:
    """The input's name with its extension replaced (step.alsc -> step.html)."""
    root, ext = os.path.splitext(path)
    return (root if ext else path) + suffix


def check_output(path: str, force: bool) -> None:
    """Refuses to overwrite an existing file unless forced (-f)."""
    if os.path.exists(path) and not force:
        raise InputError(f"{path} exists (use -f to overwrite)")


# ---- the commands that run a program (run, fit)


def add_values_arguments(parser: argparse.ArgumentParser, several_routings: bool = False) -> None:
    parser.add_argument("--compute", choices=["values", "all", "none"],
                        help="on the virtual GPU, which ops compute their values: those that steer shapes and "
                             "control flow (values, the default), every op on the host (all: slow, for small "
                             "models), none")
    parser.add_argument("--routing", metavar="ROUTING", **({"action": "append", "default": []} if several_routings
                                                            else {}),
                        help="on the virtual GPU, where an MoE router whose logits were not computed sends "
                             "tokens: balanced (the default), balanced:F (the busiest expert gets F times the "
                             "mean), worst (all to the same experts), computed (whatever the values are)" +
                             ("; repeat for several side by side" if several_routings else ""))


def values_from(args: argparse.Namespace) -> dict[str, str | None]:
    if (args.compute or args.routing) and not args.gpu:
        raise InputError("--compute and --routing are about the virtual GPU: give --gpu too")
    return {"compute": args.compute, "routing": args.routing}


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-time", type=float, metavar="SECONDS",
                        help="stop any process of the command that runs longer, saying where it was (its capture "
                             "is finished)")
    parser.add_argument("--max-events", type=int, metavar="N",
                        help="stop any process whose recording passes N events (a loop that never ends)")
    parser.add_argument("--max-host-memory", metavar="SIZE",
                        help="stop any process that holds more host memory (e.g. 16GiB: the virtual card's "
                             "written memory is host memory)")


def limits_from(args: argparse.Namespace) -> Any:  # -> Limits
    from ..common.units import parse_bytes
    from ..recording.limits import Limits

    if args.max_time is not None and not args.max_time > 0:
        raise InputError("--max-time is a number of seconds > 0")
    if args.max_events is not None and args.max_events < 1:
        raise InputError("--max-events is a number of events >= 1")
    try:
        memory = parse_bytes(args.max_host_memory) if args.max_host_memory is not None else None
    except ValueError as e:
        raise InputError(f"--max-host-memory: {e}") from None
    return Limits(args.max_time, args.max_events, memory)


def add_world_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world-size", type=int, metavar="N",
                        help="run ranks of a job of N processes, each alone on a virtual card (needs --gpu)")
    parser.add_argument("--rank", type=int, action="append", metavar="R",
                        help="a rank to run alone with --world-size (repeat for several, run one after the other; "
                             "default 0)")
    parser.add_argument("--ranks", metavar="LIST",
                        help="ranks of --world-size to run together, as processes that reach each other, the "
                             "others faked: 0,16,32,48 or 0:64:16 (a slice), 8-11, last")
    parser.add_argument("--gpus-per-node", type=int, default=8, metavar="G",
                        help="virtual cards per node with --world-size (LOCAL_RANK = rank %% G; default 8)")


def world_from(args: argparse.Namespace) -> Any:  # -> World | None
    from ..harness.world import parse_ranks, parse_world

    if args.world_size is None:
        if args.rank or args.ranks:
            raise InputError(f"{'--rank' if args.rank else '--ranks'} chooses ranks of --world-size: "
                             "give --world-size too")
        return None
    if args.ranks is not None:
        if args.rank:
            raise InputError("--rank runs ranks alone, --ranks together: give one of them")
        return parse_world(args.world_size, parse_ranks(args.ranks, args.world_size), args.gpus_per_node,
                           together=True)
    return parse_world(args.world_size, args.rank, args.gpus_per_node)
