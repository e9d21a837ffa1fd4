"""A pytest plugin for make conformance, in every mode of every suite: the
garbage collector runs before each test. Some of PyTorch's tests leave
tensors in reference cycles that a later test meets (torch 2.11's
expandable-segments run: test_memory_snapshot_with_cpp found the block of a
tensor test_memory_snapshot had left, whose frames have no "::rand", until
the collector freed it); when the collector runs depends on how many Python
objects were made since it last did, which watching changes. Collected
before each test, every mode starts each from the same memory, and the
comparison is of what allocscope does to torch, not of the collector's
schedule."""

import gc


def pytest_runtest_setup(item):
    gc.collect()
