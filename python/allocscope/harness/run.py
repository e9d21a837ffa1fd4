"""`allocscope run` as a Python call: a command run with recording on in
every Python process it starts that uses torch (recording/autostart.py), on
this machine's device or on a virtual GPU, or on a virtual GPU alone."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
import tempfile
import uuid
from typing import Collection, Iterator, Mapping, Sequence

from ..common.errors import InputError
from ..recording.limits import ENV_LIMITS, Limits
from .child import command_line, finished_outputs, outputs, wait_for, wait_for_all
from .world import World, check_initialized, rank_environment, report_file

__all__ = ["RunResult", "run_command"]


@dataclasses.dataclass(frozen=True)
class RunResult:
    status: int  # the command's exit status (128 + N for a signal N)
    captures: list[str]  # the captures written: the first process's, then .rankN / .pidN
    device: str | None  # the device recorded ("cuda", "cpu"), None when not recording


def run_command(command: Sequence[str], output: str | None, *, gpu: str | None = None, gpu_memory: str | None = None,
                device: str = "auto", stacks: str = "python", force: bool = False,
                world: World | None = None, ops: bool | None = None, watch: bool = True,
                values: Mapping[str, str | None] | None = None, limits: Limits | None = None) -> RunResult:
    """Runs `command` (a script runs with this Python) to its end, recording
    into `output` (None: not recorded, only on a virtual GPU), on a virtual
    GPU of model `gpu` (with `gpu_memory` instead of the preset's) or on
    this machine's `device` ("auto": CUDA where torch has it), with `ops`
    as record() takes it; `watch` (the default): each process watches its
    models and optimizers itself (Recording.auto_watch). The captures
    written are `output` for the first process, with .rankN or .pidN added
    for the others. InputError for bad input (no command, an unknown GPU,
    `output` in the way without force).

    world: run world.ranks as those ranks of a job of world.size processes
    (harness/world.py), each on its own virtual node of `gpu` cards, the
    other ranks faked: each alone, one after the other, or all together
    (world.together); a rank's capture is FILE with .rankN. The status is
    the first non-zero one.

    values: on the virtual GPU, {"compute": ..., "routing": ...} as
    vgpu.activate takes them (None: the defaults, or the environment's).
    limits: bounds each process of the command stops at (recording/limits.py)."""
    from .. import vgpu
    from ..recording.autostart import child_environment

    cmd = command_line(command, "allocscope run -o FILE -- python script.py")
    env = dict(os.environ)
    env[ENV_RUN_ID] = uuid.uuid4().hex
    if limits is not None and limits.any():
        env[ENV_LIMITS] = limits.to_environment()
    if world is not None:
        from .world import node_gpus

        if not gpu:
            raise InputError("--world-size runs ranks on virtual cards: give --gpu")
        gpu = node_gpus(gpu, world)
    if gpu:
        if device == "cpu":
            raise InputError("--gpu runs on a virtual CUDA device, which --device cpu would not record: leave it out")
        env = vgpu.environment(gpu, memory=gpu_memory, base=env, **(values or {}))
    elif output is None:
        raise InputError("a run without recording is a run on a virtual GPU: give --gpu")
    path = None
    recorded = None
    if output is not None:
        path = os.path.abspath(output)
        if outputs(path):
            if not force:
                raise InputError(f"{output} exists; use --force to overwrite it")
            for old in outputs(path):
                os.remove(old)
        recorded = "cuda" if gpu else _device(device)
        env = child_environment(env, path, {"device": recorded, "stacks": stacks, "ops": ops, "auto_watch": watch})
    if world is None:
        with shared_cards(env, gpu is not None) as env:
            status = wait_for(cmd, env)
            # (on the shared cards still: a process that outlives the first one may use them)
            captures = finished_outputs(path) if path else []
    else:
        status = run_ranks(cmd, env, world)
        captures = finished_outputs(path) if path else []
    return RunResult(status, captures, recorded)


# Names the run in every capture it writes (metadata "run_id"), so that the
# captures of two runs are never taken for the ranks of one.
ENV_RUN_ID = "ALLOCSCOPE_RUN_ID"


@contextlib.contextmanager
def shared_cards(env: dict[str, str], on_virtual_gpu: bool, *, cards: bool = True) -> Iterator[dict[str, str]]:
    """The processes of the run share their virtual cards (one device state
    per card: docs/vgpu.md, "Several processes") and their small
    broadcasts' bytes ("NCCL"), through files that live as long as the run.
    cards=False: only the broadcasts (ranks together, each on a node of its own)."""
    from ..vgpu import ENV_EXCHANGE, ENV_SHARED

    if not on_virtual_gpu:
        yield env
        return
    folder = tempfile.mkdtemp(prefix="allocscope-vgpu-")
    exchange = os.path.join(folder, "broadcasts")  # small broadcasts' bytes (csrc/vgpu/nccl.cpp)
    os.mkdir(exchange)
    try:
        yield {**env, **({ENV_SHARED: os.path.join(folder, "cards.state")} if cards else {}), ENV_EXCHANGE: exchange}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_ranks(cmd: list[str], env: dict[str, str], world: World,
              output_to_stderr: bool = False) -> int:
    """Runs the chosen ranks, each alone one after the other (a rank other
    than 0 with rank 0 beside it, world.with_rank0), or together; the first
    non-zero status (a rank that never initialized a process group:
    InputError)."""
    cards = f"a virtual node of {world.gpus_per_node} card{'s' if world.gpus_per_node > 1 else ''}"
    if world.together:
        print(f"allocscope run: ranks {', '.join(map(str, world.ranks))} of {world.size} together, each on "
              f"{cards}, the others faked", file=sys.stderr)
        statuses = [status for status, _ in run_together(cmd, env, world, output_to_stderr=output_to_stderr)]
        return next((s for s in statuses if s), 0)
    first = 0
    for rank in world.ranks:
        beside = world.with_rank0(rank)
        print(f"allocscope run: rank {rank} of {world.size}, on {cards}, the others faked"
              + (" (rank 0 beside it, unrecorded: the root of what the job broadcasts)" if beside else ""),
              file=sys.stderr)
        if beside is not None:
            ((status, _),) = run_together(cmd, env, beside, output_to_stderr=output_to_stderr, companions={0})
        else:
            report = report_file()
            status = wait_for(cmd, rank_environment(env, world, rank, report), output_to_stderr=output_to_stderr)
            check_initialized(report, status, rank)
        first = first or status
    return first


def run_together(cmd: list[str], env: dict[str, str], world: World, *, output_to_stderr: bool = False,
                 logs: Sequence[str | None] | None = None,
                 companions: Collection[int] = ()) -> list[tuple[int, str | None]]:
    """world.ranks started at once, reaching each other through one store
    (vgpu/distributed.py: the lowest serves it), the other ranks faked; per rank, in world.ranks' order,
    its exit status and its role (world.check_initialized). logs: each
    rank's output file (None: ours). companions: ranks that run only for
    the others to hear from (rank 0 beside a rank alone): not recorded (their
    capture goes to a scratch folder), their output discarded, not in the
    answer."""
    from ..recording.autostart import ENV_OUTPUT

    scratch = tempfile.mkdtemp(prefix="allocscope-beside-")
    logs = list(logs) if logs is not None else [None] * len(world.ranks)
    reports = [report_file() for _ in world.ranks]
    try:
        with shared_cards(env, True, cards=False) as env:
            children = []
            for rank, report, log in zip(world.ranks, reports, logs):
                child = rank_environment(env, world, rank, report)
                if rank in companions:
                    if ENV_OUTPUT in child:
                        child[ENV_OUTPUT] = os.path.join(scratch, "beside.alsc")
                    log = os.path.join(scratch, f"rank{rank}.log")
                children.append((cmd, child, log))
            statuses = wait_for_all(children, output_to_stderr=output_to_stderr)
        for (_, _, log), rank, status in zip(children, world.ranks, statuses):
            if rank in companions and status != 0:
                _say_companion_failed(rank, status, log, [r for r in world.ranks if r not in companions])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    ended = []
    for rank, report, status in zip(world.ranks, reports, statuses):
        if rank in companions:
            _discard(report)
        else:
            ended.append((status, check_initialized(report, status, rank)))
    return ended


def _say_companion_failed(rank: int, status: int, log: str, beside: list[int]) -> None:
    """A rank run only to be heard from failed: the ranks beside it lost their peer (their own verdict says
    what became of them); the end of its output, whose log goes with the scratch folder."""
    from .console import tail

    print(f"allocscope: rank {rank}, run beside rank {', '.join(map(str, beside))} to be heard from, failed "
          f"(exit status {status}); the last lines of its output:", file=sys.stderr)
    for line in tail(log):
        print(f"  | {line}", file=sys.stderr)


def _discard(report: str) -> None:
    if os.path.exists(report):
        os.remove(report)


def _device(choice: str) -> str:
    if choice != "auto":
        return choice
    try:
        import torch
    except ImportError:
        raise InputError("torch cannot be imported here; allocscope run needs it") from None
    return "cuda" if torch.cuda.is_available() else "cpu"
