"""The CUDA wrapper must forward every virtual method of the allocator
interface (a method left to its default body silently changes behaviour).
Read the interface from the installed torch's headers, not from a list."""

import os
import re

import pytest

from ..conftest import ROOT

INTERFACES = [
    ("c10/core/Allocator.h", "struct C10_API Allocator {"),
    ("c10/core/CachingDeviceAllocator.h", "struct C10_API DeviceAllocator"),
    ("c10/cuda/CUDACachingAllocator.h", "class CUDAAllocator : public DeviceAllocator"),
]
# Implemented by the wrapper on purpose rather than forwarded (raw_deleter,
# which hands out the recorder's deleter, asks the wrapped allocator too: its
# answer changes with caching_allocator_enable).
OWN: set[str] = set()


def _code(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def _virtuals(include: str) -> set[str]:
    names = set()
    for rel, opener in INTERFACES:
        with open(os.path.join(include, rel)) as f:
            text = _code(f.read())
        body = text[text.index(opener):]
        body = body[: body.index("\n};")]
        names |= set(re.findall(r"virtual\s+[^;{(]*?\b(\w+)\s*\(", body))
        names |= set(re.findall(r"\b(\w+)\s*\([^;{]*\)\s*(?:const\s*)?override", body))
    return names - {"Allocator", "DeviceAllocator"}


def test_wrapper_overrides_every_virtual_of_the_installed_torch():
    torch = pytest.importorskip("torch")
    include = os.path.join(os.path.dirname(torch.__file__), "include")
    if not os.path.isfile(os.path.join(include, "c10/cuda/CUDACachingAllocator.h")):
        pytest.skip("this torch has no CUDA headers")
    with open(os.path.join(ROOT, "csrc", "recorder", "cuda_allocator.cpp")) as f:
        source = _code(f.read())
    wrapper = source[source.index("class RecordingCUDAAllocator"):]
    overridden = set(re.findall(r"\b(\w+)\([^;{]*\)\s*(?:const\s*)?override", wrapper))
    missing = _virtuals(include) - overridden
    assert not missing, f"not forwarded by RecordingCUDAAllocator: {sorted(missing)}"
    calls_inner = {m for m in overridden if re.search(rf"inner_->{m}\(", wrapper)}
    assert overridden - OWN == calls_inner, "every override must reach the wrapped allocator"
