"""A pytest plugin for make conformance: test_cuda.py with expandable
segments, as PyTorch's test_cuda_expandable_segments.py runs it when
started as a script (which pytest does not do): the allocator set to
expandable segments before the tests, and the tests told so."""

import os
import sys


def pytest_sessionstart(session):
    import torch

    sys.path.insert(0, os.getcwd())  # (PyTorch's test/ folder: test_cuda imports as pytest will import it)
    import test_cuda

    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    test_cuda.TestCuda.expandable_segments = lambda _: True
    test_cuda.TestBlockStateAbsorption.expandable_segments = lambda _: True
