"""What a capture records about the process that made it."""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any

from ..capture import format as F

__all__ = ["ENV_FIT", "collect"]

# Set by `allocscope fit` for the runs it makes: {"gpu", "command", "search", "value"}.
ENV_FIT = "ALLOCSCOPE_FIT"


def _distributed() -> dict[str, Any]:
    info: dict[str, Any] = {}
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            info = {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "backend": str(dist.get_backend())}
    except Exception:  # a broken process group must not stop a recording
        pass
    if os.environ.get("ALLOCSCOPE_RUN_ID"):  # harness/run.py: the run these captures belong to
        info["run_id"] = os.environ["ALLOCSCOPE_RUN_ID"]
    if os.environ.get("ALLOCSCOPE_SIMULATED_WORLD") == "1":  # ranks of the job, the others faked (harness/world.py)
        running = sorted(int(r) for r in os.environ.get("ALLOCSCOPE_REAL_RANKS", "").split(",") if r.strip())
        info["ranks_run"] = running
        info["alone"] = len(running) <= 1
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        if key.lower() not in info and key in os.environ:
            try:
                info[key.lower()] = int(os.environ[key])
            except ValueError:
                pass
    return info


def collect(devices: list[str], stacks: str, ops: bool | None = True) -> dict[str, Any]:
    import torch

    from .._version import __version__
    from ..allocator.config import settings_items

    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF")
    meta: dict[str, Any] = {
        "allocscope_version": __version__,
        "format_version": F.FORMAT_VERSION,
        "start_unix_ns": time.time_ns(),
        "start_monotonic_ns": time.monotonic_ns(),  # CLOCK_MONOTONIC, the events' clock
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "argv": list(sys.argv),
        "executable": sys.executable,
        "cwd": os.getcwd(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "devices_recorded": devices,
        "stacks": stacks,
        # True: from the start; "watch": from the first watch() on (record(ops=None)); False: never
        "ops": "watch" if ops is None else ops,
        "alloc_conf": {"raw": conf, "parsed": settings_items(conf)},
        "no_cuda_memory_caching": os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") not in (None, "", "0"),
        "distributed": _distributed(),
    }
    if "cuda" in devices:
        cuda_devices = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            cuda_devices.append({"index": i, "name": p.name, "total_memory": int(p.total_memory),
                                 "capability": f"{p.major}.{p.minor}",
                                 "multi_processor_count": int(p.multi_processor_count)})
        meta["cuda_devices"] = cuda_devices
        meta["current_device"] = torch.cuda.current_device()
        meta["allocator_backend"] = torch.cuda.get_allocator_backend()
        meta.update(_virtual_gpu())
    meta.update(_fit())
    return meta


def _fit() -> dict[str, Any]:
    """Which `allocscope fit` run this is, if any (the HTML report opens with its verdict)."""
    import json

    try:
        fit = json.loads(os.environ.get(ENV_FIT) or "null")
    except ValueError:
        return {}
    return {"fit": fit} if isinstance(fit, dict) else {}


def _virtual_gpu() -> dict[str, Any]:
    """Which virtual devices the capture was made on (none: a real GPU)."""
    from .. import vgpu
    from ..vgpu import cudnn

    if not vgpu.active():
        return {}
    state = vgpu.state()
    models = {p.key: p.total_memory for p in vgpu.presets()}  # (a device given its own memory differs)
    return {"virtual_gpu": {
        "spec": os.environ.get(vgpu.ENV_GPU),
        "event_polls": state["event_polls"],
        "devices": [{**{k: d[k] for k in ("key", "total", "context_bytes")}, "model_total": models.get(d["key"])}
                    for d in state["devices"]],
        # cuDNN's stand-in and the rows per card of the tables it answered from
        "cudnn": {"stand_in": cudnn.stand_in(), "tables": cudnn.table_path(), "table_rows": cudnn.table_rows()},
        # what it computed, and where an MoE router's uncomputed logits sent tokens (docs/vgpu.md, "Values")
        "values": _values(),
    }}


def _values() -> dict[str, str]:
    from ..vgpu.values import installed_values, settings_from_environment

    try:
        settings = installed_values().settings if installed_values() is not None else settings_from_environment()
    except ValueError:
        return {}
    return {"compute": settings.mode, "routing": str(settings.routing)}
