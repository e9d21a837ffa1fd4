"""allocscope fit: will a command fit on these GPUs? One recorded run per
virtual card, and a verdict with the peaks for each."""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
from typing import Any

from ._child import command_of, outputs, wait_for

NAME = "fit"
HELP = "run a command on virtual GPUs of several models: does it fit on each, and with how much room"
DESCRIPTION = """\
Run a command once per --gpu on a virtual GPU of that model (torch's real CUDA
caching allocator on a stand-in card: memory behaves as on the card, kernels
compute nothing; docs/vgpu.md), recording it, and say for each card whether
it fits: the peaks of allocated and reserved memory, the headroom (the card's
memory less the reserved peak and what the CUDA context and libraries use),
what filled memory at the peak (categories and modules: the script's models
and optimizers are watched for it; source lines always) and, where it ran
out, the post-mortem. A command that fails for another reason is reported as
such, not as out of memory. The captures are kept in --output-dir (one per
card), for `allocscope report`, `html` and `simulate`.

With --search NAME=LOW..HIGH, finds on each card the largest value of an
integer parameter (batch size, sequence length, layers, ...) at which the
command fits, taking a value that fits to fit below it too: each run is made
where the memory measured so far (the headroom of a run that fit, the
shortfall of one that ran out) puts the boundary, or at the middle of what is
left, so at most about 2 log2(HIGH - LOW) runs and often 3 or 4. A card
searched after a larger one of the same chip (A100-40GB after A100-80GB)
starts from replays of that card's runs with its own memory
(`allocscope simulate --limit`), and runs only what they leave open. The
value reaches the command through {NAME} in its arguments and the
environment variable NAME. It reports the largest
value with its peak and headroom, and the next value with its peak and
shortfall. A run that fails for another reason stops the search.

Exit status: 0 when the command fits on every card (with --search: some
value fits on every card), 1 otherwise. --json prints the document instead
(schema: docs/report.md, "fit"), with the command's own output sent to
standard error.

examples:
  allocscope fit --gpu A100-40GB --gpu L4-24GB -- python train.py --steps 2
  allocscope fit --gpu T4-16GB --json -- train.py --batch-size 64
  allocscope fit --gpu A100-40GB --search BATCH=1..1024 -- python train.py --batch-size {BATCH}
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
    parser.add_argument("--search", metavar="NAME=LOW..HIGH", type=_search_range,
                        help="find the largest value of NAME in LOW..HIGH that fits ({NAME} in the command, "
                             "and the environment variable NAME)")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                        help="the command to run, after --")


def _search_range(text: str) -> tuple[str, int, int]:
    name, sep, span = text.partition("=")
    low, dots, high = span.partition("..")
    if not sep or not dots or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=LOW..HIGH (e.g. BATCH=1..1024)")
    try:
        a, b = int(low), int(high)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: LOW and HIGH must be integers") from None
    if a > b:
        raise argparse.ArgumentTypeError(f"{text!r}: LOW must not be above HIGH")
    return name, a, b


class _Runs:
    """Runs the command on one virtual card (at one value of the searched
    parameter) and makes its card_result; captures in `directory`."""

    def __init__(self, args: argparse.Namespace, cmd: list[str]):
        self.cmd, self.stacks, self.top = cmd, args.stacks, args.top
        self.search = args.search
        self.quiet_stdout = args.json  # the command's output must not mix with the JSON
        self.directory = os.path.abspath(args.output_dir)
        self.ran: dict[tuple[str, int], dict[str, Any]] = {}  # (gpu, value) -> card result, for predictions

    def path(self, gpu: str, value: int | None = None) -> str:
        suffix = "" if value is None else f".{self.search[0]}={value}"
        return os.path.join(self.directory, f"{gpu}{suffix}.alsc")

    def existing(self, gpu: str) -> list[str]:
        """The captures this fit would overwrite (a search's: every value's)."""
        if not self.search:
            return outputs(self.path(gpu))
        return sorted(glob.glob(os.path.join(glob.escape(self.directory), f"{glob.escape(gpu)}.{self.search[0]}=*.alsc")))

    def run(self, gpu: str, value: int | None = None) -> dict[str, Any]:
        from .. import _autostart, load, vgpu
        from .._metadata import ENV_FIT
        from ..reports.fit import card_result

        path = self.path(gpu, value)
        cmd, env = self.cmd, vgpu.environment(gpu)
        if value is not None:
            name = self.search[0]
            cmd = [a.replace("{" + name + "}", str(value)) for a in cmd]
            env[name] = str(value)
        env[ENV_FIT] = json.dumps({"gpu": gpu, "command": cmd, "search": self.search[0] if self.search else None,
                                   "value": value})
        where = f"a virtual {gpu}" + ("" if value is None else f" with {self.search[0]}={value}")
        print(f"allocscope fit: running on {where}", file=sys.stderr)
        status = wait_for(cmd, _autostart.child_environment(env, path, {"device": "cuda", "stacks": self.stacks,
                                                                       "auto_watch": True}),
                          output_to_stderr=self.quiet_stdout)
        written = outputs(path)
        cap = load(written[0], salvage=True) if written else None
        card = card_result(gpu, status, cap, capture_path=os.path.relpath(written[0]) if written else None,
                           top=self.top)
        if value is None:
            return card
        self.ran[(gpu, value)] = card
        return {"value": value, **card}

    def replayed(self, gpu: str, searched: list[str]) -> dict[int, dict[str, Any]]:
        """For --search: this card's results foreseen from the runs made on
        larger cards of the same chip (searched already): a value that ran
        out of memory there runs out here; one that fit is replayed with
        this card's memory (the same requests in the same order: torch sees
        the same device but for its memory)."""
        from .. import load
        from ..allocator.config import recorded_config
        from ..allocator.replay import replay
        from ..reports.allocator import shortfall

        mine = _single_preset(gpu)
        if mine is None:
            return {}
        larger = sorted((p.total_memory, g) for g in searched
                        if (p := _single_preset(g)) is not None and _same_chip(p, mine)
                        and p.total_memory > mine.total_memory)
        known: dict[int, dict[str, Any]] = {}
        for _, other in reversed(larger):  # the closest in memory last: its replays win
            for (g, value), card in self.ran.items():
                if g != other:
                    continue
                if card["verdict"] == "out of memory":  # less memory runs out too
                    known[value] = {"value": value, "verdict": "out of memory", "replayed_from": card["capture"]}
                elif card["verdict"] == "fits" and card.get("capture"):
                    cap = load(card["capture"])
                    rep = replay(cap, recorded_config(cap.baseline("start"), cap.metadata), limit=mine.total_memory)
                    outside = card.get("outside_allocator_bytes") or 0
                    known[value] = {"value": value, "verdict": "out of memory" if rep.ooms else "fits",
                                    "peak_reserved_bytes": rep.peak_reserved, "replayed_from": card["capture"],
                                    "headroom_bytes": None if rep.ooms else
                                    mine.total_memory - rep.peak_reserved - outside,
                                    "shortfall_bytes": shortfall(rep.ooms[0], rep.config) if rep.ooms else None}
        if known:
            print(f"allocscope fit: {len(known)} values on a virtual {gpu} foreseen from runs on "
                  f"{', '.join(g for _, g in larger)}", file=sys.stderr)
        return known


def _memory(gpu: str) -> int:
    from .. import vgpu

    return sum(p.total_memory for p in vgpu.parse_gpus(gpu))


def _single_preset(gpu: str) -> Any:
    from .. import vgpu

    presets = vgpu.parse_gpus(gpu)
    return presets[0] if len(presets) == 1 else None


def _same_chip(a: Any, b: Any) -> bool:
    """Whether torch sees the same device but for its memory (and name):
    the same program then asks for the same memory, in the same order."""
    return (a.major, a.minor, a.multi_processor_count, a.l2_cache_size) == (b.major, b.minor, b.multi_processor_count,
                                                                           b.l2_cache_size)


def run(args: argparse.Namespace) -> int:
    from .. import vgpu
    from ..reports.fit import (SearchFailed, fit_document, render_fit, render_search, search_document,
                               search_largest)

    if args.top < 1:
        raise ValueError("--top must be at least 1")
    cmd = command_of(args, "allocscope fit --gpu A100-40GB -- python train.py")
    gpus = list(dict.fromkeys(args.gpu))
    for gpu in gpus:  # every card and output checked before the first run
        vgpu.environment(gpu)
    runs = _Runs(args, cmd)
    os.makedirs(runs.directory, exist_ok=True)
    existing = [p for gpu in gpus for p in runs.existing(gpu)]
    if existing and not args.force:
        raise ValueError(f"{os.path.relpath(existing[0])} exists; use --force to overwrite it")
    for path in existing:
        os.remove(path)
    if args.search:
        name, low, high = args.search
        # Larger cards first: replays of their runs then narrow a smaller card's search (same chip).
        found: dict[str, dict[str, Any]] = {}
        try:
            for gpu in sorted(gpus, key=lambda g: -_memory(g)):
                found[gpu] = {"gpu": gpu, **search_largest(low, high, lambda v, gpu=gpu: runs.run(gpu, v),
                                                            runs.replayed(gpu, list(found)))}
        except SearchFailed as e:
            raise ValueError(str(e)) from None
        doc = search_document(cmd, name, low, high, [found[gpu] for gpu in gpus])
        text = render_search(doc)
    else:
        doc = fit_document(cmd, [runs.run(gpu) for gpu in gpus])
        text = render_fit(doc, args.top)
    print(json.dumps(doc, indent=1) if args.json else text)
    return 0 if doc["fits_everywhere"] else 1
