"""How the allocscope command's own process takes memory.

Its analyses (report, html, fit's post-mortem) make and drop arrays of tens
of millions of rows, each one used in one pass. By default numpy asks the
kernel for transparent huge pages on every large array, and glibc maps each
array of more than 32 MiB afresh and unmaps it when freed: every array is
new memory the kernel zeroes, 2 MiB at a time. On a 10-million-event
capture that was 1.1-2.1 s of a report's system time, against 2.1-2.4 s of user time
(docs/benchmarks.md). Without huge pages, and with freed arrays kept in the
heap for the next one, it is about 0.5 s, for about 70 MiB more peak memory.

Only for a process that is allocscope's command (python -m allocscope):
a user's process (the notebook magic, the pytest marker, the library's API)
keeps its own settings.
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["reuse_freed_memory"]

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# the largest values mallopt takes (an int): arrays up to 1 GiB come from the
# heap, and up to 2 GiB of freed memory stays there for the next array
_MMAP_THRESHOLD = 1 << 30
_TRIM_THRESHOLD = (1 << 31) - 1


def reuse_freed_memory() -> None:
    """Large arrays without huge pages, and freed memory kept for reuse, in
    this process. Where either setting is not there (another numpy, another
    C library), that one is left as it was."""
    try:
        import numpy

        core = getattr(numpy, "_core", None) or numpy.core
        core.multiarray._set_madvise_hugepage(False)
    except (ImportError, AttributeError):
        pass
    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process runs on
    except (OSError, AttributeError):
        return
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
    mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
