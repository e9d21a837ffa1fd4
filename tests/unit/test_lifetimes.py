"""Pairing allocations with frees, on hand-built event streams."""

import pytest

import allocscope
from allocscope.attribution.lifetimes import lifetimes, live_bytes
from allocscope.capture.writer import CaptureWriter

pytestmark = pytest.mark.torch_agnostic


def _load(tmp_path, b):
    return allocscope.load(b.write(tmp_path / "l.alsc")).events


def test_pairs_reuse_of_an_address_in_order(tmp_path):
    b = CaptureWriter()
    b.alloc(0x1000, 10)   # 0
    b.alloc(0x2000, 20)   # 1
    b.free(0x1000)        # 2 frees 0
    b.alloc(0x1000, 30)   # 3 reuses the address
    b.free(0x2000)        # 4 frees 1
    ev = _load(tmp_path, b)
    lt = lifetimes(ev)
    assert lt.alloc.tolist() == [0, 1, 3]
    assert lt.free.tolist() == [2, 4, -1]
    assert lt.live_at_end.tolist() == [3]
    assert len(lt.unmatched_frees) == 0 and len(lt.double_allocs) == 0
    assert live_bytes(ev, lt).tolist() == [10, 30, 20, 50, 30]


def test_free_of_older_memory_and_missed_free_are_reported(tmp_path):
    b = CaptureWriter()
    b.free(0x5000, 64)    # 0: allocated before recording
    b.alloc(0x6000, 8)    # 1
    b.alloc(0x6000, 8)    # 2: the recorder missed a free of 1
    b.free(0x6000)        # 3
    ev = _load(tmp_path, b)
    lt = lifetimes(ev)
    assert lt.unmatched_frees.tolist() == [0]
    assert lt.double_allocs.tolist() == [2]
    assert lt.free.tolist() == [-1, 3]
    assert live_bytes(ev, lt).tolist() == [0, 8, 16, 8]


def test_cuda_free_without_device_pairs_with_its_allocation(tmp_path):
    b = CaptureWriter(device=0)
    b.alloc(0x7F0000000000, 512)
    b.free(0x7F0000000000, stream=0)  # the wrapper's FREE: no device known
    lt = lifetimes(_load(tmp_path, b))
    assert lt.free.tolist() == [1]
