"""`allocscope fit` as a Python call: a command run on several virtual cards,
one recorded run per card (or per value of a searched parameter), and the
fit document (reports/fit.py; docs/report.md, "fit"):

    import allocscope
    doc = allocscope.fit(["python", "train.py"], ["A100-40GB", "L4-24GB"])
    doc["fits_everywhere"], [c["verdict"] for c in doc["cards"]]

fit() returns what `allocscope fit --json` prints; the command line renders
the same document as text (reports.fit.render_fit / render_search)."""

from __future__ import annotations

import glob
import json
import math
import os
import time
from typing import Any, Sequence

from .. import vgpu
from ..allocator.recorded import recorded_reserved
from ..capture.format import EventKind
from ..capture.reader import load
from ..common.errors import InputError
from ..recording.autostart import child_environment
from ..recording.limits import ENV_LIMITS, Limits
from ..recording.metadata import ENV_FIT
from ..reports.fit import FIT_DOCUMENT, fit_document, foreseen_result, run_result, search_document
from ..reports.scaling import memory_model
from ..reports.serving import read_log
from ..reports.what_fits import PLACEHOLDER
from .child import command_line, finished_outputs, outputs, wait_for
from .console import RunConsole, log_path
from .run import run_together, shared_cards
from .search import parse_search, search_largest
from .world import World, check_initialized, node_gpus, rank_environment, report_file

__all__ = ["fit"]


def fit(command: Sequence[str], gpus: Sequence[str], *, output_dir: str = "allocscope-fit", force: bool = False,
        stacks: str = "python", top: int = 5, search: str | tuple[str, int, int] | None = None,
        stdout_to_stderr: bool = False, world: World | None = None,
        gpu_memory: int | str | None = None, compute: str | None = None,
        routings: Sequence[str] = (), limits: Limits | None = None, verbose: bool = False) -> dict[str, Any]:
    """Runs `command` (a script runs with this Python) on a virtual GPU of each
    model in `gpus` (`allocscope run --gpu list`), recording it into
    output_dir (one capture per card, kept), and returns the fit document:
    per card the verdict (fits, out of memory, failed, no capture), the
    peaks, the headroom, what filled memory at the peak and the post-mortem
    of an OOM; `top` rows in each breakdown.

    search: "NAME=LOW..HIGH" (or (NAME, LOW, HIGH)): find on each card the
    largest value of NAME that fits, the value reaching the command through
    {NAME} in its arguments and the environment variable NAME. Without a
    search, a {NAME} in the command takes the value of the environment
    variable NAME where it is set: the command a search would take, run at
    one value (an OOM's post-mortem then gives that search's command line).

    gpu_memory: every card's memory instead of its model's ("20GiB": what is
    left on a shared card, say; a number is bytes); a search then runs every
    value on every card (no card has more memory than another to foresee from).

    compute, routings: what the virtual GPU computes and where an MoE
    router whose logits were not computed sends tokens (vgpu.activate); with
    several routings each card runs once per routing, side by side (an
    entry's "routing" names it).

    limits: bounds each run's processes stop at (recording/limits.py); a
    run stopped there is a failed one (exit status LIMIT_STATUS).

    force: overwrite the captures of an earlier fit in output_dir.
    verbose: the command's output shows as it runs (stdout_to_stderr: its
    standard output on standard error, so that the command line's --json
    keeps its own output parseable); otherwise it goes to a log beside each
    capture (CARD.log), and standard error gets one line per run, with the
    end of the log of a run that failed for a reason other than memory.

    world: world.ranks run as those ranks of a job of world.size processes
    (harness/world.py) on each card, each alone or all together
    (world.together), the other ranks faked; the document has one entry per
    card and rank (with the rank's role where the script made a DeviceMesh
    or pipeline stages), and per card the job's verdict (its worst rank's:
    docs/report.md, "fit").

    InputError (one line) for bad input: no command, an unknown GPU, top < 1,
    captures in the way without force, a search whose run fails for a reason
    other than memory."""
    if top < 1:
        raise InputError("top must be at least 1")
    cmd = command_line(command, "allocscope fit --gpu A100-40GB -- python train.py")
    if search is not None:  # one check for the text and the tuple
        search = parse_search(search if isinstance(search, str) else "{}={}..{}".format(*search))
    given = _given_values(cmd, search)
    gpus = list(dict.fromkeys(gpus))
    if not gpus:
        raise InputError("no GPU given: --gpu A100-40GB (`allocscope run --gpu list`)")
    if world is not None and search is not None:
        raise InputError("--search with --world-size is not supported yet: search with the ranks of a smaller job")
    routings = list(dict.fromkeys(routings))
    if len(routings) > 1 and (search is not None or world is not None):
        raise InputError("several routings side by side are for a plain fit: give one --routing with --search "
                         "or --world-size")
    if search is not None:  # bisection's runs plus one per card, at most (harness/search.py)
        expected = len(gpus) * (math.ceil(math.log2(search[2] - search[1] + 2)) + 1)
    else:
        expected = len(gpus) * max(1, len(routings)) * (len(world.ranks) if world is not None else 1)
    console = RunConsole(expected, verbose=verbose, logs=os.path.abspath(output_dir))
    runs = _Runs(cmd, os.path.abspath(output_dir), stacks, top, search, stdout_to_stderr, world, gpu_memory,
                 {"compute": compute, "routing": routings[0] if len(routings) == 1 else None}, limits, console,
                 given)
    runs.prepare(gpus, force, routings)
    try:
        if search is not None:
            doc = _search(runs, cmd, gpus, search)
        elif world is None and len(routings) > 1:
            doc = fit_document(cmd, [runs.run(gpu, routing=r) for gpu in gpus for r in routings])
        elif world is None:
            doc = fit_document(cmd, [runs.run(gpu) for gpu in gpus])
        elif world.together:
            doc = fit_document(cmd, [card for gpu in gpus for card in runs.run_together(gpu)], world=world.size)
        else:
            doc = fit_document(cmd, [runs.run_rank(gpu, r) for gpu in gpus for r in world.ranks], world=world.size)
    finally:
        console.close()
    _keep(doc, runs.directory)
    return doc


def _given_values(cmd: list[str], search: tuple[str, int, int] | None) -> dict[str, str]:
    """{NAME: value} for each {NAME} of the command that no search sets and
    whose environment variable NAME is set (`BATCH=64 allocscope fit ... --
    python train.py --batch {BATCH}`: the same command a search takes). A
    {NAME} without its variable stays as it is: an argument of the
    command's own, such as a file name's pattern."""
    names = dict.fromkeys(PLACEHOLDER.findall(" ".join(cmd)))
    return {n: os.environ[n] for n in names if n in os.environ and (search is None or n != search[0])}


def _keep(doc: dict[str, Any], directory: str) -> None:
    """The document beside the captures (FIT_DOCUMENT): the HTML page of a
    search's capture plots its card's memory against the value from it."""
    with open(os.path.join(directory, FIT_DOCUMENT), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)


def _search(runs: "_Runs", cmd: list[str], gpus: list[str], search: tuple[str, int, int]) -> dict[str, Any]:
    name, low, high = search
    # Larger cards first: replays of their runs then narrow a smaller card's search (same chip).
    found: dict[str, dict[str, Any]] = {}
    for gpu in sorted(gpus, key=lambda g: -_memory(g)):
        found[gpu] = {"gpu": gpu, **search_largest(low, high, lambda v, gpu=gpu: runs.run(gpu, v),
                                                    runs.replayed(gpu, list(found)))}
        # memory against the value, from the runs made (replays measured no parts)
        found[gpu]["memory"] = memory_model(name, [(v, runs.ran[(gpu, v)]) for v in found[gpu]["tried"]], low, high)
    return search_document(cmd, name, low, high, [found[gpu] for gpu in gpus])


class _Runs:
    """Runs the command on one virtual card (at one value of the searched
    parameter) and makes its card_result; captures in `directory`."""

    def __init__(self, cmd: list[str], directory: str, stacks: str, top: int, search: tuple[str, int, int] | None,
                 stdout_to_stderr: bool, world: World | None = None, gpu_memory: int | str | None = None,
                 values: dict[str, str | None] | None = None, limits: Limits | None = None,
                 console: RunConsole | None = None, given: dict[str, str] | None = None):
        self.cmd, self.directory, self.stacks, self.top, self.search = cmd, directory, stacks, top, search
        self.given = given or {}  # {NAME} set from the environment (_given_values)
        self.stdout_to_stderr, self.world, self.gpu_memory = stdout_to_stderr, world, gpu_memory
        self.values = values or {}
        self.limits = limits
        self.console = console or RunConsole(1)
        self.ran: dict[tuple[str, int], dict[str, Any]] = {}  # (gpu, value) -> card result, for predictions

    def path(self, gpu: str, value: int | None = None, routing: str | None = None) -> str:
        suffix = "" if value is None else f".{self.search[0]}={value}"
        if routing is not None:
            suffix += f".routing={routing}"
        return os.path.join(self.directory, f"{_stem(gpu)}{suffix}.alsc")

    def existing(self, gpu: str, routing: str | None = None) -> list[str]:
        """The captures this fit would overwrite (a search's: every value's)."""
        if not self.search:
            return outputs(self.path(gpu, routing=routing))
        pattern = f"{glob.escape(_stem(gpu))}.{self.search[0]}=*.alsc"
        return sorted(glob.glob(os.path.join(glob.escape(self.directory), pattern)))

    def prepare(self, gpus: list[str], force: bool, routings: list[str]) -> None:
        """Every card, setting and output checked before the first run."""
        for gpu in gpus:
            for routing in routings or [None]:
                vgpu.environment(gpu, memory=self.gpu_memory, compute=self.values.get("compute"), routing=routing)
            if self.world is not None:
                node_gpus(gpu, self.world)
        os.makedirs(self.directory, exist_ok=True)
        side_by_side = routings if len(routings) > 1 else [None]
        existing = [p for gpu in gpus for r in side_by_side for p in self.existing(gpu, r)]
        if existing and not force:
            raise InputError(f"{os.path.relpath(existing[0])} exists; use --force to overwrite it")
        for path in existing:
            os.remove(path)

    def _command(self, gpu: str, path: str, value: int | None,
                 routing: str | None) -> tuple[list[str], dict[str, str], str]:
        """The command, its environment and where it runs (for the console)."""
        values = self.values if routing is None else {**self.values, "routing": routing}
        cmd, env = self.cmd, vgpu.environment(gpu if self.world is None else node_gpus(gpu, self.world),
                                              memory=self.gpu_memory, **values)
        for name, given in self.given.items():
            cmd = [a.replace("{" + name + "}", given) for a in cmd]
        if value is not None:
            name = self.search[0]
            cmd = [a.replace("{" + name + "}", str(value)) for a in cmd]
            env[name] = str(value)
        if self.limits is not None and self.limits.any():
            env[ENV_LIMITS] = self.limits.to_environment()
        # (the template and the values given: what an OOM's post-mortem proposes to search with)
        env[ENV_FIT] = json.dumps({"gpu": gpu, "command": cmd, "search": self.search[0] if self.search else None,
                                   "value": value, "template": self.cmd, "placeholders": self.given})
        where = f"a virtual {gpu}" + ("" if value is None else f" with {self.search[0]}={value}") + \
            ("" if routing is None else f", {routing} routing")
        env = child_environment(env, path, {"device": "cuda", "stacks": self.stacks, "auto_watch": True})
        return cmd, env, where

    def _result(self, gpu: str, path: str, status: int, written: list[str], started: float, log: str | None,
                value: int | None = None, rank: int | None = None, routing: str | None = None,
                role: str | None = None) -> dict[str, Any]:
        """The run's card result from its captures (a rank's: its own), its console line."""
        if rank is not None and self.world.size > 1:
            stem, ext = os.path.splitext(path)
            written = [p for p in written if p == f"{stem}.rank{rank}{ext}"]
        cap = _card_process([load(p, salvage=True) for p in written]) if written else None
        card = run_result(gpu, status, cap, capture_path=os.path.relpath(cap.path) if cap is not None else None,
                          top=self.top, value=value, routing=routing, rank=rank, role=role, log=read_log(log))
        label = " ".join([gpu, *([] if rank is None else [f"rank {rank}"]),
                          *([] if value is None else [f"{self.search[0]}={value}"]),
                          *([] if routing is None else [f"routing={routing}"])])
        self.console.end(label, card, time.monotonic() - started, log)
        if value is not None:
            self.ran[(gpu, value)] = card
        return card

    def run(self, gpu: str, value: int | None = None, rank: int | None = None,
            routing: str | None = None) -> dict[str, Any]:
        path = self.path(gpu, value, routing)
        cmd, env, where = self._command(gpu, path, value, routing)
        report = None
        if rank is not None:
            where = f"rank {rank} of {self.world.size} on " + where
            report = report_file()
            env = rank_environment(env, self.world, rank, report)
        self.console.begin(where)
        log = None if self.console.verbose else log_path(path)
        started = time.monotonic()
        # A command of several processes (torchrun) shares the cards, as under allocscope run.
        with shared_cards(env, rank is None) as env:
            status = wait_for(cmd, env, output_to_stderr=self.stdout_to_stderr, log=log)
            written = finished_outputs(path)
        role = check_initialized(report, status, rank) if report is not None else None
        return self._result(gpu, path, status, written, started, log, value, rank, routing, role)

    def run_together(self, gpu: str, world: World | None = None,
                     companions: frozenset[int] = frozenset()) -> list[dict[str, Any]]:
        """The chosen ranks (of `world`, else the fit's) at once on virtual
        nodes of `gpu` cards (harness/run.run_together); a card result per
        rank but the companions, with its role."""
        world = world or self.world
        path = self.path(gpu)
        cmd, env, where = self._command(gpu, path, None, None)
        ranks = [r for r in world.ranks if r not in companions]
        beside = " (rank 0 beside it, unrecorded)" if companions else ""
        self.console.begin(f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} of {world.size}"
                           f"{' together' if len(ranks) > 1 else ''} on {where}{beside}")
        stem, ext = os.path.splitext(path)
        logs = [None if self.console.verbose or rank in companions else log_path(f"{stem}.rank{rank}{ext}")
                for rank in world.ranks]
        started = time.monotonic()
        ended = run_together(cmd, env, world, output_to_stderr=self.stdout_to_stderr, logs=logs,
                             companions=companions)
        written = finished_outputs(path)
        logs = [log for rank, log in zip(world.ranks, logs) if rank not in companions]
        return [self._result(gpu, path, status, written, started, log, rank=rank, role=role)
                for rank, (status, role), log in zip(ranks, ended, logs)]

    def run_rank(self, gpu: str, rank: int) -> dict[str, Any]:
        """One rank of the fit's world, "alone": by itself (rank 0), or with
        rank 0 beside it (World.with_rank0)."""
        beside = self.world.with_rank0(rank)
        return self.run(gpu, rank=rank) if beside is None else self.run_together(gpu, beside, frozenset({0}))[0]

    def replayed(self, gpu: str, searched: list[str]) -> dict[int, dict[str, Any]]:
        """For a search: this card's results foreseen from the runs made on
        larger cards of the same chip, searched already (reports.fit.foreseen_result)."""
        mine = _single_preset(gpu)
        if mine is None or self.gpu_memory is not None:  # (every card has the memory given)
            return {}
        larger = sorted((p.total_memory, g) for g in searched
                        if (p := _single_preset(g)) is not None and _same_chip(p, mine)
                        and p.total_memory > mine.total_memory)
        known: dict[int, dict[str, Any]] = {}
        for _, other in reversed(larger):  # the closest in memory last: its replays win
            for (g, value), card in self.ran.items():
                foreseeable = card["verdict"] == "out of memory" or card["verdict"] == "fits" and card.get("capture")
                if g == other and foreseeable:
                    known[value] = foreseen_result(value, card, mine.total_memory)
        if known:
            self.console.note(f"{len(known)} values on a virtual {gpu} foreseen from runs on "
                              f"{', '.join(g for _, g in larger)}")
        return known


def _card_process(caps: list[Any]) -> Any:
    """The capture a card's verdict is read from, where the command ran
    several processes on it (an engine process beside its parent, spawned
    workers): one that ran out of memory, else the one that reserved the
    most (a parent that only initialized CUDA reserved nothing)."""
    if len(caps) == 1:
        return caps[0]

    def weight(cap: Any) -> tuple[bool, int]:
        return bool((cap.events.kind == EventKind.OOM).any()), int(recorded_reserved(cap).max())

    return max(caps, key=weight)  # (ties: the first, the command's first process)


def _stem(gpu: str) -> str:
    """A card's captures' file name: its spec, with a colon (a memory of
    its own, "H100-80GB:20GiB") made a dash."""
    return gpu.replace(":", "-")


def _memory(gpu: str) -> int:
    return sum(p.total_memory for p in vgpu.parse_gpus(gpu))


def _single_preset(gpu: str) -> Any:
    presets = vgpu.parse_gpus(gpu)
    return presets[0] if len(presets) == 1 else None


def _same_chip(a: Any, b: Any) -> bool:
    """Whether torch sees the same device but for its memory (and name):
    the same program then asks for the same memory, in the same order."""
    return (a.major, a.minor, a.multi_processor_count, a.l2_cache_size) == (b.major, b.minor, b.multi_processor_count,
                                                                           b.l2_cache_size)
