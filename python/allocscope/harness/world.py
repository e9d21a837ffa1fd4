"""One rank of a large job, run alone (`allocscope run/fit --world-size`).

Each chosen rank runs as one process on a virtual node of `gpus_per_node`
cards of the model, with the environment torchrun gives a worker (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
MASTER_PORT), so that the script runs unmodified. Its process group has no
peers: the rendezvous gives it a store where every other rank already made
the same calls, and the virtual NCCL needs no peer (vgpu/distributed.py).
Afterwards the process says whether the script initialized a process group
(a script that never does would just have run as one process).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Mapping, Sequence

from ..common.errors import InputError

__all__ = ["ENV_WORLD_REPORT", "World", "check_initialized", "parse_world", "rank_environment"]

# Where a rank run alone writes {"initialized": bool} at exit.
ENV_WORLD_REPORT = "ALLOCSCOPE_WORLD_REPORT"
MAX_WORLD_SIZE = 1 << 20


@dataclasses.dataclass(frozen=True)
class World:
    size: int
    ranks: tuple[int, ...]
    gpus_per_node: int

    def local_rank(self, rank: int) -> int:
        return rank % self.gpus_per_node


def parse_world(size: int, ranks: Sequence[int] | None = None, gpus_per_node: int = 8) -> World:
    """A checked World; InputError (one line) for a size below 1, a rank
    outside [0, size), or a node of no cards."""
    if not 1 <= size <= MAX_WORLD_SIZE:
        raise InputError(f"--world-size must be between 1 and {MAX_WORLD_SIZE}, not {size}")
    if not 1 <= gpus_per_node <= 16:
        raise InputError(f"--gpus-per-node must be between 1 and 16, not {gpus_per_node}")
    chosen = tuple(dict.fromkeys(ranks)) if ranks else (0,)
    outside = [r for r in chosen if not 0 <= r < size]
    if outside:
        raise InputError(f"rank {outside[0]} is outside a world of {size} (ranks 0 to {size - 1})")
    return World(size, chosen, min(gpus_per_node, size))


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
    makes it a rank run alone."""
    from ..vgpu.distributed import ENV_WORLD

    env = dict(base)
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(world.size),
        "LOCAL_RANK": str(world.local_rank(rank)), "LOCAL_WORLD_SIZE": str(world.gpus_per_node),
        "GROUP_RANK": str(rank // world.gpus_per_node), "NODE_RANK": str(rank // world.gpus_per_node),
        "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world.size),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
        ENV_WORLD: "1", ENV_WORLD_REPORT: report_path,
    })
    return env


def report_file() -> str:
    fd, path = tempfile.mkstemp(prefix="allocscope-world-", suffix=".json")
    os.close(fd)
    os.remove(path)  # the rank writes it at exit
    return path


def check_initialized(report_path: str, status: int, rank: int) -> None:
    """InputError when a rank that ran to its end never initialized a process
    group: --world-size then simulated nothing."""
    try:
        with open(report_path) as f:
            initialized = bool(json.load(f).get("initialized"))
    except (OSError, ValueError):
        return  # the process died before its exit handlers: its status says so
    finally:
        if os.path.exists(report_path):
            os.remove(report_path)
    if not initialized and status == 0:
        raise InputError(f"rank {rank} never initialized a process group: --world-size runs a script that calls "
                         "torch.distributed.init_process_group (as under torchrun)")
