"""The events of a capture as its EVENTS chunks are decoded, in file order.

Two engines behind one interface (reader.py uses it): the native decoder
(allocscope._analysis.decode_events, csrc/analysis/decode.cpp) writes each chunk
straight into columns allocated once for the whole file; the reference
(capture/codec.py EventBlock, numpy) decodes each chunk into its own arrays and joins
them at the end. tests/unit/test_native_decode.py holds them to the same
columns and the same refusals.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..common.native import analysis_for
from . import format as F
from .codec import EventBlock
from .format import FormatError

__all__ = ["EventColumns"]

# Column dtypes as loaded (kind keeps its flag bits until reader.py splits them).
DTYPES = {"kind": np.uint8, "time": np.int64, "thread": np.uint16, "stream": np.uint16, "addr": np.uint64,
          "size": np.uint64, "block": np.uint64, "stack": np.uint32, "arg": np.uint64, "op": np.uint32}


class EventColumns:
    """add() one EVENTS payload after another; columns() the joined result.

    capacity: the events expected (the native engine allocates that many
    rows up front, and doubles them when a chunk needs more; pages never
    written cost no memory)."""

    def __init__(self, version: int, capacity: int, engine: str = "auto"):
        self.version = version
        self._native = analysis_for(engine, "numpy")
        self._rows = 0
        self._seq: list[tuple[int, int] | np.ndarray] = []  # per chunk (first_seq, count), or its numbers
        self._blocks: list[EventBlock] = []
        self._cols: dict[str, np.ndarray] = {}
        if self._native is not None:
            self._cols = {name: np.empty(capacity, dtype) for name, dtype in DTYPES.items()}

    def __len__(self) -> int:
        return self._rows

    def add(self, payload: memoryview, check: Callable[[dict[str, np.ndarray]], None] | None = None,
            seq: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Decodes one EVENTS payload; returns its columns (views). The
        chunk's rows count only once check(columns) (if given) has not
        raised. FormatError where the payload does not follow the format.
        seq: the events' sequence numbers where they are not consecutive
        from the payload's first (a checkpoint's)."""
        if self._native is None:
            block = EventBlock(payload, self.version)
            count, first = len(block.kind), block.first_seq
            cols = {name: getattr(block, name) for name in DTYPES}
        else:
            self._reserve(payload)
            try:
                count, first = self._native.decode_events(payload, self.version, self._cols, self._rows)
            except ValueError as e:  # _analysis.FormatError, or a payload the binding cannot take
                raise FormatError(str(e)) from None
            cols = {name: column[self._rows:self._rows + count] for name, column in self._cols.items()}
        if seq is not None and len(seq) != count:
            raise FormatError(f"{len(seq)} sequence numbers for {count} events")
        if check is not None:
            check(cols)
        if self._native is None:
            self._blocks.append(block)
        self._seq.append((first, count) if seq is None else seq)
        self._rows += count
        return cols

    def _reserve(self, payload: memoryview) -> None:
        """Room for the payload's events (its count, at most one per byte),
        doubling the columns where the capacity given was short."""
        try:
            count = min(F.read_varint(payload, 0)[0], len(payload))
        except FormatError:
            return  # the decoder refuses the payload
        need = self._rows + count
        if need > len(self._cols["kind"]):
            grown = max(need, 2 * len(self._cols["kind"]))
            for name, column in self._cols.items():
                wider = np.empty(grown, column.dtype)
                wider[:self._rows] = column[:self._rows]
                self._cols[name] = wider

    def columns(self) -> dict[str, Any]:
        """All rows decoded so far, one array per column, with `seq`."""
        if self._native is None:
            cols = {name: np.concatenate([getattr(b, name) for b in self._blocks]) if self._blocks
                    else np.zeros(0, dtype) for name, dtype in DTYPES.items()}
        else:
            cols = {name: column[:self._rows] for name, column in self._cols.items()}
        seq = np.empty(self._rows, np.uint64)
        at = 0
        for part in self._seq:
            if isinstance(part, tuple):
                first, count = part
                seq[at:at + count] = np.arange(first, first + count, dtype=np.uint64)
            else:
                count = len(part)
                seq[at:at + count] = part
            at += count
        cols["seq"] = seq
        return cols
