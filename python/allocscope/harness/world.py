"""Ranks of a large job, the others faked (`allocscope run/fit --world-size`).

Each chosen rank runs as one process on a virtual node of `gpus_per_node`
cards of the model, with the environment torchrun gives a worker (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
MASTER_PORT), so that the script runs unmodified. The ranks not chosen do
not run: the rendezvous gives each chosen rank a store where every rank not
running already made the same calls, and the virtual NCCL needs no peer
(vgpu/distributed.py). `--rank` runs the chosen ranks alone, one after the
other; `--ranks` runs them together, as processes that reach each other
through one store (objects sent between them, the pipeline stages' shapes
among them, arrive as sent). Afterwards each process says whether the
script initialized a process group (a script that never does would just
have run as one process) and its role in the job (its coordinates in the
job's DeviceMesh, its pipeline stages).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Mapping, Sequence

from ..common.errors import InputError

__all__ = ["ENV_WORLD_REPORT", "World", "check_initialized", "parse_ranks", "parse_world", "rank_environment"]

# Where a rank run alone writes {"initialized": bool} at exit.
ENV_WORLD_REPORT = "ALLOCSCOPE_WORLD_REPORT"
MAX_WORLD_SIZE = 1 << 20


# How many ranks --ranks runs together at most (each is a process of its own).
MAX_TOGETHER = 64


@dataclasses.dataclass(frozen=True)
class World:
    size: int
    ranks: tuple[int, ...]
    gpus_per_node: int
    together: bool = False  # the ranks run at once, reaching each other; else each alone, one after the other

    def local_rank(self, rank: int) -> int:
        return rank % self.gpus_per_node

    def with_rank0(self, rank: int) -> "World | None":
        """How a rank other than 0 runs "alone": with rank 0 beside it, the
        root of what jobs broadcast (DeepSpeed's checks that ranks agree,
        a configuration, a seed), unrecorded; None for rank 0 (or a world
        of one), which runs by itself."""
        if rank == 0 or self.size == 1:
            return None
        return World(self.size, (0, rank), self.gpus_per_node, together=True)


def parse_world(size: int, ranks: Sequence[int] | None = None, gpus_per_node: int = 8,
                together: bool = False) -> World:
    """A checked World; InputError (one line) for a size below 1, a rank
    outside [0, size), a node of no cards, or more ranks together than
    MAX_TOGETHER."""
    if not 1 <= size <= MAX_WORLD_SIZE:
        raise InputError(f"--world-size must be between 1 and {MAX_WORLD_SIZE}, not {size}")
    if not 1 <= gpus_per_node <= 16:
        raise InputError(f"--gpus-per-node must be between 1 and 16, not {gpus_per_node}")
    chosen = tuple(dict.fromkeys(ranks)) if ranks else (0,)
    outside = [r for r in chosen if not 0 <= r < size]
    if outside:
        raise InputError(f"rank {outside[0]} is outside a world of {size} (ranks 0 to {size - 1})")
    if together and len(chosen) > MAX_TOGETHER:
        raise InputError(f"--ranks runs at most {MAX_TOGETHER} ranks together (each is a process), not "
                         f"{len(chosen)}: choose the ranks that differ")
    return World(size, tuple(sorted(chosen)) if together else chosen, min(gpus_per_node, size), together)


def parse_ranks(text: str, size: int) -> list[int]:
    """--ranks' list: ranks and ranges, comma-separated: "0,7", "0:64:16"
    (start:stop:step, as Python slices them: 0, 16, 32, 48), "8-11" (both
    ends included); "last" is rank size - 1. InputError (one line) for
    anything else."""
    ranks: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        try:
            if part == "last":
                ranks.append(size - 1)
            elif ":" in part:
                fields = [int(f) if f else None for f in part.split(":")]
                if len(fields) > 3 or fields[-1] == 0:
                    raise ValueError
                ranks.extend(range(size)[slice(*fields)])
            elif "-" in part[1:]:
                low, high = (int(f) for f in part.split("-", 1))
                ranks.extend(range(low, high + 1))
            else:
                ranks.append(int(part))
        except ValueError:
            raise InputError(f"--ranks: {part!r} is not a rank, a range (8-11) or a slice (0:64:16); "
                             "e.g. --ranks 0,16,32,48 or --ranks 0:64:16,last") from None
    if not ranks:
        raise InputError(f"--ranks {text!r} names no rank of a world of {size}")
    return ranks


def node_gpus(gpu: str, world: World) -> str:
    """The virtual cards of the rank's node: gpus_per_node of one model."""
    from .. import vgpu

    presets = vgpu.parse_gpus(gpu)
    if len(presets) != 1:
        raise InputError(f"--world-size runs each rank on one card of a model: give one model, not {gpu!r} "
                         "(--gpus-per-node sets the cards of a node)")
    return f"{world.gpus_per_node}x{vgpu.device_spec(presets)}"


def rank_environment(base: Mapping[str, str], world: World, rank: int, report_path: str) -> dict[str, str]:
    """The environment torchrun would give the worker of `rank`, plus what
    makes the ranks not chosen fake (and which ranks run)."""
    from ..vgpu.distributed import ENV_REAL_RANKS, ENV_WORLD

    env = dict(base)
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(world.size),
        "LOCAL_RANK": str(world.local_rank(rank)), "LOCAL_WORLD_SIZE": str(world.gpus_per_node),
        "GROUP_RANK": str(rank // world.gpus_per_node), "NODE_RANK": str(rank // world.gpus_per_node),
        "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world.size),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
        ENV_WORLD: "1", ENV_WORLD_REPORT: report_path,
        ENV_REAL_RANKS: ",".join(map(str, world.ranks if world.together else (rank,))),
    })
    return env


def report_file() -> str:
    fd, path = tempfile.mkstemp(prefix="allocscope-world-", suffix=".json")
    os.close(fd)
    os.remove(path)  # the rank writes it at exit
    return path


def check_initialized(report_path: str, status: int, rank: int) -> str | None:
    """The rank's role in the job as it said at exit (None: none known);
    InputError when a rank that ran to its end never initialized a process
    group: --world-size then simulated nothing."""
    try:
        with open(report_path) as f:
            said = json.load(f)
    except (OSError, ValueError):
        return None  # the process died before its exit handlers: its status says so
    finally:
        if os.path.exists(report_path):
            os.remove(report_path)
    if not said.get("initialized") and status == 0:
        raise InputError(f"rank {rank} never initialized a process group: --world-size runs a script that calls "
                         "torch.distributed.init_process_group (as under torchrun)")
    role = said.get("role")
    return role if isinstance(role, str) and role else None
