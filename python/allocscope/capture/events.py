"""A loaded capture's events and table entries (reader.py makes them)."""

from __future__ import annotations

import dataclasses

import numpy as np

from . import format as F

__all__ = ["Events", "Frame", "StreamInfo", "ThreadInfo"]


@dataclasses.dataclass(frozen=True)
class Frame:
    filename: str
    function: str
    line: int

    def __str__(self) -> str:
        return f"{self.function} ({self.filename}:{self.line})"


@dataclasses.dataclass(frozen=True)
class ThreadInfo:
    native_id: int
    name: str


@dataclasses.dataclass(frozen=True)
class StreamInfo:
    device: int  # -1: CPU, -2: none
    handle: int  # cudaStream_t value (0: the default stream)


_EVENT_FIELDS = {
    "seq": np.uint64,
    "time_ns": np.int64,
    "kind": np.uint8,
    "via_allocator": np.bool_,
    "thread": np.uint16,
    "stream": np.uint16,
    "device": np.int16,
    "addr": np.uint64,
    "size": np.uint64,
    "block": np.uint64,
    "stack": np.uint32,
    "arg": np.uint64,
    "op": np.uint32,
}


class Events:
    """Events as parallel numpy arrays, in sequence order.

    kind: EventKind value (the via-allocator bit is split out into
    via_allocator); device: derived from the stream (-1 CPU, -2 none);
    arg: per kind (ALLOC: ns spent in the wrapped allocator; OOM: device
    free bytes; MARK and annotations: string id of the label); op: the stack
    node of the op chain behind an ALLOC or OOM (Capture.stack gives its
    frames: `<aten>` ops and `<autograd>` nodes, innermost first; 0: none or
    not recorded, as in format 1 files).
    """

    __slots__ = tuple(_EVENT_FIELDS)

    seq: np.ndarray
    time_ns: np.ndarray
    kind: np.ndarray
    via_allocator: np.ndarray
    thread: np.ndarray
    stream: np.ndarray
    device: np.ndarray
    addr: np.ndarray
    size: np.ndarray
    block: np.ndarray
    stack: np.ndarray
    arg: np.ndarray
    op: np.ndarray

    def __init__(self, **columns: np.ndarray):
        for name, dtype in _EVENT_FIELDS.items():
            setattr(self, name, np.asarray(columns.get(name, np.zeros(0, dtype)), dtype))

    def __len__(self) -> int:
        return len(self.seq)

    def select(self, index: np.ndarray) -> "Events":
        return Events(**{name: getattr(self, name)[index] for name in _EVENT_FIELDS})

    def replace(self, **columns: np.ndarray) -> "Events":
        """The same events with the given columns in place of their own (a what-if)."""
        return Events(**{name: columns.get(name, getattr(self, name)) for name in _EVENT_FIELDS})

    def in_sequence_order(self) -> bool:
        """Whether sequence numbers never decrease from one event to the next
        (files the recorder writes; a hand-made one may differ)."""
        return bool(len(self.seq) < 2 or (self.seq[1:] >= self.seq[:-1]).all())

    def counts(self) -> dict[str, int]:
        kinds, counts = np.unique(self.kind, return_counts=True)
        return {F.kind_name(int(k)): int(c) for k, c in zip(kinds, counts, strict=True)}
