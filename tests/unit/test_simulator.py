"""The caching-allocator model on hand-built request streams. Every expected
number is derived in the comments from the rules in
../shared/torch_internals.md §3 (and c10/cuda/CUDACachingAllocator.cpp), not
from running the model."""

import numpy as np
import pytest

from allocscope.allocator.config import AllocatorConfig, ConfigError, parse_alloc_conf
from allocscope.allocator.state import segments
from allocscope.allocator.model import DeviceAllocator
from allocscope.allocator.sizes import round_size, round_sizes

pytestmark = pytest.mark.torch_agnostic

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
BASE = 1 << 40  # the default address source starts here and leaves a 2 MiB gap after each segment


def alloc(settings="", **kw):
    return DeviceAllocator(parse_alloc_conf(settings), **kw)


def seg_events(d):
    return [(e.kind, e.addr - BASE, e.size) for e in d.events]


# ---- rounding


@pytest.mark.parametrize("size, divisions, expected", [
    (1, 0, 512),  # under 512 B: 512 B
    (512, 0, 512),
    (513, 0, 1024),  # otherwise up to a multiple of 512 B
    (1200, 4, 1536),  # 1200 <= 512 * 4: the 512 B rule still applies
    (5 * MiB + 1, 4, 6 * MiB),  # 4 divisions of [4, 8) MiB are 1 MiB apart: 5 MiB + 1 -> 6 MiB
    (4 * MiB, 4, 4 * MiB),  # powers of two stay
    (5 * MiB + 1, 1, 5 * MiB + 512),  # 1 division: plain 512 B rounding
    (3 * MiB + 1, 8, 3 * MiB + 256 * KiB),  # [2, 4) MiB in 8 steps of 256 KiB
])
def test_round_size(size, divisions, expected):
    assert round_size(size, (divisions,) * 16) == expected


def test_vectorised_rounding_is_the_same_rule():
    rng = np.random.default_rng(7)
    sizes = np.concatenate([rng.integers(1, 1 << 36, 3000), rng.integers(1, 4 * MiB, 3000),
                            1 << np.arange(1, 36), (1 << np.arange(1, 36)) + 1])
    for table in [(), (4,) * 16, (0, 2, 8, 1, 16) + (4,) * 11, (2, 4)]:
        assert round_sizes(sizes, table).tolist() == [round_size(int(n), table) for n in sizes]


def test_roundup_power2_divisions_table_follows_torch():
    # "[256:1,512:2,>:8]": the first entry also fills every smaller bucket;
    # bucket i holds sizes in [2^i, 2^(i+1)) MiB; ">" fills the buckets after the last entry.
    table = parse_alloc_conf("roundup_power2_divisions:[256:1,512:2,>:8]").roundup_power2_divisions
    assert table[:9] == (1,) * 9 and table[9] == 2 and table[10:] == (8,) * 6
    assert round_size(300 * MiB + 1, table) == 300 * MiB + 512  # 256 MiB bucket: 1 division -> 512 B steps
    assert round_size(600 * MiB, table) == 768 * MiB  # 512 MiB bucket: 2 divisions of 256 MiB


@pytest.mark.parametrize("bad", ["max_split_size_mb:10", "garbage_collection_threshold:1.5", "expandable_segments:yes",
                                 "roundup_power2_divisions:3", "no_such_key:1", "max_split_size_mb"])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ConfigError):
        parse_alloc_conf(bad)


# ---- pools and segment sizes


def test_small_requests_share_a_2mib_segment():
    d = alloc()
    a = d.malloc(1000, 0)  # 1000 -> 1024 B, small pool; new 2 MiB segment, split (remainder >= 512 B)
    b = d.malloc(1000, 0)  # best fit: the 2 MiB - 1 KiB remainder, split again
    assert seg_events(d) == [("segment_alloc", 0, 2 * MiB)]
    assert (a.addr - BASE, a.size, b.addr - BASE, b.size) == (0, 1024, 1024, 1024)
    assert d.reserved == 2 * MiB and d.allocated == 2048 and d.requested == 2000


def test_large_requests_under_10mib_get_a_20mib_segment():
    d = alloc()
    a = d.malloc(1 * MiB + 1, 0)  # > 1 MiB: large pool; rounds to 1 MiB + 512; < 10 MiB -> 20 MiB segment
    assert seg_events(d) == [("segment_alloc", 0, 20 * MiB)]
    assert a.size == MiB + 512  # split: the remainder (~19 MiB) is over 1 MiB


def test_large_requests_from_10mib_get_a_segment_of_their_size_rounded_to_2mib():
    d = alloc()
    d.malloc(11 * MiB, 0)  # >= 10 MiB: its own segment, 11 MiB rounded up to 12 MiB
    assert seg_events(d) == [("segment_alloc", 0, 12 * MiB)]


def test_a_split_that_is_allowed_and_one_that_is_not():
    d = alloc()
    a = d.malloc(19 * MiB + 512 * KiB, 0)  # 19.5 MiB -> 20 MiB segment; remainder 0.5 MiB <= 1 MiB: no split
    assert a.size == 20 * MiB and d.allocated == 20 * MiB
    start = a.addr
    d.free(a)
    b = d.malloc(12 * MiB, 0)  # the cached 20 MiB block fits; remainder 8 MiB > 1 MiB: split
    assert b.size == 12 * MiB and b.addr == start
    assert len(d.events) == 1  # no new segment


def test_blocks_are_reused_best_fit_then_lowest_address():
    d = alloc()
    blocks = [d.malloc(12 * MiB, 0) for _ in range(3)]  # three 12 MiB segments
    d.free(blocks[2])
    d.free(blocks[0])
    again = d.malloc(12 * MiB, 0)  # two equal candidates: the lower address wins
    assert again.addr == blocks[0].addr


def test_streams_do_not_share_cached_blocks():
    d = alloc()
    a = d.malloc(12 * MiB, 1)
    d.free(a)
    b = d.malloc(12 * MiB, 2)  # the cached block belongs to stream 1: a new segment for stream 2
    assert [e.kind for e in d.events] == ["segment_alloc", "segment_alloc"] and b.addr != a.addr


def test_freed_neighbours_merge():
    d = alloc()
    a, b = d.malloc(1000, 0), d.malloc(1000, 0)  # 0..1K and 1K..2K of one 2 MiB segment
    d.free(a)
    d.free(b)  # merges with a (before) and the remainder (after): one 2 MiB free block again
    assert [(s.total_size, [blk.size for blk in s.blocks]) for s in segments(d)] == [(2 * MiB, [2 * MiB])]


# ---- max_split_size_mb


def test_max_split_size_keeps_oversize_blocks_for_large_requests():
    d = alloc("max_split_size_mb:40")
    big = d.malloc(50 * MiB, 0)  # 50 MiB segment (>= max_split: never split)
    d.free(big)
    small = d.malloc(30 * MiB, 0)  # < max_split must not take a block >= max_split: new 30 MiB segment
    assert small.addr != big.addr
    d.free(small)
    again = d.malloc(45 * MiB, 0)  # >= max_split may take a cached block under 45 + 20 MiB: the 50 MiB one, whole
    assert again.addr == big.addr and again.size == 50 * MiB
    assert [e.size for e in d.events] == [50 * MiB, 30 * MiB]


def test_max_split_size_refuses_blocks_20mib_too_large():
    d = alloc("max_split_size_mb:40")
    big = d.malloc(70 * MiB, 0)
    d.free(big)
    b = d.malloc(45 * MiB, 0)  # 70 >= 45 + 20: refused, a new 46 MiB segment (45 MiB rounded to 2 MiB)
    assert b.addr != big.addr and d.events[-1].size == 46 * MiB


def test_release_available_cached_blocks_frees_one_oversize_block_before_retrying():
    # Capacity 80 MiB and a cached 60 MiB block (>= max_split 40 MiB). A 30 MiB request
    # (< max_split) may not take it; cudaMalloc of 30 MiB fails (60 + 30 > 80), so
    # release_available_cached_blocks frees the smallest cached block >= max(30, 40) MiB,
    # the 60 MiB one, and the second cudaMalloc fits.
    d = alloc("max_split_size_mb:40", capacity=80 * MiB)
    big = d.malloc(60 * MiB, 0)
    d.free(big)
    d.malloc(30 * MiB, 0)
    assert [(k, s) for k, _, s in seg_events(d)] == [("segment_alloc", 60 * MiB), ("segment_free", 60 * MiB),
                                                      ("segment_alloc", 30 * MiB)]
    assert d.num_alloc_retries == 0  # not the release-everything retry


# ---- release-and-retry, OOM


def test_release_and_retry_then_out_of_memory():
    d = alloc(capacity=60 * MiB)
    x = d.malloc(30 * MiB, 0)
    d.free(x)  # cached, unsplit
    d.malloc(40 * MiB, 0)  # 30 cached + 40 > 60: release every unsplit cached block, retry: fits
    assert [(k, s) for k, _, s in seg_events(d)] == [("segment_alloc", 30 * MiB), ("segment_free", 30 * MiB),
                                                      ("segment_alloc", 40 * MiB)]
    assert d.num_alloc_retries == 1
    assert d.malloc(30 * MiB, 0) is None  # 40 + 30 > 60 and nothing is cached: out of memory
    assert d.num_ooms == 1 and d.num_alloc_retries == 2 and d.reserved == 40 * MiB


def test_split_segments_cannot_be_released():
    d = alloc(capacity=40 * MiB)
    a = d.malloc(2 * MiB, 0)  # 20 MiB segment, split: a + 18 MiB free
    assert d.malloc(24 * MiB, 0) is None  # 20 + 24 > 40; the only cached block is part of a split segment
    assert d.reserved == 20 * MiB and d.free_blocks()[0].size == 18 * MiB
    assert a.allocated


def test_memory_fraction_limits_before_cudamalloc():
    d = alloc(total=100 * MiB)
    d.set_fraction(0.5)  # allowed = 50 MiB
    d.malloc(40 * MiB, 0)
    assert d.malloc(12 * MiB, 0) is None  # 40 + 12 > 50


def test_garbage_collection_frees_old_cached_blocks_under_a_fraction():
    # Allowed 100 MiB, threshold 0.5: collect when reserved > 50 MiB. Two mallocs
    # (2 get_free_block calls), then both blocks are cached at call count 2. The
    # 32 MiB request is call 3: both blocks have age 1 = the average, so one pass
    # frees both, in set order (size: 24 MiB first), then a 32 MiB segment.
    d = alloc("garbage_collection_threshold:0.5", total=100 * MiB)
    d.set_fraction(1.0)
    a, b = d.malloc(30 * MiB, 0), d.malloc(24 * MiB, 0)
    d.free(a)
    d.free(b)
    d.malloc(32 * MiB, 0)
    kinds = [(k, s) for k, _, s in seg_events(d)]
    assert kinds[2:] == [("segment_free", 24 * MiB), ("segment_free", 30 * MiB), ("segment_alloc", 32 * MiB)]
    assert d.num_gc_runs == 1


def test_no_garbage_collection_without_a_fraction():
    d = alloc("garbage_collection_threshold:0.5", total=100 * MiB)
    a = d.malloc(30 * MiB, 0)
    d.free(a)
    d.malloc(32 * MiB, 0)  # no fraction set: torch never collects; the 30 MiB block stays cached
    assert [e.kind for e in d.events] == ["segment_alloc", "segment_alloc"] and d.num_gc_runs == 0


# ---- cross-stream frees


def test_a_cross_stream_free_delays_reuse_until_it_completes():
    d = alloc()
    x = d.malloc(1000, 0)  # 0..1K of a 2 MiB segment
    d.free(x, deferred=True)  # used on another stream: not reusable yet
    y = d.malloc(1000, 0)  # must not get x's memory: takes the remainder at 1K
    assert y.addr == x.addr + 1024
    d.complete(x)  # the other stream is done: x's 1 KiB is free (y, allocated, sits after it)
    z = d.malloc(1000, 0)  # best fit: exactly 1 KiB at 0
    assert z.addr == x.addr


def test_a_release_synchronizes_pending_frees():
    d = alloc()
    x = d.malloc(12 * MiB, 0)
    d.free(x, deferred=True)
    d.empty_cache()  # synchronize_and_free_events first, then the now unsplit segment is released
    assert [e.kind for e in d.events] == ["segment_alloc", "segment_free"] and d.reserved == 0


# ---- expandable segments


def test_expandable_segments_grow_one_range_instead_of_new_segments():
    d = alloc("expandable_segments:True", total=GiB)
    a = d.malloc(5 * MiB, 0)  # large pool, pages of 20 MiB: map page 0; split (remainder >= 512 B)
    b = d.malloc(30 * MiB, 0)  # no 30 MiB free block; the free 15 MiB at 5 MiB plus unmapped space fit:
    # map page 1 (20 MiB), merge into 35 MiB at 5 MiB, take 30 MiB of it
    assert seg_events(d) == [("segment_map", 0, 20 * MiB), ("segment_map", 20 * MiB, 20 * MiB)]
    assert (a.addr - BASE, b.addr - BASE) == (0, 5 * MiB)
    assert d.reserved == 40 * MiB  # without expandable segments: 20 + 30 = 50 MiB
    d.free(a)
    d.free(b)
    d.empty_cache()  # one free 40 MiB block: unmapped whole; the range is then dropped (no event)
    assert seg_events(d)[-1] == ("segment_unmap", 0, 40 * MiB)
    assert d.reserved == 0 and not d.blocks and not d.unmapped


def test_expandable_small_pool_uses_2mib_pages():
    d = alloc("expandable_segments:True", total=GiB)
    d.malloc(1000, 0)  # small pool: its expandable range grows in 2 MiB pages
    assert [(k, s) for k, _, s in seg_events(d)] == [("segment_map", 2 * MiB)]


def test_expandable_release_keeps_pages_with_live_blocks():
    d = alloc("expandable_segments:True", total=GiB)
    a = d.malloc(30 * MiB, 0)  # maps pages 0 and 1 (40 MiB): a at 0..30 MiB, free 30..40 MiB
    d.empty_cache()  # the free 10 MiB covers no whole page (page 1 is 20..40 MiB): nothing unmapped
    assert len(d.events) == 1
    d.free(a)
    d.empty_cache()
    assert seg_events(d)[-1] == ("segment_unmap", 0, 40 * MiB)


def test_memory_limit_with_expandable_segments():
    d = alloc("expandable_segments:True", total=GiB, capacity=40 * MiB)
    d.malloc(30 * MiB, 0)  # maps 40 MiB, all there is: 10 MiB free at 30..40 MiB
    assert d.malloc(5 * MiB, 0) is not None  # fits in the free 10 MiB
    assert d.malloc(15 * MiB, 0) is None  # 5 MiB free + page 2 (20 MiB more) would exceed the capacity
    assert d.reserved == 40 * MiB and d.num_ooms == 1


def test_forced_replay_keeps_going_past_the_limit():
    d = alloc(capacity=20 * MiB)
    d.force = True
    d.malloc(30 * MiB, 0)  # what the recording did, though this device could not: counted, then served
    assert d.num_ooms == 1 and d.reserved == 30 * MiB


def test_default_config_describes_itself():
    assert AllocatorConfig().describe() == "defaults"
    assert parse_alloc_conf("expandable_segments:True,max_split_size_mb:128").describe() == \
        "expandable_segments:True,max_split_size_mb:128"
