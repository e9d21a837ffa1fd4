"""The captures of one run: a run of several processes writes FILE for its
first process and FILE with .rankN (or .pidN) for the others (`allocscope
run`, recording/autostart.py). `report`, `html` and `diff` take a run by the
name it was given, by any of its files, or by a glob."""

from __future__ import annotations

import glob
import os
import re
from typing import Any, Sequence

from ..common.errors import InputError

__all__ = ["check_one_run", "load_run", "process_of", "rank_of", "run_files", "run_name"]

_RANK = re.compile(r"\.rank(\d+)$")
# The other processes of a run (spawned workers, an engine process): FILE.pidN
_PROCESS = re.compile(r"\.(rank|pid)(\d+)$")


def run_files(name: str) -> list[str]:
    """The capture files `name` stands for, sorted by rank: a glob's
    matches; a run's name, its files (ddp.alsc -> ddp.alsc if it exists,
    ddp.rank0.alsc, ddp.rank1.alsc, ..., and its other processes'
    ddp.pidN.alsc); one rank's or process's file, that file. InputError
    when nothing matches."""
    if glob.has_magic(name):
        found = sorted(p for p in glob.glob(name) if os.path.isfile(p))
        if not found:
            raise InputError(f"no capture matches {name}")
        return _by_rank(found)
    stem, ext = os.path.splitext(name)
    if _PROCESS.search(stem) or os.path.isdir(name):  # one rank's (process's) file: that one alone
        found = [name] if os.path.exists(name) else []
    else:
        others = glob.glob(f"{glob.escape(stem)}.rank*{ext}") + glob.glob(f"{glob.escape(stem)}.pid*{ext}")
        found = ([name] if os.path.isfile(name) else []) + [p for p in others
                                                             if _PROCESS.search(os.path.splitext(p)[0])]
    if not found:
        if os.path.exists(name):
            return [name]  # not a regular file: the reader says what it is
        raise InputError(f"{name}: no such capture (nor {os.path.basename(stem)}.rankN{ext} of a run)")
    return _by_rank(found)


def rank_of(path: str, metadata: dict[str, Any] | None = None) -> int | None:
    """The rank a capture was recorded by: its metadata's, else its name's."""
    dist = (metadata or {}).get("distributed") or {}
    if isinstance(dist.get("rank"), int):
        return int(dist["rank"])
    m = _RANK.search(os.path.splitext(path)[0])
    return int(m.group(1)) if m else None


def process_of(path: str, metadata: dict[str, Any] | None = None) -> str:
    """What names a capture's process among the run's: "rank N", else
    "pid N" (its metadata's pid, else its name's), else its file's name."""
    rank = rank_of(path, metadata)
    if rank is not None:
        return f"rank {rank}"
    pid = (metadata or {}).get("pid")
    if not isinstance(pid, int):
        m = _PROCESS.search(os.path.splitext(path)[0])
        pid = int(m.group(2)) if m else None
    return f"pid {pid}" if pid is not None else os.path.basename(path)


def _by_rank(paths: Sequence[str]) -> list[str]:
    def key(p: str) -> tuple[int, str]:
        r = rank_of(p)
        return (-1 if r is None else r, p)

    return sorted(dict.fromkeys(paths), key=key)


def check_one_run(paths: Sequence[str], metadatas: Sequence[dict[str, Any]]) -> None:
    """InputError when the captures are not the processes of one run: two run
    ids (allocscope run names each run), two world sizes, or one rank twice."""
    runs = {}
    for path, meta in zip(paths, metadatas):
        run = ((meta or {}).get("distributed") or {}).get("run_id")
        if run is not None:
            runs.setdefault(run, path)
    if len(runs) > 1:
        a, b = list(runs.values())[:2]
        raise InputError(f"{a} and {b} are captures of two different runs: give the captures of one run")
    worlds = {((m or {}).get("distributed") or {}).get("world_size") for m in metadatas} - {None}
    if len(worlds) > 1:
        raise InputError(f"the captures come from jobs of {' and '.join(map(str, sorted(worlds)))} ranks: "
                         "give the captures of one run")
    seen: dict[int, str] = {}
    for path, meta in zip(paths, metadatas):
        r = rank_of(path, meta)
        if r is not None and r in seen and ((meta or {}).get("distributed") or {}).get("world_size", 1) != 1:
            raise InputError(f"{seen[r]} and {path} are both rank {r}: give the captures of one run")
        if r is not None:
            seen[r] = path


def load_run(paths: Sequence[str]) -> list[Any]:
    """The captures, checked to be one run's (check_one_run)."""
    from .reader import load

    caps = [load(p) for p in paths]
    check_one_run(paths, [c.metadata for c in caps])
    return caps


def run_name(paths: Sequence[str]) -> str:
    """The name a run's files were written under (ddp.rank0.alsc, ddp.pid7.alsc -> ddp.alsc)."""
    stem, ext = os.path.splitext(paths[0])
    m = _PROCESS.search(stem)
    return (stem[:m.start()] if m else stem) + ext
