"""Writing capture files from Python (the native recorder writes them from
C++, csrc/recorder/writer.cpp; both follow docs/format.md): for imports (interop/),
for tests of the reader and of every analysis on event streams whose right
answers are known, and for large synthetic captures (tests/support/).

    b = CaptureWriter()
    s = b.stack([("train.py", "step", 12)])
    b.alloc(0x1000, 4096, stack=s)
    b.free(0x1000)
    b.write("synthetic.alsc")
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import numpy as np

from . import format as F
from .codec import encode_event_columns, encode_events

__all__ = ["CaptureWriter"]


class CaptureWriter:
    """Accumulates tables and events, then encodes a complete capture."""

    def __init__(self, metadata: dict[str, Any] | None = None, *, device: int = -1):
        self.metadata = {"synthetic": True, "devices_recorded": ["cpu" if device < 0 else "cuda"]}
        self.metadata.update(metadata or {})
        self.strings: list[str] = []
        self._string_ids: dict[str, int] = {}
        self.frames: list[tuple[int, int, int]] = []
        self._frame_ids: dict[tuple[int, int, int], int] = {}
        self.nodes: list[tuple[int, int]] = [(0, 0)]  # node 0: the empty stack
        self._node_ids: dict[tuple[int, int], int] = {}  # the root is not a (parent, frame) key
        self.threads: list[tuple[int, str]] = [(0, "<other threads>")]
        self.streams: list[tuple[int, int]] = [(-2, 0), (-1, 0)]
        self.events: list[tuple[int, ...]] = []  # appended one by one, after the bulk blocks
        self._blocks: list[dict[str, np.ndarray]] = []  # from extend()
        self._bulk_events = 0
        self.baselines: list[dict] = []
        self.time_ns = 1_000_000
        self.default_stream = F.CPU_STREAM if device < 0 else self.stream(device, 0)

    # ---- tables

    def set_strings(self, strings: list[str]) -> None:
        """Sets the string table as it is (ids kept: events that refer to
        strings by id need no rewriting)."""
        self.strings = list(strings)
        self._string_ids = {}
        for j, text in enumerate(self.strings):
            self._string_ids.setdefault(text, j)

    def string(self, s: str) -> int:
        if s not in self._string_ids:
            self._string_ids[s] = len(self.strings)
            self.strings.append(s)
        return self._string_ids[s]

    def frame(self, filename: str, function: str, line: int) -> int:
        key = (self.string(filename), self.string(function), line)
        if key not in self._frame_ids:
            self._frame_ids[key] = len(self.frames)
            self.frames.append(key)
        return self._frame_ids[key]

    def stack(self, frames: Sequence[tuple[str, str, int]]) -> int:
        """Node id of a stack given innermost frame first."""
        node = 0
        for filename, function, line in reversed(frames):
            key = (node, self.frame(filename, function, line))
            if key not in self._node_ids:
                self._node_ids[key] = len(self.nodes)
                self.nodes.append(key)
            node = self._node_ids[key]
        return node

    def thread(self, tid: int, name: str = "") -> int:
        self.threads.append((tid, name))
        return len(self.threads) - 1

    def stream(self, device: int, handle: int) -> int:
        if (device, handle) not in self.streams:
            self.streams.append((device, handle))
        return self.streams.index((device, handle))

    # ---- events

    def event(self, kind: int, *, addr: int = 0, size: int = 0, block: int = 0, stack: int = 0,
              arg: int = 0, thread: int = 0, stream: int | None = None, dt: int = 1000, op: int = 0) -> int:
        """Appends an event dt ns after the previous one; returns its sequence
        number. op: a stack node (see stack()) whose frames are ops."""
        self.time_ns += dt
        stream = self.default_stream if stream is None else stream
        self.events.append((kind, self.time_ns, thread, stream, addr, size, block, stack, arg, op))
        return self._bulk_events + len(self.events) - 1

    def extend(self, **columns: Any) -> None:
        """Appends many events at once, as numpy columns named as in
        _format.COLUMNS (`time` absolute ns; missing columns are 0, `stream`
        defaults to the builder's stream)."""
        n = len(columns["kind"])
        if self.events:  # keep the order: what event() appended comes first
            rows = np.array(self.events, dtype=object)
            self._blocks.append({c: rows[:, i].astype(np.uint64 if c == "addr" else np.int64)
                                 for i, c in enumerate(F.COLUMNS)})
            self._bulk_events += len(self.events)
            self.events = []
        block = {}
        for c in F.COLUMNS:
            default = self.default_stream if c == "stream" else 0
            block[c] = np.asarray(columns.get(c, np.full(n, default)))
        self._blocks.append(block)
        self._bulk_events += n
        if n:
            self.time_ns = max(self.time_ns, int(block["time"][-1]))

    @property
    def n_events(self) -> int:
        return self._bulk_events + len(self.events)

    def alloc(self, addr: int, size: int, **kw: Any) -> int:
        return self.event(F.EventKind.ALLOC, addr=addr, size=size, **kw)

    def free(self, addr: int, size: int = 0, **kw: Any) -> int:
        return self.event(F.EventKind.FREE, addr=addr, size=size, **kw)

    def mark(self, label: str, **kw: Any) -> int:
        return self.event(F.EventKind.MARK, arg=self.string(label), stream=F.NO_STREAM, **kw)

    def annotate(self, kind: int, label: str, addr: int = 0, size: int = 0, **kw: Any) -> int:
        """An annotation (kinds 17-63: module scopes, phases, tensor labels)."""
        return self.event(kind, arg=self.string(label), addr=addr, size=size, stream=F.NO_STREAM, **kw)

    def baseline(self, baseline: dict) -> None:
        self.baselines.append(baseline)

    # ---- output

    def to_bytes(self, *, footer: bool = True, events_per_chunk: int = 65536,
                 version: int = F.FORMAT_VERSION) -> bytes:
        """version: an older format version to write (tests of the reader's
        compatibility); what that version cannot hold (ops) is left out."""
        out = bytearray(F.file_header(version))
        out += F.chunk(F.Chunk.METADATA, json.dumps(self.metadata).encode())
        out += F.chunk(F.Chunk.STRINGS, F.varint(0) + F.varint(len(self.strings)) + b"".join(
            F.varint(len(b)) + b for b in (s.encode() for s in self.strings)))
        out += F.chunk(F.Chunk.FRAMES, F.varint(0) + F.varint(len(self.frames)) + b"".join(
            F.varint(a) + F.varint(b) + F.varint(F.zigzag(c)) for a, b, c in self.frames))
        out += F.chunk(F.Chunk.STACKS, F.varint(0) + F.varint(len(self.nodes)) + b"".join(
            F.varint(p) + F.varint(f) for p, f in self.nodes))
        out += F.chunk(F.Chunk.THREADS, F.varint(0) + F.varint(len(self.threads)) + b"".join(
            F.varint(t) + F.varint(len(n.encode())) + n.encode() for t, n in self.threads))
        out += F.chunk(F.Chunk.STREAMS, F.varint(0) + F.varint(len(self.streams)) + b"".join(
            F.varint(F.zigzag(d)) + F.varint(h) for d, h in self.streams))
        # Baselines taken after the first event (the end state) follow the
        # events, where the recorder writes them.
        after = [isinstance(b.get("seq"), int) and b["seq"] > 0 for b in self.baselines]
        for b in (b for b, late in zip(self.baselines, after) if not late):
            out += F.chunk(F.Chunk.BASELINE, json.dumps(b).encode())
        if not self._blocks:
            for start in range(0, len(self.events), events_per_chunk):
                out += F.chunk(F.Chunk.EVENTS, encode_events(self.events[start:start + events_per_chunk], start,
                                                               version))
        else:
            self.extend(kind=np.zeros(0, np.uint8))  # flush the events appended one by one
            cols = {c: np.concatenate([b[c] for b in self._blocks]) for c in F.COLUMNS}
            for start in range(0, self._bulk_events, events_per_chunk):
                part = {c: v[start:start + events_per_chunk] for c, v in cols.items()}
                out += F.chunk(F.Chunk.EVENTS, encode_event_columns(part, start, version))
        for b in (b for b, late in zip(self.baselines, after) if late):
            out += F.chunk(F.Chunk.BASELINE, json.dumps(b).encode())
        if footer:
            out += F.chunk(F.Chunk.FOOTER, json.dumps(
                {"events": self.n_events, "dropped": 0, "reason": "stopped"}).encode())
        return bytes(out)

    def write(self, path: str | os.PathLike[str], **kw: Any) -> str:
        with open(path, "wb") as f:
            f.write(self.to_bytes(**kw))
        return os.fspath(path)
