"""The ranks of a job that `--world-size` runs (harness/world.py)."""

import pytest

from allocscope.common.errors import InputError
from allocscope.harness.world import parse_ranks, parse_world

pytestmark = pytest.mark.torch_agnostic


@pytest.mark.parametrize("text, ranks", [
    ("0,16,32,48", [0, 16, 32, 48]),
    ("0:64:16", [0, 16, 32, 48]),
    ("::16,last", [0, 16, 32, 48, 63]),
    ("8-11", [8, 9, 10, 11]),
    ("60:", [60, 61, 62, 63]),
    (" 3 , 5 ", [3, 5]),
])
def test_ranks_are_lists_ranges_and_slices(text, ranks):
    assert parse_ranks(text, 64) == ranks


@pytest.mark.parametrize("text", ["", "a", "0::0", "1:2:3:4", "3-x", "100:200"])
def test_anything_else_is_a_one_line_error(text):
    with pytest.raises(InputError) as e:
        parse_ranks(text, 64)
    assert "\n" not in str(e.value)


def test_ranks_together_run_sorted_and_once_alone_in_the_order_given():
    together = parse_world(64, [48, 0, 16, 0], together=True)
    assert together.ranks == (0, 16, 48) and together.together
    alone = parse_world(64, [48, 0, 16, 0])
    assert alone.ranks == (48, 0, 16) and not alone.together
    assert parse_world(4, None, gpus_per_node=8).gpus_per_node == 4  # a node holds no more cards than the world


def test_more_ranks_together_than_processes_allowed_is_refused():
    with pytest.raises(InputError, match="at most 64 ranks together"):
        parse_world(1024, range(0, 1024, 8), together=True)
    assert len(parse_world(1024, range(0, 1024, 8)).ranks) == 128  # alone, one after the other: any number
