"""The reader on synthetic captures: what goes in comes out, and every kind
of damage gives a clear error or a valid prefix."""

import json
import os
import warnings

import numpy as np
import pytest

import allocscope
from allocscope.capture import format as F
from allocscope.capture.writer import CaptureWriter

pytestmark = pytest.mark.torch_agnostic


def _builder() -> CaptureWriter:
    b = CaptureWriter({"purpose": "test"})
    s1 = b.stack([("train.py", "step", 12), ("train.py", "main", 40)])
    s2 = b.stack([("model.py", "forward", 7), ("train.py", "step", 11), ("train.py", "main", 40)])
    t = b.thread(4242, "worker")
    b.alloc(0x7F0000001000, 4096, stack=s1, arg=300)
    b.alloc(0x7F0000003000, 100, stack=s2, thread=t)
    b.mark("step 0")
    b.free(0x7F0000001000)
    b.alloc(0x7F0000001000, 2048, stack=s1)
    b.baseline({"label": "start", "device_type": "cpu", "rss_bytes": 123})
    return b


def test_roundtrip_of_tables_and_events(tmp_path):
    b = _builder()
    cap = allocscope.load(b.write(tmp_path / "a.alsc"))
    ev = cap.events
    assert cap.complete and cap.metadata["purpose"] == "test"
    assert ev.seq.tolist() == [0, 1, 2, 3, 4]
    assert ev.kind.tolist() == [1, 1, 16, 2, 1]
    assert ev.addr.tolist() == [0x7F0000001000, 0x7F0000003000, 0, 0x7F0000001000, 0x7F0000001000]
    assert ev.size.tolist() == [4096, 100, 0, 0, 2048]
    assert ev.arg[0] == 300 and not ev.via_allocator.any()
    assert np.all(np.diff(ev.time_ns) == 1000)
    assert ev.device.tolist() == [-1, -1, -2, -1, -1]
    assert cap.threads[ev.thread[1]].native_id == 4242 and cap.threads[ev.thread[1]].name == "worker"
    assert [str(f) for f in cap.stack(ev.stack[1])] == [
        "forward (model.py:7)", "step (train.py:11)", "main (train.py:40)"]
    assert cap.stack(0) == []
    assert cap.label(2) == "step 0"
    assert cap.baseline("start") == {"label": "start", "device_type": "cpu", "rss_bytes": 123}
    assert ev.counts() == {"alloc": 3, "free": 1, "mark": 1}


def test_events_spread_over_many_chunks(tmp_path):
    b = CaptureWriter()
    for i in range(1000):
        b.alloc(0x1000 * (i + 1), i + 1)
    cap = allocscope.load(b.write(tmp_path / "many.alsc", events_per_chunk=77))
    assert cap.events.seq.tolist() == list(range(1000))
    assert cap.events.size.tolist() == list(range(1, 1001))


def test_via_allocator_bit_is_split_out(tmp_path):
    b = CaptureWriter(device=0)
    b.event(F.EventKind.FREE | F.VIA_ALLOCATOR, addr=0x200000, size=512)
    cap = allocscope.load(b.write(tmp_path / "v.alsc"))
    assert cap.events.kind.tolist() == [F.EventKind.FREE]
    assert cap.events.via_allocator.tolist() == [True]
    assert cap.events.device.tolist() == [0]


def test_truncated_file_loads_its_prefix_with_a_warning(tmp_path):
    data = _builder().to_bytes()
    full = allocscope.load(_write(tmp_path, data))
    for cut in range(F.HEADER.size, len(data), 7):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cap = allocscope.load(_write(tmp_path, data[:cut]))
        assert not cap.complete
        assert len(cap.events) <= len(full.events)
        np.testing.assert_array_equal(cap.events.addr, full.events.addr[: len(cap.events)])
        # Cutting inside a chunk warns; cutting exactly between chunks is a
        # recording that simply had not written more yet.
        assert bool(caught) == bool(cap.warnings)
        assert all(issubclass(w.category, allocscope.TruncatedCaptureWarning) for w in caught)


def test_file_without_footer_is_incomplete(tmp_path):
    cap = allocscope.load(_builder().write(tmp_path / "nf.alsc", footer=False))
    assert not cap.complete and len(cap.events) == 5


def test_wrong_magic_is_not_a_capture(tmp_path):
    with pytest.raises(allocscope.NotACaptureError, match="not an allocscope capture"):
        allocscope.load(_write(tmp_path, b"PK\x03\x04" + b"\0" * 100))
    with pytest.raises(allocscope.NotACaptureError, match="empty"):
        allocscope.load(_write(tmp_path, b""))


def test_future_version_is_refused(tmp_path):
    data = bytearray(_builder().to_bytes())
    data[8:12] = (F.FORMAT_VERSION + 1).to_bytes(4, "little")
    with pytest.raises(allocscope.UnsupportedVersionError, match="newer"):
        allocscope.load(_write(tmp_path, bytes(data)))


def test_flipped_byte_is_a_checksum_error_or_salvaged(tmp_path):
    data = bytearray(_builder().to_bytes())
    data[-20] ^= 0x40  # inside the last chunk (the footer)
    path = _write(tmp_path, bytes(data))
    with pytest.raises(allocscope.CorruptCaptureError, match="checksum"):
        allocscope.load(path)
    with pytest.warns(allocscope.TruncatedCaptureWarning):
        cap = allocscope.load(path, salvage=True)
    assert len(cap.events) == 5 and not cap.complete and cap.damaged
    assert not allocscope.load(_write(tmp_path, _builder().to_bytes())).damaged


def test_fit_does_not_say_that_a_damaged_capture_fits(tmp_path):
    # a second writer's footer after the damage (a rank's child process
    # writing into the rank's file) made such a read look complete
    from allocscope.reports.fit import card_result

    data = bytearray(_builder().to_bytes())
    data[F.HEADER.size + F.CHUNK_HEADER.size + 2] ^= 0x40  # inside the first chunk
    path = _write(tmp_path, bytes(data))
    with pytest.warns(allocscope.TruncatedCaptureWarning):
        cap = allocscope.load(path, salvage=True)
    card = card_result("H100-80GB", 0, cap)
    assert card["verdict"] == "damaged capture" and "checksum" in card["warnings"][0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert card_result("H100-80GB", 0, allocscope.load(_write(tmp_path, _builder().to_bytes())))["verdict"] == "fits"


def test_forged_chunk_with_valid_crc_but_bad_reference_is_corrupt(tmp_path):
    b = CaptureWriter()
    b.alloc(0x1000, 1, stack=99)  # no such stack
    with pytest.raises(allocscope.CorruptCaptureError, match="stack"):
        allocscope.load(b.write(tmp_path / "forged.alsc"))


def test_unknown_chunk_types_are_skipped(tmp_path):
    data = _builder().to_bytes()
    extra = F.chunk(200, b"from a newer writer")
    cap = allocscope.load(_write(tmp_path, data[:F.HEADER.size] + extra + data[F.HEADER.size:]))
    assert cap.complete and len(cap.events) == 5


def test_json_chunks_must_be_objects(tmp_path):
    data = F.file_header() + F.chunk(F.Chunk.METADATA, json.dumps([1, 2]).encode())
    with pytest.raises(allocscope.CorruptCaptureError, match="metadata"):
        allocscope.load(_write(tmp_path, data))


def test_unreadable_paths_are_capture_errors(tmp_path):
    with pytest.raises(allocscope.CaptureError, match="cannot read"):
        allocscope.load(tmp_path / "missing.alsc")
    with pytest.raises(allocscope.CaptureError, match="directory"):
        allocscope.load(tmp_path)


def _write(tmp_path, data: bytes) -> str:
    path = os.path.join(tmp_path, "x.alsc")
    with open(path, "wb") as f:
        f.write(data)
    return path


def test_forged_footer_and_short_stream_table_are_capture_errors(tmp_path):
    data = _builder().to_bytes(footer=False)
    bad_footer = data + F.chunk(F.Chunk.FOOTER, json.dumps({"dropped": "many"}).encode())
    with pytest.raises(allocscope.CorruptCaptureError, match="footer"):
        allocscope.load(_write(tmp_path, bad_footer))
    b = CaptureWriter()
    b.streams = [(-2, 0)]  # only one of the two reserved entries
    b.alloc(0x1000, 8)  # on stream 1, which this table lacks
    with pytest.raises(allocscope.CorruptCaptureError, match="stream"):
        allocscope.load(b.write(tmp_path / "s.alsc"))
