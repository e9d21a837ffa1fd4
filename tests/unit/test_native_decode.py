"""Decoding EVENTS chunks in C++ (allocscope._analysis.decode_events,
csrc/analysis/decode.cpp) against the numpy decoder it replaces (capture/codec.py EventBlock,
the reference): the same columns, the same dtypes, the same refusals, on
every fixture, on generated chunks of every column encoding, and on damaged
chunks and files."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import allocscope
from allocscope.capture import codec
from allocscope.capture import format as F
from allocscope.capture.decode import EventColumns
from allocscope.common.native import analysis
from allocscope.capture.writer import CaptureWriter

pytestmark = [pytest.mark.torch_agnostic,
              pytest.mark.skipif(analysis() is None, reason="allocscope._analysis is not built")]

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
FIXTURES = sorted(glob.glob(os.path.join(DATA, "*.alsc")) + glob.glob(os.path.join(DATA, "*", "*.alsc")))
EVENT_FIELDS = ("seq", "time_ns", "kind", "via_allocator", "thread", "stream", "device", "addr", "size", "block",
                "stack", "arg", "op")


def same_events(a, b):
    assert len(a) == len(b)
    for f in EVENT_FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and np.array_equal(x, y), f


@pytest.mark.parametrize("path", FIXTURES, ids=[os.path.relpath(p, DATA) for p in FIXTURES])
def test_fixtures_decode_the_same_natively(path):
    same_events(allocscope.load(path, engine="numpy").events, allocscope.load(path, engine="native").events)


def decode(payloads, version, engine, sized=True):
    """Columns of the payloads decoded in order, or the FormatError raised.
    sized: the columns sized up front as a whole read sizes them (else they
    start empty and grow, as in a partial read)."""
    capacity = 0
    for p in payloads if sized else ():
        try:
            capacity += min(F.read_varint(p, 0)[0], len(p))
        except F.FormatError:
            pass
    cols = EventColumns(version, capacity, engine)
    try:
        for p in payloads:
            cols.add(memoryview(p))
    except F.FormatError as e:
        return e
    return cols.columns()


def same_outcome(payloads, version, sized=True):
    a, b = decode(payloads, version, "numpy"), decode(payloads, version, "native", sized)
    if isinstance(a, F.FormatError) or isinstance(b, F.FormatError):
        assert isinstance(a, F.FormatError) and isinstance(b, F.FormatError), (a, b)
        return a
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), name
    return a


U64 = st.integers(0, (1 << 64) - 1)
# Values clustered where the encodings switch: zeros (sparse columns), equal
# values (constant ones), and the varint lengths' edges.
SMALL = st.one_of(st.just(0), st.integers(0, 3), st.integers(0, 300))
row = st.tuples(
    st.integers(0, 255),                                    # kind with its flag bit
    st.one_of(st.integers(-(1 << 63), (1 << 63) - 1), st.integers(0, 1 << 40)),  # time
    st.integers(0, (1 << 16) - 1), st.integers(0, (1 << 16) - 1),  # thread, stream
    st.one_of(U64, st.integers(0, 1 << 20).map(lambda a: a << 9)),  # addr, often aligned
    st.one_of(SMALL, U64), st.one_of(SMALL, U64),           # size, block
    st.one_of(SMALL, st.integers(0, (1 << 32) - 1)),         # stack
    st.one_of(SMALL, U64), st.one_of(SMALL, st.integers(0, (1 << 32) - 1)),  # arg, op
)


@settings(max_examples=int(os.environ.get("ALLOCSCOPE_EXAMPLES", "200")), deadline=None)
@given(chunks=st.lists(st.lists(row, min_size=1, max_size=40), min_size=1, max_size=4),
       version=st.sampled_from([1, 2]), first=st.integers(0, 1 << 40))
def test_generated_chunks_decode_the_same(chunks, version, first):
    payloads, seq = [], first
    for rows in chunks:
        payloads.append(codec.encode_events(rows, seq, version))
        seq += len(rows)
    out = same_outcome(payloads, version)
    assert not isinstance(out, F.FormatError)
    same_outcome(payloads, version, sized=False)  # columns grown chunk by chunk
    rows = [r for c in chunks for r in c]
    assert out["seq"].tolist() == list(range(first, first + len(rows)))
    assert out["kind"].tolist() == [r[0] for r in rows] and out["time"].tolist() == [r[1] for r in rows]
    assert out["addr"].tolist() == [r[4] for r in rows] and out["arg"].tolist() == [r[8] for r in rows]
    assert out["op"].tolist() == ([r[9] for r in rows] if version >= 2 else [0] * len(rows))


@settings(max_examples=int(os.environ.get("ALLOCSCOPE_EXAMPLES", "200")), deadline=None)
@given(rows=st.lists(row, min_size=1, max_size=30), version=st.sampled_from([1, 2]), data=st.data())
def test_damaged_chunks_are_refused_the_same(rows, version, data):
    payload = bytearray(codec.encode_events(rows, 0, version))
    how = data.draw(st.sampled_from(["cut", "flip", "insert", "grow"]))
    at = data.draw(st.integers(0, len(payload) - 1))
    if how == "cut":
        payload = payload[:at]
    elif how == "flip":
        payload[at] = data.draw(st.integers(0, 255))
    elif how == "insert":
        payload[at:at] = bytes([data.draw(st.integers(0, 255))])
    else:
        payload += bytes([data.draw(st.integers(0, 255))])
    same_outcome([bytes(payload)], version)


@pytest.mark.parametrize("column,value", [("thread", 1 << 16), ("stream", 1 << 16), ("stack", 1 << 32),
                                          ("op", 1 << 32)])
def test_indices_out_of_range_are_refused_by_both(column, value):
    r = [7, 0, 0, 0, 512, 8, 8, 0, 0, 0]
    r[F.COLUMNS.index(column)] = value
    err = same_outcome([codec.encode_events([r, [7, 1, 0, 0, 1024, 8, 8, 0, 0, 0]], 0, 2)], 2)
    assert isinstance(err, F.FormatError) and "out of range" in str(err)


def test_a_damaged_file_salvages_the_same(tmp_path):
    w = CaptureWriter({"devices_recorded": ["cpu"]})
    for i in range(3000):
        w.alloc(0x1000 + 64 * i, 64)
    data = w.to_bytes(events_per_chunk=1000)
    chunks = [(at, length) for kind, at, length, _ in F.chunk_headers(data, F.HEADER.size)
              if kind == F.Chunk.EVENTS]
    # The second chunk, with a byte too many and a checksum that fits: the decoders refuse it.
    at, length = chunks[1]
    payload = data[at + F.CHUNK_HEADER.size:at + F.CHUNK_HEADER.size + length] + b"\0"
    damaged = data[:at] + F.chunk(F.Chunk.EVENTS, payload) + data[at + F.CHUNK_HEADER.size + length:]
    path = tmp_path / "damaged.alsc"
    path.write_bytes(damaged)
    with pytest.warns(allocscope.TruncatedCaptureWarning, match="loaded what precedes it"):
        loads = [allocscope.load(str(path), salvage=True, engine=e) for e in ("numpy", "native")]
    same_events(loads[0].events, loads[1].events)
    assert len(loads[0].events) == 1000
    for e in ("numpy", "native"):
        with pytest.raises(allocscope.CorruptCaptureError, match="bytes left at the end of an events chunk"):
            allocscope.load(str(path), engine=e)
    with pytest.raises(ValueError, match="unknown engine"):
        allocscope.load(str(path), engine="fast")
