"""The event columns' encodings (docs/format.md, "EVENTS"): decoding them
with numpy (the reference the native decoder, csrc/analysis/decode.cpp, is
held to) and encoding them (synthetic captures and imports; the recorder
encodes in C++)."""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from .format import COLUMNS, FORMAT_VERSION, Encoding, FormatError, columns_of, read_varint, varint, zigzag

__all__ = ["EventBlock", "decode_column", "decode_varints", "encode_column", "encode_event_columns", "encode_events",
           "encode_varints", "unzigzag", "zigzag_array"]


def decode_varints(buf: np.ndarray, count: int) -> np.ndarray:
    """Decodes exactly `count` varints that fill `buf` (uint8) exactly."""
    if count == 0:
        if len(buf):
            raise FormatError("bytes left after the last varint")
        return np.zeros(0, np.uint64)
    if len(buf) == 0:
        raise FormatError("missing varints")
    ends = np.flatnonzero(buf < 0x80)
    if len(ends) != count or ends[-1] != len(buf) - 1:
        raise FormatError(f"expected {count} varints, found {len(ends)}")
    if count == len(buf):  # every value fits in one byte
        return buf.astype(np.uint64)
    starts = np.empty(count, np.int64)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    longest = int(lengths.max())
    if longest > 10 or (longest == 10 and int(buf[ends[lengths == 10]].max()) > 1):
        raise FormatError("varint does not fit in 64 bits")
    position = np.arange(len(buf), dtype=np.int64) - np.repeat(starts, lengths)
    parts = (buf & 0x7F).astype(np.uint64) << (7 * position).astype(np.uint64)
    return np.bitwise_or.reduceat(parts, starts)


def unzigzag(v: np.ndarray) -> np.ndarray:
    """uint64 zigzag values to int64."""
    return (v >> np.uint64(1)).astype(np.int64) ^ -((v & np.uint64(1)).astype(np.int64))


def decode_column(data: memoryview, pos: int, count: int) -> tuple[np.ndarray, int]:
    """Decodes one column of `count` values at pos; returns (uint64 values, next position)."""
    if pos >= len(data):
        raise FormatError("column missing")
    enc = data[pos]
    pos += 1
    if enc == Encoding.CONST:
        value, pos = read_varint(data, pos)
        return np.full(count, value, np.uint64), pos
    if enc == Encoding.DENSE:
        length, pos = read_varint(data, pos)
        if pos + length > len(data):
            raise FormatError("column runs past the end of its chunk")
        buf = np.frombuffer(data, np.uint8, length, pos)
        return decode_varints(buf, count), pos + length
    if enc == Encoding.SPARSE:
        k, pos = read_varint(data, pos)
        length, pos = read_varint(data, pos)
        if k > count or pos + length > len(data):
            raise FormatError("sparse column is inconsistent")
        parts = decode_varints(np.frombuffer(data, np.uint8, length, pos), 2 * k)
        gaps = parts[:k]
        out = np.zeros(count, np.uint64)
        if k:
            # Each gap < count <= 2**30 first, so the sum cannot wrap.
            if int(gaps.max()) >= count or (k > 1 and int(gaps[1:].min()) == 0):
                raise FormatError("sparse column indices are not increasing")
            index = np.cumsum(gaps.astype(np.int64))
            if int(index[-1]) >= count:
                raise FormatError("sparse column index out of range")
            out[index] = parts[k:]
        return out, pos + length
    raise FormatError(f"unknown column encoding {enc}")


class EventBlock:
    """The decoded columns of one EVENTS chunk."""

    __slots__ = ("first_seq", "kind", "time", "thread", "stream", "addr", "size", "block", "stack", "arg", "op")

    def __init__(self, payload: memoryview, version: int = FORMAT_VERSION):
        count, pos = read_varint(payload, 0)
        if count == 0 or count > len(payload):
            raise FormatError("event count is inconsistent with the chunk size")
        self.first_seq, pos = read_varint(payload, pos)
        base_time, pos = read_varint(payload, pos)
        if pos + 2 + count > len(payload):
            raise FormatError("events chunk is too short")
        shift = payload[pos]
        if shift > 63:
            raise FormatError("address shift out of range")
        pos += 1
        if payload[pos] != Encoding.RAW:
            raise FormatError("the kind column must be stored raw")
        self.kind = np.frombuffer(payload, np.uint8, count, pos + 1).copy()
        pos += 1 + count
        columns = []
        for _ in columns_of(version)[1:]:
            values, pos = decode_column(payload, pos, count)
            columns.append(values)
        if pos != len(payload):
            raise FormatError("bytes left at the end of an events chunk")
        if version < 2:
            columns.append(np.zeros(count, np.uint64))
        dtime, thread, stream, daddr, self.size, self.block, stack, self.arg, op = columns
        base = unzigzag(np.array([base_time], np.uint64))[0]
        with np.errstate(over="ignore"):
            self.time = np.cumsum(unzigzag(dtime)) + base
            addr = np.cumsum(unzigzag(daddr)).view(np.uint64)
            self.addr = addr << np.uint64(shift)
        for name, values, limit in (("thread", thread, 1 << 16), ("stream", stream, 1 << 16), ("stack", stack, 1 << 32),
                                    ("op", op, 1 << 32)):
            if int(values.max()) >= limit:
                raise FormatError(f"{name} index out of range")
        self.thread = thread.astype(np.uint16)
        self.stream = stream.astype(np.uint16)
        self.stack = stack.astype(np.uint32)
        self.op = op.astype(np.uint32)


def encode_column(values: Sequence[int]) -> bytes:
    """Encodes a column the way the C++ writer does (smallest encoding wins)."""
    values = [int(v) for v in values]
    if all(v == values[0] for v in values):
        return bytes([Encoding.CONST]) + varint(values[0] if values else 0)
    dense = b"".join(varint(v) for v in values)
    nonzero = [(i, v) for i, v in enumerate(values) if v]
    idx = b"".join(varint(i if n == 0 else i - nonzero[n - 1][0]) for n, (i, _) in enumerate(nonzero))
    sparse = idx + b"".join(varint(v) for _, v in nonzero)
    if len(sparse) + len(varint(len(nonzero))) < len(dense):
        return bytes([Encoding.SPARSE]) + varint(len(nonzero)) + varint(len(sparse)) + sparse
    return bytes([Encoding.DENSE]) + varint(len(dense)) + dense


def encode_varints(values: np.ndarray) -> bytes:
    """LEB128 varints of a uint64 array, vectorised (imports and large
    synthetic captures write millions of values)."""
    v = np.ascontiguousarray(values, np.uint64)
    if not len(v):
        return b""
    bits = np.zeros(len(v), np.int64)
    rest = v.copy()
    while True:  # bit length, 7 bits at a time
        nz = rest > 0
        if not nz.any():
            break
        bits += nz
        rest >>= np.uint64(7)
    nbytes = np.maximum(bits, 1)
    ends = np.cumsum(nbytes)
    out = np.zeros(int(ends[-1]), np.uint8)
    starts = ends - nbytes
    for k in range(int(nbytes.max())):
        has = nbytes > k
        byte = ((v[has] >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        more = (nbytes[has] > k + 1).astype(np.uint8) << 7
        out[starts[has] + k] = byte | more
    return out.tobytes()


def zigzag_array(values: np.ndarray) -> np.ndarray:
    """int64 (two's complement, wrapping) to uint64 zigzag values."""
    v = np.asarray(values).astype(np.int64, copy=False)
    return ((v << 1) ^ (v >> 63)).view(np.uint64)


def _encode_array_column(values: np.ndarray) -> bytes:
    if len(values) and (values == values[0]).all():
        return bytes([Encoding.CONST]) + varint(int(values[0]))
    dense = encode_varints(values)
    return bytes([Encoding.DENSE]) + varint(len(dense)) + dense


def encode_event_columns(cols: dict[str, np.ndarray], first_seq: int, version: int = FORMAT_VERSION) -> bytes:
    """EVENTS payload from numpy columns (COLUMNS names, "op" optional; addr
    as uint64), the vectorised twin of encode_events (CONST or DENSE columns
    only)."""
    n = len(cols["kind"])
    if not n:
        raise ValueError("an events chunk holds at least one event")
    addr = np.asarray(cols["addr"]).astype(np.uint64)
    any_addr = int(np.bitwise_or.reduce(addr)) if n else 0
    shift = (any_addr & -any_addr).bit_length() - 1 if any_addr else 0
    times = np.asarray(cols["time"]).astype(np.int64)
    shifted = (addr >> np.uint64(shift)).view(np.int64)
    with np.errstate(over="ignore"):
        dtime = np.diff(times, prepend=times[0])
        daddr = np.diff(shifted, prepend=np.int64(0))
    out = bytearray(varint(n) + varint(first_seq) + varint(zigzag(int(times[0]))) + bytes([shift]))
    out += bytes([Encoding.RAW]) + np.asarray(cols["kind"]).astype(np.uint8).tobytes()
    out += _encode_array_column(zigzag_array(dtime))
    out += _encode_array_column(np.asarray(cols["thread"]).astype(np.uint64))
    out += _encode_array_column(np.asarray(cols["stream"]).astype(np.uint64))
    out += _encode_array_column(zigzag_array(daddr))
    for name in columns_of(version)[5:]:
        column = cols.get(name)
        out += _encode_array_column(np.zeros(n, np.uint64) if column is None else
                                    np.asarray(column).astype(np.uint64))
    return bytes(out)


def encode_events(rows: Iterable[Sequence[int]], first_seq: int, version: int = FORMAT_VERSION) -> bytes:
    """EVENTS payload from rows of (kind, time, thread, stream, addr, size, block, stack, arg[, op])."""
    rows = [tuple(int(x) for x in r) + (0,) * (len(COLUMNS) - len(r)) for r in rows]
    if not rows:
        raise ValueError("an events chunk holds at least one event")
    cols = list(zip(*rows, strict=True))
    any_addr = 0
    for a in cols[4]:
        any_addr |= a
    shift = (any_addr & -any_addr).bit_length() - 1 if any_addr else 0
    times = cols[1]
    addrs = [a >> shift for a in cols[4]]
    out = bytearray()
    out += varint(len(rows)) + varint(first_seq) + varint(zigzag(times[0])) + bytes([shift])
    out += bytes([Encoding.RAW]) + bytes(cols[0])
    # Deltas wrap to int64, as the readers' cumulative sums do.
    wrap = lambda d: (d + (1 << 63)) % (1 << 64) - (1 << 63)  # noqa: E731
    out += encode_column([zigzag(wrap(t - (times[i - 1] if i else times[0]))) for i, t in enumerate(times)])
    out += encode_column(cols[2])
    out += encode_column(cols[3])
    out += encode_column([zigzag(wrap(a - (addrs[i - 1] if i else 0))) for i, a in enumerate(addrs)])
    for c in cols[5:len(columns_of(version))]:
        out += encode_column(c)
    return bytes(out)
