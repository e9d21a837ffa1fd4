"""How the CUDA workload scripts end (tests/scripts/oom_workloads.py,
benchmarks/training_loops.py): the work runs once, recorded or not; an
out-of-memory error ends it; the last line printed says how it went, for the
process that started the script (it compares runs under other settings or
on other cards)."""

from __future__ import annotations

import contextlib
import json
from typing import Any, Callable

__all__ = ["measured_run"]


def measured_run(work: Callable[[Any], None], record: str | None) -> None:
    """Runs work(recorder, or None when not recording) on CUDA, recorded to
    `record` if given, then prints {"oom": it ran out of memory,
    "max_reserved": torch's peak reserved bytes} as JSON."""
    import torch

    import allocscope

    ran_out = False
    with allocscope.record(record, device="cuda") if record else contextlib.nullcontext() as rec:
        try:
            work(rec)
        except torch.cuda.OutOfMemoryError:
            ran_out = True
        torch.cuda.synchronize()
    print(json.dumps({"oom": ran_out, "max_reserved": torch.cuda.max_memory_reserved()}))
