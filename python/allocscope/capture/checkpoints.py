"""Reading a capture from a checkpoint (docs/format.md, CHECKPOINT).

A CHECKPOINT chunk holds what the events before its point left behind that
a report of later events needs: the allocations live there (with the labels,
phase and module scope they were made in), the watches, the scopes open on
each thread, and the allocator's state (a baseline). A reader that wants
only steps after the point reads those, then the events from the point on,
and skips the events before it undecoded.

find() lists a file's checkpoints from the chunk headers (their JSON
headers decoded, nothing else); choose() picks the one a read of steps
first..last starts from, before_mark() the one a read of a mark starts
from; retained() decodes its events.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from . import format as F
from .codec import decode_column, unzigzag
from .format import FormatError

__all__ = ["Checkpoint", "baseline", "before_mark", "choose", "find", "first_mark", "holds_forward_before",
           "recording_start", "retained"]


@dataclasses.dataclass
class Checkpoint:
    """One CHECKPOINT chunk: where it is, its header, and where the events
    after its point start (the EVENTS chunk whose first event is `seq`)."""

    offset: int  # of the chunk's header
    length: int  # of its payload
    header: dict[str, Any]  # seq, events, iteration, marks, time_ns, live; baseline
    tail_offset: int  # of the EVENTS chunk the events after the point start with

    @property
    def seq(self) -> int:
        return int(self.header["seq"])

    @property
    def iteration(self) -> int:
        return int(self.header.get("iteration", -1))


def _header(payload: memoryview) -> tuple[dict[str, Any], int]:
    """The JSON header of a CHECKPOINT payload, and where the events start."""
    n, pos = F.read_varint(payload, 0)
    if pos + n > len(payload):
        raise FormatError("checkpoint header runs past the end of its chunk")
    header = F.parse_json_object(payload[pos:pos + n], "checkpoint header")
    for key in ("seq", "events", "iteration"):
        if not isinstance(header.get(key), int):
            raise FormatError(f"checkpoint header has no integer {key!r}")
    if not isinstance(header.get("baseline"), dict):
        raise FormatError("checkpoint header has no baseline object")
    return header, pos + n


def _scan(data: memoryview) -> list[tuple[int, int, dict[str, Any] | None, int | None]]:
    """Every CHECKPOINT chunk in file order: (offset, length, header or None
    where the chunk is damaged, offset of the events chunk its point starts
    or None where that is not in the file)."""
    first_seq_at: dict[int, int] = {}  # first sequence number of an EVENTS chunk -> its offset
    found: list[tuple[int, int, int]] = []
    for kind, at, length, crc in F.chunk_headers(data, F.HEADER.size):
        start = at + F.CHUNK_HEADER.size
        if kind == F.Chunk.EVENTS:
            try:
                pos = F.read_varint(data[start:start + length], 0)[1]
                first_seq_at.setdefault(F.read_varint(data[start:start + length], pos)[0], at)
            except FormatError:
                break
        elif kind == F.Chunk.CHECKPOINT:
            found.append((at, length, crc))
    out: list[tuple[int, int, dict[str, Any] | None, int | None]] = []
    for at, length, crc in found:
        payload = data[at + F.CHUNK_HEADER.size:at + F.CHUNK_HEADER.size + length]
        header = None
        if F.chunk_crc(F.Chunk.CHECKPOINT, length, payload) == crc:
            try:
                header, _ = _header(payload)
            except FormatError:
                pass
        out.append((at, length, header, None if header is None else first_seq_at.get(int(header["seq"]))))
    return out


def find(data: memoryview) -> list[Checkpoint]:
    """The file's checkpoints, in file order, each with the events chunk its
    point starts; a damaged one, or one whose events chunk is not in the
    file (cut short), is left out: reading from the start still works."""
    return [Checkpoint(at, length, header, tail) for at, length, header, tail in _scan(data)
            if header is not None and tail is not None]


def before_mark(data: memoryview, label: str) -> list[Checkpoint]:
    """The checkpoints a read of the first MARK labelled `label` can start
    from, in file order: those whose point is known to precede that mark.
    Each checkpoint lists the marks since the one before it, so the mark
    follows every checkpoint before the first that lists it. A damaged
    checkpoint's list is unknown: none after it is chosen. Not those taken
    after private pools were used (see choose())."""
    out = []
    for at, length, header, tail in _scan(data):
        marks = header.get("marks") if header is not None else None
        if not isinstance(marks, list) or label in marks:
            break
        if tail is not None and not header.get("private_pools"):
            out.append(Checkpoint(at, length, header, tail))
    return out


def first_mark(capture: Any, label: str) -> int | None:
    """Index of the first MARK event labelled `label` a capture holds, or None."""
    marks = np.flatnonzero(capture.events.kind == F.EventKind.MARK).tolist()
    return next((i for i in marks if capture.label(i) == label), None)


def holds_forward_before(capture: Any, mark: int) -> bool:
    """Whether a capture read from a checkpoint holds the start of the last
    forward phase begun before event `mark` (the forward the estimate at the
    mark is of: estimate.theory), or, with none begun before it, was read
    from where no phase had been (iteration -1)."""
    phases = np.flatnonzero(capture.events.kind[:mark] == F.EventKind.PHASE).tolist()
    forwards = [i for i in phases if capture.label(i) == "forward"]
    if forwards:
        return forwards[-1] >= capture.prefix_events
    return capture.resumed is None or int(capture.resumed["iteration"]) < 0


def choose(checkpoints: list[Checkpoint], first_step: int) -> Checkpoint | None:
    """The last checkpoint taken before iteration first_step began (the
    iteration it saw last is earlier), or None. Not one taken after private
    memory pools were used (CUDA graphs, MemPool): which pool serves which
    allocation is not in a checkpoint, so the replay would go astray; such
    reads start at the beginning."""
    best = None
    for c in checkpoints:
        if c.header.get("private_pools"):
            continue
        if c.iteration < first_step and (best is None or c.seq > best.seq):
            best = c
    return best


def retained(data: memoryview, c: Checkpoint) -> tuple[memoryview, np.ndarray]:
    """The checkpoint's events (an EVENTS payload, to decode as one) and their
    sequence numbers."""
    payload = data[c.offset + F.CHUNK_HEADER.size:c.offset + F.CHUNK_HEADER.size + c.length]
    _, pos = _header(payload)
    n, pos = F.read_varint(payload, pos)
    if pos + n > len(payload):
        raise FormatError("checkpoint events run past the end of its chunk")
    block = payload[pos:pos + n]
    count, _ = F.read_varint(block, 0)
    if count > n:
        raise FormatError("checkpoint event count is inconsistent with its size")
    deltas, end = decode_column(payload, pos + n, count)
    if end != len(payload):
        raise FormatError("bytes left at the end of a checkpoint")
    seq = np.cumsum(unzigzag(deltas.astype(np.uint64)).astype(np.int64)).astype(np.uint64)
    return block, seq


def recording_start(payload: memoryview, crc: int) -> dict[str, Any] | None:
    """The file's first BASELINE chunk (its payload and checksum), which a
    read from a checkpoint skips with the events before it, when it is the
    start of recording's and intact: the checkpoint's baseline replaces it
    for everything but its device readings (docs/format.md, CHECKPOINT)."""
    if F.chunk_crc(F.Chunk.BASELINE, len(payload), payload) != crc:
        return None
    try:
        base = F.parse_json_object(payload, "baseline")
    except FormatError:
        return None
    return base if base.get("label") == "start" else None


def baseline(c: Checkpoint) -> dict[str, Any]:
    """Its baseline, labelled as the start of what a read from it holds."""
    base = dict(c.header["baseline"])
    base["checkpoint"] = base.get("label")
    base["label"] = "start"
    return base
