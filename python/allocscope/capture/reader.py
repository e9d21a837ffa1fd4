"""Reading capture files: allocscope.load(path) -> Capture.

Events come back as columnar numpy arrays, with the string, frame, stack,
thread and stream tables, the baselines and the metadata. A file that ends
early (the recorded process crashed or was killed) loads up to its last whole
chunk, with a TruncatedCaptureWarning.
"""

from __future__ import annotations

import mmap
import os
import struct
import warnings
from typing import Any, Iterator

import numpy as np

from ..common.errors import InputError
from ..common.progress import Progress
from . import checkpoints as CK
from . import format as F
from .codec import unzigzag
from .decode import EventColumns
from .errors import (CaptureError, CorruptCaptureError, NotACaptureError, TruncatedCaptureWarning,
                     UnsupportedVersionError)
from .events import Events, Frame, StreamInfo, ThreadInfo
from .format import EventKind, FormatError

__all__ = [
    "Capture",
    "CaptureError",
    "CorruptCaptureError",
    "Events",
    "Frame",
    "NotACaptureError",
    "StreamInfo",
    "ThreadInfo",
    "TruncatedCaptureWarning",
    "UnsupportedVersionError",
    "load",
]


# Chunks a read from a checkpoint skips before its point: the events the
# checkpoint stands for, the baselines it replaces, other checkpoints.
_BEFORE_CHECKPOINT = (F.Chunk.EVENTS, F.Chunk.BASELINE, F.Chunk.CHECKPOINT)


class Capture:
    """A loaded capture. See allocscope.load."""

    def __init__(self, path: str):
        self.path = path
        self.version = F.FORMAT_VERSION
        self.metadata: dict[str, Any] = {}
        self.events = Events()
        self.strings: list[str] = []
        self.frame_file = np.zeros(0, np.uint32)  # string ids
        self.frame_function = np.zeros(0, np.uint32)
        self.frame_line = np.zeros(0, np.int32)
        self.stack_parent = np.zeros(0, np.uint32)  # node 0 is the empty stack
        self.stack_frame = np.zeros(0, np.uint32)
        self.threads: list[ThreadInfo] = []
        self.streams: list[StreamInfo] = []
        self.baselines: list[dict[str, Any]] = []
        self.footer: dict[str, Any] | None = None
        self.warnings: list[str] = []
        # A salvaging read stopped at a damaged chunk: what follows it in the
        # file (events, the footer of another writer) was not read.
        self.damaged = False
        self.chunk_bytes: dict[str, int] = {}  # file bytes by chunk type, headers included (of the chunks read)
        # load(through_step=...): set when the read stopped before the end of
        # the file (the step whose start ended it); events_in_file is then the
        # footer's count (None without a footer).
        self.read_until_step: int | None = None
        self.events_in_file: int | None = None
        # load(from_step=...) read from a checkpoint: its header (baseline
        # left out: it is baseline("start")), with "prefix": how many of the
        # events come from it (checkpoints.py). None: read from the start.
        self.resumed: dict[str, Any] | None = None
        # A read from a checkpoint: the baseline taken when recording started
        # (its device readings: memory outside the allocator grows after it
        # on a GPU), read though the events around it are not.
        self._recording_start: dict[str, Any] | None = None

    def recording_start(self) -> dict[str, Any] | None:
        """The baseline taken when recording started, also in a read from a
        checkpoint (whose baseline("start") is the checkpoint's; that one
        where the recording's was damaged)."""
        return self._recording_start or self.baseline("start")

    @property
    def partial(self) -> bool:
        """True when load(through_step=...) left the events after some step
        unread, or load(from_step=...) those before a checkpoint."""
        return self.read_until_step is not None or self.resumed is not None

    @property
    def prefix_events(self) -> int:
        """Events that a checkpoint put before the events read (0: none)."""
        return int(self.resumed["prefix"]) if self.resumed else 0

    @property
    def complete(self) -> bool:
        """True when recording stopped cleanly (the file has its footer)."""
        return self.footer is not None

    def frame(self, frame_id: int) -> Frame:
        return Frame(self.strings[self.frame_file[frame_id]], self.strings[self.frame_function[frame_id]],
                     int(self.frame_line[frame_id]))

    def stack(self, stack_id: int) -> list[Frame]:
        """The frames of a stack, innermost first."""
        frames = []
        node = int(stack_id)
        while node != 0:
            frames.append(self.frame(int(self.stack_frame[node])))
            node = int(self.stack_parent[node])
        return frames

    def label(self, event_index: int) -> str:
        """The label of a MARK or annotation event."""
        sid = int(self.events.arg[event_index])
        return self.strings[sid] if sid < len(self.strings) else "?"

    def baseline(self, label: str) -> dict[str, Any] | None:
        for b in self.baselines:
            if b.get("label") == label:
                return b
        return None

    @property
    def duration_ns(self) -> int:
        t = self.events.time_ns
        return int(t.max() - t.min()) if len(t) else 0

    def __repr__(self) -> str:
        state = "complete" if self.complete else "incomplete"
        return f"<Capture {self.path!r}: {len(self.events)} events, {len(self.stack_parent)} stacks, {state}>"


def load(path: str | os.PathLike[str], *, salvage: bool = False, progress: bool | None = None,
         through_step: int | None = None, from_step: int | None = None, at_mark: str | None = None,
         engine: str = "auto") -> Capture:
    """Reads a capture file.

    Raises NotACaptureError, UnsupportedVersionError or CorruptCaptureError
    (all CaptureError) when the file cannot be read. A file that ends early
    loads up to its last whole chunk with a TruncatedCaptureWarning. With
    salvage=True a damaged chunk ends the load the same way instead of raising.
    progress: show a progress bar on stderr (default: for large files on a TTY).
    through_step: read only what optimizer steps up to this one need (of a
    watched model; report --steps): events stop with the chunk where step
    through_step + 2 starts, so that step through_step + 1, in which the last
    step's tensors are freed, is read whole. The rest of the file is not
    decoded; its footer is still found (Capture.events_in_file, .complete).
    from_step: read only what optimizer steps from this one on need: from
    the last checkpoint before it (docs/format.md, CHECKPOINT), if the file
    has one (Capture.resumed says which); events before it are not decoded.
    at_mark: read what a report at the first MARK with this label needs
    (report --at): from a checkpoint before it, through its iteration + 1.
    engine: "auto" (the native decoder where allocscope._analysis is built),
    "native", or "numpy" (the reference decoder).
    """
    path = os.fspath(path)
    for name, step in (("through_step", through_step), ("from_step", from_step)):
        if step is not None and step < 0:
            raise InputError(f"{name} must be >= 0, not {step}")
    if at_mark is not None and (through_step is not None or from_step is not None):
        raise InputError("at_mark reads what one mark needs: not with through_step or from_step")
    partial = through_step is not None or from_step is not None or at_mark is not None
    try:
        with open(path, "rb") as f:
            data = _map(f) if partial else f.read()
    except IsADirectoryError:
        raise CaptureError(f"{path} is a directory, not a capture file") from None
    except OSError as e:
        raise CaptureError(f"cannot read {path}: {e.strerror or e}") from None
    capture = _read_at_mark(path, data, salvage, progress, engine, at_mark) if at_mark is not None else \
        _Decoder(path, data, salvage, progress, through_step, engine, from_step).run()
    for message in capture.warnings:
        warnings.warn(f"{path}: {message}", TruncatedCaptureWarning, stacklevel=2)
    return capture


def _read_at_mark(path: str, data: bytes | mmap.mmap, salvage: bool, progress: bool | None, engine: str,
                  label: str) -> Capture:
    """load(at_mark=label): from the last checkpoint before the mark that
    also precedes the forward the estimate at the mark is of (the last one
    begun before it: estimate.theory), else from an earlier one."""
    candidates = CK.before_mark(memoryview(data), label) if len(data) else []
    while True:
        start = candidates.pop() if candidates else None
        capture = _Decoder(path, data, salvage, progress, engine=engine, at_mark=label, resume=start).run()
        if start is None:
            return capture
        mark = CK.first_mark(capture, label)
        if mark is None:
            candidates = []  # no such mark: a read from the start, whose report names the marks there are
        elif CK.holds_forward_before(capture, mark):
            return capture


def _map(f: Any) -> bytes | mmap.mmap:
    """The file mapped, so that of the part a partial read skips only the
    chunk headers are read from disk (an empty file cannot be mapped)."""
    if os.fstat(f.fileno()).st_size == 0:
        return b""
    return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


class _Decoder:
    def __init__(self, path: str, data: bytes | mmap.mmap, salvage: bool, progress: bool | None,
                 through_step: int | None = None, engine: str = "auto", from_step: int | None = None,
                 at_mark: str | None = None, resume: CK.Checkpoint | None = None):
        self.path = path
        self.data = memoryview(data)
        self.salvage = salvage
        self.through_step = through_step
        self.resume = CK.choose(CK.find(self.data), from_step) if from_step is not None and len(data) else resume
        self.at_mark = at_mark  # until the mark is read; then through_step is its iteration
        self.iteration = -1  # the last PHASE's iteration read (while looking for the mark)
        self.engine = engine
        self.progress = Progress(f"loading {os.path.basename(path)}", len(data), enabled=progress)
        self.capture = Capture(path)
        self.events: EventColumns | None = None  # after the header
        self.last: dict[str, np.ndarray] = {}  # the columns of the last events chunk
        self.frame_rows: list[tuple[int, int, int]] = []
        self.node_rows: list[tuple[int, int]] = []
        self.seen_baseline = False  # (a read from a checkpoint: the first one before it)

    def run(self) -> Capture:
        self._header()
        # The columns are sized from the chunk headers first, a partial read's
        # too: rows it never reaches are pages never written, which cost no
        # memory, where growing the columns as it reads copied every row
        # about twice (1.7 s of a 9.3M-event read).
        # (a checkpoint's events: at most one per byte of it, as in any events block)
        expected = self._declared_events() + (self.resume.length if self.resume else 0)
        self.events = EventColumns(self.capture.version, expected, self.engine)
        try:
            for kind, payload, offset in self._chunks():
                try:
                    if self.resume is not None and offset == self.resume.tail_offset:
                        self._resume()
                    self._chunk(kind, payload)
                except (ValueError, struct.error, IndexError, OverflowError) as e:  # FormatError is a ValueError
                    self._damaged(f"chunk at byte {offset} is invalid: {e}")
                    break
                end = offset + F.CHUNK_HEADER.size + len(payload)
                self.progress.update(end)
                if kind == F.Chunk.EVENTS and self._read_enough():
                    self._find_footer(end)
                    break
        finally:
            self.progress.close()
        self._finish()
        return self.capture

    def _damaged(self, message: str) -> None:
        if not self.salvage:
            raise CorruptCaptureError(f"{self.path}: {message}")
        self.capture.damaged = True
        self.capture.warnings.append(f"{message}; loaded what precedes it")

    def _header(self) -> None:
        if len(self.data) == 0:
            raise NotACaptureError(f"{self.path} is empty, not an allocscope capture file")
        if len(self.data) < F.HEADER.size or bytes(self.data[:8]) != F.MAGIC:
            if bytes(self.data[:8]) == F.MAGIC[: min(8, len(self.data))] and len(self.data) < F.HEADER.size:
                raise CorruptCaptureError(f"{self.path}: the file ends inside its header")
            raise NotACaptureError(f"{self.path} is not an allocscope capture file")
        _, version, _flags = F.HEADER.unpack_from(self.data, 0)
        if version not in F.READABLE_VERSIONS:
            newer = "newer than" if version > F.FORMAT_VERSION else "older than"
            raise UnsupportedVersionError(
                f"{self.path} uses capture format version {version}, {newer} the versions this allocscope reads "
                f"({', '.join(map(str, F.READABLE_VERSIONS))})")
        self.capture.version = version

    def _chunks(self) -> Iterator[tuple[int, memoryview, int]]:
        pos = F.HEADER.size
        end = len(self.data)
        while pos < end:
            if pos + F.CHUNK_HEADER.size > end:
                self.capture.warnings.append(f"the file ends inside a chunk header at byte {pos}")
                return
            kind, zero1, zero2, length, crc = F.CHUNK_HEADER.unpack_from(self.data, pos)
            if zero1 or zero2 or length > F.MAX_CHUNK:
                self._damaged(f"chunk header at byte {pos} is invalid")
                return
            start = pos + F.CHUNK_HEADER.size
            if start + length > end:
                self.capture.warnings.append(
                    f"the file ends inside a chunk (byte {pos}, {length} bytes declared, {end - start} present)")
                return
            if self.resume is not None and pos < self.resume.tail_offset and kind in _BEFORE_CHECKPOINT:
                if kind == F.Chunk.BASELINE and not self.seen_baseline:
                    self.seen_baseline = True
                    self.capture._recording_start = CK.recording_start(self.data[start:start + length], crc)
                pos = start + length  # what the checkpoint stands for: neither read nor checked
                continue
            payload = self.data[start:start + length]
            if F.chunk_crc(kind, length, payload) != crc:
                if kind == F.Chunk.CHECKPOINT:  # it repeats what precedes it: nothing is lost
                    self.capture.warnings.append(f"the checkpoint at byte {pos} is damaged; skipped")
                    pos = start + length
                    continue
                self._damaged(f"checksum mismatch in the chunk at byte {pos}")
                return
            name = F.Chunk(kind).name.lower() if kind in F.Chunk._value2member_map_ else "unknown"
            self.capture.chunk_bytes[name] = self.capture.chunk_bytes.get(name, 0) + F.CHUNK_HEADER.size + length
            yield kind, payload, pos
            pos = start + length

    def _chunk(self, kind: int, payload: memoryview) -> None:
        c = self.capture
        if kind == F.Chunk.EVENTS:
            assert self.events is not None
            self.last = self.events.add(payload, self._check_references)
        elif kind == F.Chunk.STRINGS:
            count, pos = F.table_entries(payload, len(c.strings))
            for _ in range(count):
                text, pos = self._text(payload, pos, "string")
                try:
                    c.strings.append(text.decode("utf-8"))
                except UnicodeDecodeError as e:
                    raise FormatError(f"string is not UTF-8: {e}") from None
            self._end(payload, pos)
        elif kind == F.Chunk.FRAMES:
            count, pos = F.table_entries(payload, len(self.frame_rows))
            for _ in range(count):
                filename, pos = F.read_varint(payload, pos)
                function, pos = F.read_varint(payload, pos)
                line, pos = F.read_varint(payload, pos)
                if filename >= len(c.strings) or function >= len(c.strings):
                    raise FormatError("frame names a string not yet defined")
                self.frame_rows.append((filename, function, unzigzag(np.array([line], np.uint64))[0]))
            self._end(payload, pos)
        elif kind == F.Chunk.STACKS:
            count, pos = F.table_entries(payload, len(self.node_rows))
            for _ in range(count):
                parent, pos = F.read_varint(payload, pos)
                frame, pos = F.read_varint(payload, pos)
                n = len(self.node_rows)
                if n and (parent >= n or frame >= len(self.frame_rows)):
                    raise FormatError("stack node names an undefined parent or frame")
                self.node_rows.append((parent, frame))
            self._end(payload, pos)
        elif kind == F.Chunk.THREADS:
            count, pos = F.table_entries(payload, len(c.threads))
            for _ in range(count):
                tid, pos = F.read_varint(payload, pos)
                name, pos = self._text(payload, pos, "thread name")
                c.threads.append(ThreadInfo(tid, name.decode("utf-8", "replace")))
            self._end(payload, pos)
        elif kind == F.Chunk.STREAMS:
            count, pos = F.table_entries(payload, len(c.streams))
            for _ in range(count):
                device, pos = F.read_varint(payload, pos)
                handle, pos = F.read_varint(payload, pos)
                c.streams.append(StreamInfo(int(unzigzag(np.array([device], np.uint64))[0]), handle))
            self._end(payload, pos)
        elif kind == F.Chunk.METADATA:
            c.metadata = F.parse_json_object(payload, "metadata")
        elif kind == F.Chunk.BASELINE:
            c.baselines.append(F.parse_json_object(payload, "baseline"))
        elif kind == F.Chunk.FOOTER:
            footer = F.parse_json_object(payload, "footer")
            if not all(isinstance(footer.get(k, 0), int) for k in ("events", "dropped")):
                raise FormatError("footer counts are not integers")
            c.footer = footer
        # Unknown chunk types are skipped: a newer writer may add some without
        # breaking older readers (docs/format.md, "Compatibility").

    def _resume(self) -> None:
        """Before the first events after the checkpoint's point: its events
        and its baseline (docs/format.md, CHECKPOINT)."""
        assert self.resume is not None and self.events is not None
        block, seq = CK.retained(self.data, self.resume)
        self.events.add(block, self._check_references, seq=seq)
        self.capture.baselines.append(CK.baseline(self.resume))
        self.capture.resumed = {k: v for k, v in self.resume.header.items() if k != "baseline"}
        self.capture.resumed["prefix"] = len(seq)

    def _read_enough(self) -> bool:
        """Whether the last events block holds the start of step through_step + 2."""
        if self.at_mark is not None:
            self._look_for_mark()
        if self.through_step is None:
            return False
        kind, addr = self.last["kind"], self.last["addr"]
        phases = (kind & F.KIND_MASK) == EventKind.PHASE
        if not phases.any() or int(addr[phases].max()) <= self.through_step + 1:
            return False
        self.capture.read_until_step = int(addr[phases].max())
        return True

    def _look_for_mark(self) -> None:
        """If the last events block holds the mark load(at_mark=...) reads
        for, what follows is read as far as through_step = its iteration
        (the last PHASE's before it) would read."""
        kind, addr = self.last["kind"] & F.KIND_MASK, self.last["addr"]
        marks = np.flatnonzero(kind == EventKind.MARK).tolist()
        strings, arg = self.capture.strings, self.last["arg"]
        at = next((i for i in marks if int(arg[i]) < len(strings) and strings[int(arg[i])] == self.at_mark), None)
        phases = kind[:at] == EventKind.PHASE  # (at None: the whole block)
        if self.resume is not None and self.iteration < 0:
            self.iteration = self.resume.iteration
        self.iteration = max(self.iteration, int(addr[:at][phases].max()) if phases.any() else -1)
        if at is not None:
            self.at_mark, self.through_step = None, max(self.iteration, 0)

    def _find_footer(self, pos: int) -> None:
        """After a partial read: the baselines taken when recording stopped
        (the allocator's end state, device readings, read as a whole read
        would) and the footer (recording stopped cleanly, and how many
        events the file holds). What follows a damaged chunk stays unknown."""
        skipped = False
        for kind, at, length, crc in F.chunk_headers(self.data, pos):
            skipped |= kind == F.Chunk.EVENTS
            if kind not in (F.Chunk.FOOTER, F.Chunk.BASELINE):
                continue
            payload = self.data[at + F.CHUNK_HEADER.size:at + F.CHUNK_HEADER.size + length]
            try:
                if F.chunk_crc(kind, length, payload) != crc:
                    return
                self._chunk(kind, payload)
            except ValueError:  # FormatError
                return
            if kind == F.Chunk.FOOTER:
                events = self.capture.footer.get("events") if self.capture.footer else None
                if not skipped:  # the read stopped in the last events: it read them all
                    self.capture.read_until_step = None
                elif isinstance(events, int):
                    self.capture.events_in_file = events
                return

    @staticmethod
    def _text(payload: memoryview, pos: int, what: str) -> tuple[bytes, int]:
        """A length-prefixed byte string at pos, and the position after it."""
        n, pos = F.read_varint(payload, pos)
        if pos + n > len(payload):
            raise FormatError(f"{what} runs past the end of its chunk")
        return bytes(payload[pos:pos + n]), pos + n

    @staticmethod
    def _end(payload: memoryview, pos: int) -> None:
        if pos != len(payload):
            raise FormatError("bytes left at the end of a table chunk")

    def _declared_events(self) -> int:
        """The events the file's chunks say they hold (each EVENTS payload
        starts with its count); the decoding says what is wrong, if anything."""
        total = 0
        for kind, at, length, _ in F.chunk_headers(self.data, F.HEADER.size):
            if kind == F.Chunk.EVENTS:
                start = at + F.CHUNK_HEADER.size
                try:
                    count, _ = F.read_varint(self.data[start:start + length], 0)
                except FormatError:
                    break
                total += min(count, length)  # a valid chunk holds at most one event per byte
        return total

    def _check_references(self, cols: dict[str, np.ndarray]) -> None:
        # Writers put every table entry before its first use, so a reference
        # beyond the tables read so far means a damaged or forged file.
        # Before any table chunk, the reserved entries stand in (the root stack,
        # the overflow thread, no-device and CPU streams).
        c = self.capture
        if max(int(cols["stack"].max()), int(cols["op"].max())) >= (len(self.node_rows) or 1):
            raise FormatError("event names a stack not yet defined")
        if int(cols["thread"].max()) >= (len(c.threads) or 1):
            raise FormatError("event names a thread not yet defined")
        if int(cols["stream"].max()) >= (len(c.streams) or 2):
            raise FormatError("event names a stream not yet defined")

    def _finish(self) -> None:
        c = self.capture
        if self.frame_rows:
            rows = np.array(self.frame_rows, np.int64)
            c.frame_file, c.frame_function = rows[:, 0].astype(np.uint32), rows[:, 1].astype(np.uint32)
            c.frame_line = rows[:, 2].astype(np.int32)
        nodes = np.array(self.node_rows or [(0, 0)], np.int64).reshape(-1, 2)
        c.stack_parent, c.stack_frame = nodes[:, 0].astype(np.uint32), nodes[:, 1].astype(np.uint32)
        if self.events is None or not len(self.events):
            return
        cols = self.events.columns()
        raw_kind = cols["kind"]
        stream = cols["stream"]
        stream_device = np.array([s.device for s in c.streams] or [-2, -1], np.int16)
        c.events = Events(
            seq=cols["seq"], time_ns=cols["time"], kind=raw_kind & F.KIND_MASK,
            via_allocator=(raw_kind & F.VIA_ALLOCATOR) != 0, thread=cols["thread"], stream=stream,
            device=stream_device[stream], addr=cols["addr"], size=cols["size"], block=cols["block"],
            stack=cols["stack"], arg=cols["arg"], op=cols["op"])
        if c.footer is not None and c.footer.get("dropped", 0):
            c.warnings.append(f"{c.footer['dropped']} events were lost to write errors while recording")
